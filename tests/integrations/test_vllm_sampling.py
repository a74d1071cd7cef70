"""Sampling at temperature 1 in real vLLM 0.32.0 on CPU, drafts cut by D-Cut: the exact target distribution.

vLLM verifies greedy drafts by rejection sampling (accept draft t with the target's probability of
it, else draw from the target with it removed), which keeps each token's distribution the target's
for any per-request length fixed before verification, so D-Cut's lengths must not change it
(docs/sampling.md). ``vllm_sampling_driver.py`` (in the vLLM environment) takes the reference
probabilities from vLLM without speculation (top 20 next tokens at the prompt, after its most likely
token m1, after m1 m2) and 600 three-token samples of the same prompt from vLLM + D-Cut (``dcut``,
B = 8) at temperature 1. A chi-square goodness-of-fit test (alpha 1e-3; tokens expected fewer than
5 times pooled with the rest of the vocabulary) checks token 1 (from the prefill: the check of the
check), token 2 given m1 and token 3 given m1 m2 (both from verification steps).

The cost curve is linear in the verified tokens (``make_curve``), so ``dcut`` keeps its smallest
bucket (rho = 0.25, 2 of 8 slots per request on average, spread by the global top-K) at every batch
size up to the 128 requests in flight. The prompt (dcut_sched/data/traces/prompts.jsonl line 40) has a likely
first token (P(m1) = 0.82) and spread second and third tokens (P(m2 | m1) = 0.44), so both
conditional tests keep a few hundred samples.

Without ``cpu_kernels`` (vLLM's CPU ``expand_kernel`` fallback truncates temperatures to int64 and
writes into a copy) the same run gives p < 1e-10 for tokens 2 and 3 (token 2's mode drawn 59 times
against 216 expected); with it p = 0.57 and 0.23 on this machine. The same check runs over the DFlash
block drafter (``dflash:drafters/smollm2-135m-dflash``), whose drafts vLLM verifies the same way, with
``fine`` alternating drafted and undrafted steps (the undrafted step's context-only drafter pass).
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from dcut_sched.integrations.vllm_tools.venv import cpu_env, venv_python, vllm_available

REPO_ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow

BLOCK_SIZE = 8
NUM_SAMPLES = 600
PROMPT_INDEX = 39
ALPHA = 1e-3
DRIVER = Path(__file__).with_name("vllm_sampling_driver.py")


def _chisquare(observed_tokens: list[int], reference: dict) -> tuple[float, int, list[tuple[int, float]]]:
    """(p-value, samples, [(observed, expected)]) of the tokens against the reference probabilities."""
    n = len(observed_tokens)
    counts = collections.Counter(observed_tokens)
    probs = np.asarray(reference["probs"], dtype=np.float64)
    keep = [i for i in range(len(probs)) if n * probs[i] >= 5]
    expected = [n * probs[i] for i in keep]
    observed = [counts.get(reference["token_ids"][i], 0) for i in keep]
    expected.append(n - sum(expected))  # every other token of the vocabulary
    observed.append(n - sum(observed))
    return float(stats.chisquare(observed, expected).pvalue), n, list(zip(observed, expected))


DFLASH_DRAFTER = REPO_ROOT / "drafters" / "smollm2-135m-dflash"
#: ``fine`` made to alternate: every drafted step stops drafting, every plain step asks for a probe
# fine alternating drafted and undrafted steps (a probe after every plain step); decided without
# feedback, so two runs make the same decisions whatever their measured step times
SWITCHING = {"speculate_margin": 1000.0, "probe_interval": 1, "probe_budget": 0.9, "feedback": False}


@pytest.mark.parametrize("drafter", ["draft_model", "dflash"])
def test_sampled_tokens_follow_the_target_distribution(tmp_path, make_curve, drafter):
    """``draft_model``: the layer-skip draft (vLLM's draft-model path); ``dflash``: the shipped DFlash
    block drafter (vLLM's ``DFlashProposer``, all B-1 drafts from one parallel pass)."""
    ok, reason = vllm_available()
    if not ok:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the vLLM tests: {reason}")
        pytest.skip(reason)
    from dcut_sched.integrations.vllm_tools.checkpoint import write_pair

    target, draft = write_pair()
    if drafter == "dflash":
        draft = f"dflash:{DFLASH_DRAFTER}"
    curve = make_curve(batch_sizes=(1, 2, 4, 8, 16, 32, 64, 128), block_size=BLOCK_SIZE, base_ms=2.0,
                       per_token_ms=0.5)
    curve.save(tmp_path / "linear-b8.json")
    # the DFlash run alternates drafted and undrafted steps (the undrafted step's context-only drafter
    # pass, hooks.context_only_pass): requests switch between the two within their three tokens
    policy, params = ("fine", SWITCHING) if drafter == "dflash" else ("dcut", {})
    job = {"target": str(target), "draft": str(draft), "block_size": BLOCK_SIZE, "policy": policy,
           "policy_params": params, "cost_curve": str(tmp_path / "linear-b8.json"), "temperature": 1.0, "num_samples": NUM_SAMPLES,
           "max_num_seqs": 128, "logprobs": 20,
           "prompt": {"file": str(REPO_ROOT / "dcut_sched" / "data" / "traces" / "prompts.jsonl"), "n": 1, "offset": PROMPT_INDEX,
                      "chat": True}}
    (tmp_path / "job.json").write_text(json.dumps(job))
    proc = subprocess.run([str(venv_python()), str(DRIVER), str(tmp_path / "job.json"), str(tmp_path / "out.json")],
                          env=cpu_env(), capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        pytest.fail(f"vLLM sampling driver exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-5000:]}")
    out = json.loads((tmp_path / "out.json").read_text())
    samples, (m1, m2) = out["samples"], out["modes"]
    assert len(samples) == NUM_SAMPLES and all(len(s) == 3 for s in samples)
    metrics = out["dcut_metrics"]
    assert metrics["drafted_steps"] >= 1 and metrics["keep_ratio"] < 1.0, metrics  # drafts were cut
    if drafter == "dflash":
        assert metrics["steps"] - metrics["drafted_steps"] >= 2, metrics  # undrafted steps ran too

    checks = {
        "token 1": _chisquare([s[0] for s in samples], out["reference"][0]),
        "token 2 | m1": _chisquare([s[1] for s in samples if s[0] == m1], out["reference"][1]),
        "token 3 | m1 m2": _chisquare([s[2] for s in samples if s[:2] == [m1, m2]], out["reference"][2]),
    }
    for name, (p, n, cells) in checks.items():
        assert n >= 150, f"{name}: only {n} samples"
        assert p > ALPHA, f"{name}: chi-square p = {p:.2e} over {n} samples; (observed, expected) = {cells}"
