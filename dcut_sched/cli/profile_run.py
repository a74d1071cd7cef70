"""``dcut-profile``'s profiles: resolve the model and the draft step, then model (analytic) or measure a curve.

:func:`resolve` fills each mode's defaults and checks the model, the draft step and a trained
drafter before anything is built; :func:`run_analytic` and :func:`run_measured` return the
:class:`~dcut_sched.CostCurve`, a measured one with the machine's load and its warnings recorded.
"""

from __future__ import annotations

import argparse
import os
import time
import warnings
from typing import Any

import numpy as np

from dcut_sched import CostCurve
from dcut_sched.cli.errors import UsageError
from dcut_sched.cost_curve import AssumedArWarning

DEFAULTS = {
    # mode: (model, batch sizes, context_len, warmups, repeats, dtype)
    "gpu": ("qwen3-8b", (1, 2, 4, 8, 16, 32, 64), 1024, 5, 20, "bfloat16"),
    "cpu": ("tiny", (1, 2, 4, 8), 256, 1, 5, "float32"),
    "analytic": ("qwen3-8b", (1, 2, 4, 8, 16, 32, 64), 1024, 0, 0, "bfloat16"),
}


def _auto_draft(model_name: str, num_layers: int) -> str:
    if model_name == "smollm2-135m":
        return "self-skip:14,15"
    return f"dflash:{min(5, max(1, num_layers // 4))}"


#: Warn when the median p20-p80 spread of a profile's cells exceeds this fraction of the median ...
SPREAD_WARN_MEDIAN = 0.10
#: ... or the widest cell's spread exceeds this.
SPREAD_WARN_MAX = 0.30


def _load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (``os.getloadavg``), or None where there are none."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def _cpu_hardware(threads: int) -> dict[str, Any]:
    import torch

    from dcut_sched.cost_curve import cpu_model_name

    load = _load_average()
    return {"device_name": cpu_model_name(), "backend": "cpu-eager", "torch_version": torch.__version__,
            "cuda_version": None, "driver_version": None, "threads": threads, "cpu_count": os.cpu_count(),
            "load_average_at_start": None if load is None else load[0],
            "note": "eager CPU times of this machine only; not a GPU cost curve"}


def _load_warnings(load: dict[str, Any], cpu_count: int | None, threads: int,
                   seconds: float | None = None) -> list[str]:
    """Why the recorded machine load makes the timings suspect (empty when it does not): the 1-minute
    load average at the start or the end above the core count, or the 5-minute one at the end for a
    profile that took 5 minutes or more (a shorter one's 5-minute average is mostly the time before)."""
    cores = cpu_count or 1
    keys = ["start_1min", "end_1min"] + (["end_5min"] if seconds is not None and seconds >= 300 else [])
    seen = [load.get(k) for k in keys if load.get(k) is not None]
    worst = max(seen) if seen else 0.0
    if worst > cores:
        return [f"machine load average reached {worst:g} on {cores} cores (this profile uses {threads} thread(s)): "
                f"other processes competed for the CPU, so the times are inflated and noisy; re-profile on a quiet "
                f"machine for a curve that describes it"]
    return []


def _spread_warnings(curve: CostCurve) -> list[str]:
    from dcut_sched.profiler.report import noise_summary

    noise = noise_summary(curve)
    if np.isnan(noise["median_spread_pct"]):
        return []
    if noise["median_spread_pct"] > 100 * SPREAD_WARN_MEDIAN or noise["max_spread_pct"] > 100 * SPREAD_WARN_MAX:
        return [f"p20-p80 spread is high (median {noise['median_spread_pct']:.1f}%, max {noise['max_spread_pct']:.1f}% "
                f"of the median, in {noise['max_spread_cell']}): the medians are uncertain; add --repeats/--rounds "
                f"or profile on a quieter machine"]
    return []


def _monotone_warnings(curve: CostCurve, tolerance: float = 0.05) -> list[str]:
    """Plain-decode or draft steps that get cheaper with more requests (by more than ``tolerance``):
    a sign of load drift or noise, since a bigger batch never does less work."""
    out = []
    for fam, rows in (("ar", curve.ar), ("draft", curve.draft)):
        rows = sorted(rows, key=lambda r: r.batch_size)
        drops = [f"bs {a.batch_size} {a.median_ms:.4g} ms > bs {b.batch_size} {b.median_ms:.4g} ms"
                 for a, b in zip(rows, rows[1:]) if b.median_ms < a.median_ms * (1 - tolerance)]
        if drops:
            out.append(f"{fam} step not monotone in batch size ({'; '.join(drops[:3])}"
                       f"{'; ...' if len(drops) > 3 else ''}): noise, load drift or a real shape effect (matmul "
                       f"blocking at some batch sizes); the lookup interpolates these medians as they are")
    return out


