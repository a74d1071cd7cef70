"""``dense_fallback``: D-Cut with the SGLang port's dense-fallback rule.

Source: the SGLang port of D-Cut (adaptive verification for DFlash in SGLang, following the AngelSlim
D-Cut documentation). Why the port falls back to the dense graph: docs/design.md §2.6; what was
checked against which source, and which reading of "eligible" this is: docs/policies.md.

Contract, per step: the D-Cut buckets ``rho_q`` (full verification always among them) give budgets
``K_q = ceil(rho_q * bs * B)``; a bucket with ``K_q < bs * B`` is *eligible* only if
``1 - C_verify(bs, K_q) / C_verify(bs, bs * B) >= min_saving`` (:func:`eligible_buckets`); among the
eligible buckets and full verification the one with the best ``U_q = E_q / C_verify(bs, K_q)`` wins
(ties: the smaller budget), and the lengths are its global top-K. ``min_saving = 0`` gives ``dcut``.

Engine needs: per-token confidences, no lag, one host sync per step (as ``dcut``).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..scores import Array, ScoreRanking
from ..step_costs import StepCosts
from .base import VerifyPlan, check_conf_shape, register
from .dcut import DCut


def eligible_buckets(num_tokens: np.ndarray, verify_ms: np.ndarray, min_saving: float) -> np.ndarray:
    """Mask of the budgets the dense-fallback rule allows: full itself, or a saving ``>= min_saving``.

    Args:
        num_tokens: ``[n]`` bucket budgets ascending; the last is the full block ``bs * B``.
        verify_ms: ``[n]`` ``C_verify`` of each budget.
        min_saving: the fraction of the full verify cost a compact bucket must save.
    """
    num_tokens = np.asarray(num_tokens)
    verify_ms = np.asarray(verify_ms, dtype=np.float64)
    saving = 1.0 - verify_ms / verify_ms[-1]
    return (num_tokens == num_tokens[-1]) | (saving >= min_saving - 1e-12)


@register
class DenseFallback(DCut):
    """D-Cut buckets; a compact bucket counts only if it saves ``min_saving`` of the full verify cost.

    Args:
        ratios: the captured verification ratios (as ``dcut``); full verification is always a candidate.
        min_saving: in [0, 1); the SGLang port uses 0.12.
    """

    name = "dense_fallback"

    def __init__(self, ratios: Sequence[float] = (0.25, 0.5, 0.75, 1.0), min_saving: float = 0.12):
        super().__init__(ratios=tuple(ratios) + (1.0,))
        if not (0.0 <= min_saving < 1.0):
            raise ValueError(f"dense_fallback: min_saving={min_saving} must be in [0, 1)")
        self.min_saving = float(min_saving)

    def params(self) -> dict:
        return {"ratios": self.ratios, "min_saving": self.min_saving}

    def plan(self, conf: Array, cost: StepCosts | None = None, *, accept_len=None, validate: bool = True) -> VerifyPlan:
        bs, block = check_conf_shape(conf, validate)
        costs = self._check_costs(cost, block)
        scores = self._scores(conf, validate=False)
        ranking = ScoreRanking(scores)
        ks = self.budgets(bs, block)  # ascending, the last is bs * B
        verify_ms = costs.verify_ms_at(bs, ks)
        expected = ranking.expected_tokens_at(ks)  # the one host sync of the step
        utility = np.where(eligible_buckets(ks, verify_ms, self.min_saving),
                           expected / verify_ms, -np.inf)
        q = int(np.argmax(utility))
        k = int(ks[q])
        return self._make_plan(scores, ranking.lengths(k), num_tokens=k, expected=float(expected[q]))
