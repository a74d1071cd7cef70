"""``dcut-profile``: measure (GPU, CPU) or model (analytic) a verification cost curve.

Examples::

    dcut-profile --gpu --model qwen3-8b --out dcut_sched/profiler/profiles/h200-qwen3-8b.json
    dcut-profile --cpu --model tiny --out /tmp/tiny.json
    dcut-profile --analytic --device h200 --model qwen3-8b --out h200-qwen3-8b-analytic.json
    dcut-profile --analytic --device h20 --model qwen3-8b --fit dcut_sched/profiler/profiles/h20-qwen3-8b-published.json --out h20.json
    dcut-profile --analytic --device h20 --fit dcut_sched/profiler/profiles/h20-qwen3-8b-published.json --block-size 8 --out h20-b8.json

Every mode writes three cell families: verification ``C_verify(bs, num_tokens)``, the plain decode
step ``C_ar(bs)`` (its own engine path: one token per request, a full CUDA graph on a GPU) and the
draft step ``C_draft(bs)``. Measured modes record the machine's load average at the start and the
end and warn when the load or the p20-p80 spread of the cells is high.

Bad input exits with status 2 and one line on stderr; SIGINT/SIGTERM exit 130/143 (see
:mod:`dcut_sched.cli.errors`) and an interrupted measurement keeps its cells in ``OUT.partial``, which
``--resume`` continues; ``--out`` and ``--report`` are written together or not at all.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
import warnings
from typing import Any, Sequence

import numpy as np

from dcut_sched import CostCurve, CostCurveError
from dcut_sched.cli.args import (
    check_json_input,
    check_paths,
    comma_list,
    flag_of,
    given_flags,
    int_at_least,
    seed_type,
)
from dcut_sched.cli.errors import CliParser, UsageError, run_cli
from dcut_sched.cost_curve import AssumedArWarning

__all__ = ["build_parser", "main"]

DEFAULTS = {
    # mode: (model, batch sizes, context_len, warmups, repeats, dtype)
    "gpu": ("qwen3-8b", (1, 2, 4, 8, 16, 32, 64), 1024, 5, 20, "bfloat16"),
    "cpu": ("tiny", (1, 2, 4, 8), 256, 1, 5, "float32"),
    "analytic": ("qwen3-8b", (1, 2, 4, 8, 16, 32, 64), 1024, 0, 0, "bfloat16"),
}


#: Documented limits of the profiler's size flags (docs/reliability.md), enforced at parse time: each
#: keeps one profile within hours on a 2-core machine and its tensors within a machine's memory.
MAX_BLOCK_SIZE = 256
MAX_CONTEXT_LEN = 131_072
MAX_REPEATS = 10_000
MAX_THREADS = 1024
MAX_ENGINE_STEP_TOKENS = 4096
MAX_BATCH_SIZE = 4096


def _nonempty(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("empty; give a model folder")
    return text


_int_list = comma_list(item="batch size", minimum=1, need="positive integers", limit=MAX_BATCH_SIZE, unique=True)
_ratio_list = comma_list(float, what="ratios", item="ratio", minimum=0, open_low=True, maximum=1,
                         need="ratios in (0, 1]")


def build_parser() -> CliParser:
    ap = CliParser(
        prog="dcut-profile",
        description="Write a cost curve: verification C_verify(bs, num_tokens), the plain decode step C_ar(bs) "
                    "and the draft step C_draft(bs) (JSON, schema dcut.cost-curve/2) for the simulator and the "
                    "controller.",
        epilog=(
            "examples:\n"
            "  dcut-profile --cpu --model tiny --out out/tiny.json                 # seconds, eager on this CPU\n"
            "  dcut-profile --cpu --model smollm2-135m --block-size 8 --draft self-skip:14,15 --out out/cpu-b8.json\n"
            "  dcut-profile --gpu --model qwen3-8b --out dcut_sched/profiler/profiles/h200-qwen3-8b.json   # on the serving GPU\n"
            "  dcut-profile --analytic --device h200 --model qwen3-8b --out out/h200-qwen3-8b.json\n"
            "  dcut-profile --analytic --device h20 --model qwen3-8b \\\n"
            "               --fit dcut_sched/profiler/profiles/h20-qwen3-8b-published.json --out out/h20-fitted.json\n"
            "  dcut-profile --analytic --device h20 --block-size 8 \\\n"
            "               --fit dcut_sched/profiler/profiles/h20-qwen3-8b-published.json --out out/h20-b8.json  # B8 from B16\n"
            "  dcut-profile --cpu --model tiny --out out/tiny.json --resume      # continue an interrupted run\n"
            "  dcut-profile --cpu --model tiny --out out/tiny.json --fresh       # start over, replacing OUT.partial\n"
            "cells per batch size: verification at num_tokens = bs, at the D-Cut buckets ceil(rho*bs*B)\n"
            "and at every multiple of --grid-step in [bs, bs*B]; the plain decode step (one token per\n"
            "request on the plain-decode path); the draft step. [gpu: X, cpu: Y] in an option's help\n"
            "gives each mode's default. Details: docs/profiler.md.\n"
            "exit status: 0 ok, 2 bad input (one line on stderr)."),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--gpu", action="store_const", dest="mode", const="gpu",
                      help="time CUDA-graph replays of the model's forward on the current CUDA device")
    mode.add_argument("--cpu", action="store_const", dest="mode", const="cpu",
                      help="time the forward eagerly on this CPU (numbers describe this CPU only)")
    mode.add_argument("--analytic", action="store_const", dest="mode", const="analytic",
                      help="roofline model from FLOPs/bytes and a device's public peaks")
    mode.add_argument("--vllm", type=_nonempty, metavar="MODEL",
                      help="time vLLM's own forward on dummy batches for the Hugging Face model folder MODEL, in "
                           "the vLLM environment (.venv-vllm; docs/vllm.md); with --vllm-draft also the draft step")
    ap.add_argument("--vllm-draft", type=_nonempty, metavar="DIR|dflash:DIR",
                    help="vllm: the draft model folder (vLLM method draft_model), or dflash:DIR for a DFlash block "
                         "drafter (vLLM method dflash, e.g. dflash:drafters/smollm2-135m-dflash)")
    ap.add_argument("--vllm-engine-steps", type=int_at_least(0, MAX_ENGINE_STEP_TOKENS), default=40, metavar="TOKENS",
                    help="vllm with --vllm-draft: also time real engine steps on held-out prompts (dcut_sched/data/traces/prompts.jsonl "
                         "rows 32..), TOKENS new tokens per request, for the step_overhead, draft_first and real draft "
                         "rows (docs/vllm.md); 0 = dummy batches only (default: %(default)s)")
    ap.add_argument("--out", required=True, help="output cost-curve JSON (written atomically)")
    ap.add_argument("--model", help="preset (tiny, smollm2-135m, qwen3-8b, llama-3.1-8b, qwen3.5-27b, "
                                    "qwen3.5-35b-a3b, qwen3-30b-a3b), a config.json or a checkpoint directory "
                                    "[gpu/analytic: qwen3-8b, cpu: tiny]")
    ap.add_argument("--device", help="analytic: h200, h100, h20 or a100")
    ap.add_argument("--fit", metavar="FILE", help="analytic: fit the efficiency factors of the verify and the "
                                                  "plain-decode paths to this measured or published curve of the "
                                                  "same device (both families together, residuals per family) and "
                                                  "fill its gaps; with a smaller --block-size derive that block "
                                                  "size's curve (verify cells up to bs*B, the B-slot draft step)")
    ap.add_argument("--batch-sizes", type=_int_list, help="comma-separated [gpu/analytic: 1,2,4,8,16,32,64; "
                                                          "cpu: 1,2,4,8]")
    ap.add_argument("--block-size", type=int_at_least(1, MAX_BLOCK_SIZE), help="B, slots per request [16; with --fit: the fitted file's]")
    ap.add_argument("--context-len", type=int_at_least(0, MAX_CONTEXT_LEN), help="cached tokens per request [gpu/analytic: 1024, cpu: 256]")
    ap.add_argument("--ratios", type=_ratio_list, default=[0.25, 0.5, 0.75, 1.0], help="D-Cut bucket ratios rho (default: 0.25,0.5,0.75,1.0)")
    ap.add_argument("--grid-step", type=int_at_least(0), default=16,
                    help="also every multiple of this in [bs, bs*B] (the dense grid of the fine policy); "
                         "0 = num_tokens = bs and the buckets only (fastest) (default: %(default)s)")
    ap.add_argument("--draft", default="auto",
                    help="draft step: none, self-skip:I,J,... (target minus layers, B-1 one-token steps), "
                         "dflash:N (N layers of the target width, one block forward) or dflash:CONFIG; "
                         "auto = self-skip:14,15 for smollm2-135m, else dflash:min(5, max(1, layers/4)) (default: auto)")
    ap.add_argument("--draft-config", help="shorthand for --draft dflash:CONFIG (a layer count, preset or config.json)")
    ap.add_argument("--warmups", type=int_at_least(0, MAX_REPEATS), help="untimed calls per cell [gpu: 5, cpu: 1]")
    ap.add_argument("--repeats", type=int_at_least(1, MAX_REPEATS), help="timed calls per cell [gpu: 20, cpu: 5]")
    ap.add_argument("--rounds", type=int_at_least(1, MAX_REPEATS),
                    help="passes over the shuffled cells, each taking repeats/rounds samples per cell; "
                         "rounds = repeats spreads each cell's samples over the whole run, so load drift on a "
                         "shared machine hits all cells alike [gpu: 1, cpu: repeats]")
    ap.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], help="[gpu: bfloat16, cpu: float32]")
    ap.add_argument("--threads", type=int_at_least(1, MAX_THREADS), default=1,
                    help="cpu: torch threads; 1 keeps timings stable on a shared machine (several threads "
                         "spin-wait on each other when cores are busy) (default: %(default)s)")
    ap.add_argument("--eager", action="store_true", help="gpu: time eager forwards instead of graph replays")
    ap.add_argument("--seed", type=seed_type, default=0, help="seeds the weights, inputs and cell order (default: %(default)s)")
    ap.add_argument("--resume", action="store_true",
                    help="continue from OUT.partial of an interrupted run; a partial whose fields have the wrong "
                         "types, or of other settings, is refused (exit 2) and left as it is")
    ap.add_argument("--fresh", action="store_true",
                    help="ignore an existing OUT.partial and replace it with this run's (the way out of a refused "
                         "or unwanted partial)")
    ap.add_argument("--report", metavar="FILE", help="write the coarse-vs-dense interpolation error table "
                                                     "(.csv, .json or .parquet)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    ap.add_argument("--quiet", action="store_true", help="no tables, only the final line")
    return ap


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


def _resolve(args: argparse.Namespace):
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

    draft = replace(draft, config=_named_drafter(draft.config))
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


def _run_analytic(args, shape, draft, console) -> tuple[CostCurve, Any]:
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


def _run_measured(args, cfg, draft, console, command: str) -> CostCurve:
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
    settings = {**_flag_settings(args, draft), "model": workload.describe(), "device_name": hardware["device_name"]}
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


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``dcut-profile``; returns the exit status (:mod:`dcut_sched.cli.errors`)."""
    from dcut_sched.profiler.harness import NoCudaError, PartialMismatch
    from dcut_sched.util.console import make_console

    argv = list(sys.argv[1:] if argv is None else argv)
    console = make_console()
    # KeyError: an unknown preset or device; NoCudaError: --gpu without CUDA (a RuntimeError).
    return run_cli("dcut-profile", lambda: _main(argv, console),
                   errors=(KeyError, CostCurveError, NoCudaError, PartialMismatch))


