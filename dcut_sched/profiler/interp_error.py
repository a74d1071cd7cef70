"""How far lookups on the coarse 4-bucket grid are from the dense grid that was also measured.

At each batch size with dense cells, the *coarse* points are the autoregressive point
(num_tokens = bs) and the D-Cut buckets; every other measured token count is a *dense* point.
Two predictions of each dense point from the coarse points alone are compared with its measured
median:

- ``linear``: ``numpy.interp`` through the coarse medians (what a 4-graph engine that interpolates
  linearly would assume);
- ``curve``: :meth:`dcut_sched.CostCurve.verify_ms` of a curve holding only the coarse rows
  (isotonic + PCHIP, the lookup the simulator and controller use).

Errors are ``prediction - measured`` in ms and relative to measured.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import numpy as np
import pandas as pd

from dcut_sched import CostCurve

from .grid import DEFAULT_RATIOS, bucket_tokens

__all__ = ["interpolation_error", "interpolation_points"]


def interpolation_points(curve: CostCurve, ratios: Sequence[float] = DEFAULT_RATIOS) -> pd.DataFrame:
    """One row per dense point: ``batch_size, num_tokens, measured_ms, linear_ms, curve_ms``.

    Empty when no batch size has token counts beyond the coarse grid.
    """
    rows = []
    for bs in curve.batch_sizes:
        tokens = curve.token_counts(bs)
        coarse = sorted({bs, *bucket_tokens(bs, curve.block_size, ratios)} & set(tokens))
        dense = [k for k in tokens if k not in coarse and coarse[0] <= k <= coarse[-1]] if len(coarse) >= 2 else []
        if not dense:
            continue
        by_tok = {r.num_tokens: r for r in curve.verify if r.batch_size == bs}
        coarse_ms = np.array([by_tok[k].median_ms for k in coarse])
        coarse_curve = replace(curve, verify=[by_tok[k] for k in coarse], draft=[], path=None)
        linear = np.interp(dense, coarse, coarse_ms)
        lookup = coarse_curve.verify_ms(bs, np.array(dense))
        for k, lin, cur in zip(dense, linear, lookup):
            rows.append({"batch_size": bs, "num_tokens": k, "measured_ms": by_tok[k].median_ms,
                         "linear_ms": float(lin), "curve_ms": float(cur)})
    return pd.DataFrame(rows, columns=["batch_size", "num_tokens", "measured_ms", "linear_ms", "curve_ms"])


def interpolation_error(curve: CostCurve, ratios: Sequence[float] = DEFAULT_RATIOS) -> pd.DataFrame:
    """Per batch size: ``dense_points``, and for ``linear`` and ``curve`` the max |error| in ms, the max
    and mean |relative error| in percent (columns ``linear_max_ms, linear_max_pct, linear_mean_pct,
    curve_max_ms, curve_max_pct, curve_mean_pct``)."""
    pts = interpolation_points(curve, ratios)
    cols = ["batch_size", "dense_points", "linear_max_ms", "linear_max_pct", "linear_mean_pct",
            "curve_max_ms", "curve_max_pct", "curve_mean_pct"]
    if pts.empty:
        return pd.DataFrame(columns=cols)
    out = []
    for bs, g in pts.groupby("batch_size"):
        row = {"batch_size": int(bs), "dense_points": int(len(g))}
        for how in ("linear", "curve"):
            err = g[f"{how}_ms"].to_numpy() - g["measured_ms"].to_numpy()
            rel = 100.0 * np.abs(err) / g["measured_ms"].to_numpy()
            row.update({f"{how}_max_ms": float(np.abs(err).max()), f"{how}_max_pct": float(rel.max()),
                        f"{how}_mean_pct": float(rel.mean())})
        out.append(row)
    return pd.DataFrame(out, columns=cols)
