"""What calibration is measured on: the censored outcomes a verified step reveals, the reached slots
of a fully verified block, the logit and logistic map both calibrators' priors use, and the expected
calibration error. Pure functions of their inputs (numpy, and torch where noted); docs/design.md §2.7.
"""

from __future__ import annotations

import numpy as np
import torch
from scipy.stats import binned_statistic

__all__ = ["CONF_EPS", "censored_outcomes", "expected_calibration_error", "logistic_map", "logit", "reached_slots"]

#: Confidences are clipped into ``[CONF_EPS, 1 - CONF_EPS]`` before the logit (0 and 1 themselves map to 0 and 1).
CONF_EPS = 1e-6


def censored_outcomes(num_accepted: np.ndarray, lengths: np.ndarray, num_drafts: int) -> tuple[np.ndarray, np.ndarray]:
    """The observed and accepted masks ``[bs, B-1]`` of one step (docs/design.md §2.7, "Observations").

    Args:
        num_accepted: ``[bs]`` ints, drafts accepted (already ``<= lengths - 1``).
        lengths: ``[bs]`` ints in ``[1, B]``, slots verified.
        num_drafts: ``B - 1``.

    Returns:
        ``(observed, accepted)`` bool arrays ``[bs, B-1]`` (numpy or torch, like ``num_accepted``).
    """
    if isinstance(num_accepted, torch.Tensor):
        t = torch.arange(1, num_drafts + 1, device=num_accepted.device)[None, :]
    else:
        t = np.arange(1, num_drafts + 1)[None, :]
    acc = num_accepted[:, None]
    accepted = t <= acc
    observed = accepted | ((t == acc + 1) & (t <= lengths[:, None] - 1))
    return observed, accepted


def expected_calibration_error(prob: np.ndarray, outcome: np.ndarray, num_bins: int = 15) -> float:
    """Expected calibration error: ``sum_b (n_b / N) |mean(outcome)_b - mean(prob)_b|``.

    Equal-width bins of the predicted probability on [0, 1] (Guo et al. 2017, "On Calibration of
    Modern Neural Networks", eq. 3); the per-bin means come from ``scipy.stats.binned_statistic``.

    Args:
        prob: predicted probabilities (any shape, flattened).
        outcome: 0/1 outcomes, same size.
        num_bins: number of bins.
    """
    prob = np.asarray(prob, dtype=np.float64).ravel()
    outcome = np.asarray(outcome, dtype=np.float64).ravel()
    if prob.size == 0:
        return 0.0
    edges = np.linspace(0.0, 1.0, num_bins + 1)
    count, _, _ = binned_statistic(prob, prob, statistic="count", bins=edges)
    mean_p, _, _ = binned_statistic(prob, prob, statistic="mean", bins=edges)
    mean_o, _, _ = binned_statistic(prob, outcome, statistic="mean", bins=edges)
    keep = count > 0
    return float(np.sum(count[keep] / prob.size * np.abs(mean_o[keep] - mean_p[keep])))


def reached_slots(accept_len: np.ndarray, num_drafts: int, num_slots: np.ndarray | None = None
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Reached and accepted masks ``[N, num_drafts]`` of fully verified blocks.

    Slot t (1-based) of block i is *reached* when drafts ``< t`` were all accepted
    (``t <= accept_len[i] + 1``) and the slot could be checked (``t <= num_slots[i]``: a block near
    the end of its sequence has fewer); its label is ``t <= accept_len[i]``.
    """
    a = np.asarray(accept_len, dtype=np.int64)[:, None]
    t = np.arange(1, num_drafts + 1)[None, :]
    reached = t <= a + 1
    if num_slots is not None:
        reached &= t <= np.asarray(num_slots, dtype=np.int64)[:, None]
    return reached, t <= a


def logit(conf: np.ndarray) -> np.ndarray:
    """``log(c / (1 - c))`` of ``conf`` clipped into ``[CONF_EPS, 1 - CONF_EPS]`` (finite everywhere)."""
    c = np.clip(conf, CONF_EPS, 1.0 - CONF_EPS)
    return np.log(c) - np.log1p(-c)


def logistic_map(conf: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``sigmoid(a_t + b_t logit(c))`` along the last axis; exact 0 and 1 stay 0 and 1 (the map's limits)."""
    z = a + b * logit(conf)
    out = 0.5 * (1.0 + np.tanh(0.5 * z))  # the logistic function, without overflow warnings
    return np.where(conf <= 0.0, 0.0, np.where(conf >= 1.0, 1.0, out))