#: The flags each kind of profile reads (argparse dests); a flag given to a profile that does not read
#: it is refused (:func:`check_flags_used`) instead of being ignored.
_MEASURED_FLAGS = frozenset({"mode", "model", "batch_sizes", "block_size", "context_len", "ratios", "grid_step",
                             "draft", "draft_config", "warmups", "repeats", "rounds", "dtype", "seed", "resume",
                             "fresh", "no_progress", "out", "report", "quiet"})
MODE_FLAGS = {
    "cpu": _MEASURED_FLAGS | {"threads"},
    "gpu": _MEASURED_FLAGS | {"eager"},
    "analytic": frozenset({"mode", "model", "device", "fit", "batch_sizes", "block_size", "context_len", "ratios",
                           "grid_step", "draft", "draft_config", "dtype", "out", "report", "quiet", "no_progress"}),
    # --quiet and --no-progress only quieten output: accepted by every profile
    "vllm": frozenset({"vllm", "vllm_draft", "vllm_engine_steps", "block_size", "batch_sizes", "context_len",
                       "warmups", "repeats", "dtype", "out", "quiet", "no_progress"}),
}


def check_flags_used(args: argparse.Namespace, given) -> None:
    """Refuse a flag the chosen profile would ignore (``--resume`` or ``--repeats`` with ``--analytic``,
    ``--device`` with ``--cpu``, ``--vllm-engine-steps`` without ``--vllm-draft``, ...).

    Raises:
        UsageError: naming the flag, the profile and the fix.
    """
    mode = "vllm" if args.vllm else args.mode
    for dest in sorted(given):
        if dest not in MODE_FLAGS[mode]:
            flag = flag_of(dest)
            raise UsageError(f"{flag} has no effect on a --{mode} profile; drop {flag} (see dcut-profile --help for "
                             f"which profile reads it)")
    if "vllm_engine_steps" in given and not args.vllm_draft:
        raise UsageError("--vllm-engine-steps times drafted engine steps: add --vllm-draft DIR or drop it")
    if "draft" in given and "draft_config" in given:
        raise UsageError("--draft and --draft-config both name the draft step; give one (--draft-config C is "
                         "--draft dflash:C)")


