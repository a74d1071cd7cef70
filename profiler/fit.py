"""Fit the analytic model's efficiency factors to a measured or published curve, and fill its gaps.

The fit (``scipy.optimize.least_squares``, trust-region reflective with bounds) minimises the
squared *log* ratio ``log(model_ms / curve_ms)`` over the curve's ``measured`` and ``published``
verification rows, i.e. relative error, so that a 130 ms cell does not drown a 8 ms one. Free
parameters: ``eta_compute``, ``eta_memory``, ``eta_attention`` in (0, 1] and ``overhead_ms`` in
[0, 100]; ``smoothness`` is held fixed (it and the overhead trade off against each other on few
points). With fewer rows than free parameters the fit is refused.

:func:`fill_curve` keeps every row of the source curve as it is and adds the cells it lacks
(other batch sizes, the autoregressive point, draft steps) from the fitted model, marked
``provenance="fitted"``.
"""

from __future__ import annotations

import datetime as _dt
import re
from dataclasses import dataclass, replace
from typing import Any, Sequence

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from dcut_sched import CostCurve
from dcut_sched.cost_curve import DraftRow, VerifyRow

from .analytic import DraftSpec, Efficiency, draft_ms, forward_ms
from .devices import DeviceSpec
from .grid import DEFAULT_RATIOS, verify_tokens
from .shapes import ModelShape

__all__ = ["FitResult", "device_matches", "fill_curve", "fit_efficiency"]

FIT_PROVENANCES = ("measured", "published")
_FREE = ("eta_compute", "eta_memory", "eta_attention", "overhead_ms")
_LOWER = (1e-3, 1e-3, 1e-3, 0.0)
_UPPER = (1.0, 1.0, 1.0, 100.0)


@dataclass
class FitResult:
    """A fitted :class:`Efficiency` and how well it matches the rows it was fitted to.

    Attributes:
        efficiency: the fitted factors.
        residuals: DataFrame ``batch_size, num_tokens, curve_ms, model_ms, rel_err`` (model/curve - 1).
        rms_rel_err: root mean square of ``rel_err``.
        max_abs_rel_err: largest ``|rel_err|``.
        context_len: context length the model was evaluated at (the curve's).
        device: device whose peaks were used.
    """

    efficiency: Efficiency
    residuals: pd.DataFrame
    rms_rel_err: float
    max_abs_rel_err: float
    context_len: int
    device: DeviceSpec

    def summary(self) -> dict[str, Any]:
        """JSON-ready description (stored in curve files made with the fit)."""
        return {"efficiency": self.efficiency.to_dict(), "rms_rel_err": round(self.rms_rel_err, 5),
                "max_abs_rel_err": round(self.max_abs_rel_err, 5), "fitted_rows": int(len(self.residuals)),
                "device": self.device.key, "method": "scipy.optimize.least_squares on log(model/curve)"}


def device_matches(device: DeviceSpec, device_name: str | None) -> bool:
    """Whether a curve's ``hardware.device_name`` names ``device`` (exact name, or the key as a word:
    ``"NVIDIA H20"`` matches ``h20`` but ``"NVIDIA H200"`` does not)."""
    if not device_name:
        return False
    if device_name.strip().lower() == device.name.lower():
        return True
    return device.key in re.split(r"[^0-9a-z]+", device_name.lower())


