"""``dcut-trace``: record, synthesise, validate, summarise and fit acceptance traces.

Subcommands (``dcut-trace SUBCOMMAND --help`` for each):

- ``record``   run a real target/draft pair greedily and write a position-indexed trace
- ``synth``    generate a synthetic trace from a preset or fitted parameters
- ``validate`` check trace files; one line per fault, exit 2 if any file is bad
- ``stats``    tau, per-depth acceptance, acceptance-length histogram, calibration (table or --json)
- ``fit``      fit the synthetic generator's parameters to a trace (scipy.optimize)

Exit codes: 0 success, 2 bad input (one clear line on stderr, never a traceback), 130/143 on
SIGINT/SIGTERM (``record`` keeps its resumable partial file; no output file is left half-written).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Sequence

from .args import (
    SELF_SPEC_SKIP_LAYERS,
    check_paths,
    comma_list,
    finite_float,
    flag_of,
    int_at_least,
    path_arg,
    seed_type,
    torch_device,
)
from .errors import CliParser, UsageError, run_cli

__all__ = ["build_parser", "main"]

TRACE_SUFFIXES = (".parquet",)


#: Documented limits of the size flags (docs/reliability.md), enforced at parse time: each keeps one
#: invocation within hours on a 2-core machine and its arrays within memory.
MAX_BLOCK_SIZE = 256
MAX_NEW_TOKENS = 8192
MAX_THREADS = 1024
MAX_GENERATE_BATCH = 1024
MAX_SYNTH_REQUESTS = 20_000
MAX_BINS = 10_000
MAX_FIT_EVALS = 100_000

_layer_list = comma_list(what="layer indices", item="layer", allow_empty=True)


def _ints(text: str) -> tuple[int, ...]:
    """``--skip-layers``: layer indices separated by commas or dashes."""
    return tuple(_layer_list(text.replace("-", ",")))


#: The examples ``dcut-trace --help`` ends with.
EXAMPLES = (
    "examples:\n"
    "  dcut-trace stats dcut_sched/data/traces/smollm2-135m-dflash-b16.parquet   # tau, acceptance, ECE\n"
    "  dcut-trace validate out/*.parquet                                       # exit 2 on any fault\n"
    "  dcut-trace synth --list                                                 # the presets\n"
    "  dcut-trace synth --preset dflash-qwen3-8b-gsm8k --num-requests 64 --out out/gsm8k.parquet\n"
    "  dcut-trace fit dcut_sched/data/traces/smollm2-135m-dflash-b16.parquet --out out/fit.json\n"
    "  dcut-trace record --draft dflash:drafters/smollm2-135m-dflash --limit 4 --max-new-tokens 32 "
    "--out out/rec.parquet"
)


def build_parser() -> CliParser:
    parser = CliParser(
        prog="dcut-trace",
        description="Acceptance traces for block speculative decoding: record from a real model pair, "
                    "synthesise, validate, summarise and fit (format: docs/design.md §3).",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="SUBCOMMAND")

    # ---------------------------------------------------------------- record
    rec = sub.add_parser("record", help="record a position-indexed trace from a real target/draft pair",
                         description="Greedy-decode every prompt with the target, then record the draft's B-1 "
                                     "proposals and confidences from every output position and how many match. "
                                     "Resumable: finished requests are kept in OUT's .partial.parquet. "
                                     "Slow on a CPU: the 80 shipped prompts x 128 tokens (7763 positions) with the "
                                     "DFlash drafter at B=16 took 2.7 minutes on a quiet 2-core machine, a "
                                     "layer-skip draft far longer; the run prints its size, an "
                                     "estimate after the first request, and progress (use --threads 1 when the "
                                     "cores are shared).")
    rec.add_argument("--prompts", default=None, type=path_arg, help="prompt file (JSON lines: id, category, prompt); default: the "
                     "shipped prompt set (dcut_sched/data/traces/prompts.jsonl)")
    rec.add_argument("--out", required=True, type=path_arg, help="output trace (.parquet)")
    rec.add_argument("--backend", choices=("native", "hf"), default="native",
                     help="native: SmolLM2-135M-Instruct + self-speculative drafter (default); "
                          "hf: a local Hugging Face checkpoint pair (--target, --draft)")
    rec.add_argument("--block-size", type=int_at_least(2, MAX_BLOCK_SIZE), default=16, help="B: draft slots per block incl. anchor (default 16)")
    rec.add_argument("--max-new-tokens", type=int_at_least(1, MAX_NEW_TOKENS), default=256, help="longest target output per prompt (default 256)")
    rec.add_argument("--skip-layers", type=_ints, default=SELF_SPEC_SKIP_LAYERS,
                     help="native: decoder layers the self-speculative drafter skips, e.g. 14,15 (default)")
    rec.add_argument("--target", type=path_arg, help="hf: local checkpoint directory of the target model")
    rec.add_argument("--draft", type=path_arg, help="hf: local checkpoint directory of the draft model; native: dflash:PATH records "
                                     "the DFlash block drafter in that folder instead of the self-speculative one "
                                     "(e.g. dflash:drafters/smollm2-135m-dflash)")
    rec.add_argument("--dtype", help="hf: torch dtype (float32 (default), bfloat16, float16)")
    rec.add_argument("--device", type=torch_device, default="cpu", help="cpu or cuda[:i] (default cpu)")
    rec.add_argument("--threads", type=int_at_least(1, MAX_THREADS), help="torch CPU threads (use 1 on a busy shared machine)")
    rec.add_argument("--limit", type=int_at_least(1), help="use only the first N prompts")
    rec.add_argument("--max-positions", type=int_at_least(1), help="stop after the request that reaches this many positions")
    rec.add_argument("--generate-batch", type=int_at_least(1, MAX_GENERATE_BATCH), default=16, help="native: prompts the target decodes together")
    rec.add_argument("--dataset", help="dataset label for the metadata (default: the prompt file's name)")
    rec.add_argument("--fresh", action="store_true", help="discard a partial recording instead of resuming it")
    rec.add_argument("--no-progress", action="store_true",
                     help="no progress (a bar on a terminal, else a status line with rate and ETA every 30 s, "
                          "also during the target decode) and no up-front estimate")
    rec.add_argument("--temperature", type=float, default=0.0,
                     help="target sampling temperature; > 0 records a sampled trace with p1..p{B-1} (native backend; "
                          "default 0 = greedy)")
    rec.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass in (0, 1] (default 1 = off)")
    rec.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (default 0 = off)")
    rec.add_argument("--seed", type=seed_type, default=0, help="sampling seed; request i uses key (seed, i) (default 0)")

    # ---------------------------------------------------------------- synth
    syn = sub.add_parser("synth", help="generate a synthetic trace (preset or fitted parameters)",
                         description="Sample a position-indexed trace from the synthetic generator "
                                     "(dcut_sched.traces.synth).")
    src = syn.add_mutually_exclusive_group(required=True)
    src.add_argument("--preset", help="preset name (see --list)")
    src.add_argument("--params", type=path_arg, help="JSON file of generator parameters (as written by `fit --out`)")
    src.add_argument("--list", action="store_true", help="list presets with their source figures and exit")
    syn.add_argument("--out", type=path_arg, help="output trace (.parquet)")
    syn.add_argument("--num-requests", type=int_at_least(1, MAX_SYNTH_REQUESTS), default=32, help="requests to generate (default 32)")
    syn.add_argument("--block-size", type=int_at_least(2, MAX_BLOCK_SIZE), help="override B (default: the preset's)")
    syn.add_argument("--seed", type=seed_type, default=0, help="random seed (default 0)")
    syn.add_argument("--calibration-gap", type=finite_float(), default=None, metavar="G",
                     help="reported confidence = calibrated confidence ** (1 + G): G > 0 under-confident (as "
                          "real DFlash confidence is reported), -1 < G < 0 over-confident (default: the "
                          "preset's, 0 = calibrated)")

    # ---------------------------------------------------------------- validate
    val = sub.add_parser("validate", help="check trace files (exit 2 on any fault)",
                         description="Check every fault of docs/design.md §3; print one line per fault naming the "
                                     "file, row, request, position and field.")
    val.add_argument("files", nargs="+", help="trace files (.parquet)")
    val.add_argument("--max-faults", type=int_at_least(1), default=50, help="faults listed per file (default 50)")
    val.add_argument("--quiet", action="store_true", help="print faults only, not the OK lines")

    # ---------------------------------------------------------------- stats
    st = sub.add_parser("stats", help="tau, per-depth acceptance, histogram, calibration",
                        description="Summarise a trace: mean acceptance length tau (incl. the bonus token), "
                                    "per-depth acceptance rate, acceptance-length histogram, reliability "
                                    "table and expected calibration error.")
    st.add_argument("file", help="trace file (.parquet)")
    st.add_argument("--json", action="store_true", help="print JSON instead of tables")
    st.add_argument("--bins", type=int_at_least(1, MAX_BINS), default=10, help="confidence bins of the reliability table (default 10)")
    st.add_argument("--out", type=path_arg, help="also write the JSON to this file")

    # ---------------------------------------------------------------- fit
    ft = sub.add_parser("fit", help="fit the synthetic generator to a trace",
                        description="Fit the generator's parameters (difficulty spread, acceptance decay, "
                                    "confidence separation, calibration) so that a synthetic trace matches the "
                                    "given trace's statistics (scipy.optimize); report the fit error.")
    ft.add_argument("file", help="trace file (.parquet)")
    ft.add_argument("--out", type=path_arg, help="write the fitted parameters as JSON (usable with `synth --params`)")
    ft.add_argument("--json", action="store_true", help="print the result as JSON")
    ft.add_argument("--seed", type=seed_type, default=0, help="random seed of the simulated moments (default 0)")
    ft.add_argument("--max-evals", type=int_at_least(1, MAX_FIT_EVALS), default=400,
                    help="objective evaluations (default 400, at least 84: the first two generations)")
    return parser


# ============================================================================ record
def _cmd_record(args: argparse.Namespace) -> int:
    import torch

    from dcut_sched.engine.trace_backends import HFBackend, NativeBackend
    from dcut_sched.sampling import SamplingParams
    from dcut_sched.traces.prompts import PromptError, load_prompt_records
    from dcut_sched.traces.record import RecordError, load_partial, partial_path, record_trace

    if args.prompts is None:
        from ..paths import prompts_path

        args.prompts = str(prompts_path())
    # the resumable OUT.partial.parquet is written too: neither it nor --out may be an input
    check_paths({"--prompts": args.prompts}, {"--out": (args.out, TRACE_SUFFIXES),
                                              "--out's resumable partial": (partial_path(args.out), None)})
    try:
        sampling = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed)
    except ValueError as exc:
        raise UsageError(f"--temperature/--top-p/--top-k/--seed: {exc}") from None
    if not sampling.is_greedy and args.backend == "hf":
        raise UsageError("--temperature > 0 needs --backend native (the hf backend records greedy traces only)")
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        prompts = load_prompt_records(args.prompts)
    except PromptError as exc:
        raise UsageError(f"--prompts: {exc}") from None
    if args.limit is not None:  # --limit >= 1 and --block-size >= 2: their argparse types
        prompts = prompts[: args.limit]
    if not args.fresh:
        try:
            load_partial(partial_path(args.out), prompts)  # a damaged partial file is refused before the model loads
        except RecordError as exc:
            raise UsageError(str(exc)) from None
    t0 = time.perf_counter()
    try:
        if args.backend == "hf":
            if not args.target or not args.draft:
                raise UsageError("--backend hf needs --target DIR and --draft DIR (local checkpoints)")
            if tuple(args.skip_layers) != SELF_SPEC_SKIP_LAYERS:  # not the default: the hf draft is its own checkpoint
                raise UsageError("--skip-layers has no effect with --backend hf (it sets the native self-speculative "
                                 "drafter's layers; --draft DIR is the draft model): drop --skip-layers")
            for p in (args.target, args.draft):
                if not Path(p).exists():
                    raise UsageError(f"{p}: no such checkpoint directory")
            backend = HFBackend(args.target, args.draft, device=args.device, dtype=args.dtype or "float32")
            extra = {}
        elif args.target or args.dtype:  # read by --backend hf only
            flag = "--target" if args.target else "--dtype"
            raise UsageError(f"{flag} has no effect with --backend native (only --backend hf reads it); drop "
                             f"{flag}, or record with --backend hf")
        elif args.draft:
            from dcut_sched.drafters import load_dflash, parse_draft_spec
            from dcut_sched.drafters.checkpoint import DraftCheckpointError, check_target
            from dcut_sched.engine.trace_backends import DFlashBackend
            from dcut_sched.model.config import LlamaConfig

            try:
                spec = parse_draft_spec(args.draft)
            except ValueError as exc:
                raise UsageError(f"--draft {exc}") from None
            if spec.kind != "dflash":
                raise UsageError(f"--draft {args.draft}: the native backend takes dflash:PATH (or no --draft for the "
                                 "self-speculative drafter)")
            try:
                model = load_dflash(spec)
                check_target(model.config, LlamaConfig.preset("smollm2-135m"))  # before the target is loaded
            except DraftCheckpointError as exc:
                raise UsageError(f"--draft {args.draft} ({spec.path}): {exc}") from None
            if tuple(args.skip_layers) != SELF_SPEC_SKIP_LAYERS:  # not the default: the DFlash drafter is its own model
                raise UsageError(f"--skip-layers has no effect with --draft {args.draft} (it sets the self-speculative "
                                 f"drafter's layers): drop --skip-layers")
            if args.block_size > model.config.block_size:
                raise UsageError(f"--block-size {args.block_size}: the DFlash drafter in {spec.path} (--draft) drafts "
                                 f"blocks of at most {model.config.block_size}")
            backend = DFlashBackend(model, str(spec.path), device=args.device, generate_batch=args.generate_batch)
            extra = {}
        else:
            backend = NativeBackend(skip_layers=args.skip_layers, device=args.device,
                                    generate_batch=args.generate_batch)
            extra = {}
    except UsageError:
        raise
    except (ImportError, FileNotFoundError, ValueError, RecordError) as exc:
        raise UsageError(f"cannot load the model pair: {exc}") from None
    load_s = time.perf_counter() - t0
    try:
        trace = record_trace(backend, prompts, args.out, block_size=args.block_size,
                             max_new_tokens=args.max_new_tokens, dataset=args.dataset or Path(args.prompts).stem,
                             resume=not args.fresh, progress=not args.no_progress,
                             max_positions=args.max_positions, extra_metadata=extra, sampling=sampling)
    except RecordError as exc:
        raise UsageError(str(exc)) from None
    print(f"wrote {args.out}: {trace.num_requests} requests, {trace.num_rows} positions, B={trace.block_size}, "
          f"model load {load_s:.1f} s, recording {trace.metadata.get('record_seconds')} s")
    return 0


# ============================================================================ synth
def _cmd_synth(args: argparse.Namespace) -> int:
    from dcut_sched.traces import synth

    if args.list:
        bare = vars(build_parser().parse_args(["synth", "--list"]))  # what --list alone parses to
        extra = sorted(dest for dest, value in vars(args).items() if value != bare.get(dest))
        if extra:
            flag = flag_of(extra[0])
            raise UsageError(f"{flag} has no effect with --list (it prints the presets and writes nothing); drop {flag}")
        for name, preset in synth.PRESETS.items():
            print(f"{name}: B={preset.params.block_size}, target tau={preset.target_tau:.2f} -- {preset.source}")
        return 0
    if not args.out:
        raise UsageError("synth needs --out FILE.parquet")
    check_paths({"--params": args.params}, {"--out": (args.out, TRACE_SUFFIXES)})
    try:
        if args.preset:
            params, name = synth.get_preset(args.preset).params, args.preset
        else:
            params, name = synth.SynthParams.load(args.params), Path(args.params).stem
    except (KeyError, synth.SynthParamsError) as exc:
        flag = "--preset" if args.preset else "--params"
        raise UsageError(f"{flag}: {exc.args[0] if isinstance(exc, KeyError) else exc}") from None
    if args.block_size is not None:  # >= 2 (its argparse type)
        params = params.replace(block_size=args.block_size)
    if args.calibration_gap is not None:
        try:
            params = params.replace(calibration_gap=args.calibration_gap)
        except synth.SynthParamsError as exc:
            raise UsageError(f"--calibration-gap: {exc}") from None
    trace = synth.generate(params, num_requests=args.num_requests, seed=args.seed, dataset=name)
    trace.save(args.out)
    print(f"wrote {args.out}: {trace.num_requests} requests, {trace.num_rows} positions, B={trace.block_size}")
    return 0


# ============================================================================ validate
def _cmd_validate(args: argparse.Namespace) -> int:
    from dcut_sched.traces.stats import validate_file

    bad = 0
    for f in args.files:
        faults, summary = validate_file(f, max_faults=args.max_faults)
        if faults:
            bad += 1
            for fault in faults:
                print(fault)
        elif not args.quiet:
            print(f"{f}: OK ({summary})")
    if bad:
        print(f"{bad} of {len(args.files)} file(s) invalid", file=sys.stderr)
        return 2
    return 0


# ============================================================================ stats
def _cmd_stats(args: argparse.Namespace) -> int:
    from dcut_sched.traces import Trace, TraceError
    from dcut_sched.traces.stats import print_stats, trace_stats

    check_paths({"FILE": args.file}, {"--out": (args.out, (".json",))})
    try:
        trace = Trace.load(args.file)
    except TraceError as exc:
        raise UsageError(str(exc)) from None
    stats = trace_stats(trace, bins=args.bins)
    if args.out:
        from dcut_sched.util.atomic import atomic_write_text

        atomic_write_text(args.out, json.dumps(stats, indent=2) + "\n")
    if args.json:
        print(json.dumps(stats, indent=2))
    else:
        print_stats(stats)
    return 0


# ============================================================================ fit
def _cmd_fit(args: argparse.Namespace) -> int:
    from dcut_sched.traces import Trace, TraceError
    from dcut_sched.traces.fit import FIT_BOUNDS, fit_trace, min_evals, print_fit

    least = min_evals(len(FIT_BOUNDS))
    if args.max_evals < least:
        raise UsageError(f"--max-evals {args.max_evals}: a fit runs at least {least} evaluations (the first two "
                         f"generations); give --max-evals {least} or more")
    check_paths({"FILE": args.file}, {"--out": (args.out, (".json",))})
    try:
        trace = Trace.load(args.file)
    except TraceError as exc:
        raise UsageError(str(exc)) from None
    if not trace.exact_replay:
        raise UsageError(f"{args.file}: fit needs a position-indexed trace (indexing=position)")
    result = fit_trace(trace, seed=args.seed, max_evals=args.max_evals)
    if args.out:
        result.params.save(args.out)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print_fit(result)
        if args.out:
            print(f"wrote {args.out}: the fitted generator parameters (dcut-trace synth --params {args.out})")
    return 0


_COMMANDS = {"record": _cmd_record, "synth": _cmd_synth, "validate": _cmd_validate, "stats": _cmd_stats,
             "fit": _cmd_fit}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``dcut-trace``; returns the exit code (:mod:`dcut_sched.cli.errors`)."""
    try:
        args = build_parser().parse_args(argv)
    except UsageError:
        return run_cli("dcut-trace", lambda: build_parser().parse_args(argv))
    return run_cli(f"dcut-trace {args.command}", lambda: _COMMANDS[args.command](args))


if __name__ == "__main__":
    sys.exit(main())
