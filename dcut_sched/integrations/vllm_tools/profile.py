"""``dcut-profile --vllm``: cost curves measured inside vLLM 0.32.0, dummy batches and real engine steps.

Runs in the vLLM environment::

    .venv-vllm/bin/python -m dcut_sched.integrations.vllm_tools.profile --model DIR --out FILE ...

builds an engine and times its forward on dummy batches
(:func:`dcut_sched.integrations.vllm.startup_profile.profile_runner`, whose docstring says what is
timed; the same code as the plugin's start-up profile) and, with ``--draft``, real engine steps on
held-out prompts (:mod:`.engine_steps`: per-step overheads, the real draft pass).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ...cost_curve import CostCurve
from ...paths import prompts_path
from ...util.atomic import atomic_write_text
from ..vllm import llm_kwargs
from ..vllm.startup_profile import find_model_runner, profile_runner
from .engine_steps import StepTimer, engine_step_rows
from .run import load_prompt_token_ids

__all__ = ["HELDOUT_OFFSET", "measure_engine_steps", "main"]


#: Held-out prompts for the engine-step measurement: ``dcut_sched/data/traces/prompts.jsonl`` rows 32..47, distinct
#: from the benchmark's (rows 0..15, analysis/bench_vllm.py) and the project-engine fidelity check's
#: held-out rows 16..31 (analysis/fidelity.py).
HELDOUT_OFFSET = 32


def measure_engine_steps(llm_args: dict[str, Any], prompts: list[list[int]], batch_sizes: Sequence[int],
                         max_tokens: int, llm=None, progress=print) -> list[dict[str, Any]]:
    """Time the decode steps of one engine on waves of held-out prompts (:mod:`.engine_steps`).

    For each bs: one wave of the first ``bs`` prompts, greedy, ``max_tokens`` each (EOS ignored),
    after one untimed warm-up wave. ``llm``: reuse a built engine (else ``vllm.LLM(**llm_args)``,
    shut down afterwards).

    Returns:
        the :class:`~.engine_steps.VllmStepTiming` dicts of every step.
    """
    from vllm import LLM, SamplingParams, TokensPrompt

    own = llm is None
    if own:
        llm = LLM(**llm_args)
    timer = StepTimer(llm)
    try:
        warm = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
        llm.generate([TokensPrompt(prompt_token_ids=prompts[0])], warm, use_tqdm=False)
        for bs in sorted(set(int(b) for b in batch_sizes)):
            timer.wave = bs
            sp = SamplingParams(temperature=0.0, max_tokens=int(max_tokens), ignore_eos=True)
            llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts[:bs]], sp, use_tqdm=False)
            kinds = {}
            for r in timer.records:
                if r.wave == bs and r.num_requests == bs:
                    kinds.setdefault(r.kind, []).append(r.step_ms)
            progress("engine steps bs %d: %s" % (bs, ", ".join(f"{k} {len(v)} x {np.median(v):.1f} ms"
                                                                  for k, v in sorted(kinds.items()))))
    finally:
        timer.restore()
        if own:
            try:
                llm.llm_engine.engine_core.shutdown()
            except Exception:  # noqa: BLE001 - best effort between engines
                pass
            del llm

            gc.collect()
    return [r.to_dict() for r in timer.records]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m dcut_sched.integrations.vllm_tools.profile",
        description="Time vLLM's own forward on dummy batches and, with --draft, real engine steps on held-out "
                    "prompts (per-step overheads, the real draft pass); write a v2 cost curve.")
    ap.add_argument("--model", required=True, help="target model folder")
    ap.add_argument("--draft", help="draft model folder (vLLM method draft_model): also time the draft step")
    ap.add_argument("--block-size", type=int, default=8)
    ap.add_argument("--batch-sizes", default="1,2,4,8,16")
    ap.add_argument("--context-len", type=int, default=128)
    ap.add_argument("--warmups", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--engine-steps", type=int, default=40, metavar="TOKENS",
                    help="with --draft: time real engine steps (no speculation, drafted with full verification, "
                         "undrafted) on waves of held-out prompts, TOKENS new tokens per request; 0 = dummy "
                         "batches only (the draft step is then vLLM's dummy pass, without attention)")
    ap.add_argument("--prompts", default=str(prompts_path()),
                    help="engine steps: prompt file (JSON lines with 'prompt'); rows from --prompt-offset")
    ap.add_argument("--prompt-offset", type=int, default=HELDOUT_OFFSET,
                    help="engine steps: first held-out prompt row (default %(default)s: not the benchmark's)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    from vllm import LLM

    batch_sizes = [int(x) for x in args.batch_sizes.split(",") if x.strip()]
    sizes = {"max_num_seqs": max(batch_sizes), "max_model_len": max(1024, args.context_len + 2 * args.block_size),
             "max_num_batched_tokens": max(2048, max(batch_sizes) * args.block_size)}
    base = {"model": args.model, "dtype": args.dtype, "enforce_eager": True, **sizes}
    steps = bool(args.draft) and args.engine_steps > 0
    if args.draft:
        kw = {**llm_kwargs(args.model, args.draft, args.block_size, "full", dtype=args.dtype, log_interval_s=3600.0),
              **sizes}
    else:
        kw = base
    t0, c0 = time.perf_counter(), time.process_time()
    llm = LLM(**kw)
    runner = find_model_runner(llm)
    if runner is None:
        print("error: vLLM's model runner is not in this process; set VLLM_ENABLE_V1_MULTIPROCESSING=0")
        return 2
    curve = profile_runner(runner, args.block_size, batch_sizes, args.context_len, args.warmups, args.repeats,
                           draft=bool(args.draft), model_name=Path(args.model).name, progress=print)

    given = list(sys.argv[1:] if argv is None else argv)
    curve.hardware["profile_command"] = "python -m dcut_sched.integrations.vllm_tools.profile " + shlex.join(given)
    if steps:
        spec = {"file": args.prompts, "offset": args.prompt_offset, "n": max(batch_sizes), "chat": True}
        prompts = load_prompt_token_ids(spec, args.model)
        records = []
        def spec(policy: str, **params: Any) -> dict[str, Any]:
            return {**llm_kwargs(args.model, args.draft, args.block_size, policy, dtype=args.dtype,
                                 log_interval_s=3600.0, policy_params=params), **sizes}

        for run, llm_args in (("drafted, full verification", None),
                              ("drafted, anchors verified only", spec("uniform", rho=1.0 / args.block_size)),
                              ("undrafted", spec("ar")),
                              ("plain", base)):
            print(f"engine steps: {run} run ({'the profiled engine' if llm_args is None else 'a new engine'})", flush=True)
            records += measure_engine_steps(llm_args, prompts, batch_sizes, args.engine_steps,
                                            llm=llm if llm_args is None else None)
            if llm_args is None:
                llm.llm_engine.engine_core.shutdown()
                del llm, runner

                gc.collect()

        atomic_write_text(Path(args.out).with_suffix(".steps.jsonl"), "".join(json.dumps(r) + "\n" for r in records))
        draft, first, overhead, notes = engine_step_rows(curve, records, args.block_size, batch_sizes)
        dummy_draft = {r.batch_size: round(r.median_ms, 3) for r in curve.draft}
        curve = CostCurve(hardware={**curve.hardware, "engine_steps": {
                              "prompts": f"{Path(args.prompts).name} rows {args.prompt_offset}..{args.prompt_offset + max(batch_sizes) - 1} (held out)",
                              "max_tokens": args.engine_steps,
                              "runs": "drafted: policy full (K = bs*B) and policy uniform at rho = 1/B (K = bs), "
                                      "drafting every step; undrafted: policy ar on the same speculative engine "
                                      "(num_spec_tokens_to_schedule = 0); plain: no speculative config",
                              "residuals": notes, "dummy_pass_draft_ms": dummy_draft,
                              # CPU time of this process over wall time: below 1 when other jobs take the core
                              "cpu_share": round((time.process_time() - c0) / (time.perf_counter() - t0), 3)},
                              "load_average": {**curve.hardware["load_average"], "end_1min": round(os.getloadavg()[0], 2)}},
                          model=curve.model, block_size=curve.block_size, context_len=curve.context_len,
                          verify=curve.verify, ar=curve.ar, draft=draft, draft_first=first, step_overhead=overhead,
                          graph_mode=curve.graph_mode, profile_seconds=time.perf_counter() - t0,
                          source=curve.source + "; draft, draft_first and step_overhead rows from real engine steps on "
                                                "held-out prompts (dcut_sched.integrations.vllm_tools.engine_steps)")
    curve.save(args.out)
    print(f"wrote {args.out} in {curve.profile_seconds:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
