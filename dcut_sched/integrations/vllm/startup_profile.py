"""Start-up profile of the vLLM plugin: cost curves measured inside vLLM 0.32.0 (imported only inside vLLM).

Times vLLM's own forward on dummy batches (each cell ``warmups`` untimed then ``repeats`` timed
calls, the cells of a batch size in turn so that a burst of other work on a shared machine spreads
over all of them; median, p20, p80 ms; ``torch.cuda.synchronize()`` around each call on a GPU):

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

:func:`startup_curve` is the plugin's start-up profile when no ``cost_curve`` is configured: the
in-process engine's model runner is timed (how long that takes: docs/vllm.md) and the file cached under
``profile_cache_dir`` keyed by model, draft, block size, dtype, batch sizes and vLLM version.
:func:`profile_runner` is also what ``dcut-profile --vllm`` runs
(:mod:`dcut_sched.integrations.vllm_tools.profile`, which adds real engine steps).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from ...cost_curve import ArRow, CostCurve, DraftRow, VerifyRow, cpu_model_name
from ...model.gguf_weights import cache_dir
from .config import DCutConfigError

__all__ = ["find_model_runner", "profile_runner", "startup_curve"]


def find_model_runner(llm=None):
    """The in-process engine's model runner (a ``GPUModelRunner``; the CPU runner derives from it).

    With ``llm`` (a ``vllm.LLM``) it follows ``llm_engine.engine_core`` (the in-process client) to
    the engine core; without, it walks up the call stack to the ``EngineCore`` that is building the
    scheduler (the start-up profile). From there: ``model_executor.driver_worker.worker.model_runner``.
    ``None`` when the worker lives in another process (multiprocessing executors).
    """
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
        "note": "vLLM's own forward on dummy batches (dcut_sched.integrations.vllm.startup_profile)",
    }
    model = {"name": model_name or str(mc.model), "config": {
        k: getattr(hf, k, None) for k in ("num_hidden_layers", "hidden_size", "intermediate_size",
                                          "num_attention_heads", "num_key_value_heads", "vocab_size")}}
    if has_spec:
        model["draft"] = Path(str(runner.speculative_config.model)).name
    return CostCurve(hardware=hardware, model=model, block_size=int(block_size), context_len=int(context_len),
                     verify=verify, ar=ar, draft=drafts, graph_mode=None if mc.enforce_eager else "piecewise",
                     profile_seconds=time.perf_counter() - t_start,
                     source="vLLM dummy-batch forward timings (dcut_sched.integrations.vllm.startup_profile)")


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
