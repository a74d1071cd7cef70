"""Cost curves measured inside vLLM 0.32.0: its own forward on dummy batches (imported only inside vLLM).

What is timed (each cell ``warmups`` untimed then ``repeats`` timed calls, the cells of a batch
size in turn so that a burst of other work on a shared machine spreads over all of them; median,
p20, p80 ms; ``torch.cuda.synchronize()`` around each call on a GPU):

- **verify** ``(bs, num_tokens)``, num_tokens = ``bs * L`` for L = 1..B: the target's
  ``GPUModelRunner._dummy_run(num_tokens)`` with ``bs`` requests (``max_num_seqs`` set to ``bs``
  for the call, so the tokens split as evenly as vLLM's dummy batch does), attention metadata at
  ``context_len`` cached tokens (``profile_seq_lens``), CUDA-graph mode chosen by vLLM's dispatcher
  as in serving (eager on CPU), plus ``compute_logits`` and the greedy argmax over the
  ``num_tokens`` verified positions. The drafter's own dummy pass is switched off for these calls.
- **ar** ``(bs)``: the plain decode step, one token per request, on the uniform-decode path vLLM
  takes without speculation (``uniform_decode=True`` when the engine has no speculative config;
  on a spec engine the same ragged path as verify at ``num_tokens = bs``).
- **draft** ``(bs)``: the drafter's ``dummy_run(bs)`` (its ``num_speculative_tokens`` one-token
  forwards; vLLM's dummy pass runs them without attention metadata, so attention over the context
  is not in this number) plus ``B - 1`` times ``compute_logits`` with the argmax and the
  confidence (logsumexp) of the D-Cut hook.

The file is a ``dcut.cost-curve/2`` whose ``hardware`` names ``engine: vllm``, its version, the
device and the settings that change the numbers (dtype, enforce_eager, threads, multiprocessing,
the OpenMP runtime preloaded).

Two entry points:

- :func:`startup_curve`: the plugin's start-up profile when no ``cost_curve`` is configured: the
  in-process engine's model runner is timed (how long that takes: docs/vllm.md) and the file cached under
  ``profile_cache_dir`` keyed by model, draft, block size, dtype, batch sizes and vLLM version;
- ``python -m dcut_sched.integrations.vllm.profile --model DIR --out FILE ...`` (what
  ``dcut-profile --vllm`` runs in the vLLM environment): builds an engine and times it.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import platform
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from ...cost_curve import ArRow, CostCurve, DraftRow, VerifyRow, cpu_model_name
from ...paths import prompts_path

__all__ = ["find_model_runner", "profile_runner", "startup_curve", "main"]


def find_model_runner(llm=None):
    """The in-process engine's model runner (a ``GPUModelRunner``; the CPU runner derives from it).

    With ``llm`` (a ``vllm.LLM``) it follows ``llm_engine.engine_core`` (the in-process client) to
    the engine core; without, it walks up the call stack to the ``EngineCore`` that is building the
    scheduler (the start-up profile). From there: ``model_executor.driver_worker.worker.model_runner``.
    ``None`` when the worker lives in another process (multiprocessing executors).
    """
    import sys

    core = None
    if llm is not None:
        client = llm.llm_engine.engine_core
        core = getattr(client, "engine_core", None)
    else:
        frame = sys._getframe(1)
        while frame is not None and core is None:
            obj = frame.f_locals.get("self")
            if obj is not None and hasattr(obj, "model_executor") and hasattr(obj, "scheduler") is False:
                core = obj
            elif obj is not None and type(obj).__name__ == "EngineCore":
                core = obj
            frame = frame.f_back
    executor = getattr(core, "model_executor", None)
    worker = getattr(getattr(executor, "driver_worker", None), "worker", None)
    return getattr(worker, "model_runner", None)


def _sync(device) -> None:
    if torch.cuda.is_available() and getattr(device, "type", str(device)) == "cuda":
        torch.cuda.synchronize()


def _time_round_robin(runner, batch_size: int, cells, warmups: int, repeats: int, device) -> list[list[float]]:
    """ms samples per cell, the cells timed in turn (``warmups`` untimed rounds, then ``repeats``
    timed ones): on a shared machine a burst of other work then spreads over every cell of the
    batch size instead of taking one cell's whole sample, so each median stays a median."""
    out: list[list[float]] = [[] for _ in cells]
    for r in range(warmups + repeats):
        for j, (_, _, call, drafter_off) in enumerate(cells):
            with _batch_of(runner, batch_size, drafter_off=drafter_off):
                _sync(device)
                t0 = time.perf_counter()
                call()
                _sync(device)
                if r >= warmups:
                    out[j].append((time.perf_counter() - t0) * 1e3)
    return out


