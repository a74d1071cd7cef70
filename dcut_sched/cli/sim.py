"""``dcut-sim``: replay an acceptance trace under every policy with a measured cost curve.

Run ``dcut-sim --help``; docs/simulator.md has the details. Exit status: 0 on success, 2 on bad input
(one line on stderr, no partial output file), 130/143 on SIGINT/SIGTERM (no output file either); see
:mod:`dcut_sched.cli.errors`.
"""

from __future__ import annotations

import argparse
import contextlib
import filecmp
import itertools
import os
import sys
from pathlib import Path
from typing import Any, Sequence

from .args import (
    MAX_SEED,
    check_json_input,
    check_paths,
    comma_list,
    finite_float,
    flag_of,
    given_flags,
    int_at_least,
    param_value,
    same_file,
    seed_type,
    short_value,
)
from .errors import CliParser, UsageError, run_cli
from .graph_tokens import check_graph_tokens

DEFAULT_SCHEDULER_TIMEOUT_S = 10.0  # dcut_sched.simulator.sweep.DEFAULT_SCHEDULER_TIMEOUT_S (not imported: --help stays light)

PROG = "dcut-sim"

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
#: The most sampled requests of a selection curve, --selection-bs x --selection-batches (arrays of
#: that many rows x B per budget; the default is 64 x 200 = 12,800).
MAX_SELECTION_SAMPLES = 1_000_000
#: Time and scale flags are capped where a sum over a run could overflow to inf and turn the table
#: into NaN (``--overhead-ms 1e308``): far above any real step time.
MAX_MS = 1e6
MAX_DRAFT_SCALE = 1e6
MAX_RATE_RPS = 1e9
MAX_LOAD = 1e3
MAX_PROMPT_LEN = 1_000_000
#: The longest wait for a Dask scheduler; a wait that must stay bounded has a bound (docs/reliability.md).
MAX_SCHEDULER_TIMEOUT_S = 3600.0
PLOT_SUFFIXES = (".png", ".svg", ".pdf")
TABLE_SUFFIXES = (".csv", ".parquet", ".json")


_policy_list = comma_list(str, what="policy names", item="policy")


def _int_list(item: str) -> "callable":
    """``--batch-sizes`` / ``--graph-tokens``: distinct positive integers up to :data:`MAX_LIST_VALUE`."""
    return comma_list(item=item, minimum=1, need="positive integers, e.g. 4,8,16,32,64", limit=MAX_LIST_VALUE,
                      unique=True)


