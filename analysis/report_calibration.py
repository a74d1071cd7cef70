"""Report section: calibration of draft confidence, and what online calibration does to throughput.

Reliability (held-out): the trace's requests are split in two halves (seeded). A fresh
:class:`dcut_sched.calibration.OnlineCalibrator` observes the first half's rows in trace order, in
steps of ``fit_batch_size`` rows with every slot verified (``lengths = B``), as
``RatioController.observe`` would; then, on the second half, each *observed* draft slot (every slot up
to and including the first rejection: :func:`dcut_sched.calibration.censored_outcomes`) contributes
one (predicted probability, accepted?) pair, the prediction being the raw confidence or the fitted
map of it. Per equal-width confidence bin: mean prediction, observed acceptance rate, count
(``scipy.stats.binned_statistic``); ECE by :func:`dcut_sched.calibration.expected_calibration_error`
(Guo et al. 2017, eq. 3) over the same bins.

Throughput: :func:`dcut_sched.simulate` with and without ``calibrator=OnlineCalibrator()`` (what
``dcut-sim --calibrate`` does): the calibrator starts from the identity map in every run and learns
online from the censored outcomes of the run's own verified steps.
"""

from __future__ import annotations

import os
from typing import Callable, Sequence

import numpy as np
import pandas as pd
from report_figures import figure_module, save_figure
from scipy.stats import binned_statistic

import dcut_sched as d
from dcut_sched.calibration import OnlineCalibrator, censored_outcomes, expected_calibration_error
from dcut_sched.traces import Trace

__all__ = ["CONFIDENCE_POLICIES", "calibrated_throughput", "plot_reliability", "reliability"]

#: Policies whose plans depend on the confidences (the others are unaffected by a calibrator).
CONFIDENCE_POLICIES = ("threshold", "topk", "dcut", "fine")