def _check_partial(args: argparse.Namespace, partial) -> None:
    """Before any work (model build, measurement): an existing ``OUT.partial`` needs ``--resume`` (it
    is then strictly typed by :func:`dcut_sched.profiler.harness.load_partial`, and a bad one refused and
    kept byte-identical) or ``--fresh`` (ignored, replaced at the first write)."""
    from dcut_sched.profiler.harness import load_partial

    if args.resume and args.fresh:
        raise UsageError("give --resume (continue OUT.partial) or --fresh (ignore and replace it), not both")
    if not partial.exists() or args.fresh:
        return
    if not args.resume:
        raise UsageError(f"{partial} exists from an interrupted run; add --resume to continue it, or --fresh to "
                         f"ignore and replace it")
    load_partial(partial)


#: The settings a partial file records (harness ``settings``) that come from one flag each, and that
#: flag: a resume over a partial measured with another value is refused naming it.
_SETTING_FLAGS = {"backend": "--cpu/--gpu/--eager", "block_size": "--block-size", "context_len": "--context-len",
                  "dtype": "--dtype", "draft": "--draft", "warmups": "--warmups", "repeats": "--repeats",
                  "rounds": "--rounds", "seed": "--seed", "threads": "--threads"}


def _flag_settings(args: argparse.Namespace, draft) -> dict[str, Any]:
    """The partial file's settings that this run's flags fix (after :func:`_resolve`), without
    building anything; :func:`_run_measured` records them, with the model and the device."""
    settings = {"mode": args.mode,
                "backend": "cpu-eager" if args.mode == "cpu" else ("cuda-eager" if args.eager else "cuda-graph"),
                "block_size": args.block_size, "context_len": args.context_len, "dtype": args.dtype,
                "draft": draft.label(), "warmups": args.warmups, "repeats": args.repeats, "rounds": args.rounds,
                "seed": args.seed}
    if args.mode == "cpu":
        settings["threads"] = args.threads
    return settings


