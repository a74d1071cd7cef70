"""Per-(policy, batch size) figures of simulated runs, and the results DataFrame.

Closed loop (steady state, the steps after the warm-up):

- ``tokens_per_s``: output tokens / simulated time (``1000 * sum(tokens) / sum(step_ms)``).
- ``speedup_vs_ar``: ``tokens_per_s`` / the ``ar`` run's ``tokens_per_s`` at the same batch size
  (docs/design.md §1, "Speedup").
- ``mean_tokens_per_step``: output tokens per request per step (exactly 1 for ``ar``; ``1 + tau`` for
  ``full`` on a position-indexed trace, tau the mean acceptance length).
- ``verified_tokens_per_step``: slots verified per request per step (``B`` for ``full``).
- ``waste_frac``: verified slots that produced no token / verified slots. A request that verifies
  ``L`` slots and produces ``verified_prefix_tokens(a, L)`` tokens used that many slots (the anchor's bonus token
  and the accepted drafts) and wasted the rest.
- ``mean_ratio``: mean over steps of ``num_tokens / (bs * B)`` (rho; a plain step counts ``1/B``).
- ``draft_frac``: share of steps that ran the draft model.

Open loop adds, over the requests after the warm-up arrivals: ``goodput_tokens_per_s`` (output
tokens of the requests that met the TPOT objective, all of them without one, divided by the span from
their first arrival to their last finish), ``tpot_ms_*`` (time per output token: decode time from the
start of the request's first decode step to its last, divided by its output tokens), ``ttft_ms_*``
(arrival to the end of the first decode step), ``e2e_ms_*`` (arrival to finish), as mean and
p50/p90/p99 (``numpy.percentile``, linear). Its ``speedup_vs_ar`` is the ``ar`` run's mean TPOT
divided by the policy's (decode speed at the same load); ``tokens_per_s`` is over the whole run.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.stats import gmean

from .loop import ClosedLoopRun, OpenLoopRun

__all__ = [
    "CLOSED_COLUMNS",
    "OPEN_COLUMNS",
    "add_speedups",
    "closed_loop_row",
    "open_loop_row",
    "speedup_table",
]

#: The leading columns of a closed-loop results frame, in order: the output contract that
#: reports and tests read by name.
CLOSED_COLUMNS = [
    "policy", "batch_size", "tokens_per_s", "speedup_vs_ar", "mean_tokens_per_step",
    "verified_tokens_per_step", "waste_frac", "mean_ratio", "draft_frac",
]
#: The latency columns open-loop frames add.
OPEN_COLUMNS = [
    "rate_rps", "goodput_tokens_per_s", "requests_per_s", "mean_batch_size",
    "tpot_ms_mean", "tpot_ms_p50", "tpot_ms_p90", "tpot_ms_p99",
    "ttft_ms_p50", "ttft_ms_p90", "ttft_ms_p99",
    "e2e_ms_p50", "e2e_ms_p90", "e2e_ms_p99",
]
PERCENTILES = (50, 90, 99)


def _step_figures(steps, sl: slice, block_size: int) -> dict:
    step_ms = steps.step_ms[sl]
    tokens = steps.tokens[sl]
    num_tokens = steps.num_tokens[sl]
    bs = steps.batch_size[sl]
    request_steps = int(bs.sum())
    total_tokens = int(tokens.sum())
    verified = int(num_tokens.sum())
    total_ms = float(step_ms.sum())
    return {
        "tokens_per_s": 1000.0 * total_tokens / total_ms if total_ms > 0 else float("nan"),
        "mean_tokens_per_step": total_tokens / request_steps,
        "verified_tokens_per_step": verified / request_steps,
        "waste_frac": (verified - total_tokens) / verified,
        "mean_ratio": float(np.mean(num_tokens / (bs * block_size))),
        "draft_frac": float(np.mean(steps.drafted[sl])),
        "mean_expected_tokens_per_step": float(steps.expected_tokens[sl].sum()) / request_steps,
        "steps": int(len(step_ms)),
        "request_steps": request_steps,
        "sim_time_s": total_ms / 1000.0,
        "output_tokens": total_tokens,
    }


def closed_loop_row(run: ClosedLoopRun) -> dict:
    """The steady-state figures of one closed-loop run (``speedup_vs_ar`` left NaN; see :func:`add_speedups`)."""
    sl = slice(run.warmup_steps, None)
    row = {"policy": run.policy, "batch_size": run.batch_size, "speedup_vs_ar": float("nan")}
    row.update(_step_figures(run.steps, sl, run.block_size))
    row.update({
        "warmup_steps": run.warmup_steps,
        "finished_requests": run.finished_requests,
        "trace_cycles": run.trace_cycles,
        "approximate": run.approximate,
    })
    return row


def _percentiles(values: np.ndarray, name: str) -> dict:
    if values.size == 0:
        return {f"{name}_p{p}": float("nan") for p in PERCENTILES}
    got = np.percentile(values, PERCENTILES)
    return {f"{name}_p{p}": float(v) for p, v in zip(PERCENTILES, got)}


def open_loop_row(run: OpenLoopRun, slo_tpot_ms: float | None = None) -> dict:
    """The figures of one open-loop run (``speedup_vs_ar`` left NaN; see :func:`add_speedups`).

    Args:
        slo_tpot_ms: TPOT objective; goodput counts only the requests that met it (None: all).
    """
    row = {"policy": run.policy, "batch_size": run.max_batch_size, "speedup_vs_ar": float("nan")}
    row.update(_step_figures(run.steps, slice(None), run.block_size))
    measured = slice(run.warmup_requests, None)
    arrival = run.arrival_ms[measured]
    finish = run.finish_ms[measured]
    out = run.output_tokens[measured]
    tpot = (finish - run.start_ms[measured]) / out
    ttft = run.first_token_ms[measured] - arrival
    e2e = finish - arrival
    good = np.ones(len(out), dtype=bool) if slo_tpot_ms is None else tpot <= slo_tpot_ms
    span_ms = float(finish.max() - arrival.min()) if len(out) else float("nan")
    row.update({
        "rate_rps": run.rate_rps,
        "goodput_tokens_per_s": 1000.0 * float(out[good].sum()) / span_ms,
        "requests_per_s": 1000.0 * len(out) / span_ms,
        "mean_batch_size": float(run.steps.batch_size.mean()),
        "tpot_ms_mean": float(tpot.mean()) if len(out) else float("nan"),
        **_percentiles(tpot, "tpot_ms"),
        **_percentiles(ttft, "ttft_ms"),
        **_percentiles(e2e, "e2e_ms"),
        "slo_tpot_ms": float("nan") if slo_tpot_ms is None else float(slo_tpot_ms),
        "slo_met_frac": float(good.mean()) if len(out) else float("nan"),
        "measured_requests": int(len(out)),
        "warmup_requests": run.warmup_requests,
        "prefill_s": run.prefill_ms_total / 1000.0,
        "trace_cycles": run.trace_cycles,
        "approximate": run.approximate,
    })
    return row


def add_speedups(df: pd.DataFrame, mode: str, baseline: str = "ar") -> pd.DataFrame:
    """Fill ``speedup_vs_ar`` from the ``baseline`` rows with the same batch size (and trace/curve).

    Closed loop: ``tokens_per_s / baseline tokens_per_s``; open loop: ``baseline tpot_ms_mean / tpot_ms_mean``.
    """
    keys = [k for k in ("trace", "cost", "batch_size") if k in df.columns]
    cols = ["tokens_per_s"] + (["tpot_ms_mean"] if mode == "open" else [])
    base = df.loc[df["policy"] == baseline, keys + cols].rename(columns={c: f"{c}_base" for c in cols})
    joined = df[keys + cols].merge(base, on=keys, how="left")
    if mode == "open":
        df["speedup_vs_ar"] = (joined["tpot_ms_mean_base"] / joined["tpot_ms_mean"]).to_numpy()
    else:
        df["speedup_vs_ar"] = (joined["tokens_per_s"] / joined["tokens_per_s_base"]).to_numpy()
    return df


def seed_spread(df: pd.DataFrame, value: str = "speedup_vs_ar") -> pd.DataFrame:
    """Mean and spread over seeds of ``value`` per (policy, batch size) (and trace/cost when present).

    Args:
        df: rows of several :func:`~dcut_sched.simulator.simulate` runs with a ``seed`` column.

    Returns:
        One row per group: ``speedup_mean``, ``speedup_std`` (sample standard deviation, ddof 1; NaN
        for one seed), ``speedup_min``, ``speedup_max``, ``tokens_per_s_mean``, ``seeds``.
    """
    keys = [k for k in ("trace", "cost", "policy", "batch_size") if k in df.columns]
    g = df.groupby(keys, sort=False)
    out = g[value].agg(speedup_mean="mean", speedup_std="std", speedup_min="min", speedup_max="max")
    out["tokens_per_s_mean"] = g["tokens_per_s"].mean()
    out["seeds"] = g["seed"].nunique()
    return out.reset_index()


def speedup_table(df: pd.DataFrame, value: str = "speedup_vs_ar") -> pd.DataFrame:
    """Policies x batch sizes of ``value``, plus a ``geomean`` column (``scipy.stats.gmean`` over batch sizes).

    Rows keep the order policies first appear in ``df``.
    """
    order = list(dict.fromkeys(df["policy"]))
    table = df.pivot_table(index="policy", columns="batch_size", values=value, aggfunc="first").reindex(order)
    table["geomean"] = [gmean(row.dropna()) if row.notna().any() and (row.dropna() > 0).all() else np.nan
                        for _, row in table.iterrows()]
    return table
