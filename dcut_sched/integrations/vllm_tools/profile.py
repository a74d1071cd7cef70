"""``dcut-profile --vllm``: cost curves measured inside vLLM 0.32.0, dummy batches and real engine steps.

Runs in the vLLM environment (the command, :mod:`dcut_sched.cli.vllm_profile`)::

    .venv-vllm/bin/python -m dcut_sched.cli.vllm_profile --model DIR --out FILE ...

:func:`profile_engine` builds an engine and times its forward on dummy batches
(:func:`dcut_sched.integrations.vllm.startup_profile.profile_runner`, whose docstring says what is
timed; the same code as the plugin's start-up profile) and, with ``--draft``, real engine steps on
held-out prompts (:mod:`.engine_steps`: per-step overheads, the real draft pass).
"""

from __future__ import annotations

import gc
import json
import os
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ...cost_curve import CostCurve
from ...util.atomic import atomic_write_text
from ..vllm import llm_kwargs
from ..vllm.startup_profile import find_model_runner, profile_runner
from .engine_steps import StepTimer, engine_step_rows
from .run import load_prompt_token_ids

__all__ = ["HELDOUT_OFFSET", "ModelRunnerNotFound", "engine_sizes", "measure_engine_steps", "profile_engine"]


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


class ModelRunnerNotFound(RuntimeError):
    """vLLM runs its model in another process, where the dummy batches cannot be timed."""


def engine_sizes(batch_sizes: Sequence[int], context_len: int, block_size: int) -> dict[str, int]:
    """The engine limits a profile needs: every batch size, the context plus two blocks, a full verify."""
    return {"max_num_seqs": max(batch_sizes), "max_model_len": max(1024, context_len + 2 * block_size),
            "max_num_batched_tokens": max(2048, max(batch_sizes) * block_size)}


def profile_engine(model: str, out: str, *, draft: str | None, block_size: int, batch_sizes: Sequence[int],
                   context_len: int, warmups: int, repeats: int, dtype: str, engine_steps: int,
                   prompts_file: str, prompt_offset: int, command: str) -> CostCurve:
    """Build a vLLM engine on ``model`` (with ``draft``: speculative, policy full), time its forward on
    dummy batches (:func:`~dcut_sched.integrations.vllm.startup_profile.profile_runner`) and, with a
    draft and ``engine_steps`` > 0, real engine steps (:func:`_add_engine_steps`).

    ``command`` is recorded as the curve's ``hardware.profile_command``. The engine-step records are
    written to ``OUT.steps.jsonl`` (``out`` with that suffix); the curve is returned, not saved.

    Raises:
        ModelRunnerNotFound: vLLM's model runner is not in this process.
    """
    from vllm import LLM

    batch_sizes = list(batch_sizes)
    sizes = engine_sizes(batch_sizes, context_len, block_size)
    base = {"model": model, "dtype": dtype, "enforce_eager": True, **sizes}
    steps = bool(draft) and engine_steps > 0
    if draft:
        kw = {**llm_kwargs(model, draft, block_size, "full", dtype=dtype, log_interval_s=3600.0), **sizes}
    else:
        kw = base
    t0, c0 = time.perf_counter(), time.process_time()
    llm = LLM(**kw)
    runner = find_model_runner(llm)
    if runner is None:
        raise ModelRunnerNotFound("vLLM's model runner is not in this process; set VLLM_ENABLE_V1_MULTIPROCESSING=0")
    curve = profile_runner(runner, block_size, batch_sizes, context_len, warmups, repeats,
                           draft=bool(draft), model_name=Path(model).name, progress=print)
    curve.hardware["profile_command"] = command
    if not steps:
        return curve
    spec = {"file": prompts_file, "offset": prompt_offset, "n": max(batch_sizes), "chat": True}
    prompts = load_prompt_token_ids(spec, model)
    records = []

    def run_args(policy: str, **params: Any) -> dict[str, Any]:
        # the whole block drafted every drafted step: the curve's draft rows price that pass
        return {**llm_kwargs(model, draft, block_size, policy, dtype=dtype, log_interval_s=3600.0,
                             adaptive_draft_depth=False, policy_params=params), **sizes}

    for run, llm_args in (("drafted, full verification", None),
                          ("drafted, anchors verified only", run_args("uniform", rho=1.0 / block_size)),
                          ("undrafted", run_args("ar")),
                          ("plain", base)):
        print(f"engine steps: {run} run ({'the profiled engine' if llm_args is None else 'a new engine'})", flush=True)
        records += measure_engine_steps(llm_args, prompts, batch_sizes, engine_steps,
                                        llm=llm if llm_args is None else None)
        if llm_args is None:
            llm.llm_engine.engine_core.shutdown()
            del llm, runner

            gc.collect()

    atomic_write_text(Path(out).with_suffix(".steps.jsonl"), "".join(json.dumps(r) + "\n" for r in records))
    return _add_engine_steps(curve, records, block_size=block_size, batch_sizes=batch_sizes,
                             engine_steps=engine_steps, prompts_file=prompts_file, prompt_offset=prompt_offset,
                             t0=t0, c0=c0)


def _add_engine_steps(curve: CostCurve, records: list[dict[str, Any]], *, block_size: int,
                      batch_sizes: list[int], engine_steps: int, prompts_file: str, prompt_offset: int,
                      t0: float, c0: float) -> CostCurve:
    """``curve`` with its draft, draft_first and step_overhead rows from the engine-step ``records``
    (:func:`~.engine_steps.engine_step_rows`) and how they were measured under ``hardware.engine_steps``;
    ``t0``/``c0``: wall and CPU clocks at the start of the profile."""
    draft, first, overhead, notes = engine_step_rows(curve, records, block_size, batch_sizes)
    dummy_draft = {r.batch_size: round(r.median_ms, 3) for r in curve.draft}
    return CostCurve(hardware={**curve.hardware, "engine_steps": {
                         "prompts": f"{Path(prompts_file).name} rows {prompt_offset}..{prompt_offset + max(batch_sizes) - 1} (held out)",
                         "max_tokens": engine_steps,
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