def _check_partial_matches(args: argparse.Namespace, draft, partial) -> None:
    """Before the model is built: the ``OUT.partial`` to resume was measured with this run's flags
    (:data:`_SETTING_FLAGS`; a partial of an older version without ``threads`` counts as another
    thread count), and its cells are cells of this run's grid. The model and the device are
    compared by the harness once the model is built (:func:`~.harness.run_profile`)."""
    from dcut_sched.profiler.grid import build_cells
    from dcut_sched.profiler.harness import PARTIAL_FIX, PartialMismatch, load_partial
    from dcut_sched.util.inputs import shown

    doc = load_partial(partial)
    old = doc["settings"]
    diff = [(key, old.get(key), value) for key, value in _flag_settings(args, draft).items()
            if key != "mode" and old.get(key) != value]
    if diff:
        def text(value: Any) -> str:
            return "not recorded" if value is None else value if isinstance(value, str) else shown(value, 40)

        changed = "; ".join(f"{_SETTING_FLAGS[k]}: {text(a)} then, {text(b)} now" for k, a, b in diff[:4])
        raise PartialMismatch(f"partial file {partial}: measured with other settings ({changed}); resume with the "
                              f"settings it was measured with, or rerun with --fresh to ignore and replace it")
    keys = {c.key for c in build_cells(args.batch_sizes, args.block_size, args.ratios, args.grid_step,
                                       draft=draft.kind != "none", ar=True)}
    stray = sorted(k for k in doc["samples_ms"] if k not in keys)
    if stray:
        raise PartialMismatch(f"partial file {partial}: cell {stray[0][:60]} is not a cell of this run's grid "
                              f"(--batch-sizes, --ratios, --grid-step, --block-size, --draft); resume with the grid it "
                              f"was measured with, or {PARTIAL_FIX}")


