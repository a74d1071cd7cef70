"""Driver for test_vllm_sampling.py, run inside the vLLM environment (``.venv-vllm/bin/python``).

    python tests/integrations/vllm_sampling_driver.py JOB.json OUT.json

JOB: ``target``, ``draft``, ``block_size``, ``cost_curve``, ``prompt`` (a
:func:`dcut_sched.integrations.vllm_tools.run.load_prompt_token_ids` spec; its first prompt is used), ``temperature``,
``num_samples``, ``max_num_seqs``, ``logprobs`` (how many of the target's most likely tokens the
reference reports per position), ``policy``.

1. **Reference** (vLLM without speculation, fp32): the target's top-``logprobs`` next-token
   probabilities at the prompt, at prompt + m1 and at prompt + m1 + m2, where m1, m2 are the most
   likely tokens (one prefill per prefix, ``max_tokens=1``; at temperature 1 vLLM's logprobs are
   the sampling distribution).
2. **Samples** (vLLM + D-Cut with ``policy``): ``num_samples`` copies of the prompt, 3 tokens each
   at ``temperature`` from the engine's seeded sampler; token 1 comes from the prefill, tokens 2 and
   3 from verification steps whose drafts D-Cut cut to the planned lengths.

OUT: ``{"reference": [{"token_ids": [...], "probs": [...]}, x3], "modes": [m1, m2],
"samples": [[t1, t2, t3], ...], "dcut_metrics": {...}}``.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path


def main(job_path: str, out_path: str) -> int:
    from vllm import LLM, SamplingParams, TokensPrompt

    from dcut_sched.integrations.vllm import llm_kwargs
    from dcut_sched.integrations.vllm_tools.run import load_prompt_token_ids
    from dcut_sched.util.atomic import atomic_write_text

    job = json.loads(Path(job_path).read_text())
    prompt = load_prompt_token_ids(job["prompt"], job["target"])[0]
    temperature = float(job["temperature"])
    common = {"max_model_len": 512, "max_num_seqs": int(job["max_num_seqs"]), "seed": 0, "dtype": "float32"}

    ref = LLM(model=job["target"], enforce_eager=True, **common)
    reference, prefix = [], list(prompt)
    for _ in range(3):
        sp = SamplingParams(temperature=temperature, max_tokens=1, logprobs=int(job["logprobs"]), seed=0)
        (out,) = ref.generate([TokensPrompt(prompt_token_ids=prefix)], sp, use_tqdm=False)
        top = out.outputs[0].logprobs[0]  # {token_id: Logprob}, the top-k plus the sampled one
        items = sorted(((int(t), math.exp(lp.logprob)) for t, lp in top.items()), key=lambda x: -x[1])
        reference.append({"token_ids": [t for t, _ in items], "probs": [p for _, p in items]})
        prefix.append(items[0][0])
    modes = prefix[len(prompt): len(prompt) + 2]
    ref.llm_engine.engine_core.shutdown()
    del ref

    kw = llm_kwargs(job["target"], job["draft"], int(job["block_size"]), job["policy"],
                    cost_curve=job.get("cost_curve"), dtype="float32", policy_params=job.get("policy_params", {}))
    kw.pop("dtype", None)
    spec = LLM(**kw, **common)
    # One sampler stream for the engine (LLM(seed=0)), not per-request seeds: vLLM 0.32.0 rewinds a
    # request's generator with set_offset after a partial prefill, which a CPU generator refuses.
    sp = SamplingParams(temperature=temperature, max_tokens=3, ignore_eos=True)
    outs = spec.generate([TokensPrompt(prompt_token_ids=prompt)] * int(job["num_samples"]), sp, use_tqdm=False)
    core = spec.llm_engine.engine_core
    sched = getattr(core, "engine_core", core).scheduler
    doc = {"reference": reference, "modes": modes,
           "samples": [list(map(int, o.outputs[0].token_ids)) for o in outs],
           "dcut_metrics": dict(getattr(sched, "dcut_metrics", {}) or {})}
    atomic_write_text(out_path, json.dumps(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:3]))
