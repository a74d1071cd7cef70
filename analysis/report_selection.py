"""Report section: the selection curve (accepted tokens vs verification budget), uniform vs top-K.

Batches are step-weighted (:func:`dcut_sched.selection_curve`, what ``dcut-sim --selection-curve``
plots): their rows are the positions a full-verification replay visits, as a running engine meets
them, and the registry's ``uniform`` and ``topk`` plan them at ``rho = K / (bs * B)``.

The curve is set next to the published D-Cut figures for DFlash on GSM8K at bs = 32, B = 16 (tokens
per batch step at 128/256/384/512 verified slots; the numbers this project's GSM8K preset was fitted
to, dcut_sched/data/traces/README.md).
"""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np
import pandas as pd
from report_figures import figure_module, save_figure

import dcut_sched as d
from dcut_sched.traces import Trace

__all__ = ["PUBLISHED_BATCH_SIZE", "PUBLISHED_BUDGETS", "PUBLISHED_GSM8K", "plot_selection", "selection_table"]

PUBLISHED_BATCH_SIZE = 32
PUBLISHED_BUDGETS = (128, 256, 384, 512)
#: Published accepted tokens per step (DFlash, Qwen3-8B, GSM8K, bs = 32, B = 16), by policy.
PUBLISHED_GSM8K = {
    "uniform": (101.4, 152.9, 183.0, 201.2),
    "topk": (124.6, 190.8, 200.9, 201.2),
}


def selection_table(
    traces: Sequence[str], *, batch_size: int = PUBLISHED_BATCH_SIZE, budgets: Sequence[int] = PUBLISHED_BUDGETS,
    num_batches: int = 300, seed: int = 0, published: dict[str, Sequence[float]] | None = None,
    published_trace: str | None = None,
) -> pd.DataFrame:
    """Accepted tokens per step at each budget for ``uniform`` and ``topk``, one row per (trace, policy, budget).

    Args:
        traces: trace paths (block size B each; budgets must lie in ``[bs, bs*B]``).
        batch_size, budgets, num_batches, seed: as :func:`dcut_sched.selection_curve`.
        published: published ``accepted_tokens`` per policy, aligned with ``budgets``.
        published_trace: the trace (path) the published figures belong to; its rows get
            ``published_tokens`` and ``rel_error`` (simulated / published - 1).

    Returns:
        Columns ``trace_name, weighting, policy, budget, ratio, accepted_tokens, expected_tokens`` (+
        ``published_tokens, rel_error``, NaN where not applicable).
    """
    parts = []
    for path in traces:
        trace = Trace.load(path)
        df = d.selection_curve(trace, batch_size, budgets=list(budgets), num_batches=num_batches, seed=seed)
        df.insert(1, "weighting", "step-weighted")
        df.insert(0, "trace_name", os.path.splitext(os.path.basename(str(path)))[0])
        df["published_tokens"] = np.nan
        if published is not None and path == published_trace:
            for policy, values in published.items():
                for k, v in zip(budgets, values):
                    df.loc[(df["policy"] == policy) & (df["budget"] == k), "published_tokens"] = v
        parts.append(df)
    out = pd.concat(parts, ignore_index=True)
    out["rel_error"] = out["accepted_tokens"] / out["published_tokens"] - 1.0
    return out[["trace_name", "weighting", "policy", "batch_size", "budget", "ratio", "accepted_tokens", "expected_tokens",
                "published_tokens", "rel_error"]]


def plot_selection(df: pd.DataFrame, path: str | os.PathLike) -> None:
    """One panel per trace: accepted tokens vs budget, uniform and top-K; published points as crosses."""
    plt = figure_module()
    names = list(dict.fromkeys(df["trace_name"]))
    fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 3.8), squeeze=False)
    colours = {"uniform": "tab:blue", "topk": "tab:orange"}
    for ax, name in zip(axes[0], names):
        rows = df[df["trace_name"] == name]
        for (policy, weighting), sub in rows.groupby(["policy", "weighting"], sort=False):
            label = "confidence top-K" if policy == "topk" else policy
            style = "o-" if weighting == "step-weighted" else "s:"
            ax.plot(sub["budget"], sub["accepted_tokens"], style, color=colours.get(policy),
                    label=f"{label} ({weighting})", markersize=4)
            if weighting != "step-weighted":
                continue
            pub = sub.dropna(subset=["published_tokens"])
            if len(pub):
                ax.plot(pub["budget"], pub["published_tokens"], "x--", color=colours.get(policy), alpha=0.7,
                        label=f"{label} (published)")
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("verification budget K (slots per step)")
        ax.set_xticks(sorted(rows["budget"].unique()))
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel(f"accepted tokens per step (bs={int(df['batch_size'].iat[0])})")
    save_figure(fig, path)
