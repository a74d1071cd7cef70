"""``dcut-sim``'s run modes: a selection curve, several seeds, or load, build and run a simulation.

Every input and output path is checked, and the :class:`~dcut_sched.simulator.SimConfig` built and
checked against each (trace, curve) pair, before the size line and any run; the outputs are
:mod:`.sim_output`'s.
"""

from __future__ import annotations

import contextlib
import filecmp
import itertools
import os
from pathlib import Path
from typing import Any, Sequence

from .args import MAX_SEED, check_json_input, check_paths, same_file, short_value
from .errors import UsageError
from .graph_tokens import check_graph_tokens
from .sim_output import PLOT_SUFFIXES, PROG, TABLE_SUFFIXES, with_settings, wrote

DEFAULT_SCHEDULER_TIMEOUT_S = 10.0  # dcut_sched.simulator.sweep.DEFAULT_SCHEDULER_TIMEOUT_S (not imported: --help stays light)
#: The most sampled requests of a selection curve, --selection-bs x --selection-batches (arrays of
#: that many rows x B per budget; the default is 64 x 200 = 12,800).
MAX_SELECTION_SAMPLES = 1_000_000


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


def run_selection_curve(args, console) -> None:
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
    wrote(args.selection_curve, f"selection curve at bs {args.selection_bs}, {len(df)} rows" if suffix not in
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


def run_seeds(args, console) -> None:
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
    if args.param:  # a value out of a policy's range (uniform.rho=1.5) is refused naming --param
        from ..simulator import SimulationError

        try:
            config.built_policies  # built once here and kept: every run works on a reset copy
        except SimulationError as exc:
            raise UsageError(f"--param: {exc}; give a value in the range dcut-sim --help lists") from None
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


def _check_warmup(warmup: int, steps: int, mode: str) -> None:
    if mode == "closed" and warmup >= steps:
        raise UsageError(f"--warmup {warmup:,} must be less than --steps {steps:,} (the warm-up steps are left out of "
                         f"the figures, so none would be left): lower --warmup or raise --steps")


def load_inputs(args):
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
        missing = " and ".join(([] if args.sweep else ["--sweep"])
                               + ([] if args.scheduler_address else ["--scheduler-address ADDR"]))
        empty = " (the address given is empty)" if args.scheduler_address is not None and args.sweep else ""
        raise UsageError(f"--scheduler dask runs a --sweep on a cluster: add {missing}{empty}")
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


def build_work(args, traces: list[str], costs: list[str], config, benchmarks: bool) -> _Work:
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


def simulate_runs(args, work: _Work, traces: list[str], costs: list[str], config, benchmarks: bool):
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


def _policy_params(given: list[tuple[str, str, Any]], run: list[str] | None) -> dict[str, dict[str, Any]]:
    """``--param`` values per policy, checked before any work (names, keys given once, kinds, finite
    values: :func:`dcut_sched.policies.check_params`); a value out of a policy's range is refused when
    :func:`_sim_config` builds the policies, naming ``--param``."""
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