def fit_efficiency(curve: CostCurve, shape: ModelShape, device: DeviceSpec, *, smoothness: float = 4.0,
                   start: Efficiency | None = None, provenances: Sequence[str] = FIT_PROVENANCES) -> FitResult:
    """Fit ``eta_compute, eta_memory, eta_attention, overhead_ms`` to ``curve``'s verification rows.

    Args:
        curve: measured or published curve of ``device`` (its ``context_len`` is used).
        shape: the model the curve was measured with.
        device: its peaks.
        smoothness: fixed ``p`` of the soft roofline.
        start: initial guess (default :class:`Efficiency` defaults).
        provenances: row provenances fitted to.

    Raises:
        ValueError: fewer usable rows than free parameters (4).
    """
    rows = [r for r in curve.verify if r.provenance in provenances]
    if len(rows) < len(_FREE):
        raise ValueError(f"{curve.path or 'cost curve'}: {len(rows)} measured/published verify rows; the fit needs at "
                         f"least {len(_FREE)} (one per efficiency factor)")
    bs = np.array([r.batch_size for r in rows], dtype=np.float64)
    tok = np.array([r.num_tokens for r in rows], dtype=np.float64)
    y = np.array([r.median_ms for r in rows], dtype=np.float64)
    ctx = int(curve.context_len)
    start = start or Efficiency(smoothness=smoothness)
    x0 = np.clip([getattr(start, k) for k in _FREE], np.add(_LOWER, 1e-6), np.subtract(_UPPER, 1e-6))

    def make(x: np.ndarray) -> Efficiency:
        return Efficiency(**dict(zip(_FREE, (float(v) for v in x))), smoothness=smoothness)

    def residual(x: np.ndarray) -> np.ndarray:
        return np.log(forward_ms(shape, device, make(x), bs, tok, ctx)) - np.log(y)

    sol = least_squares(residual, x0, bounds=(_LOWER, _UPPER), method="trf", x_scale="jac")
    eff = make(sol.x)
    model = forward_ms(shape, device, eff, bs, tok, ctx)
    rel = model / y - 1.0
    frame = pd.DataFrame({"batch_size": bs.astype(int), "num_tokens": tok.astype(int), "curve_ms": y,
                          "model_ms": model, "rel_err": rel})
    return FitResult(eff, frame, float(np.sqrt(np.mean(rel ** 2))), float(np.max(np.abs(rel))), ctx, device)


def fill_curve(curve: CostCurve, shape: ModelShape, fit: FitResult, *, batch_sizes: Sequence[int],
               ratios: Sequence[float] = DEFAULT_RATIOS, grid_step: int = 0, draft: DraftSpec | None = None,
               extra_hardware: dict[str, Any] | None = None, source: str | None = None) -> CostCurve:
    """``curve`` plus fitted rows for the cells of :func:`profiler.grid.verify_tokens` it lacks.

    Every source row is kept verbatim. Draft rows are added at ``batch_sizes`` lacking one when
    ``draft`` is given and is not ``none``.
    """
    have = {(r.batch_size, r.num_tokens) for r in curve.verify}
    verify = list(curve.verify)
    for bs in sorted(set(batch_sizes)):
        missing = [k for k in verify_tokens(bs, curve.block_size, ratios, grid_step) if (bs, k) not in have]
        if not missing:
            continue
        ms = forward_ms(shape, fit.device, fit.efficiency, bs, np.array(missing), curve.context_len)
        verify += [VerifyRow(bs, int(k), round(float(m), 4), provenance="fitted") for k, m in zip(missing, ms)]
    drafts = list(curve.draft)
    if draft is not None and draft.kind != "none":
        have_d = {r.batch_size for r in curve.draft}
        for bs in sorted(set(batch_sizes) - have_d):
            m = draft_ms(shape, draft, fit.device, fit.efficiency, bs, curve.block_size, curve.context_len)
            drafts.append(DraftRow(int(bs), round(float(m), 4), provenance="fitted"))
    hardware = dict(curve.hardware)
    hardware["fit"] = {**fit.summary(), "peak_bf16_tflops": fit.device.peak_bf16_tflops,
                       "hbm_tb_per_s": fit.device.hbm_tb_per_s, "device_source": fit.device.source}
    if extra_hardware:
        hardware.update(extra_hardware)
    model = dict(curve.model)
    if draft is not None:
        model["draft"] = draft.label()
    created = _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()
    return replace(curve, verify=verify, draft=drafts, hardware=hardware, model=model, path=None, created=created,
                   source=source if source is not None else curve.source)