def _fit_split(trace: Trace, seed: int) -> np.ndarray:
    """Bool mask ``[num_rows]``: rows of the (seeded) half of the requests the calibrator learns from."""
    ids = np.unique(trace.request_id)
    rng = np.random.default_rng(seed)
    rng.shuffle(ids)
    return np.isin(trace.request_id, ids[: len(ids) // 2])


def reliability(
    trace_path: str, *, seed: int = 0, num_bins: int = 15, fit_batch_size: int = 16,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Held-out reliability of raw vs online-calibrated confidence (module docstring).

    Returns:
        ``(bins, summary)``: ``bins`` has one row per (map, bin) with ``map`` in {raw, calibrated},
        ``bin_lo, bin_hi, mean_prob, accept_rate, count``; ``summary`` one row per map with ``ece``,
        ``fit_requests, test_requests, test_slots``.
    """
    trace = Trace.load(trace_path)
    block = trace.block_size
    fit = _fit_split(trace, seed)
    conf = trace.conf.astype(np.float64)
    accept = trace.accept_len.astype(np.int64)
    cal = OnlineCalibrator(block)
    rows = np.flatnonzero(fit)
    for start in range(0, len(rows), fit_batch_size):
        r = rows[start : start + fit_batch_size]
        cal.observe(conf[r], accept[r], np.full(len(r), block))
    cal.refit()
    test = ~fit
    observed, accepted = censored_outcomes(accept[test], np.full(int(test.sum()), block), block - 1)
    outcome = accepted[observed].astype(np.float64)
    edges = np.linspace(0.0, 1.0, num_bins + 1)
    name = os.path.splitext(os.path.basename(str(trace_path)))[0]
    bins, summary = [], []
    for label, prob in (("raw", conf[test]), ("calibrated", cal.transform(conf[test]))):
        p = prob[observed]
        count, _, _ = binned_statistic(p, p, statistic="count", bins=edges)
        mean_p, _, _ = binned_statistic(p, p, statistic="mean", bins=edges)
        rate, _, _ = binned_statistic(p, outcome, statistic="mean", bins=edges)
        bins.append(pd.DataFrame({"trace_name": name, "map": label, "bin_lo": edges[:-1], "bin_hi": edges[1:],
                                  "mean_prob": mean_p, "accept_rate": rate, "count": count.astype(np.int64)}))
        summary.append({"trace_name": name, "map": label, "ece": expected_calibration_error(p, outcome, num_bins),
                        "mean_prob": float(p.mean()), "accept_rate": float(outcome.mean()),
                        "fit_requests": int(len(np.unique(trace.request_id[fit]))),
                        "test_requests": int(len(np.unique(trace.request_id[test]))), "test_slots": int(p.size)})
    return pd.concat(bins, ignore_index=True), pd.DataFrame(summary)


def plot_reliability(bins: pd.DataFrame, summary: pd.DataFrame, path: str | os.PathLike) -> None:
    """Reliability diagram, one panel per trace: acceptance rate vs mean prediction per bin, raw and calibrated."""
    plt = figure_module()
    names = list(dict.fromkeys(bins["trace_name"]))
    fig, axes = plt.subplots(1, len(names), figsize=(4.0 * len(names), 4.0), squeeze=False)
    colours = {"raw": "tab:gray", "calibrated": "tab:blue"}
    for ax, name in zip(axes[0], names):
        ax.plot([0, 1], [0, 1], "k--", linewidth=1, label="perfect calibration")
        for label in ("raw", "calibrated"):
            b = bins[(bins["trace_name"] == name) & (bins["map"] == label) & (bins["count"] > 0)]
            ece = float(summary[(summary["trace_name"] == name) & (summary["map"] == label)]["ece"].iat[0])
            ax.plot(b["mean_prob"], b["accept_rate"], marker="o", color=colours[label],
                    label=f"{label} (ECE {ece:.3f})")
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_aspect("equal")
        ax.grid(True, alpha=0.3)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("predicted P(accept | earlier drafts accepted)")
        ax.legend(fontsize=7, loc="upper left")
    axes[0][0].set_ylabel("observed acceptance rate (held-out requests)")
    save_figure(fig, path)


def calibrated_throughput(
    trace_paths: Sequence[str], cost_path: str, batch_sizes: Sequence[int], *, policies: Sequence[str] = CONFIDENCE_POLICIES,
    num_steps: int, warmup_steps: int, seed: int, on_run: Callable[[int, int, str], None] | None = None,
) -> pd.DataFrame:
    """Tokens/s with raw vs online-calibrated confidences, per (trace, policy, bs).

    Returns:
        Columns ``trace_name, cost, policy, batch_size, speedup_raw, speedup_calibrated,
        tokens_per_s_raw, tokens_per_s_calibrated, change`` (calibrated / raw tokens/s - 1).
    """
    parts = []
    for path in trace_paths:
        frames = {}
        for label, calibrator in (("raw", None), ("calibrated", OnlineCalibrator())):
            frames[label] = d.simulate(path, cost_path, policies=list(policies), batch_sizes=list(batch_sizes),
                                       num_steps=num_steps, warmup_steps=warmup_steps, seed=seed,
                                       calibrator=calibrator, on_run=on_run)
        raw = frames["raw"].set_index(["policy", "batch_size"])
        cal = frames["calibrated"].set_index(["policy", "batch_size"])
        df = pd.DataFrame({
            "speedup_raw": raw["speedup_vs_ar"], "speedup_calibrated": cal["speedup_vs_ar"],
            "tokens_per_s_raw": raw["tokens_per_s"], "tokens_per_s_calibrated": cal["tokens_per_s"],
        }).reset_index()
        df = df[df["policy"] != "ar"]
        df["change"] = df["tokens_per_s_calibrated"] / df["tokens_per_s_raw"] - 1.0
        df.insert(0, "cost", os.path.splitext(os.path.basename(str(cost_path)))[0])
        df.insert(0, "trace_name", os.path.splitext(os.path.basename(str(path)))[0])
        parts.append(df)
    return pd.concat(parts, ignore_index=True)
