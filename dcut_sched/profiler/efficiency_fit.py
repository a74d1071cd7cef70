"""Fit the analytic model's efficiency factors to a measured or published curve, and fill its gaps.

Two cell families are fitted together (``scipy.optimize.least_squares``, trust-region reflective
with bounds), minimising the squared *log* ratio ``log(model_ms / curve_ms)`` over the curve's
``measured`` and ``published`` rows, i.e. relative error, so that a 130 ms cell does not drown a 8 ms
one:

- **verify** rows ``C_verify(bs, num_tokens)`` (:func:`dcut_sched.profiler.analytic.forward_ms`);
- **ar** rows ``C_ar(bs)``, the plain decode step on its own path (:func:`dcut_sched.profiler.analytic.ar_step_ms`).

Shared between the families (the same GEMMs read the same weights on the same device):
``eta_compute``, ``eta_memory``. Per family: ``eta_attention`` (verification's variable-length
kernel vs the decode kernel) and ``overhead_ms`` (piecewise vs full graphs). Bounds: eta in (0, 1],
overhead in [0, 100] ms; ``smoothness`` is held fixed (it and the overhead trade off against each
other on few points). With fewer verify rows than the verify path's 4 factors the fit is refused;
with fewer than 2 ``ar`` rows the decode path is not fitted (``EfficiencyFit.ar_efficiency`` is None)
and no ``ar`` rows are filled: the curve then keeps an assumed plain step rather than an invented one.

:func:`fill_curve` keeps every row of the source curve as it is and adds the cells it lacks
(other batch sizes, draft steps, plain-decode steps) from the fitted model, marked
``provenance="fitted"``; with another ``block_size`` it derives a curve for that block size (verify
cells up to ``bs * B``, the draft step of B slots).
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
from dcut_sched.cost_curve import ArRow, DraftRow, VerifyRow

from .analytic import DraftSpec, Efficiency, ar_step_ms, draft_ms, forward_ms
from .devices import DeviceSpec
from .grid import DEFAULT_RATIOS, verify_tokens
from .shapes import ModelShape

__all__ = ["FAMILIES", "EfficiencyFit", "device_matches", "fill_curve", "fit_efficiency"]

FIT_PROVENANCES = ("measured", "published")
FAMILIES = ("verify", "ar")
_SHARED = ("eta_compute", "eta_memory")
_PER_PATH = ("eta_attention", "overhead_ms")
_LOWER = {"eta_compute": 1e-3, "eta_memory": 1e-3, "eta_attention": 1e-3, "overhead_ms": 0.0}
_UPPER = {"eta_compute": 1.0, "eta_memory": 1.0, "eta_attention": 1.0, "overhead_ms": 100.0}
MIN_AR_ROWS = 2


@dataclass
class EfficiencyFit:
    """Fitted :class:`Efficiency` factors of the verification and decode paths and how well they match.

    Attributes:
        efficiency: the verification path's factors (also used for the draft step).
        ar_efficiency: the plain-decode path's factors, or None when the curve had fewer than
            :data:`MIN_AR_ROWS` measured/published ``ar`` rows.
        residuals: DataFrame ``family, batch_size, num_tokens, curve_ms, model_ms, rel_err``
            (model/curve - 1; ``num_tokens = batch_size`` for ``ar`` rows).
        rms_rel_err: root mean square of ``rel_err`` over all fitted rows.
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
    ar_efficiency: Efficiency | None = None

    def family_errors(self) -> pd.DataFrame:
        """Per family: ``family, rows, rms_rel_err, max_abs_rel_err``."""
        g = self.residuals.groupby("family", sort=False)["rel_err"]
        out = pd.DataFrame({"rows": g.size(), "rms_rel_err": g.apply(lambda x: float(np.sqrt(np.mean(x ** 2)))),
                            "max_abs_rel_err": g.apply(lambda x: float(np.max(np.abs(x))))})
        return out.reset_index()

    def summary(self) -> dict[str, Any]:
        """JSON-ready description (stored in curve files made with the fit)."""
        fams = {r.family: {"rows": int(r.rows), "rms_rel_err": round(float(r.rms_rel_err), 5),
                           "max_abs_rel_err": round(float(r.max_abs_rel_err), 5)}
                for r in self.family_errors().itertuples()}
        return {"efficiency": self.efficiency.to_dict(),
                "ar_efficiency": None if self.ar_efficiency is None else self.ar_efficiency.to_dict(),
                "rms_rel_err": round(self.rms_rel_err, 5), "max_abs_rel_err": round(self.max_abs_rel_err, 5),
                "fitted_rows": int(len(self.residuals)), "families": fams, "device": self.device.key,
                "method": "scipy.optimize.least_squares on log(model/curve), verify and ar families together "
                          "(shared eta_compute, eta_memory; per-path eta_attention, overhead_ms)"}