def _main(argv: list[str], console) -> int:
    args = build_parser().parse_args(argv)  # before the heavy imports: --help and usage errors stay fast
    check_flags_used(args, given_flags(build_parser, argv, args))
    if args.vllm:
        return _main_vllm(args)

    from dcut_sched.profiler.harness import partial_path_for
    from dcut_sched.profiler.interp_error import interpolation_error
    from dcut_sched.profiler.report import curve_table, interp_table, noise_summary, write_frame
    from dcut_sched.util.atomic import all_or_none
    from dcut_sched.util.tables import TABLE_SUFFIXES

    command = "dcut-profile " + " ".join(shlex.quote(a) for a in argv)
    partial = partial_path_for(args.out)
    # the measured modes also write OUT.partial: it is an output like --out and --report
    check_paths({"--fit": args.fit, "--model": _config_inputs(args.model),
                 "--draft-config" if args.draft_config else "--draft": _draft_inputs(args)},
                {"--out": (args.out, (".json",)), "--report": (args.report, TABLE_SUFFIXES),
                 "--out's resumable partial": (str(partial) if args.mode != "analytic" else None, None)})
    check_json_input(args.fit, "--fit", "a cost-curve JSON file of the same device")
    if args.mode != "analytic":
        _check_partial(args, partial)
    shape, cfg, draft = _resolve(args)
    if args.mode != "analytic" and args.resume and not args.fresh and partial.exists():
        _check_partial_matches(args, draft, partial)
    if args.mode == "analytic":
        curve, _ = _run_analytic(args, shape, draft, console)
    else:
        curve = _run_measured(args, cfg, draft, console, command)
    err = interpolation_error(curve, args.ratios)
    with all_or_none():  # --out and --report appear together or not at all
        curve.save(args.out)
        if args.report:
            write_frame(err, args.report)
    if args.mode != "analytic":
        partial.unlink(missing_ok=True)  # the measurement is complete: its resumable partial is done
    if not args.quiet:
        console.print(curve_table(curve, args.ratios))
        if not err.empty:
            console.print(interp_table(err))
    noise = noise_summary(curve)
    noise_text = "" if np.isnan(noise["median_spread_pct"]) else (
        f", p20-p80 spread median {noise['median_spread_pct']:.1f}% max {noise['max_spread_pct']:.1f}% "
        f"({', '.join(f'{fam} {pct:.1f}%' for fam, pct in noise['median_spread_pct_by_family'].items())})")
    load = curve.hardware.get("load_average")
    load_text = "" if not isinstance(load, dict) else (
        f", load {load.get('start_1min')} -> {load.get('end_1min')} on {load.get('cpu_count')} cores")
    secs = f" in {curve.profile_seconds:.1f} s" if curve.profile_seconds else ""
    console.print(f"wrote {args.out}: {len(curve.verify)} verify + {len(curve.ar)} ar + {len(curve.draft)} draft rows"
                  f"{secs}{noise_text}{load_text}; plain step: {curve.ar_provenance}", soft_wrap=True)
    return 0


