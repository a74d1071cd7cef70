"""The drafter's calibration prior: the ``calibration.json`` format (:class:`CalibrationPrior`,
``dcut.calibration-prior/1``, one intercept per depth and one slope on the logit), its
maximum-likelihood fit on fully verified blocks (:func:`fit_prior`) and the before/after evidence
(:func:`calibration_report`). One format in one place; docs/design.md §2.7.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field
from scipy.optimize import minimize

from ..util.atomic import atomic_write_text
from ..util.inputs import InputFileError, parse_json_strict, read_text
from ..util.validation import validate
from .metrics import CONF_EPS, expected_calibration_error, logistic_map, logit, reached_slots

__all__ = ["PRIOR_FORMAT", "PRIOR_NAME", "CalibrationPrior", "CalibrationPriorError", "calibration_report", "fit_prior"]

#: The ``format`` field of a calibration prior file.
PRIOR_FORMAT = "dcut.calibration-prior/1"
#: The prior's file name inside a drafter folder (read by the checkpoint loader and the vLLM plugin).
PRIOR_NAME = "calibration.json"
_Intercept = Annotated[float, Field(ge=-50.0, le=50.0, allow_inf_nan=False)]


class CalibrationPriorError(ValueError):
    """A calibration prior file that cannot be used; the message names the file, the field and the fix."""


class CalibrationPrior(BaseModel):
    """A drafter's per-depth calibration: ``P(draft t accepted | drafts < t accepted, c_t) =
    sigmoid(intercepts[t-1] + slope * logit(c_t))``; depths beyond the last intercept reuse it.

    The form of vLLM's acceptance estimator (an intercept per depth, one slope on the logit of the
    confidence). ``intercepts = [0], slope = 1`` is the identity (:meth:`identity`). ``provenance``
    records how it was fitted (command, seed, data, log-loss and ECE before/after); it is not read.
    """

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    format: Literal["dcut.calibration-prior/1"] = PRIOR_FORMAT
    intercepts: list[_Intercept] = Field(min_length=1, max_length=1024)
    slope: float = Field(gt=0.0, le=100.0, allow_inf_nan=False)
    provenance: dict[str, Any] = Field(default_factory=dict)

    @classmethod
    def identity(cls) -> "CalibrationPrior":
        """The prior that says the raw confidence is already calibrated."""
        return cls(intercepts=[0.0], slope=1.0)

    @property
    def is_identity(self) -> bool:
        return self.slope == 1.0 and all(a == 0.0 for a in self.intercepts)

    def intercepts_for(self, num_depths: int) -> np.ndarray:
        """``[num_depths]`` float64 intercepts of depths ``1..num_depths`` (the last one reused beyond)."""
        a = np.asarray(self.intercepts, dtype=np.float64)
        return a[np.minimum(np.arange(num_depths), a.size - 1)]

    def probability(self, conf: np.ndarray) -> np.ndarray:
        """The prior's acceptance probability of ``conf [..., D]`` (depth = last axis), float64."""
        conf = np.asarray(conf, dtype=np.float64)
        return logistic_map(conf, self.intercepts_for(conf.shape[-1]), np.full(conf.shape[-1], self.slope))

    # ------------------------------------------------------------------ files
    @classmethod
    def load(cls, path: str | os.PathLike) -> "CalibrationPrior":
        """Read and validate a prior file.

        Raises:
            CalibrationPriorError: unreadable, not strict JSON, or a field missing / of the wrong
                type or range (one line naming the file, the field and the fix).
        """
        fix = ("refit it with `dcut-drafter calibrate --draft DIR --out DIR/calibration.json` (or delete it to run "
               "without a prior)")
        try:
            raw = parse_json_strict(read_text(path, "a calibration prior"), str(path))
        except InputFileError as exc:
            raise CalibrationPriorError(f"{exc}; {fix}") from None
        return validate(cls, raw, str(path), fix, CalibrationPriorError,
                        extra="is not a field of a calibration prior")

    @classmethod
    def from_folder(cls, folder: str | os.PathLike | None) -> "CalibrationPrior | None":
        """The prior of a drafter folder (its :data:`PRIOR_NAME`), ``None`` when it has none (or
        ``folder`` is not a local folder, e.g. a model name on a hub).

        Raises:
            CalibrationPriorError: the file is there but malformed, or something else has its name
                (a folder, a link that leads nowhere): a prior the drafter was given is never skipped.
        """
        if folder is None:
            return None
        path = Path(folder) / PRIOR_NAME
        if path.is_file():
            return cls.load(path)
        if os.path.lexists(path):
            what = "a folder" if path.is_dir() else "not a file (a link that leads nowhere, or a special file)"
            raise CalibrationPriorError(f"{path}: is {what}, not a calibration prior; remove it (to run without a "
                                        "prior, or before `dcut-drafter calibrate --draft DIR` refits one)")
        return None

    def save(self, path: str | os.PathLike) -> None:
        """Write the prior atomically (JSON, indented)."""
        atomic_write_text(path, json.dumps(self.model_dump(), indent=2) + "\n")