def device_matches(device: DeviceSpec, device_name: str | None) -> bool:
    """Whether a curve's ``hardware.device_name`` names ``device`` (exact name, or the key as a word:
    ``"NVIDIA H20"`` matches ``h20`` but ``"NVIDIA H200"`` does not)."""
    if not device_name:
        return False
    if device_name.strip().lower() == device.name.lower():
        return True
    return device.key in re.split(r"[^0-9a-z]+", device_name.lower())


def fit_efficiency(curve: CostCurve, shape: ModelShape, device: DeviceSpec, *, smoothness: float = 4.0,
                   start: Efficiency | None = None, provenances: Sequence[str] = FIT_PROVENANCES) -> EfficiencyFit:
    """Fit the verify and decode paths' factors to ``curve``'s verify and ``ar`` rows together.

    Args:
        curve: measured or published curve of ``device`` (its ``context_len`` is used).
        shape: the model the curve was measured with.
        device: its peaks.
        smoothness: fixed ``p`` of the soft roofline.
        start: initial guess (default :class:`Efficiency` defaults) for both paths.
        provenances: row provenances fitted to.

    Raises:
        ValueError: fewer usable verify rows than the verification path's free parameters (4).
    """
    rows = [r for r in curve.verify if r.provenance in provenances]
    ar_rows = [r for r in curve.ar if r.provenance in provenances]
    n_free = len(_SHARED) + len(_PER_PATH)
    if len(rows) < n_free:
        raise ValueError(f"{curve.path or 'cost curve'}: {len(rows)} measured/published verify rows; the fit needs at "
                         f"least {n_free} (one per efficiency factor)")
    fit_ar = len(ar_rows) >= MIN_AR_ROWS
    names = [*_SHARED, *_PER_PATH] + ([f"ar_{k}" for k in _PER_PATH] if fit_ar else [])
    lower = [_LOWER[n.removeprefix("ar_")] for n in names]
    upper = [_UPPER[n.removeprefix("ar_")] for n in names]
    bs = np.array([r.batch_size for r in rows], dtype=np.float64)
    tok = np.array([r.num_tokens for r in rows], dtype=np.float64)
    y = np.array([r.median_ms for r in rows], dtype=np.float64)
    ar_bs = np.array([r.batch_size for r in ar_rows], dtype=np.float64) if fit_ar else np.zeros(0)
    ar_y = np.array([r.median_ms for r in ar_rows], dtype=np.float64) if fit_ar else np.zeros(0)
    ctx = int(curve.context_len)
    start = start or Efficiency(smoothness=smoothness)
    x0 = np.clip([getattr(start, n.removeprefix("ar_")) for n in names], np.add(lower, 1e-6), np.subtract(upper, 1e-6))

    def make(x: np.ndarray) -> tuple[Efficiency, Efficiency | None]:
        v = dict(zip(names, (float(t) for t in x)))
        shared = {k: v[k] for k in _SHARED}
        verify_eff = Efficiency(**shared, **{k: v[k] for k in _PER_PATH}, smoothness=smoothness)
        ar_eff = Efficiency(**shared, **{k: v[f"ar_{k}"] for k in _PER_PATH}, smoothness=smoothness) if fit_ar else None
        return verify_eff, ar_eff

    def residual(x: np.ndarray) -> np.ndarray:
        v_eff, a_eff = make(x)
        res = np.log(forward_ms(shape, device, v_eff, bs, tok, ctx)) - np.log(y)
        if a_eff is None:
            return res
        return np.concatenate([res, np.log(ar_step_ms(shape, device, a_eff, ar_bs, ctx)) - np.log(ar_y)])

    sol = least_squares(residual, x0, bounds=(lower, upper), method="trf", x_scale="jac")
    eff, ar_eff = make(sol.x)
    model = forward_ms(shape, device, eff, bs, tok, ctx)
    frames = [pd.DataFrame({"family": "verify", "batch_size": bs.astype(int), "num_tokens": tok.astype(int),
                            "curve_ms": y, "model_ms": model, "rel_err": model / y - 1.0})]
    if ar_eff is not None:
        ar_model = ar_step_ms(shape, device, ar_eff, ar_bs, ctx)
        frames.append(pd.DataFrame({"family": "ar", "batch_size": ar_bs.astype(int), "num_tokens": ar_bs.astype(int),
                                    "curve_ms": ar_y, "model_ms": ar_model, "rel_err": ar_model / ar_y - 1.0}))
    frame = pd.concat(frames, ignore_index=True)
    rel = frame["rel_err"].to_numpy()
    return EfficiencyFit(eff, frame, float(np.sqrt(np.mean(rel ** 2))), float(np.max(np.abs(rel))), ctx, device,
                     ar_efficiency=ar_eff)


