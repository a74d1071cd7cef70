"""The published protocol: the same policies on several benchmarks, mean speedup over them per batch size.

The D-Cut publication reports, per batch size, the **mean of the speedups over five benchmarks**
(GSM8K, MATH-500, HumanEval, MBPP, MT-Bench; greedy, one cost curve; docs/design.md §1 "Speedup").
:func:`simulate_benchmarks` runs :func:`~.simulate.simulate` once per trace (same options, same
seed, so every policy sees the same request sequence of each benchmark) and stacks the rows;
:func:`benchmark_table` reduces them to the published table: per policy and batch size the
arithmetic mean of ``speedup_vs_ar`` over the benchmarks, and per policy the geometric mean over all
(benchmark, batch size) settings (``scipy.stats.gmean``).
"""

from __future__ import annotations

import os
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd
from scipy.stats import gmean

from ..cost_curve import CostCurve
from ..traces import Trace
from .config import SimConfig
from .parallel import run_cells
from .simulate import _prepare, result_frame, run_tasks, sim_config

__all__ = ["benchmark_table", "simulate_benchmarks"]


def _benchmark_name(trace: Trace) -> str:
    return trace.metadata.get("dataset") or trace.name


def simulate_benchmarks(
    traces: Sequence[Trace | str | os.PathLike],
    cost: CostCurve | str | os.PathLike,
    config: SimConfig | None = None,
    *,
    on_run: Callable[[int, int, str], None] | None = None,
    jobs: int = 1,
    **options: Any,
) -> pd.DataFrame:
    """:func:`simulate` on each trace with the same cost curve and options; one row per (trace, policy, bs).

    Args:
        traces: the benchmarks' traces (objects or paths); all are loaded and checked before any runs.
        cost: one cost curve for all of them.
        config: the options (:class:`~.config.SimConfig`), the same for every trace.
        on_run: progress, called as ``on_run(done, total, label)`` over all traces' runs.
        jobs: worker processes shared by every trace's runs (:func:`~.parallel.run_cells`); the
            rows are the same for every ``jobs``.
        **options: SimConfig fields (policies, batch_sizes, num_steps, seed, ...), applied over ``config``.

    Returns:
        The stacked result rows with a ``benchmark`` column (the trace's ``dataset`` metadata, else its
        file stem) first; ``df.attrs`` as :func:`simulate`'s plus ``benchmarks`` (their names in order).

    Raises:
        TraceError / CostCurveError / SimulationError: as :func:`simulate`, for the first bad input.
    """
    if not traces:
        raise ValueError("no traces given")
    config = sim_config(config, **options)
    prepared = []
    for t in traces:  # every input loaded and checked before any run; the curve loaded once
        trace, cost, runs = _prepare(t, cost, config)  # the policies: built once, shared by every trace
        prepared.append((trace, cost, runs))
    loaded = [trace for trace, _, _ in prepared]
    names = [_benchmark_name(t) for t in loaded]
    if len(set(names)) != len(names):
        names = [t.name for t in loaded]
    per_trace = [run_tasks(trace, curve, config, runs) for trace, curve, runs in prepared]
    tasks = [(i, *t) for i, ts in enumerate(per_trace) for t in ts]
    total = len(tasks)

    def progress(done: int, n: int) -> None:
        if on_run is not None:
            i, label, _, bs, _ = tasks[n]
            on_run(done, total, f"{names[i]}: {label} bs={bs}")

    rows = run_cells([(trace, curve, config) for trace, curve, _ in prepared], tasks, jobs, progress)
    frames = []
    start = 0
    for (trace, curve, _), ts, name in zip(prepared, per_trace, names):
        df = result_frame(rows[start:start + len(ts)], trace, curve, config)
        start += len(ts)
        per_trace_attrs = df.attrs
        df.insert(0, "benchmark", name)
        frames.append(df)
    out = pd.concat(frames, ignore_index=True)
    out.attrs.update(dict(per_trace_attrs))
    out.attrs.update({
        "benchmarks": names,
        "trace": ", ".join(str(f["trace"].iat[0]) for f in frames),
        "approximate": bool(out["approximate"].any()),
        "trace_cycles": int(out["trace_cycles"].max()),
    })
    return out


def benchmark_table(df: pd.DataFrame, value: str = "speedup_vs_ar") -> pd.DataFrame:
    """Policies x batch sizes of the mean of ``value`` over benchmarks, plus ``geomean`` over all settings.

    Args:
        df: rows of :func:`simulate_benchmarks` (columns ``benchmark``, ``policy``, ``batch_size``, ``value``).

    Returns:
        One row per policy (in first-seen order), one column per batch size (ascending) holding
        ``mean over benchmarks of value``, and ``geomean``: the geometric mean of ``value`` over every
        (benchmark, batch size) setting of that policy (NaN if any is <= 0 or missing).
    """
    order = list(dict.fromkeys(df["policy"]))
    table = df.pivot_table(index="policy", columns="batch_size", values=value, aggfunc="mean").reindex(order)
    geo = []
    for policy in order:
        v = df.loc[df["policy"] == policy, value].to_numpy(dtype=np.float64)
        geo.append(float(gmean(v)) if v.size and np.all(v > 0) else np.nan)
    table["geomean"] = geo
    return table
