"""``dcut-profile``: measure (GPU, CPU) or model (analytic) a verification cost curve.

The parser, the flag and ``OUT.partial`` checks, and the writing of ``--out`` and ``--report``
(together or not at all); the profiles themselves are :mod:`.profile_run`'s and the vLLM one
:mod:`dcut_sched.profiler.vllm_engine`'s. Examples and the cell families: ``dcut-profile --help``,
docs/profiler.md. Bad input exits 2 with one line on stderr; SIGINT/SIGTERM exit 130/143.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from typing import Any, Sequence

import numpy as np

from dcut_sched import CostCurveError
from dcut_sched.cli.args import (
    check_json_input,
    check_paths,
    comma_list,
    flag_of,
    given_flags,
    int_at_least,
    path_arg,
    seed_type,
)
from dcut_sched.cli.errors import CliParser, UsageError, run_cli
from dcut_sched.cli.profile_run import flag_settings, named_drafter, resolve, run_analytic, run_measured

__all__ = ["build_parser", "main"]


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
    ap.add_argument("--out", required=True, type=path_arg, help="output cost-curve JSON (written atomically)")
    ap.add_argument("--model", help="preset (tiny, smollm2-135m, qwen3-8b, llama-3.1-8b, qwen3.5-27b, "
                                    "qwen3.5-35b-a3b, qwen3-30b-a3b), a config.json or a checkpoint directory "
                                    "[gpu/analytic: qwen3-8b, cpu: tiny]")
    ap.add_argument("--device", help="analytic: h200, h100, h20 or a100")
    ap.add_argument("--fit", metavar="FILE", type=path_arg, help="analytic: fit the efficiency factors of the verify and the "
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
                    help="also every multiple of this in [bs, bs*B] (the measured grid fine prices its budgets on); "
                         "0 = num_tokens = bs and the buckets only (fastest) (default: %(default)s)")
    ap.add_argument("--draft", default="auto",
                    help="draft step: none, self-skip:I,J,... (target minus layers, B-1 one-token steps), "
                         "dflash:N (N layers of the target width, one block forward) or dflash:CONFIG; "
                         "auto = self-skip:14,15 for smollm2-135m, else dflash:min(5, max(1, layers/4)) (default: auto)")
    ap.add_argument("--draft-config", type=path_arg, help="shorthand for --draft dflash:CONFIG (a layer count, preset or config.json)")
    ap.add_argument("--warmups", type=int_at_least(0, MAX_REPEATS), help="untimed calls per cell [gpu: 5, cpu: 1]")
    ap.add_argument("--repeats", type=int_at_least(1, MAX_REPEATS), help="timed calls per cell [gpu: 20, cpu: 5]")
    ap.add_argument("--rounds", type=int_at_least(1, MAX_REPEATS),
                    help="passes over the shuffled cells, each taking repeats/rounds samples per cell; "
                         "rounds = repeats spreads each cell's samples over the whole run, so load drift on a "
                         "shared machine hits all cells alike [gpu: 1, cpu: repeats]")
    ap.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], help="[gpu: bfloat16, cpu: float32; analytic: bfloat16 only]")
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
    ap.add_argument("--report", metavar="FILE", type=path_arg, help="write the coarse-vs-dense interpolation error table "
                                                     "(.csv, .json or .parquet)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    ap.add_argument("--quiet", action="store_true", help="no tables, only the final line")
    return ap


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
                           "grid_step", "draft", "draft_config", "out", "report", "quiet", "no_progress"}),  # bf16 only
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
    if mode == "analytic" and args.fit and "context_len" in given:  # fill_curve keeps the file's context length
        raise UsageError("--context-len has no effect with --fit (the filled curve keeps the context length the --fit "
                         "file was measured at); drop --context-len, or measure a curve at that context length")
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
    diff = [(key, old.get(key), value) for key, value in flag_settings(args, draft).items()
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
    shape, cfg, draft = resolve(args)
    if args.mode != "analytic" and args.resume and not args.fresh and partial.exists():
        _check_partial_matches(args, draft, partial)
    if args.mode == "analytic":
        curve, _ = run_analytic(args, shape, draft, console)
    else:
        curve = run_measured(args, cfg, draft, console, command)
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


def _draft_inputs(args: argparse.Namespace) -> list[str] | None:
    """The files ``--draft-config`` / ``--draft dflash:CONFIG`` reads (None for presets and counts): a
    config file, or a folder with its config.json -- for a trained drafter (a bare name resolved) also
    its weights and calibration.json (:func:`dcut_sched.drafters.drafter_files`)."""
    from dcut_sched.drafters import drafter_files
    from dcut_sched.profiler.workload import _is_dflash_folder

    text = args.draft_config or (args.draft.removeprefix("dflash:") if args.draft.startswith("dflash:") else None)
    if not text:
        return None
    path = named_drafter(text)
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