def _param(text: str) -> tuple[str, str, Any]:
    """``POLICY.KEY=VALUE``; VALUE is strict JSON when it parses (numbers, lists), else a string
    (:func:`~dcut_sched.cli.args.param_value`)."""
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
    g.add_argument("--trace", action="append", metavar="FILE",
                   help="acceptance trace (Parquet, docs/design.md §3); repeat it for the mean over several benchmarks, "
                        "or with --sweep (default: the five DFlash benchmark traces)")
    g.add_argument("--cost", action="append", metavar="FILE",
                   help=f"cost curve (JSON, dcut.cost-curve/2, docs/design.md §4; /1 still loads); repeat with --sweep (default: {defaults.DEFAULT_COST})")
    g = p.add_argument_group("what to simulate")
    g.add_argument("--policies", type=_policy_list, default=None, metavar="LIST",
                   help=f"comma-separated policies, or 'all' ({','.join(policies.names())}); ar is always run as the "
                        f"baseline (default: all for one --trace; {','.join(defaults.DEFAULT_BENCHMARK_POLICIES)} for "
                        "the five-benchmark main job)")
    g.add_argument("--param", type=_param, action="append", default=[], metavar="POLICY.KEY=VALUE",
                   help="policy parameter, repeatable, e.g. --param uniform.rho=0.25 --param dcut.ratios=[0.5,1.0]")
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
    g.add_argument("--slo-tpot-ms", type=finite_float(0.0, MAX_MS, open_low=True), default=None, help="TPOT objective: goodput counts only requests that meet it")
    g = p.add_argument_group("output")
    g.add_argument("--out", metavar="FILE", help="detail results, one row per (policy, batch size): .csv, .parquet or .json")
    g.add_argument("--plot", metavar="FILE", help="speedup vs batch size plot (.png, .svg or .pdf)")
    g.add_argument("--quiet", action="store_true", help="no progress bar and no table (files only)")
    g = p.add_argument_group("selection curve (instead of the speedup table)")
    g.add_argument("--selection-curve", metavar="FILE",
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


def _input_paths(given: list[str] | None, default: str | Sequence[str], flag: str, what: str, several: bool) -> list[str]:
    """The files of ``flag`` (``given``), else the shipped default file(s) named ``default``;
    ``several``: more than one is allowed."""
    from ..simulator.defaults import default_cost_path, default_trace_path

    if not given:
        paths = []
        locate = default_trace_path if flag == "--trace" else default_cost_path
        for name in ([default] if isinstance(default, str) else list(default)):
            path = locate(name)
            if not path.is_file():
                how = "dcut-trace makes one" if flag == "--trace" else "dcut-profile measures one"
                raise UsageError(f"default {what} {name} not found (looked for {path}); pass {flag} FILE ({how})")
            paths.append(str(path))
        return paths
    if len(given) > 1 and not several:
        raise UsageError(f"{flag} given {len(given)} times; add --sweep to run several")
    for j, path in enumerate(given):  # a set: a file given twice would be run (and counted) twice
        for earlier in given[:j]:
            if path == earlier:
                raise UsageError(f"{flag} {path} is given twice; give each {what} once")
            if same_file(path, earlier, flags=(flag, flag)):
                raise UsageError(f"{flag} {earlier} and {flag} {path} are the same file; give each {what} once")
            if _same_bytes(path, earlier):
                raise UsageError(f"{flag} {earlier} and {flag} {path} hold the same bytes (a copy); it would be "
                                 f"run and counted twice: give each {what} once")
    return given


def _same_bytes(a: str, b: str) -> bool:
    """Two readable files with equal contents (a copy under another name); False when either cannot
    be read (the loader names that)."""
    try:
        return os.path.isfile(a) and os.path.isfile(b) and filecmp.cmp(a, b, shallow=False)
    except OSError:
        return False


def _make_calibrator():
    from ..calibration import OnlineCalibrator

    return OnlineCalibrator()


def _run_selection_curve(args, console) -> None:
    from ..simulator import plot_selection_curve, selection_curve, write_frame
    from ..util.atomic import all_or_none

    suffix = Path(args.selection_curve).suffix.lower()
    if args.trace and len(args.trace) > 1:
        raise UsageError("--selection-curve takes one --trace")
    if args.selection_bs * args.selection_batches > MAX_SELECTION_SAMPLES:
        raise UsageError(f"--selection-bs {args.selection_bs:,} x --selection-batches {args.selection_batches:,} = "
                         f"{args.selection_bs * args.selection_batches:,} sampled requests is above the limit "
                         f"{MAX_SELECTION_SAMPLES:,} (docs/reliability.md); lower either")
    trace = _input_paths(args.trace, _defaults().DEFAULT_TRACE, "--trace", "trace", False)[0]
    check_paths({"--trace": trace, "--cost": args.cost},
                {"--selection-curve": (args.selection_curve, TABLE_SUFFIXES + PLOT_SUFFIXES)})
    df = selection_curve(trace, args.selection_bs, num_batches=args.selection_batches, seed=args.seed)
    if not args.quiet:
        from .render import render_selection

        render_selection(df, console, args.selection_bs)
    with all_or_none():
        if suffix in PLOT_SUFFIXES:
            plot_selection_curve(df, args.selection_curve, trace=trace)
        else:
            write_frame(df, args.selection_curve)
    _wrote(args.selection_curve, f"selection curve at bs {args.selection_bs}, {len(df)} rows" if suffix not in
           PLOT_SUFFIXES else f"selection curve plot at bs {args.selection_bs}")


class _Work:
    """The size of a simulation, printed before it starts; an estimate, printed after its first
    unit of work finishes (that unit's time x the rounds of ``parallel`` units); progress while it
    runs (:class:`~dcut_sched.util.progress.RunProgress` on stderr: a bar on a terminal, a line every
    ``DCUT_PROGRESS_INTERVAL_S`` seconds elsewhere). Nothing with ``--quiet``.

    Args:
        args: the parsed flags (``--mode``, ``--steps``, ``--requests``, ``--quiet``).
        total: units of work (runs, or sweep jobs).
        unit: their name, plural (``"runs"``, ``"jobs"``).
        what: how ``total`` is made up, e.g. ``"3 seeds x 10 runs (5 policies x 2 batch sizes)"``.
        parallel: units that run at once (sweep workers); 1 for one process.
    """

    def __init__(self, args, *, total: int, unit: str, what: str, parallel: int = 1):
        from ..util.progress import RunProgress

        self.total, self.unit, self.parallel = total, unit, max(1, min(parallel, total))
        per = f"{args.steps:,} steps" if args.mode == "closed" else f"{args.requests:,} arrivals"
        self.size = f"{PROG}: size: {what} = {total:,} {unit}, {per} per run"
        self.progress = RunProgress(f"{PROG}", total, unit, enabled=not args.quiet)
        self._estimated = False

    def __enter__(self) -> "_Work":
        self.progress.__enter__()
        self.progress.note(self.size)
        return self

    def __exit__(self, *exc) -> None:
        self.progress.__exit__(*exc)

    def done(self, completed: int, detail: str = "") -> None:
        """``completed`` units of ``total`` are finished; the first call also prints the estimate."""
        from ..util.progress import format_duration

        self.progress.update(completed=completed, detail=detail)
        if self._estimated or completed < 1:
            return
        self._estimated = True
        each = self.progress.elapsed_s / completed
        whole = each * -(-self.total // self.parallel)
        took = f"{each:.2f} s" if each < 60 else format_duration(each)
        at_once = f" with {self.parallel} at a time" if self.parallel > 1 else ""
        self.progress.note(f"{PROG}: estimate: the first {self.unit[:-1]} took {took}; all {self.total:,}{at_once} "
                           f"~{format_duration(whole)} (extrapolated)")


def _num_runs(config) -> tuple[int, int]:
    """(policies, runs) of one :func:`~dcut_sched.simulator.simulate` call: ``ar`` included, x batch sizes."""
    from ..simulator.config import policy_specs

    policies = len(policy_specs(config.policies, config.policy_params))  # counted, not built
    return policies, policies * len(config.batch_sizes)


def _run_seeds(args, console) -> None:
    """``--seeds N``: one trace and curve, N seeds; the table shows mean, std and range of the speedup."""
    from ..simulator import check_simulation, seed_spread, simulate, write_frame

    if args.sweep or args.plot or (args.trace and len(args.trace) > 1) or (args.cost and len(args.cost) > 1):
        raise UsageError("--seeds runs one --trace and one --cost (no --sweep, no --plot)")
    if args.seed + args.seeds - 1 > MAX_SEED:
        raise UsageError(f"--seed {args.seed:,} with --seeds {args.seeds:,} runs seeds up to "
                         f"{args.seed + args.seeds - 1:,}, above the largest seed {MAX_SEED:,}: lower --seed")
    d = _defaults()
    trace = _input_paths(args.trace, d.DEFAULT_TRACE, "--trace", "trace", False)[0]
    cost = _input_paths(args.cost, d.DEFAULT_COST, "--cost", "cost curve", False)[0]
    # the one output-path check: --out must be neither input (it was checked alone here before)
    check_paths({"--trace": trace, "--cost": cost}, {"--out": (args.out, TABLE_SUFFIXES)})
    steps = args.steps if args.steps is not None else d.DEFAULT_NUM_STEPS
    warmup = args.warmup if args.warmup is not None else min(d.DEFAULT_WARMUP_STEPS, max(steps - 1, 0))
    _check_warmup(warmup, steps, args.mode)
    check_json_input(cost, "--cost", "a cost-curve JSON file (dcut-profile writes one)")
    config = _sim_config(args, num_steps=steps, warmup_steps=warmup,
                         policies=None if args.policies == ["all"] else args.policies, costs=[cost])
    check_simulation(trace, cost, config)  # bad input is refused before the size line and any run
    args.steps = steps
    policies, runs = _num_runs(config)
    frames = []
    with _Work(args, total=args.seeds * runs, unit="runs",
               what=f"{args.seeds:,} seeds x {policies} policies x {len(config.batch_sizes)} batch sizes") as work:
        for n, seed in enumerate(range(args.seed, args.seed + args.seeds)):
            def on_run(done: int, _total: int, label: str, n=n, seed=seed) -> None:
                work.done(n * runs + done, f"seed {seed}: {label}")

            frames.append(simulate(trace, cost, config.replace(seed=seed), on_run=on_run, jobs=_jobs(args)))
    import pandas as pd

    df = pd.concat(frames, ignore_index=True)
    df.attrs = dict(frames[0].attrs)
    spread = seed_spread(df)
    if not args.quiet:
        from .render import render_seeds

        render_seeds(spread, console, args, PROG)
        from ..traces import Trace

        sampled = ("sampled trace: acceptance redrawn from p per seed" if Trace.load(trace).sampled
                   else "greedy trace: seeds change the request order (and arrivals) only")
        console.print(f"trace {trace}\ncost {cost}\n{sampled}; sd = sample standard deviation over seeds",
                      highlight=False, soft_wrap=True)
    if args.out:
        write_frame(with_settings(df, args), args.out)


def _sim_config(args, *, num_steps: int, warmup_steps: int, policies: list[str] | None, costs: Sequence[str]):
    """The :class:`~dcut_sched.simulator.SimConfig` of the parsed flags (the one place the CLI builds
    it; ``--param``, the prefill flags and ``--graph-tokens`` against each of the ``costs`` curve
    files checked first, with the flag names)."""
    from ..simulator import SimConfig

    if args.prompt_len is not None and args.prefill_ms is not None:
        raise UsageError("give --prompt-len or --prefill-ms, not both")
    config = SimConfig(
        policies=policies, policy_params=_policy_params(args.param, policies), batch_sizes=args.batch_sizes,
        mode=args.mode, num_steps=num_steps, warmup_steps=warmup_steps, seed=args.seed,
        shuffle=not args.no_shuffle, overhead_ms=args.overhead_ms, draft_scale=args.draft_scale,
        calibrator=_make_calibrator() if args.calibrate else None, graph_token_counts=args.graph_tokens,
        rate_rps=args.rate, load=args.load, num_requests=args.requests, prompt_len=args.prompt_len,
        prefill_ms=args.prefill_ms, slo_tpot_ms=args.slo_tpot_ms,
    )
    if config.graph_token_counts is not None:
        for cost in costs:
            check_graph_tokens(config, cost)
    return config


def _jobs(args) -> int:
    """``--jobs``, or the usable cores when it is not given."""
    from ..simulator.parallel import usable_cores

    return args.jobs if args.jobs is not None else usable_cores()


def _defaults():
    from ..simulator import defaults

    return defaults


#: Which flags each kind of run reads (by ``argparse`` dest). A flag given with a value other than its
#: default to a run that does not read it is refused (:func:`check_flags_used`) rather than ignored.
SELECTION_FLAGS = frozenset({"trace", "selection_curve", "selection_bs", "selection_batches", "seed", "quiet"})
RUN_FLAGS = frozenset({"trace", "cost", "policies", "param", "batch_sizes", "mode", "seed", "seeds", "no_shuffle",
                       "overhead_ms", "draft_scale", "calibrate", "graph_tokens", "out", "plot", "quiet", "jobs",
                       "sweep", "scheduler", "scheduler_address", "scheduler_timeout"})
CLOSED_FLAGS = frozenset({"steps", "warmup"})
OPEN_FLAGS = frozenset({"rate", "load", "requests", "prompt_len", "prefill_ms", "slo_tpot_ms"})
DASK_FLAGS = ("scheduler", "scheduler_address", "scheduler_timeout")


def _check_warmup(warmup: int, steps: int, mode: str) -> None:
    if mode == "closed" and warmup >= steps:
        raise UsageError(f"--warmup {warmup:,} must be less than --steps {steps:,} (the warm-up steps are left out of "
                         f"the figures, so none would be left): lower --warmup or raise --steps")


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


def _load(args):
    """Load: the traces and cost curves (or the shipped defaults), the run's defaults and its
    :class:`~dcut_sched.simulator.SimConfig`; every input and output checked before any run.
    Returns ``(traces, costs, benchmarks, config)``; ``benchmarks``: several traces, one mean."""
    from ..simulator import check_simulation

    if args.plot and args.sweep:
        raise UsageError("--plot draws one trace and curve; plot a sweep's --out file with analysis/ scripts")
    d = _defaults()
    traces = _input_paths(args.trace, d.DEFAULT_TRACES, "--trace", "trace", True)
    costs = _input_paths(args.cost, d.DEFAULT_COST, "--cost", "cost curve", args.sweep)
    # Check every output path before simulating anything.
    check_paths({"--trace": traces, "--cost": costs},
                {"--out": (args.out, TABLE_SUFFIXES), "--plot": (args.plot, PLOT_SUFFIXES)})
    for cost in costs:
        check_json_input(cost, "--cost", "a cost-curve JSON file (dcut-profile writes one)")
    benchmarks = len(traces) > 1 and not args.sweep  # the published protocol: mean over the traces
    if args.steps is None:
        args.steps = d.DEFAULT_BENCHMARK_STEPS if benchmarks else d.DEFAULT_NUM_STEPS
    if args.warmup is None:
        args.warmup = min(d.DEFAULT_BENCHMARK_WARMUP_STEPS if benchmarks else d.DEFAULT_WARMUP_STEPS,
                          max(args.steps - 1, 0))
    _check_warmup(args.warmup, args.steps, args.mode)
    if args.policies == ["all"]:
        args.policies = None
    elif args.policies is None and benchmarks:
        args.policies = list(d.DEFAULT_BENCHMARK_POLICIES)
    config = _sim_config(args, num_steps=args.steps, warmup_steps=args.warmup, policies=args.policies, costs=costs)
    if args.scheduler == "dask" and not (args.sweep and args.scheduler_address):
        raise UsageError("--scheduler dask runs a --sweep on a cluster: add --sweep and --scheduler-address ADDR")
    if args.scheduler_address and args.scheduler != "dask":
        raise UsageError("--scheduler-address is for --scheduler dask")
    if args.scheduler_timeout is not None and args.scheduler != "dask":
        raise UsageError("--scheduler-timeout is for --scheduler dask")
    # Bad input is refused before the size line and any run.
    pairs = list(itertools.product(traces, costs if args.sweep else costs[:1]))
    for trace, cost in pairs:
        try:
            check_simulation(trace, cost, config)
        except ValueError as exc:  # of several pairs (a B = 8 trace beside B = 16 curves): name this one
            if len(pairs) == 1:
                raise
            raise UsageError(f"--trace {trace} with --cost {cost} cannot run: {exc}") from None
    return traces, costs, benchmarks, config


def _build_work(args, traces: list[str], costs: list[str], config, benchmarks: bool) -> _Work:
    """Build: the run's size line, estimate and progress (:class:`_Work`)."""
    policies, runs = _num_runs(config)
    per_sim = f"{policies} policies x {len(config.batch_sizes)} batch sizes"
    if args.sweep:
        cells = len(traces) * len(costs) * len(config.batch_sizes)
        parallel = 1 if args.scheduler == "dask" else (args.jobs or os.cpu_count() or 1)
        return _Work(args, total=cells, unit="jobs", parallel=parallel,
                     what=f"{cells} jobs ({len(traces)} traces x {len(costs)} costs x {len(config.batch_sizes)} "
                          f"batch sizes) of {policies} policies each")
    return _Work(args, total=len(traces) * runs, unit="runs",
                 what=f"{len(traces)} traces x {per_sim}" if benchmarks else per_sim)


def _simulate(args, work: _Work, traces: list[str], costs: list[str], config, benchmarks: bool):
    """Run: a sweep (local processes or a Dask cluster), the benchmarks' mean, or one trace."""
    from ..simulator import simulate, simulate_benchmarks, sweep

    with contextlib.ExitStack() as stack:
        executor = None
        if args.scheduler == "dask":  # connected (or refused, within --scheduler-timeout) before the size line
            from ..simulator import dask_executor

            timeout = args.scheduler_timeout if args.scheduler_timeout is not None else DEFAULT_SCHEDULER_TIMEOUT_S
            executor = stack.enter_context(dask_executor(args.scheduler_address, timeout_s=timeout))
        stack.enter_context(work)

        def on_run(done: int, total: int, label: str) -> None:
            work.done(done, label)

        if args.sweep:
            def on_job(done: int, total: int) -> None:
                work.done(done)

            return sweep(traces, costs, config.batch_sizes, config, jobs=args.jobs, executor=executor, on_job=on_job)
        if benchmarks:
            return simulate_benchmarks(traces, costs[0], config, on_run=on_run, jobs=_jobs(args))
        return simulate(traces[0], costs[0], config, on_run=on_run, jobs=_jobs(args))


def _report(args, console, df, traces: list[str], costs: list[str], benchmarks: bool) -> None:
    """Report: the benchmarks' mean table (and the open-loop one), or one table per trace and curve."""
    from .render import render_benchmarks, render_open_benchmarks, render_runs

    if args.quiet:
        return
    if benchmarks:
        render_benchmarks(df, console, args, costs[0], PROG)
        if args.mode == "open":
            render_open_benchmarks(df, console, len(traces), PROG)
    else:
        render_runs(df, console, args, traces, costs, PROG)


#: The run settings that change results and that the simulator's rows do not hold themselves
#: (``--param`` values are in the policy label, e.g. ``uniform(rho=0.25)``); :func:`with_settings`
#: adds them to the rows written to ``--out``.
SETTING_COLUMNS = ("calibrate", "overhead_ms", "shuffle", "graph_tokens")
OPEN_SETTING_COLUMNS = ("requests", "slo_tpot_ms")


def with_settings(df, args):
    """The rows as ``--out`` holds them: ``df`` plus a column for each setting of
    :data:`SETTING_COLUMNS` (and, open loop, :data:`OPEN_SETTING_COLUMNS`), so a row says how it
    was produced: ``calibrate`` (``--calibrate``), ``overhead_ms``, ``shuffle`` (false with
    ``--no-shuffle``), ``graph_tokens`` (``--graph-tokens`` as ``64,128``; ``all``: every budget),
    ``requests`` and ``slo_tpot_ms`` (NaN: none). The same values go into the frame's ``attrs``.
    The table on screen is drawn from ``df`` and does not change."""
    import math

    out = df.copy()
    settings: dict[str, Any] = {
        "calibrate": bool(args.calibrate), "overhead_ms": float(args.overhead_ms), "shuffle": not args.no_shuffle,
        "graph_tokens": ",".join(str(n) for n in args.graph_tokens) if args.graph_tokens else "all"}
    if args.mode == "open":
        settings.update(requests=int(args.requests),
                        slo_tpot_ms=math.nan if args.slo_tpot_ms is None else float(args.slo_tpot_ms))
    for column, value in settings.items():
        if column not in out.columns:
            out[column] = value
    out.attrs = {**df.attrs, **settings}
    if args.mode == "open" and args.slo_tpot_ms is None:
        out.attrs["slo_tpot_ms"] = None
    return out


def _write(args, df, traces: list[str], costs: list[str], benchmarks: bool) -> None:
    """Write: ``--out`` (the rows with their settings, :func:`with_settings`) and ``--plot``,
    together or not at all; then say what was written."""
    from ..simulator import benchmark_table, plot_speedup, write_frame
    from ..simulator.plot import describe_inputs
    from ..util.atomic import all_or_none

    with all_or_none():  # --out and --plot appear together or not at all
        if args.out:
            write_frame(with_settings(df, args), args.out)
        if args.plot and benchmarks:
            mean = benchmark_table(df).drop(columns="geomean").stack().rename("speedup_vs_ar").reset_index()
            mean.attrs = dict(df.attrs)
            plot_speedup(mean, args.plot, title=f"{args.mode} loop: mean speedup over {len(traces)} benchmarks "
                                                 f"vs ar\ncost {describe_inputs(df).partition('cost ')[2] or costs[0]}")
        elif args.plot:
            plot_speedup(df, args.plot)
    if args.out:
        rows = "trace, " if benchmarks else ("trace, cost, " if args.sweep else "")
        _wrote(args.out, f"{len(df)} rows, one per ({rows}policy, batch size)")
    if args.plot:
        _wrote(args.plot, "speedup plot")


def _run(args, console) -> None:
    """One ``dcut-sim`` invocation: a selection curve, several seeds, or load, build, run, report, write."""
    if args.selection_curve:
        _run_selection_curve(args, console)
        return
    if args.seeds != 1:
        _run_seeds(args, console)
        return
    traces, costs, benchmarks, config = _load(args)
    work = _build_work(args, traces, costs, config, benchmarks)
    df = _simulate(args, work, traces, costs, config, benchmarks)
    _report(args, console, df, traces, costs, benchmarks)
    _write(args, df, traces, costs, benchmarks)


def _wrote(path: str, what: str) -> None:
    """Say which file a run wrote (stderr, so stdout stays the table; also with --quiet)."""
    print(f"{PROG}: wrote {path} ({what})", file=sys.stderr)


def _policy_params(given: list[tuple[str, str, Any]], run: list[str] | None) -> dict[str, dict[str, Any]]:
    """``--param`` values per policy, checked before any work (names, keys given once, kinds, finite
    values: :func:`dcut_sched.policies.check_params`); a value out of a policy's range is refused when
    the run builds the policy, before any step."""
    from .. import policies

    params: dict[str, dict[str, Any]] = {}
    for policy, key, value in given:
        values = params.setdefault(policy, {})
        if key in values:
            raise UsageError(f"--param {policy}.{key} is given twice ({short_value(values[key])} and {short_value(value)}); "
                             f"give it once")
        values[key] = value
    for policy, values in params.items():
        where = f"--param {policy}.{next(iter(values))}"
        if policy not in policies.names():
            raise UsageError(f"{where}: unknown policy {policy!r}; known policies: {', '.join(policies.names())}")
        if run is not None and policy not in run:
            raise UsageError(f"{where}: policy {policy} is not run (--policies {','.join(run)}); add it to "
                             f"--policies or drop the parameter")
        try:
            policies.check_params(policy, values)  # names, keys, kinds; the run builds each policy once
        except ValueError as exc:
            raise UsageError(f"--param: {exc}") from None
    return params


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
