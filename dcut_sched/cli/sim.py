"""``dcut-sim``: replay an acceptance trace under every policy with a measured cost curve.

The parser, the flag checks and the dispatch to a run mode (:mod:`.sim_run`) and its outputs
(:mod:`.sim_output`); docs/simulator.md has the details. Exit status: 0 on success, 2 on bad input
(one line on stderr, no partial output file), 130/143 on SIGINT/SIGTERM (no output file either).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Sequence

from .args import comma_list, finite_float, flag_of, given_flags, int_at_least, param_value, path_arg, seed_type
from .errors import CliParser, UsageError, run_cli
from .sim_output import PROG, report_tables, write_outputs
from .sim_run import (
    DEFAULT_SCHEDULER_TIMEOUT_S,
    build_work,
    load_inputs,
    run_seeds,
    run_selection_curve,
    simulate_runs,
)

#: Documented limits of the work-size flags (docs/reliability.md), enforced at parse time. Each keeps
#: one invocation within hours on a 2-core machine at the default policies and batch sizes; the
#: size and an estimate are printed before the work starts, so a larger product shows up front.
MAX_SEEDS = 1_000
MAX_STEPS = 1_000_000
MAX_REQUESTS = 100_000
#: The most worker processes --jobs may ask for (docs/reliability.md): far above any machine's cores.
MAX_JOBS = 1024
#: The largest batch size or token count in --batch-sizes / --graph-tokens.
MAX_LIST_VALUE = 1_000_000
MAX_SELECTION_BATCHES = 100_000
MAX_SELECTION_BS = 65_536
#: Time and scale flags are capped where a sum over a run could overflow to inf and turn the table
#: into NaN (``--overhead-ms 1e308``): far above any real step time.
MAX_MS = 1e6
MAX_DRAFT_SCALE = 1e6
MAX_RATE_RPS = 1e9
MAX_LOAD = 1e3
MAX_PROMPT_LEN = 1_000_000
#: The longest wait for a Dask scheduler; a wait that must stay bounded has a bound (docs/reliability.md).
MAX_SCHEDULER_TIMEOUT_S = 3600.0


_policy_list = comma_list(str, what="policy names", item="policy")


def _int_list(item: str) -> "callable":
    """``--batch-sizes`` / ``--graph-tokens``: distinct positive integers up to :data:`MAX_LIST_VALUE`."""
    return comma_list(item=item, minimum=1, need="positive integers, e.g. 4,8,16,32,64", limit=MAX_LIST_VALUE,
                      unique=True)


def _param(text: str) -> tuple[str, str, Any]:
    """``POLICY.KEY=VALUE``; VALUE is strict JSON when it parses (numbers, lists), a boolean or None for
    ``True``/``False``/``None`` in any case, else a string (:func:`~dcut_sched.cli.args.param_value`)."""
    head, sep, raw = text.partition("=")
    policy, dot, key = head.partition(".")
    if not sep or not dot or not policy or not key:
        raise argparse.ArgumentTypeError(f"{text[:80]!r}: expected POLICY.KEY=VALUE, e.g. uniform.rho=0.25")
    return policy, key, param_value(raw, head)


def build_parser() -> CliParser:
    from .. import policies
    from ..simulator import defaults

    p = CliParser(
        prog=PROG,
        description=(
            "Replay an acceptance trace through a simulated serving engine with a measured cost curve, once "
            "per policy and batch size, and print output tokens/s and speedup over autoregressive decoding "
            "(ar), with the geometric mean over batch sizes. With no arguments it runs the published protocol: "
            f"the five shipped DFlash benchmark traces ({', '.join(Path(t).name for t in defaults.DEFAULT_TRACES)}) "
            f"on the H20 cost curve ({defaults.DEFAULT_COST}), policies {','.join(defaults.DEFAULT_BENCHMARK_POLICIES)}, "
            "and prints per policy and batch size the mean speedup over the five (and the geometric mean over "
            "all 25 benchmark x batch-size settings). Several --trace without --sweep do the same for any traces."
        ),
        epilog=(
            "examples:\n"
            "  dcut-sim                                  # the published protocol: mean over the five benchmarks\n"
            "  dcut-sim --out out/rows.csv --policies all  # one row per (trace, policy, bs), every policy\n"
            "  dcut-sim --draft-scale 0.5                # what if the drafter cost half as much\n"
            "  dcut-sim --trace t.parquet --cost c.json --policies ar,full,dcut,fine --out out/results.csv --plot out/speedup.png\n"
            "  dcut-sim --mode open --batch-sizes 16,64 --load 0.8 --out out/open.json\n"
            "  dcut-sim --selection-curve out/selection.png --selection-bs 64\n"
            "  dcut-sim --sweep --trace a.parquet --trace b.parquet --cost h20.json --cost h100.json --jobs 8 --out out/sweep.parquet\n"
            "  dcut-sim --sweep --trace a.parquet --cost h20.json --scheduler dask --scheduler-address tcp://10.0.0.5:8786 --out out/sweep.parquet\n"
            "policy parameters (--param POLICY.KEY=VALUE), with their defaults:\n"
            f"{policies.param_help()}\n"
            "exit status: 0 ok, 2 bad input (no partial output file is left), 130/143 interrupted by\n"
            "SIGINT/SIGTERM (no output file is written)."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_run_flags(p, policies, defaults)
    _add_loop_and_output_flags(p, defaults)
    return p


def _add_run_flags(p: CliParser, policies, defaults) -> None:
    """The inputs and what to simulate: traces, curves, policies, batch sizes, seeds, what-ifs."""
    g = p.add_argument_group("inputs")
    g.add_argument("--trace", action="append", metavar="FILE", type=path_arg,
                   help="acceptance trace (Parquet, docs/design.md §3); repeat it for the mean over several benchmarks, "
                        "or with --sweep (default: the five DFlash benchmark traces)")
    g.add_argument("--cost", action="append", metavar="FILE", type=path_arg,
                   help=f"cost curve (JSON, dcut.cost-curve/2, docs/design.md §4; /1 still loads); repeat with --sweep (default: {defaults.DEFAULT_COST})")
    g = p.add_argument_group("what to simulate")
    g.add_argument("--policies", type=_policy_list, default=None, metavar="LIST",
                   help=f"comma-separated policies, or 'all' ({','.join(policies.names())}); ar is always run as the "
                        f"baseline (default: all for one --trace; {','.join(defaults.DEFAULT_BENCHMARK_POLICIES)} for "
                        "the five-benchmark main job)")
    g.add_argument("--param", type=_param, action="append", default=[], metavar="POLICY.KEY=VALUE",
                   help="policy parameter, repeatable, e.g. --param uniform.rho=0.25 --param dcut.ratios=[0.5,1.0] "
                        "--param fine.feedback=False (booleans: True/False or true/false)")
    g.add_argument("--batch-sizes", type=_int_list("batch size"), default=list(defaults.DEFAULT_BATCH_SIZES), metavar="LIST",
                   help="comma-separated batch sizes (open loop: maximum batch sizes) (default: %(default)s)")
    g.add_argument("--mode", choices=("closed", "open"), default="closed",
                   help="closed: fixed concurrency, steady state (the published benchmark); open: Poisson "
                        "arrivals with continuous batching, latency percentiles (default: %(default)s)")
    g.add_argument("--seed", type=seed_type, default=0, help="seeds the request order and arrivals (default: %(default)s)")
    g.add_argument("--seeds", type=int_at_least(1, MAX_SEEDS), default=1, metavar="N",
                   help="run seeds SEED..SEED+N-1 and report the mean and spread (std, min-max) over them; on a "
                        "sampled trace each seed also redraws the acceptance from p1..p{B-1}; at most "
                        f"{MAX_SEEDS:,} (default: %(default)s)")
    g.add_argument("--no-shuffle", action="store_true", help="admit requests in the trace's order instead of a seeded shuffle")
    g.add_argument("--overhead-ms", type=finite_float(0.0, MAX_MS), default=0.0,
                   help="fixed controller overhead added to every drafted step, ms (default: %(default)s)")
    g.add_argument("--draft-scale", type=finite_float(0.0, MAX_DRAFT_SCALE, open_low=True), default=1.0, metavar="X",
                   help="multiply the cost curve's draft step by X (what-if: a cheaper or dearer drafter) (default: %(default)s)")
    g.add_argument("--calibrate", action="store_true",
                   help="pass confidences through dcut_sched.calibration.OnlineCalibrator before each policy")
    g.add_argument("--graph-tokens", type=_int_list("token count"), default=None, metavar="LIST",
                   help="token counts a CUDA-graph bank captured (at every batch size), e.g. 64,128,256,512,1024: "
                        "fine only chooses among them and each drafted step is charged at the smallest captured "
                        "count >= its budget, as the controller with a VerifyGraphBank (default: every budget)")


def _add_loop_and_output_flags(p: CliParser, defaults) -> None:
    """The closed- and open-loop flags, the outputs, the selection curve and the sweeps."""
    g = p.add_argument_group("closed loop")
    g.add_argument("--steps", type=int_at_least(1, MAX_STEPS), default=None,
                   help=f"engine steps per (trace, policy, batch size), warm-up included; at most {MAX_STEPS:,} "
                        f"(default: {defaults.DEFAULT_NUM_STEPS} for one trace, {defaults.DEFAULT_BENCHMARK_STEPS} per "
                        "benchmark for several)")
    g.add_argument("--warmup", type=int_at_least(0), default=None,
                   help=f"leading steps left out of the figures (default: {defaults.DEFAULT_WARMUP_STEPS} for one "
                        f"trace, {defaults.DEFAULT_BENCHMARK_WARMUP_STEPS} per benchmark for several)")
    g = p.add_argument_group("open loop")
    g.add_argument("--rate", type=finite_float(0.0, MAX_RATE_RPS, open_low=True), default=None, metavar="RPS",
                   help="arrival rate, requests/s (default: --load times the ar capacity at each max batch size)")
    g.add_argument("--load", type=finite_float(0.0, MAX_LOAD, open_low=True), default=0.7, help="arrival rate as a fraction of ar capacity (default: %(default)s)")
    g.add_argument("--requests", type=int_at_least(1, MAX_REQUESTS), default=400,
                   help=f"arrivals per run; at most {MAX_REQUESTS:,} (default: %(default)s)")
    g.add_argument("--prompt-len", type=int_at_least(1, MAX_PROMPT_LEN), default=None,
                   help="prefill k admitted requests at C_verify(k, k*PROMPT_LEN) (default: prefill is free)")
    g.add_argument("--prefill-ms", type=finite_float(0.0, MAX_MS), default=None, help="prefill time per admitted request, ms (instead of --prompt-len)")
    g.add_argument("--slo-tpot-ms", type=finite_float(0.0, open_low=True), default=None, help="TPOT objective: goodput counts only requests that meet it")
    g = p.add_argument_group("output")
    g.add_argument("--out", metavar="FILE", type=path_arg, help="detail results, one row per (trace, policy, batch size) (--sweep: also "
                   "per cost curve; --seeds: also per seed): .csv, .parquet or .json")
    g.add_argument("--plot", metavar="FILE", type=path_arg, help="speedup vs batch size plot (.png, .svg or .pdf)")
    g.add_argument("--quiet", action="store_true", help="no progress bar and no table (files only)")
    g = p.add_argument_group("selection curve (instead of the speedup table)")
    g.add_argument("--selection-curve", metavar="FILE", type=path_arg,
                   help="accepted tokens vs verification budget for uniform and topk; FILE: .csv/.parquet/.json "
                        "(data) or .png/.svg/.pdf (plot). Needs only the trace")
    g.add_argument("--selection-bs", type=int_at_least(1, MAX_SELECTION_BS), default=defaults.DEFAULT_SELECTION_BATCH_SIZE,
                   help="batch size of the selection curve (default: %(default)s)")
    g.add_argument("--selection-batches", type=int_at_least(1, MAX_SELECTION_BATCHES), default=200, help="sampled batches per point (default: %(default)s)")
    g = p.add_argument_group("sweeps")
    g.add_argument("--sweep", action="store_true",
                   help="run every (trace, cost, batch size) in parallel processes (repeat --trace/--cost)")
    g.add_argument("--jobs", type=int_at_least(1, MAX_JOBS), default=None,
                   help="worker processes for the independent (trace, policy, batch size) runs of the main job, "
                        "--trace runs, --seeds and --sweep; rows are identical for any value (default: the usable "
                        "cores; 1 runs everything in this process)")
    g.add_argument("--scheduler", choices=("local", "dask"), default="local",
                   help="where --sweep runs: local worker processes, or a Dask cluster (needs "
                        "--scheduler-address and the 'distributed' package) (default: %(default)s)")
    g.add_argument("--scheduler-address", metavar="ADDR",
                   help="Dask scheduler address for --scheduler dask, e.g. tcp://10.0.0.5:8786; the workers "
                        "must import dcut_sched and see the --trace/--cost paths")
    g.add_argument("--scheduler-timeout", type=finite_float(0.0, MAX_SCHEDULER_TIMEOUT_S, open_low=True), default=None, metavar="SECONDS",
                   help="the most seconds to wait for the Dask scheduler to connect and answer; an address where "
                        "nothing answers (or another kind of server) is an error naming it, exit 2 (default: "
                        f"{DEFAULT_SCHEDULER_TIMEOUT_S:g})")


#: Which flags each kind of run reads (by ``argparse`` dest). A flag given with a value other than its
#: default to a run that does not read it is refused (:func:`check_flags_used`) rather than ignored.
SELECTION_FLAGS = frozenset({"trace", "selection_curve", "selection_bs", "selection_batches", "seed", "quiet"})
RUN_FLAGS = frozenset({"trace", "cost", "policies", "param", "batch_sizes", "mode", "seed", "seeds", "no_shuffle",
                       "overhead_ms", "draft_scale", "calibrate", "graph_tokens", "out", "plot", "quiet", "jobs",
                       "sweep", "scheduler", "scheduler_address", "scheduler_timeout"})
CLOSED_FLAGS = frozenset({"steps", "warmup"})
OPEN_FLAGS = frozenset({"rate", "load", "requests", "prompt_len", "prefill_ms", "slo_tpot_ms"})
DASK_FLAGS = ("scheduler", "scheduler_address", "scheduler_timeout")


def check_flags_used(args, given) -> None:
    """Refuse a flag the run would silently ignore: ``--rate`` in a closed loop, ``--steps`` in an
    open one, run flags with ``--selection-curve``, ``--scheduler`` with ``--seeds``, ``--jobs`` on
    a Dask sweep.

    Args:
        args: the parsed flags.
        given: the dests of the flags given on the command line (:func:`~.args.given_flags`; a flag
            given with its default value counts).

    Raises:
        UsageError: naming the flag, what it is for and the fix.
    """
    given = sorted(given)
    if args.selection_curve:
        for dest in given:
            if dest not in SELECTION_FLAGS:
                raise UsageError(f"{flag_of(dest)} has no effect with --selection-curve (it reads one --trace, "
                                 f"--selection-bs, --selection-batches and --seed); drop {flag_of(dest)}")
        return
    for dest in given:
        if dest in ("selection_bs", "selection_batches"):
            raise UsageError(f"{flag_of(dest)} is for --selection-curve FILE; add it or drop {flag_of(dest)}")
        if args.mode == "closed" and dest in OPEN_FLAGS:
            raise UsageError(f"{flag_of(dest)} is an open-loop flag and the run is closed-loop: add --mode open or "
                             f"drop {flag_of(dest)}")
        if args.mode == "open" and dest in CLOSED_FLAGS:
            raise UsageError(f"{flag_of(dest)} sizes a closed-loop run and --mode open runs --requests arrivals: "
                             f"drop {flag_of(dest)} (or use --requests)")
        if args.seeds != 1 and dest in DASK_FLAGS:
            raise UsageError(f"{flag_of(dest)} is for --sweep, and --seeds runs here (in --jobs processes): "
                             f"drop {flag_of(dest)}")
    if "scheduler" in given and not args.sweep and args.seeds == 1 and args.scheduler != "dask":  # dask: below
        raise UsageError("--scheduler chooses where a --sweep runs: add --sweep or drop --scheduler")
    if args.mode == "open" and "rate" in given and "load" in given:
        raise UsageError("--load has no effect with --rate (the arrival rate is given): drop one of them")
    if args.policies == ["ar"]:  # plain decoding only: nothing drafts
        for dest in ("graph_tokens", "calibrate", "overhead_ms", "draft_scale"):
            if dest in given:
                raise UsageError(f"{flag_of(dest)} has no effect with --policies ar (nothing drafts): drop it")
    if args.scheduler == "dask" and "jobs" in given:
        raise UsageError("--jobs has no effect with --scheduler dask (the cluster's workers run the jobs): drop --jobs")


def _run(args, console) -> None:
    """One ``dcut-sim`` invocation: a selection curve, several seeds, or load, build, run, report, write."""
    if args.selection_curve:
        run_selection_curve(args, console)
        return
    if args.seeds != 1:
        run_seeds(args, console)
        return
    traces, costs, benchmarks, config = load_inputs(args)
    work = build_work(args, traces, costs, config, benchmarks)
    df = simulate_runs(args, work, traces, costs, config, benchmarks)
    report_tables(args, console, df, traces, costs, benchmarks)
    write_outputs(args, df, traces, costs, benchmarks)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``dcut-sim``; returns the exit status (:mod:`dcut_sched.cli.errors`)."""
    def body() -> None:
        args = build_parser().parse_args(argv)
        check_flags_used(args, given_flags(build_parser, argv, args))
        from ..util.console import make_console  # after parsing: --help answers without importing rich

        _run(args, make_console())

    # Flag errors, UsageError, TraceError, CostCurveError, CostCurveRangeError, SimulationError and
    # the output checks are ValueErrors; unwritable outputs are OSErrors: bad input, one line, exit 2.
    return run_cli(PROG, body)


if __name__ == "__main__":
    sys.exit(main())
