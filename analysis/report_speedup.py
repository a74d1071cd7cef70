"""Report section: speedup over ``ar`` vs batch size, every registered policy, per trace family.

A *family* is a set of (trace, cost curve) pairs simulated at the same batch sizes with
:func:`dcut_sched.simulate` (closed loop, the published benchmark). The family's summary is the
geometric mean over its traces of each (policy, batch size) speedup (``scipy.stats.gmean``), laid out
as in the D-Cut paper: rows = policies, columns = batch sizes, then the geometric mean over batch
sizes (:func:`dcut_sched.simulator.speedup_table`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable, Sequence

import pandas as pd
from scipy.stats import gmean

import dcut_sched as d
from dcut_sched.simulator import plot_speedup, speedup_table

__all__ = ["Family", "family_speedups", "family_table", "plot_family", "run_family"]


@dataclass
class Family:
    """Traces simulated together on one cost curve.

    Attributes:
        key: short name used in file names (``speedup-<key>.png``).
        title: one line saying what the family is (plot title, table caption).
        traces: trace file paths.
        cost: cost-curve JSON path (its block size must match every trace's).
        batch_sizes: closed-loop batch sizes.
        note: caveat printed under the family's table (e.g. "what-if pairing").
    """

    key: str
    title: str
    traces: Sequence[str]
    cost: str
    batch_sizes: Sequence[int]
    note: str = ""
    policies: Sequence[str] | None = field(default=None)


def run_family(
    family: Family, *, num_steps: int, warmup_steps: int, seed: int,
    on_run: Callable[[int, int, str], None] | None = None,
) -> pd.DataFrame:
    """Simulate every trace of ``family`` (all registered policies unless ``family.policies``).

    Returns the concatenated :func:`dcut_sched.simulate` frames with a ``family`` column and a
    ``trace_name`` column (file stem).
    """
    parts = []
    for path in family.traces:
        df = d.simulate(path, family.cost, policies=family.policies, batch_sizes=list(family.batch_sizes),
                        num_steps=num_steps, warmup_steps=warmup_steps, seed=seed, on_run=on_run)
        df.insert(0, "trace_name", os.path.splitext(os.path.basename(str(path)))[0])
        df.insert(0, "family", family.key)
        parts.append(df)
    return pd.concat(parts, ignore_index=True)


def family_speedups(df: pd.DataFrame) -> pd.DataFrame:
    """Per (policy, batch size): the geometric mean of ``speedup_vs_ar`` over the family's traces.

    Args:
        df: rows of one family (:func:`run_family`).

    Returns:
        Columns ``policy, batch_size, speedup_vs_ar, num_traces`` in the policies' first-seen order.
    """
    order = list(dict.fromkeys(df["policy"]))
    out = (df.groupby(["policy", "batch_size"], sort=False)["speedup_vs_ar"]
             .agg(speedup_vs_ar=gmean, num_traces="count").reset_index())
    out["policy"] = pd.Categorical(out["policy"], categories=order, ordered=True)
    out = out.sort_values(["policy", "batch_size"]).reset_index(drop=True)
    out["policy"] = out["policy"].astype(str)
    return out


def family_table(df: pd.DataFrame) -> pd.DataFrame:
    """The paper-style table of one family: policies x batch sizes (+ ``geomean``), traces pooled by gmean."""
    return speedup_table(family_speedups(df))


def plot_family(df: pd.DataFrame, path: str | os.PathLike, title: str) -> None:
    """Speedup vs batch size of one family (gmean over its traces), one line per policy, 1.0 marked."""
    summary = family_speedups(df)
    summary.attrs["mode"] = "closed"
    plot_speedup(summary, path, title=title)
