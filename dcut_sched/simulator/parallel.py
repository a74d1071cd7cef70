"""Independent simulation runs spread over worker processes, with the rows a serial run gives.

A run of :func:`~.simulate.simulate` (one policy at one batch size over one trace and cost curve)
depends on nothing but its inputs: the policy runs on a reset deep copy, the request sequence comes
from the config's seed. So the runs of a table (the main job: 5 benchmarks x 5 policies x 5 batch
sizes) can go to any process in any order, and their rows, put back in task order, are the serial
rows exactly (tests/sim/test_parallel.py compares them byte for byte).

The inputs (traces, cost curves, configs) reach each worker once, through the pool's initializer,
not with every task. Workers ignore SIGINT/SIGTERM: Ctrl-C reaches the parent, which stops them.
"""

from __future__ import annotations

import os
import signal
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any, Callable, Sequence

from ..cost_curve import CostCurve, CostCurveRangeError
from ..policies import Policy
from ..traces import Trace
from .config import SimConfig, SimulationError
from .loop import run_closed_loop, run_open_loop
from .results import closed_loop_row, open_loop_row

__all__ = ["run_cells", "run_one", "usable_cores", "worker_ignores_signals"]

#: Per worker process: the ``(trace, cost, config)`` inputs that tasks index (set by ``_init``).
_INPUTS: list[tuple[Any, Any, Any]] = []


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS reports it, else the count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def worker_ignores_signals() -> None:
    """Pool initializer: the worker leaves SIGINT/SIGTERM to the parent, which stops it (no worker
    tracebacks on Ctrl-C)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def run_one(trace: Trace, cost: CostCurve, config: SimConfig, label: str, policy: Policy, bs: int,
            rate: float | None) -> dict:
    """One (policy, batch size) run of :func:`simulate`: its result row (before speedups).

    Raises:
        SimulationError: a budget outside the cost curve or no captured graph cell for it, naming
            the policy and the batch size.
    """
    try:
        if config.mode == "closed":
            return closed_loop_row(run_closed_loop(trace, cost, policy, bs, config, label=label))
        run = run_open_loop(trace, cost, policy, bs, config, rate_rps=rate, label=label)
        return open_loop_row(run, config.slo_tpot_ms)
    except CostCurveRangeError as exc:
        raise SimulationError(f"policy {label!r} at batch size {bs}: {exc}") from None
    except ValueError as exc:
        if config.graph_token_counts is None or "no captured cell" not in str(exc):
            raise
        raise SimulationError(f"policy {label!r} at batch size {bs}: {exc} (graph_token_counts)") from None


def _init(inputs: list[tuple[Any, Any, Any]]) -> None:
    worker_ignores_signals()
    _INPUTS[:] = inputs


def _run(task: tuple) -> dict:
    index, *rest = task
    trace, cost, config = _INPUTS[index]
    return run_one(trace, cost, config, *rest)


def run_cells(inputs: Sequence[tuple[Any, Any, Any]], tasks: Sequence[tuple], jobs: int,
              on_done: Callable[[int, int], None] | None = None) -> list[dict]:
    """The result row of every task, in task order.

    Args:
        inputs: ``(trace, cost, config)`` triples (picklable; sent once to each worker).
        tasks: ``(input_index, label, policy, batch_size, rate_rps)`` each; the arguments of
            :func:`run_one` after its inputs.
        jobs: worker processes; 1 (or a single task) runs everything in this process.
        on_done: called as ``on_done(done, task_index)`` as each task finishes.

    Raises:
        Whatever the first failing task raised (the others are cancelled); ``ValueError`` for
        ``jobs < 1``.
    """
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be an integer >= 1, got {jobs!r}")
    rows: list[dict | None] = [None] * len(tasks)
    if jobs == 1 or len(tasks) <= 1:
        for n, (index, *rest) in enumerate(tasks):
            trace, cost, config = inputs[index]
            rows[n] = run_one(trace, cost, config, *rest)
            if on_done is not None:
                on_done(n + 1, n)
        return rows  # type: ignore[return-value]
    # Largest batch sizes first: they take longest, so the last tasks to finish are short ones.
    order = sorted(range(len(tasks)), key=lambda n: -int(tasks[n][3]))
    pool = ProcessPoolExecutor(max_workers=min(jobs, len(tasks)), initializer=_init, initargs=(list(inputs),))
    try:
        futures = {pool.submit(_run, tasks[n]): n for n in order}
        for done, fut in enumerate(as_completed(futures), start=1):
            rows[futures[fut]] = fut.result()
            if on_done is not None:
                on_done(done, futures[fut])
    except KeyboardInterrupt:
        for proc in list((getattr(pool, "_processes", None) or {}).values()):
            proc.terminate()
        raise
    finally:
        pool.shutdown(cancel_futures=True)
    return rows  # type: ignore[return-value]