def resolve(args: argparse.Namespace):
    from dcut_sched.profiler.analytic import parse_draft_spec
    from dcut_sched.profiler.shapes import resolve_model

    model, bss, ctx, warm, reps, dtype = DEFAULTS[args.mode]
    if args.block_size is None and not (args.mode == "analytic" and args.fit):
        args.block_size = 16
    args.model = args.model or model
    args.batch_sizes = args.batch_sizes or list(bss)
    args.context_len = ctx if args.context_len is None else args.context_len
    args.warmups = warm if args.warmups is None else args.warmups
    args.repeats = reps if args.repeats is None else args.repeats
    args.dtype = args.dtype or dtype
    if args.rounds is None:
        args.rounds = args.repeats if args.mode == "cpu" else 1
    # the argparse types hold --block-size >= 1, --context-len, --grid-step, --warmups >= 0, --repeats >= 1
    if args.mode != "analytic" and args.rounds > args.repeats:
        raise UsageError(f"--rounds {args.rounds} is more than --repeats {args.repeats}: each round times every cell "
                         "at least once; give --rounds <= --repeats")
    if args.mode == "analytic" and not args.device:
        raise UsageError("--analytic needs --device (h200, h100, h20 or a100)")
    shape, cfg = resolve_model(args.model)
    if args.mode != "analytic" and cfg is None:
        raise UsageError(f"model {args.model!r} is MoE; the measured modes run the dense project forward only "
                         f"(use --analytic for MoE models)")
    draft_text = f"dflash:{args.draft_config}" if args.draft_config else args.draft
    if draft_text == "auto":
        draft_text = _auto_draft(args.model, shape.num_layers)
    draft = parse_draft_spec(draft_text)
    if draft.kind == "dflash" and draft.config is not None:
        draft = _trained_drafter(args, draft, draft_text, cfg)
    if draft.kind == "self-skip":
        bad = [i for i in draft.skip_layers if not 0 <= i < shape.num_layers]
        if bad:
            raise UsageError(f"--draft {draft_text}: layers {bad} out of range for {args.model} "
                             f"({shape.num_layers} layers)")
    return shape, cfg, draft


def _trained_drafter(args: argparse.Namespace, draft, draft_text: str, target_cfg):
    """``dflash:NAME`` / ``dflash:FOLDER`` of a trained drafter: a bare name is looked up as
    ``dcut-engine`` does (:func:`dcut_sched.paths.drafter_dir`) when it is no folder here and no preset;
    the drafter must fit the target and draft blocks of ``--block-size`` (checked before measuring)."""
    from dataclasses import replace

    from dcut_sched.drafters.checkpoint import DraftCheckpointError, check_target, read_config
    from dcut_sched.profiler.workload import _is_dflash_folder

    draft = replace(draft, config=named_drafter(draft.config))
    if not _is_dflash_folder(draft.config):
        return draft  # a preset or a model config.json: a random-weight drafter of that shape
    given = f"--draft-config {args.draft_config}" if args.draft_config else f"--draft {draft_text}"
    try:
        dcfg = read_config(draft.config)
        if target_cfg is not None:
            check_target(dcfg, target_cfg)
    except DraftCheckpointError as exc:
        raise UsageError(f"{given} ({draft.config}): {exc}") from None
    if args.block_size is not None and args.block_size > dcfg.block_size:
        raise UsageError(f"--block-size {args.block_size}: the DFlash drafter in {draft.config} ({given}) "
                         f"drafts blocks of at most {dcfg.block_size}; give --block-size {dcfg.block_size} or less")
    return draft