def _config_inputs(path: str | None) -> list[str] | None:
    """The files an input given as a file or a model folder stands for: the file itself, or the folder
    and the ``config.json`` in it (an output may be neither)."""
    if not path or not os.path.exists(path):
        return None
    return [path, os.path.join(path, "config.json")] if os.path.isdir(path) else [path]


def _named_drafter(name: str) -> str:
    """``name`` of ``dflash:NAME``, or the folder of the trained drafter it names when it is no path
    here and no preset (looked up as ``dcut-engine`` does, :func:`dcut_sched.paths.drafter_dir`)."""
    from pathlib import Path

    from dcut_sched.paths import drafter_dir
    from dcut_sched.profiler.shapes import model_names

    if not Path(name).exists() and len(Path(name).parts) == 1 and name not in model_names() \
            and (drafter_dir(name) / "config.json").is_file():
        return str(drafter_dir(name))
    return name


def _draft_inputs(args: argparse.Namespace) -> list[str] | None:
    """The files ``--draft-config`` / ``--draft dflash:CONFIG`` reads (None for presets and counts): a
    config file, or a folder with its config.json -- for a trained drafter (a bare name resolved) also
    its weights and calibration.json (:func:`dcut_sched.drafters.drafter_files`)."""
    from dcut_sched.drafters import drafter_files
    from dcut_sched.profiler.workload import _is_dflash_folder

    text = args.draft_config or (args.draft.removeprefix("dflash:") if args.draft.startswith("dflash:") else None)
    if not text:
        return None
    path = _named_drafter(text)
    return [path, *drafter_files(path)] if _is_dflash_folder(path) else _config_inputs(path)


def _main_vllm(args: argparse.Namespace) -> int:
    """``--vllm MODEL``: the in-engine profile (dcut_sched/profiler/vllm_engine.py)."""
    from dcut_sched.profiler.vllm_engine import VllmProfileError, profile_vllm, steps_path_for

    draft_dir = args.vllm_draft.removeprefix("dflash:") if args.vllm_draft else None
    draft_files = _config_inputs(draft_dir)
    if draft_files and os.path.isdir(draft_dir):
        from dcut_sched.drafters import drafter_files

        draft_files += drafter_files(draft_dir)  # the weights and the calibration prior: inputs too
    check_paths({"--vllm": _config_inputs(args.vllm), "--vllm-draft": draft_files},
                {"--out": (args.out, (".json",)),
                 "--out's engine-step records": (str(steps_path_for(args.out)) if args.vllm_draft else None, None)})

    try:
        curve = profile_vllm(args.vllm, args.out, draft=args.vllm_draft, block_size=args.block_size or 8,
                             batch_sizes=args.batch_sizes or [1, 2, 4, 8, 16], context_len=args.context_len or 128,
                             warmups=1 if args.warmups is None else args.warmups, repeats=args.repeats or 5,
                             dtype=args.dtype or "float32", engine_steps=args.vllm_engine_steps)
    except (VllmProfileError, CostCurveError, OSError) as exc:
        print(f"dcut-profile: error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}: {len(curve.verify)} verify + {len(curve.ar)} ar + {len(curve.draft)} draft + "
          f"{len(curve.draft_first)} draft_first + {len(curve.step_overhead)} step_overhead rows, "
          f"vLLM {curve.hardware.get('engine_version')} on {curve.hardware.get('device_name')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