def fit_prior(conf: np.ndarray, accept_len: np.ndarray, num_slots: np.ndarray | None = None, *,
              min_reached: int = 50, provenance: dict[str, Any] | None = None) -> CalibrationPrior:
    """Maximum-likelihood :class:`CalibrationPrior` of fully verified blocks (docs/design.md §2.7).

    The reached slots (:func:`reached_slots`) of depths ``1..D`` get one intercept each, where D is
    the last depth such that every depth up to it has at least ``min_reached`` reached slots; deeper
    slots share depth D's intercept (as the prior is applied). One slope on ``logit(conf)``. Fitted
    with ``scipy.optimize.minimize`` (L-BFGS-B, analytic gradient; intercepts bounded to [-30, 30],
    slope to [1e-3, 100], so perfectly separable data stays finite).

    Args:
        conf: ``[N, B-1]`` raw confidences of N blocks; accept_len: ``[N]`` drafts accepted with every
            slot verified; num_slots: ``[N]`` slots each block could check (default ``B-1``).

    Raises:
        ValueError: shapes disagree, or depth 1 has fewer than ``min_reached`` reached slots.
    """
    conf = np.asarray(conf, dtype=np.float64)
    accept_len = np.asarray(accept_len)
    if conf.ndim != 2 or accept_len.shape != (conf.shape[0],):
        raise ValueError(f"fit_prior: conf must be [N, B-1] and accept_len [N]; got {conf.shape} and "
                         f"{accept_len.shape}")
    reached, accepted = reached_slots(accept_len, conf.shape[1], num_slots)
    counts = reached.sum(0)
    if counts[0] < min_reached:
        raise ValueError(f"fit_prior: {int(counts[0])} reached slots at depth 1, fewer than min_reached="
                         f"{min_reached}; give more prompts or tokens")
    num_fit = int(np.argmin(counts >= min_reached)) if not (counts >= min_reached).all() else conf.shape[1]
    depth = np.broadcast_to(np.minimum(np.arange(conf.shape[1]), num_fit - 1), conf.shape)[reached]
    x = logit(conf[reached])
    y = accepted[reached].astype(np.float64)

    def nll(theta: np.ndarray) -> tuple[float, np.ndarray]:
        z = theta[depth] + theta[-1] * x
        p = 0.5 * (1.0 + np.tanh(0.5 * z))
        loss = float(np.sum(np.logaddexp(0.0, z) - y * z)) / x.size
        r = (p - y) / x.size
        return loss, np.concatenate([np.bincount(depth, weights=r, minlength=num_fit), [r @ x]])

    theta0 = np.concatenate([np.zeros(num_fit), [1.0]])
    res = minimize(nll, theta0, jac=True, method="L-BFGS-B", bounds=[(-30.0, 30.0)] * num_fit + [(1e-3, 100.0)])
    return CalibrationPrior(intercepts=[round(float(v), 6) for v in res.x[:-1]], slope=round(float(res.x[-1]), 6),
                            provenance=dict(provenance or {}))


def calibration_report(conf: np.ndarray, accept_len: np.ndarray, num_slots: np.ndarray | None = None,
                       prior: CalibrationPrior | None = None, *, num_bins: int = 15) -> dict[str, Any]:
    """Raw confidence against ``prior`` on the reached slots of fully verified blocks.

    Returns ``{"reached", "log_loss_raw", "log_loss_calibrated", "ece_raw", "ece_calibrated",
    "by_depth": [{"depth", "reached", "acceptance", "mean_conf", "mean_calibrated", "ece_raw",
    "ece_calibrated"}]}`` (mean Bernoulli log-loss; ECE of :func:`expected_calibration_error`);
    ``prior=None`` reports the raw confidence on both sides. Depths with no reached slot are left out.
    """
    conf = np.asarray(conf, dtype=np.float64)
    prior = prior or CalibrationPrior.identity()
    cal = prior.probability(conf)
    reached, accepted = reached_slots(accept_len, conf.shape[1], num_slots)

    def log_loss(p: np.ndarray, y: np.ndarray) -> float:
        p = np.clip(p, CONF_EPS, 1.0 - CONF_EPS)
        return float(-np.mean(y * np.log(p) + (1.0 - y) * np.log1p(-p))) if y.size else float("nan")

    y = accepted[reached].astype(np.float64)
    out: dict[str, Any] = {
        "reached": int(y.size),
        "log_loss_raw": round(log_loss(conf[reached], y), 5), "log_loss_calibrated": round(log_loss(cal[reached], y), 5),
        "ece_raw": round(expected_calibration_error(conf[reached], y, num_bins), 5),
        "ece_calibrated": round(expected_calibration_error(cal[reached], y, num_bins), 5), "by_depth": []}
    for t in range(conf.shape[1]):
        m = reached[:, t]
        if not m.any():
            continue
        yt = accepted[m, t].astype(np.float64)
        out["by_depth"].append({
            "depth": t + 1, "reached": int(m.sum()), "acceptance": round(float(yt.mean()), 4),
            "mean_conf": round(float(conf[m, t].mean()), 4), "mean_calibrated": round(float(cal[m, t].mean()), 4),
            "ece_raw": round(expected_calibration_error(conf[m, t], yt, num_bins), 4),
            "ece_calibrated": round(expected_calibration_error(cal[m, t], yt, num_bins), 4)})
    return out
