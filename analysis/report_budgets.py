"""Report section: where ``fine`` beats ``dcut``, from the budgets each chooses step by step.

Both policies run through :func:`dcut_sched.simulator.run_closed_loop`, whose ``steps``
(:class:`dcut_sched.simulator.SimulatedSteps`) already hold, per engine step, the verified budget
``num_tokens`` (K), whether the step drafted, the tokens produced and the step time; nothing is
added to the simulator. Per (trace, policy, bs) the summary gives the steady-state tokens/s, the
mean ratio rho = K / (bs*B), the number of distinct budgets used, the share of steps that skipped
drafting, and the tokens per step and ms per step that make up the throughput.
"""

from __future__ import annotations

import os
from typing import Callable, Sequence

import numpy as np
import pandas as pd
from report_figures import figure_module, save_figure

import dcut_sched as d
from dcut_sched.cost_curve import CostCurve
from dcut_sched.simulator import run_closed_loop
from dcut_sched.traces import Trace

__all__ = ["VARIANTS", "budget_steps", "budget_summary", "plot_budgets"]


def _dcut_fine_ratios(bs: int, block: int):
    """``dcut`` with a ratio per slot count (k/B): D-Cut's objective over finer budgets (every multiple of
    bs; ``fine`` chooses among every count)."""
    return d.policies.get("dcut", ratios=[k / block for k in range(1, block + 1)])


def _fine_buckets(bs: int, block: int):
    """``fine`` restricted to ``dcut``'s 4 bucket budgets: ``fine``'s objective, D-Cut's granularity."""
    return d.policies.get("fine", allowed_num_tokens=[int(k) for k in d.policies.get("dcut").budgets(bs, block)])


#: Policy variants by label: a registry name, or a factory ``(bs, B) -> Policy`` (ablations).
VARIANTS = {
    "dcut": "dcut",
    "dcut(ratios=k/B)": _dcut_fine_ratios,
    "fine(4 buckets)": _fine_buckets,
    "fine": "fine",
}


def budget_steps(
    trace_path: str, cost_path: str, batch_sizes: Sequence[int], *, policies: Sequence[str] = ("dcut", "fine"),
    num_steps: int = 1500, seed: int = 0, on_run: Callable[[str], None] | None = None,
) -> pd.DataFrame:
    """One row per engine step of each (policy, bs) closed-loop run.

    Args:
        policies: labels of :data:`VARIANTS` (registry names or ablations).

    Returns:
        Columns ``trace_name, policy, batch_size, step, num_tokens, ratio, drafted, tokens, step_ms``
        (``ratio = num_tokens / (bs*B)``; a plain step verifies bs slots, ratio 1/B).
    """
    trace = Trace.load(trace_path)
    cost = CostCurve.load(cost_path, check_hardware=False)
    name = os.path.splitext(os.path.basename(str(trace_path)))[0]
    parts = []
    for bs in batch_sizes:
        for policy in policies:
            spec = VARIANTS.get(policy, policy)
            pol = d.policies.get(spec) if isinstance(spec, str) else spec(int(bs), trace.block_size)
            run = run_closed_loop(trace, cost, pol, int(bs), num_steps=num_steps, seed=seed, label=policy)
            s = run.steps
            parts.append(pd.DataFrame({
                "trace_name": name, "policy": policy, "batch_size": int(bs), "step": np.arange(len(s)),
                "num_tokens": s.num_tokens, "ratio": s.num_tokens / (bs * trace.block_size), "drafted": s.drafted,
                "tokens": s.tokens, "step_ms": s.step_ms,
            }))
            if on_run is not None:
                on_run(f"{name} {policy} bs={bs}")
    return pd.concat(parts, ignore_index=True)


def budget_summary(steps: pd.DataFrame, warmup_steps: int) -> pd.DataFrame:
    """Steady-state figures (steps from ``warmup_steps`` on) per (trace, policy, bs).

    Columns: ``tokens_per_s`` (1000 * tokens / ms), ``tokens_per_step``, ``ms_per_step``,
    ``mean_ratio``, ``distinct_budgets``, ``skipped_draft_frac`` (steps without a draft), and
    ``vs_dcut`` (this row's tokens/s over the ``dcut`` row's at the same trace and bs).
    """
    ss = steps[steps["step"] >= warmup_steps]
    g = ss.groupby(["trace_name", "policy", "batch_size"], sort=False)
    out = g.agg(tokens=("tokens", "sum"), ms=("step_ms", "sum"), steps=("step", "count"),
                mean_ratio=("ratio", "mean"), distinct_budgets=("num_tokens", "nunique"),
                drafted=("drafted", "mean")).reset_index()
    out["tokens_per_s"] = 1000.0 * out["tokens"] / out["ms"]
    out["tokens_per_step"] = out["tokens"] / out["steps"]
    out["ms_per_step"] = out["ms"] / out["steps"]
    out["skipped_draft_frac"] = 1.0 - out["drafted"]
    base = out[out["policy"] == "dcut"].set_index(["trace_name", "batch_size"])["tokens_per_s"]
    out["vs_dcut"] = out["tokens_per_s"].to_numpy() / base.reindex(
        pd.MultiIndex.from_frame(out[["trace_name", "batch_size"]])).to_numpy()
    return out[["trace_name", "policy", "batch_size", "tokens_per_s", "vs_dcut", "tokens_per_step", "ms_per_step",
                "mean_ratio", "distinct_budgets", "skipped_draft_frac", "steps"]]


def plot_budgets(steps: pd.DataFrame, path: str | os.PathLike, *, first_step: int, num_shown: int = 150,
                 policies: Sequence[str] = ("dcut", "fine"), batch_sizes: Sequence[int] | None = None) -> None:
    """Grid: rows = traces, columns = batch sizes; the ratio K/(bs*B) each policy chose over ``num_shown`` steps.

    Plain (no-draft) steps of ``fine`` are marked with a dot at rho = 1/B.
    """
    plt = figure_module()
    steps = steps[steps["policy"].isin(list(policies))]
    if batch_sizes is not None:
        steps = steps[steps["batch_size"].isin(list(batch_sizes))]
    names = list(dict.fromkeys(steps["trace_name"]))
    sizes = sorted(steps["batch_size"].unique())
    fig, axes = plt.subplots(len(names), len(sizes), figsize=(3.6 * len(sizes), 3.1 * len(names)),
                             squeeze=False, sharey=True)
    colours = {"dcut": "tab:red", "fine": "tab:green"}
    window = steps[(steps["step"] >= first_step) & (steps["step"] < first_step + num_shown)]
    for r, name in enumerate(names):
        for c, bs in enumerate(sizes):
            ax = axes[r][c]
            sub = window[(window["trace_name"] == name) & (window["batch_size"] == bs)]
            for policy, rows in sub.groupby("policy", sort=False):
                ax.step(rows["step"], rows["ratio"], where="post", color=colours.get(policy), label=policy,
                        linewidth=1)
                plain = rows[~rows["drafted"]]
                if len(plain):
                    ax.plot(plain["step"], plain["ratio"], ".", color=colours.get(policy), markersize=3,
                            label=f"{policy}: no draft")
            ax.set_ylim(0, 1.05)
            ax.grid(True, alpha=0.3)
            ax.set_title(f"{name}\nbs={bs}", fontsize=8)
            if c == 0:
                ax.set_ylabel("verification ratio K/(bs*B)")
            if r == len(names) - 1:
                ax.set_xlabel("engine step")
            if r == 0 and c == 0:
                ax.legend(fontsize=7)
    save_figure(fig, path)
