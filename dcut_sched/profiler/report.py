"""Readable rich tables of a profile: the curve summary, the fit, the interpolation error."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd
from rich.table import Table

from dcut_sched import CostCurve
from dcut_sched.util.tables import write_table

from .efficiency_fit import EfficiencyFit
from .grid import DEFAULT_RATIOS, bucket_tokens

__all__ = ["curve_table", "fit_table", "interp_table", "noise_summary", "write_frame"]


def _mark(provenance: str) -> str:
    return "" if provenance in ("measured", "analytic") else f" ({provenance[0]})"


def _spread(row) -> float | None:
    return (row.p80_ms - row.p20_ms) / row.median_ms if row.p20_ms and row.p80_ms else None


def curve_table(curve: CostCurve, ratios: Sequence[float] = DEFAULT_RATIOS, title: str | None = None) -> Table:
    """Per batch size: the plain AR step ``C_ar``, the verify ms at num_tokens = bs and at each bucket,
    the draft ms, cells and the median (p80-p20)/median spread of the batch size's cells."""
    prov = {(r.batch_size, r.num_tokens): r for r in curve.verify}
    ar_rows = {r.batch_size: r for r in curve.ar}
    t = Table(title=title or f"{curve.model.get('name')} on {curve.hardware.get('device_name')} "
                             f"({curve.hardware.get('backend')}), B={curve.block_size}, context {curve.context_len}: "
                             f"ms per plain AR step, per verify at num_tokens = bs and at each rho, per draft step")
    t.add_column("bs", justify="right")
    t.add_column("AR step", justify="right")
    t.add_column("verify bs", justify="right")
    for r in ratios:
        t.add_column(f"{r:g}", justify="right")
    t.add_column("draft", justify="right")
    t.add_column("cells", justify="right")
    t.add_column("spread", justify="right")
    for bs in sorted(set(curve.batch_sizes) | set(ar_rows)):
        def cell(k: int) -> str:
            row = prov.get((bs, k))
            return "-" if row is None else f"{row.median_ms:.4g}{_mark(row.provenance)}"

        draft = next((d for d in curve.draft if d.batch_size == bs), None)
        ar = ar_rows.get(bs)
        if ar is not None:
            ar_text = f"{ar.median_ms:.4g}{_mark(ar.provenance)}"
        elif curve.ar_assumed and (bs, bs) in prov:
            ar_text = f"{prov[(bs, bs)].median_ms:.4g} (assumed)"
        else:
            ar_text = "-"
        rows = [r for r in curve.verify if r.batch_size == bs]
        spreads = [x for x in map(_spread, [*rows, *([ar] if ar else []), *([draft] if draft else [])]) if x is not None]
        t.add_row(str(bs), ar_text, cell(bs), *[cell(k) for k in bucket_tokens(bs, curve.block_size, ratios)],
                  "-" if draft is None else f"{draft.median_ms:.4g}{_mark(draft.provenance)}",
                  str(len(rows) + (ar is not None) + (draft is not None)),
                  f"{100 * np.median(spreads):.1f}%" if spreads else "-")
    t.caption = (f"AR step provenance: {curve.ar_provenance}. (p) published, (f) fitted; spread = median over the "
                 f"batch size's cells of (p80 - p20) / median")
    return t


def noise_summary(curve: CostCurve) -> dict[str, Any]:
    """Median and max over cells (verify, ar, draft) of (p80 - p20) / median, in percent (``nan``
    without percentiles), the key of the widest cell and the median per family."""
    rel = [(x, f"{fam}:{r.batch_size}" + (f":{r.num_tokens}" if fam == "verify" else ""), fam)
           for fam, rows in (("verify", curve.verify), ("ar", curve.ar), ("draft", curve.draft))
           for r in rows for x in [_spread(r)] if x is not None]
    if not rel:
        return {"median_spread_pct": float("nan"), "max_spread_pct": float("nan"), "max_spread_cell": None,
                "median_spread_pct_by_family": {}}
    vals = np.array([x for x, _, _ in rel])
    by_family = {fam: 100 * float(np.median([x for x, _, f in rel if f == fam]))
                 for fam in dict.fromkeys(f for _, _, f in rel)}
    return {"median_spread_pct": 100 * float(np.median(vals)), "max_spread_pct": 100 * float(np.max(vals)),
            "max_spread_cell": rel[int(np.argmax(vals))][1], "median_spread_pct_by_family": by_family}


def fit_table(fit: EfficiencyFit, title: str = "efficiency fit") -> Table:
    """The fitted factors of both paths, the residual of every fitted row, and the error per family."""
    def factors(e) -> str:
        return (f"eta_compute={e.eta_compute:.3f} eta_memory={e.eta_memory:.3f} eta_attention={e.eta_attention:.3f} "
                f"overhead={e.overhead_ms:.3f} ms")

    fams = "; ".join(f"{r.family}: {r.rows} rows, rms {100 * r.rms_rel_err:.2f}%, max {100 * r.max_abs_rel_err:.2f}%"
                     for r in fit.family_errors().itertuples())
    ar = "not fitted (fewer than 2 measured/published ar rows)" if fit.ar_efficiency is None else factors(fit.ar_efficiency)
    t = Table(title=title, caption=(f"verify path: {factors(fit.efficiency)} (p={fit.efficiency.smoothness:g})\n"
                                    f"decode (ar) path: {ar}\n{fams}"))
    for col in ("family", "bs", "num_tokens", "curve ms", "model ms", "error"):
        t.add_column(col, justify="right")
    for r in fit.residuals.itertuples():
        t.add_row(r.family, str(r.batch_size), str(r.num_tokens), f"{r.curve_ms:.2f}", f"{r.model_ms:.2f}",
                  f"{100 * r.rel_err:+.1f}%")
    return t


def interp_table(err: pd.DataFrame) -> Table:
    """:func:`dcut_sched.profiler.interp_error.interpolation_error` as a table."""
    t = Table(title="coarse grid (num_tokens = bs + 4 buckets) vs measured dense grid: prediction error of the dense points",
              caption="lin: numpy.interp between coarse points; curve: CostCurve lookup (isotonic + PCHIP)")
    for col in ("bs", "pts", "lin max ms", "lin max %", "lin mean %", "curve max ms", "curve max %",
                "curve mean %"):
        t.add_column(col, justify="right")
    for r in err.itertuples():
        t.add_row(str(r.batch_size), str(r.dense_points), f"{r.linear_max_ms:.3g}", f"{r.linear_max_pct:.1f}",
                  f"{r.linear_mean_pct:.1f}", f"{r.curve_max_ms:.3g}", f"{r.curve_max_pct:.1f}", f"{r.curve_mean_pct:.1f}")
    return t


def write_frame(frame: pd.DataFrame, path: str | Path) -> None:
    """Write a DataFrame with the project's one table writer (:func:`dcut_sched.util.tables.write_table`).

    Raises:
        ValueError: a suffix other than .csv, .json or .parquet.
    """
    write_table(frame, path)