def fill_curve(curve: CostCurve, shape: ModelShape, fit: EfficiencyFit, *, batch_sizes: Sequence[int],
               ratios: Sequence[float] = DEFAULT_RATIOS, grid_step: int = 0, draft: DraftSpec | None = None,
               extra_hardware: dict[str, Any] | None = None, source: str | None = None,
               block_size: int | None = None) -> CostCurve:
    """``curve`` plus fitted rows for the cells of :func:`dcut_sched.profiler.grid.verify_tokens` it lacks.

    Every source row is kept verbatim. Draft rows are added at ``batch_sizes`` lacking one when
    ``draft`` is given and is not ``none``; ``ar`` rows at ``batch_sizes`` lacking one when the fit
    has a decode path (``fit.ar_efficiency``).

    Args:
        block_size: B of the curve to make (default: the source's). Another B derives that block
            size's curve from the fit: source verify rows with ``num_tokens <= bs * B`` are kept (a
            forward of N tokens for bs requests is the same forward whatever B it was measured
            for), the cells of the new B's grid are filled, the source's draft rows (drafting a block
            of the old B) are dropped and the draft step of B slots is filled from the model, and the
            ``ar`` rows (independent of B) are kept. ``draft_first`` rows (the drafter's forward over
            a step's verified tokens) are kept like verify rows, where ``num_tokens <= bs * B``;
            ``step_overhead`` rows are kept (drafted rows keyed by K where ``num_tokens <= bs * B``). The counts of dropped verify,
            draft and draft_first rows are recorded in ``hardware.fit.derived_block_size``.
    """
    block = curve.block_size if block_size is None else int(block_size)
    if block < 1:
        raise ValueError(f"block_size must be >= 1, got {block}")
    keep = [r for r in curve.verify if r.num_tokens <= r.batch_size * block]
    have = {(r.batch_size, r.num_tokens) for r in keep}
    verify = list(keep)
    for bs in sorted(set(batch_sizes)):
        missing = [k for k in verify_tokens(bs, block, ratios, grid_step) if (bs, k) not in have]
        if not missing:
            continue
        ms = forward_ms(shape, fit.device, fit.efficiency, bs, np.array(missing), curve.context_len)
        verify += [VerifyRow(bs, int(k), round(float(m), 4), provenance="fitted") for k, m in zip(missing, ms)]
    drafts = list(curve.draft) if block == curve.block_size else []
    draft_first = [r for r in curve.draft_first if r.num_tokens <= r.batch_size * block]
    # K-keyed drafted overhead rows are cells like draft_first's: kept where num_tokens <= bs * B
    overhead = [r for r in curve.step_overhead if r.num_tokens is None or r.num_tokens <= r.batch_size * block]
    if draft is not None and draft.kind != "none":
        have_d = {r.batch_size for r in drafts}
        for bs in sorted(set(batch_sizes) - have_d):
            m = draft_ms(shape, draft, fit.device, fit.efficiency, bs, block, curve.context_len)
            drafts.append(DraftRow(int(bs), round(float(m), 4), provenance="fitted"))
    ar = list(curve.ar)
    if fit.ar_efficiency is not None:
        have_a = {r.batch_size for r in ar}
        for bs in sorted(set(batch_sizes) - have_a):
            m = ar_step_ms(shape, fit.device, fit.ar_efficiency, bs, curve.context_len)
            ar.append(ArRow(int(bs), round(float(m), 4), provenance="fitted"))
    hardware = dict(curve.hardware)
    hardware["fit"] = {**fit.summary(), "peak_bf16_tflops": fit.device.peak_bf16_tflops,
                       "hbm_tb_per_s": fit.device.hbm_tb_per_s, "device_source": fit.device.source}
    if block != curve.block_size:
        hardware["fit"]["derived_block_size"] = {"from": curve.block_size, "to": block,
                                                 "dropped_verify_rows": len(curve.verify) - len(keep),
                                                 "dropped_draft_rows": len(curve.draft),
                                                 "dropped_draft_first_rows": len(curve.draft_first) - len(draft_first),
                                                 "dropped_step_overhead_rows": len(curve.step_overhead) - len(overhead)}
    if extra_hardware:
        hardware.update(extra_hardware)
    model = dict(curve.model)
    if draft is not None:
        model["draft"] = draft.label()
    created = _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()
    return replace(curve, verify=verify, draft=drafts, draft_first=draft_first, step_overhead=overhead, ar=ar,
                   hardware=hardware,
                   model=model, path=None, created=created, block_size=block,
                   source=source if source is not None else curve.source, loaded_schema=None)