def run_analytic(args, shape, draft, console) -> tuple[CostCurve, Any]:
    from dcut_sched.profiler.analytic import DEFAULT_AR_EFFICIENCY, DEFAULT_EFFICIENCY, ar_step_ms, draft_ms, forward_ms
    from dcut_sched.profiler.devices import get_device
    from dcut_sched.profiler.efficiency_fit import device_matches, fill_curve, fit_efficiency
    from dcut_sched.profiler.grid import verify_tokens
    from dcut_sched.profiler.report import fit_table

    device = get_device(args.device)
    if args.fit:
        with warnings.catch_warnings():  # an assumed plain step in the source is reported below, not warned
            warnings.simplefilter("ignore", AssumedArWarning)
            src = CostCurve.load(args.fit, check_hardware=False)
        if args.block_size is None:
            args.block_size = src.block_size
        if args.block_size > src.block_size:
            raise UsageError(f"--block-size {args.block_size} with --fit {args.fit}: the file was measured for block "
                             f"size {src.block_size}, so its fit has seen at most {src.block_size} tokens per request; "
                             f"a B = {args.block_size} curve would extrapolate every cell above that. Fit to a curve "
                             f"measured with B >= {args.block_size}, or derive a block size <= {src.block_size}")
        if not src.has_ar() and not args.quiet:
            console.print(f"[yellow]--fit {args.fit} has no plain-decode ('ar') rows ({src.ar_provenance}): the decode "
                          f"path is not fitted and the output's plain step stays assumed[/]")
        if not device_matches(device, src.hardware.get("device_name")):
            raise UsageError(f"--fit {args.fit}: curve was measured on {src.hardware.get('device_name')!r}, not "
                             f"{device.name!r}; fit to a curve of the same device")
        if src.model.get("name") != shape.name:
            warnings.warn(f"--fit {args.fit} describes model {src.model.get('name')!r}, filling with {shape.name!r}",
                          UserWarning, stacklevel=2)
        fit = fit_efficiency(src, shape, device)
        if not args.quiet:
            console.print(fit_table(fit, title=f"efficiency fit to {args.fit} (verify and ar families together)"))
            if args.block_size != src.block_size:
                console.print(f"derived a B = {args.block_size} curve from the B = {src.block_size} fit: source verify "
                              f"cells with num_tokens <= bs*{args.block_size} kept, the rest of the B = "
                              f"{args.block_size} grid and its draft step filled from the fitted model")
        source = (f"{src.source} | gaps filled by dcut-profile --analytic --device {device.key} --fit {args.fit}: "
                  f"roofline of dcut_sched.profiler.analytic with efficiency factors fitted to the file's measured/published rows")
        curve = fill_curve(src, shape, fit, batch_sizes=args.batch_sizes, ratios=args.ratios,
                           grid_step=args.grid_step, draft=draft, source=source, block_size=args.block_size)
        return curve, fit
    eff, ar_eff = DEFAULT_EFFICIENCY, DEFAULT_AR_EFFICIENCY
    verify, drafts, ar = [], [], []
    for bs in args.batch_sizes:
        tokens = np.array(verify_tokens(bs, args.block_size, args.ratios, args.grid_step))
        for k, ms in zip(tokens, forward_ms(shape, device, eff, bs, tokens, args.context_len)):
            verify.append({"batch_size": bs, "num_tokens": int(k), "median_ms": round(float(ms), 4),
                           "provenance": "analytic"})
        if draft.kind != "none":
            ms = draft_ms(shape, draft, device, eff, bs, args.block_size, args.context_len)
            drafts.append({"batch_size": bs, "median_ms": round(float(ms), 4), "provenance": "analytic"})
        ar.append({"batch_size": bs, "median_ms": round(float(ar_step_ms(shape, device, ar_eff, bs, args.context_len)), 4),
                   "provenance": "analytic"})
    hardware = {"device_name": device.name, "backend": "analytic", "torch_version": None, "cuda_version": None,
                "driver_version": None, "peak_bf16_tflops": device.peak_bf16_tflops,
                "hbm_tb_per_s": device.hbm_tb_per_s, "device_source": device.source, "efficiency": eff.to_dict(),
                "ar_efficiency": ar_eff.to_dict()}
    curve = CostCurve(hardware=hardware, model={"name": shape.name, "config": shape.to_dict(), "dtype": "bfloat16",
                                                "draft": draft.label()},
                      block_size=args.block_size, context_len=args.context_len, verify=verify, draft=drafts, ar=ar,
                      source="dcut_sched.profiler.analytic roofline with default (unfitted) efficiency factors for the verify and "
                             "the plain-decode paths; see docs/profiler.md",
                      profile_seconds=0.0)
    return curve, None