@contextlib.contextmanager
def _batch_of(runner, batch_size: int, drafter_off: bool):
    sc = runner.scheduler_config
    saved = sc.max_num_seqs
    drafter = getattr(runner, "drafter", None)
    saved_dummy = drafter.__dict__.get("dummy_run") if drafter is not None else None
    sc.max_num_seqs = int(batch_size)
    if drafter is not None and drafter_off:
        drafter.dummy_run = lambda *a, **k: None
    try:
        yield
    finally:
        sc.max_num_seqs = saved
        if drafter is not None and drafter_off:
            if saved_dummy is None:
                del drafter.dummy_run
            else:
                drafter.dummy_run = saved_dummy


def _settings(runner) -> dict[str, Any]:
    import vllm

    mc = runner.vllm_config.model_config
    return {
        "engine": "vllm", "engine_version": vllm.__version__,
        "dtype": str(mc.dtype).replace("torch.", ""),
        "enforce_eager": bool(mc.enforce_eager),
        "cudagraph_mode": str(runner.vllm_config.compilation_config.cudagraph_mode),
        "VLLM_ENABLE_V1_MULTIPROCESSING": os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING"),
        "LD_PRELOAD": os.path.basename(os.environ.get("LD_PRELOAD", "")) or None,
        "torch_threads": torch.get_num_threads(),
    }


def profile_runner(runner, block_size: int, batch_sizes: Sequence[int], context_len: int = 128,
                   warmups: int = 1, repeats: int = 5, draft: bool = True, model_name: str = "",
                   progress=None) -> CostCurve:
    """Time ``runner``'s forward on dummy batches (module docstring) and return the curve.

    Args:
        runner: a vLLM ``GPUModelRunner`` (or the CPU runner) with a loaded model and KV cache.
        block_size: B; verify cells at ``bs * L`` tokens for L = 1..B.
        batch_sizes: request counts to measure (each <= the engine's ``max_num_seqs``).
        context_len: cached tokens per request in the attention metadata.
        draft: also time the drafter (needs a speculative engine).
        progress: optional ``callable(str)`` for one line per batch size.

    Raises:
        ValueError: a batch size above ``max_num_seqs`` or a cell above ``max_num_batched_tokens``.
    """
    t_start = time.perf_counter()
    load_start = os.getloadavg()[0]
    device = runner.device
    max_seqs = runner.scheduler_config.max_num_seqs
    has_spec = runner.speculative_config is not None
    verify, ar, drafts = [], [], []
    for bs in sorted(set(int(b) for b in batch_sizes)):
        if bs > max_seqs:
            raise ValueError(f"batch size {bs} > the engine's max_num_seqs {max_seqs}")
        cells: list[tuple[str, int, Any, bool]] = []  # (kind, num_tokens, call, drafter off)
        for length in range(1, block_size + 1):
            n = bs * length
            if n > runner.max_num_tokens:
                raise ValueError(f"cell ({bs}, {n}) exceeds max_num_batched_tokens {runner.max_num_tokens}")

            def verify_call(n=n):
                hidden, _ = runner._dummy_run(n, force_attention=True, profile_seq_lens=context_len)
                runner.model.compute_logits(hidden[:n]).argmax(dim=-1)

            cells.append(("verify", n, verify_call, True))

        def ar_call(bs=bs):
            hidden, _ = runner._dummy_run(bs, force_attention=True, uniform_decode=not has_spec,
                                          profile_seq_lens=context_len)
            runner.model.compute_logits(hidden[:bs]).argmax(dim=-1)

        cells.append(("ar", bs, ar_call, True))
        if draft and has_spec:
            drafter = runner.drafter

            def draft_call(bs=bs):
                drafter.dummy_run(bs, use_cudagraphs=False)
                h = drafter.hidden_states[:bs] if getattr(drafter, "hidden_states", None) is not None \
                    else torch.zeros(bs, drafter.hidden_size, device=device)
                for _ in range(block_size - 1):
                    lf = drafter.model.compute_logits(h.to(runner.dtype)).float()
                    lf.argmax(dim=-1)
                    torch.logsumexp(lf, dim=-1)

            cells.append(("draft", bs, draft_call, False))
        with torch.inference_mode():
            samples = _time_round_robin(runner, bs, cells, warmups, repeats, device)
        for (kind, n, _, _), times in zip(cells, samples):
            p20, med, p80 = (float(x) for x in np.percentile(times, [20, 50, 80]))
            if kind == "verify":
                verify.append(VerifyRow(bs, n, med, p20, p80, repeats, "measured"))
            elif kind == "ar":
                ar.append(ArRow(bs, med, p20, p80, repeats, "measured"))
            else:
                drafts.append(DraftRow(bs, med, p20, p80, repeats, "measured"))
        if progress is not None:
            progress(f"bs {bs}: verify {verify[-block_size].median_ms:.1f}..{verify[-1].median_ms:.1f} ms, "
                     f"ar {ar[-1].median_ms:.1f} ms" + (f", draft {drafts[-1].median_ms:.1f} ms" if drafts else ""))
    mc = runner.vllm_config.model_config
    hf = mc.hf_config
    hardware = {
        "device_name": torch.cuda.get_device_name(device) if getattr(device, "type", "") == "cuda" else cpu_model_name(),
        "backend": "cuda-graph" if getattr(device, "type", "") == "cuda" and not mc.enforce_eager else
                   ("cuda-eager" if getattr(device, "type", "") == "cuda" else "cpu-eager"),
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "load_average": {"start_1min": round(load_start, 2), "end_1min": round(os.getloadavg()[0], 2),
                         "cpu_count": os.cpu_count()},
        **_settings(runner),
        "note": "vLLM's own forward on dummy batches (dcut_sched.integrations.vllm.profile)",
    }
    model = {"name": model_name or str(mc.model), "config": {
        k: getattr(hf, k, None) for k in ("num_hidden_layers", "hidden_size", "intermediate_size",
                                          "num_attention_heads", "num_key_value_heads", "vocab_size")}}
    if has_spec:
        model["draft"] = Path(str(runner.speculative_config.model)).name
    return CostCurve(hardware=hardware, model=model, block_size=int(block_size), context_len=int(context_len),
                     verify=verify, ar=ar, draft=drafts, graph_mode=None if mc.enforce_eager else "piecewise",
                     profile_seconds=time.perf_counter() - t_start,
                     source="vLLM dummy-batch forward timings (dcut_sched.integrations.vllm.profile)")


