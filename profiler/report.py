"""Readable rich tables of a profile: the curve summary, the fit, the interpolation error."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
from rich.table import Table

from dcut_sched import CostCurve
from dcut_sched.tables import write_table

from .fit import FitResult
from .grid import DEFAULT_RATIOS, bucket_tokens

__all__ = ["curve_table", "fit_table", "interp_table", "noise_summary", "write_frame"]


def curve_table(curve: CostCurve, ratios: Sequence[float] = DEFAULT_RATIOS, title: str | None = None) -> Table:
    """Per batch size: AR ms, each bucket's ms, draft ms, cells and median (p80-p20)/median spread."""
    prov = {(r.batch_size, r.num_tokens): r for r in curve.verify}
    t = Table(title=title or f"{curve.model.get('name')} on {curve.hardware.get('device_name')} "
                             f"({curve.hardware.get('backend')}), B={curve.block_size}, context {curve.context_len}: "
                             f"ms per verify at the AR point and at each rho, ms per draft step")
    t.add_column("bs", justify="right")
    t.add_column("AR", justify="right")
    for r in ratios:
        t.add_column(f"{r:g}", justify="right")
    t.add_column("draft", justify="right")
    t.add_column("cells", justify="right")
    t.add_column("spread", justify="right")
    for bs in curve.batch_sizes:
        def cell(k: int) -> str:
            row = prov.get((bs, k))
            if row is None:
                return "-"
            mark = "" if row.provenance in ("measured", "analytic") else f" ({row.provenance[0]})"
            return f"{row.median_ms:.4g}{mark}"
        draft = next((d for d in curve.draft if d.batch_size == bs), None)
        rows = [r for r in curve.verify if r.batch_size == bs]
        spreads = [(r.p80_ms - r.p20_ms) / r.median_ms for r in rows if r.p20_ms and r.p80_ms]
        t.add_row(str(bs), cell(bs), *[cell(k) for k in bucket_tokens(bs, curve.block_size, ratios)],
                  "-" if draft is None else f"{draft.median_ms:.4g}" + (
                      "" if draft.provenance in ("measured", "analytic") else f" ({draft.provenance[0]})"),
                  str(len(rows)),
                  f"{100 * np.median(spreads):.1f}%" if spreads else "-")
    t.caption = "(p) published, (f) fitted; spread = median over cells of (p80 - p20) / median"
    return t


def noise_summary(curve: CostCurve) -> dict[str, float]:
    """Median and max over cells of (p80 - p20) / median, in percent (``nan`` without percentiles)."""
    rel = [(r.p80_ms - r.p20_ms) / r.median_ms for r in [*curve.verify, *curve.draft] if r.p20_ms and r.p80_ms]
    if not rel:
        return {"median_spread_pct": float("nan"), "max_spread_pct": float("nan")}
    return {"median_spread_pct": 100 * float(np.median(rel)), "max_spread_pct": 100 * float(np.max(rel))}


def fit_table(fit: FitResult, title: str = "efficiency fit") -> Table:
    """The fitted factors and the residual of every fitted row."""
    e = fit.efficiency
    t = Table(title=title, caption=(f"eta_compute={e.eta_compute:.3f} eta_memory={e.eta_memory:.3f} "
                                    f"eta_attention={e.eta_attention:.3f} overhead={e.overhead_ms:.3f} ms "
                                    f"(p={e.smoothness:g}); rms {100 * fit.rms_rel_err:.2f}%, "
                                    f"max {100 * fit.max_abs_rel_err:.2f}%"))
    for col in ("bs", "num_tokens", "curve ms", "model ms", "error"):
        t.add_column(col, justify="right")
    for r in fit.residuals.itertuples():
        t.add_row(str(r.batch_size), str(r.num_tokens), f"{r.curve_ms:.2f}", f"{r.model_ms:.2f}", f"{100 * r.rel_err:+.1f}%")
    return t


def interp_table(err: pd.DataFrame) -> Table:
    """:func:`profiler.interp_error.interpolation_error` as a table."""
    t = Table(title="coarse grid (AR + 4 buckets) vs measured dense grid: prediction error of the dense points",
              caption="lin: numpy.interp between coarse points; curve: CostCurve lookup (isotonic + PCHIP)")
    for col in ("bs", "pts", "lin max ms", "lin max %", "lin mean %", "curve max ms", "curve max %",
                "curve mean %"):
        t.add_column(col, justify="right")
    for r in err.itertuples():
        t.add_row(str(r.batch_size), str(r.dense_points), f"{r.linear_max_ms:.3g}", f"{r.linear_max_pct:.1f}",
                  f"{r.linear_mean_pct:.1f}", f"{r.curve_max_ms:.3g}", f"{r.curve_max_pct:.1f}", f"{r.curve_mean_pct:.1f}")
    return t


def write_frame(frame: pd.DataFrame, path: str | Path) -> None:
    """Write a DataFrame with the project's one table writer (:func:`dcut_sched.tables.write_table`).

    Raises:
        ValueError: a suffix other than .csv, .json or .parquet.
    """
    write_table(frame, path)
