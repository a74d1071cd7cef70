"""Calibration of draft confidences: ``P(draft t accepted | drafts < t accepted, conf_t)`` learnt from
the censored outcomes a serving loop observes anyway (docs/design.md §2.7). ``logistic``: the
controller's default, per-depth logistic map from the drafter's prior; ``prior``: that prior's
``calibration.json`` format, fit and report; ``isotonic``: the binned monotone map of the simulator's
``--calibrate``; ``metrics``: the outcome masks, logit and ECE they share.
"""

from __future__ import annotations

from .isotonic import OnlineCalibrator
from .logistic import LogisticCalibrator
from .metrics import censored_outcomes, expected_calibration_error, reached_slots
from .prior import PRIOR_FORMAT, PRIOR_NAME, CalibrationPrior, CalibrationPriorError, calibration_report, fit_prior

__all__ = ["PRIOR_FORMAT", "PRIOR_NAME", "CalibrationPrior", "CalibrationPriorError", "LogisticCalibrator",
           "OnlineCalibrator", "calibration_report", "censored_outcomes", "expected_calibration_error", "fit_prior",
           "reached_slots"]