def run_measured(args, cfg, draft, console, command: str) -> CostCurve:
    import torch

    from dcut_sched.drafters.checkpoint import DraftCheckpointError
    from dcut_sched.profiler.cuda_graphs import GraphTimer, cuda_hardware, require_cuda
    from dcut_sched.profiler.grid import build_cells
    from dcut_sched.profiler.harness import EagerTimer, partial_path_for, run_profile
    from dcut_sched.profiler.workload import ForwardWorkload

    gpu = args.mode == "gpu"
    if gpu:
        require_cuda()
        backend = "cuda-eager" if args.eager else "cuda-graph"
        device = "cuda"
    else:
        backend = "cpu-eager"
        device = "cpu"
        torch.set_num_threads(args.threads)  # >= 1 (its argparse type)
    partial = partial_path_for(args.out)
    dtype = getattr(torch, args.dtype)
    cells = build_cells(args.batch_sizes, args.block_size, args.ratios, args.grid_step, draft=draft.kind != "none",
                        ar=True)
    t_build = time.perf_counter()
    try:
        workload = ForwardWorkload(cfg, args.block_size, args.context_len, max(args.batch_sizes), draft,
                                   dtype=dtype, device=device, seed=args.seed)
    except DraftCheckpointError as exc:  # a trained drafter's weights or calibration.json: name the flag
        given = f"--draft-config {args.draft_config}" if args.draft_config else f"--draft {args.draft}"
        raise UsageError(f"{given} ({draft.config}): {exc}") from None
    build_s = time.perf_counter() - t_build
    hardware = cuda_hardware(backend) if gpu else _cpu_hardware(torch.get_num_threads())
    if gpu and not args.eager:
        timer: Any = GraphTimer(workload)
    else:
        timer = EagerTimer(workload, synchronize=torch.cuda.synchronize if gpu else None)
    settings = {**flag_settings(args, draft), "model": workload.describe(), "device_name": hardware["device_name"]}
    if not args.quiet:
        console.print(f"model {cfg.name} built in {build_s:.1f} s ({backend}, {args.dtype}); measuring "
                      f"{len(cells)} cells, {args.warmups} warm-ups + {args.repeats} repeats each in "
                      f"{args.rounds} round(s)")
    try:
        run = run_profile(timer, cells, warmups=args.warmups, repeats=args.repeats, rounds=args.rounds, seed=args.seed,
                          partial_path=partial, settings=settings, resume=args.resume and not args.fresh,
                          progress=not args.no_progress, console=console)
    except KeyboardInterrupt:
        console.print(f"[yellow]interrupted: measured cells kept in {partial}; rerun with --resume[/]")
        raise
    if not run.verify:
        raise UsageError(f"no verification cell could be measured ({len(run.skipped)} skipped: "
                         f"{next(iter(run.skipped.values()), '')})")
    load_end = _load_average()
    hardware["load_average"] = None if load_end is None else {
        "start_1min": hardware.get("load_average_at_start"), "end_1min": load_end[0], "end_5min": load_end[1],
        "end_15min": load_end[2], "cpu_count": os.cpu_count(),
        "note": "os.getloadavg() of the machine while it measured (other processes included)"}
    hardware["profile"] = {"warmups": args.warmups, "repeats": args.repeats, "rounds": args.rounds, "seed": args.seed,
                           "ratios": list(args.ratios), "grid_step": args.grid_step, "skipped": run.skipped,
                           "model_build_seconds": round(build_s, 2), "capture_seconds": round(run.prepare_seconds, 2),
                           "resumed_cells": run.resumed_cells, "command": command}
    curve = CostCurve(hardware=hardware, model=workload.describe(), block_size=args.block_size,
                      context_len=args.context_len, verify=run.verify, draft=run.draft, ar=run.ar,
                      graph_mode="full" if backend == "cuda-graph" else None,
                      profile_seconds=round(run.measure_seconds + run.prepare_seconds, 2),
                      source=f"measured by {command}")
    for msg in (_load_warnings(hardware["load_average"], os.cpu_count(), args.threads, run.measure_seconds)
                if not gpu and
                hardware["load_average"] else []) + _spread_warnings(curve) + _monotone_warnings(curve):
        curve.hardware.setdefault("warnings", []).append(msg)  # the curve holds its own copy of hardware
        console.print(f"[yellow]warning: {msg}[/]", soft_wrap=True)
    if run.skipped and not args.quiet:
        for key, why in sorted(run.skipped.items()):
            console.print(f"[yellow]skipped {key}: {why}[/]")
    return curve


def flag_settings(args: argparse.Namespace, draft) -> dict[str, Any]:
    """The partial file's settings that this run's flags fix (after :func:`resolve`), without
    building anything; :func:`run_measured` records them, with the model and the device."""
    settings = {"mode": args.mode,
                "backend": "cpu-eager" if args.mode == "cpu" else ("cuda-eager" if args.eager else "cuda-graph"),
                "block_size": args.block_size, "context_len": args.context_len, "dtype": args.dtype,
                "draft": draft.label(), "warmups": args.warmups, "repeats": args.repeats, "rounds": args.rounds,
                "seed": args.seed}
    if args.mode == "cpu":
        settings["threads"] = args.threads
    return settings


def named_drafter(name: str) -> str:
    """``name`` of ``dflash:NAME``, or the folder of the trained drafter it names when it is no path
    here and no preset (looked up as ``dcut-engine`` does, :func:`dcut_sched.paths.drafter_dir`)."""
    from pathlib import Path

    from dcut_sched.paths import drafter_dir
    from dcut_sched.profiler.shapes import model_names

    if not Path(name).exists() and len(Path(name).parts) == 1 and name not in model_names() \
            and (drafter_dir(name) / "config.json").is_file():
        return str(drafter_dir(name))
    return name