def _default_batch_sizes(max_num_seqs: int) -> list[int]:
    sizes = {1, max_num_seqs}
    b = 2
    while b < max_num_seqs:
        sizes.add(b)
        b *= 2
    return sorted(sizes)


def startup_curve(cfg, vllm_config, block_size: int) -> CostCurve:
    """The plugin's curve when none is configured: the cached start-up profile, else measure now.

    Raises:
        DCutConfigError: the engine's model runner is not in this process (multiprocessing).
    """
    import vllm

    from ...model.gguf_weights import cache_dir
    from .config import DCutConfigError

    spec = vllm_config.speculative_config
    max_bs = int(vllm_config.scheduler_config.max_num_seqs)
    batch_sizes = _default_batch_sizes(max_bs)
    key = {"model": str(vllm_config.model_config.model), "draft": str(spec.model) if spec else None,
           "block_size": block_size, "dtype": str(vllm_config.model_config.dtype), "batch_sizes": batch_sizes,
           "vllm": vllm.__version__, "device": str(vllm_config.device_config.device), "threads": torch.get_num_threads()}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    folder = Path(cfg.profile_cache_dir) if cfg.profile_cache_dir else cache_dir() / "vllm-profiles"
    path = folder / f"vllm-{Path(str(vllm_config.model_config.model)).name}-b{block_size}-{digest}.json"
    if path.is_file():
        return CostCurve.load(path, check_hardware=False)
    runner = find_model_runner()
    if runner is None:
        raise DCutConfigError(
            f"{cfg.source}: policy {cfg.policy!r} needs a cost curve and the start-up profile needs the engine in "
            "this process (VLLM_ENABLE_V1_MULTIPROCESSING=0); or profile first with `dcut-profile --vllm MODEL "
            f"--block-size {block_size} --out FILE` and set 'cost_curve'"
        )
    from vllm.logger import init_logger

    log = init_logger("vllm.plugins.dcut")
    log.info("D-Cut: no cost curve configured; profiling vLLM at start-up (batch sizes %s, block size %d)",
             batch_sizes, block_size)
    curve = profile_runner(runner, block_size, batch_sizes, progress=lambda s: log.info("D-Cut profile: %s", s))
    curve.save(path)
    log.info("D-Cut: start-up profile took %.1f s, cached in %s", curve.profile_seconds, path)
    return CostCurve.load(path, check_hardware=False)


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

    from .engine_steps import StepTimer

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
            import gc

            gc.collect()
    return [r.to_dict() for r in timer.records]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m dcut_sched.integrations.vllm.profile",
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

    from . import llm_kwargs

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
    import shlex
    import sys

    given = list(sys.argv[1:] if argv is None else argv)
    curve.hardware["profile_command"] = "python -m dcut_sched.integrations.vllm.profile " + shlex.join(given)
    if steps:
        from .engine_steps import engine_step_rows
        from .run import load_prompt_token_ids

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
                import gc

                gc.collect()
        from ...atomic import atomic_write_text

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
                                                "held-out prompts (dcut_sched.integrations.vllm.engine_steps)")
    curve.save(args.out)
    print(f"wrote {args.out} in {curve.profile_seconds:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
