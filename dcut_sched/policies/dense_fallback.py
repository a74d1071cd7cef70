"""``dense_fallback``: D-Cut with the SGLang port's dense-fallback rule (the SGLang port of D-Cut,
after the AngelSlim D-Cut documentation; the rule: docs/design.md §2.6, the reading: docs/policies.md).
A compact bucket is eligible only if it saves ``min_saving`` of the full verify cost
(:func:`eligible_buckets`); among the eligible ones and full verification the best
``E_q / C_verify(bs, K_q)`` wins (ties: the smaller). ``min_saving = 0`` gives ``dcut``.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..scores import Array, ScoreRanking
from ..step_costs import StepCosts
from .base import VerifyPlan, check_conf_shape, register
from .dcut import DCut


def eligible_buckets(num_tokens: np.ndarray, verify_ms: np.ndarray, min_saving: float) -> np.ndarray:
    """Mask of the ascending bucket budgets ``num_tokens`` (the last is ``bs * B``) the rule allows: full
    itself, or ``1 - verify_ms / verify_ms[-1] >= min_saving``.
    """
    num_tokens = np.asarray(num_tokens)
    verify_ms = np.asarray(verify_ms, dtype=np.float64)
    saving = 1.0 - verify_ms / verify_ms[-1]
    return (num_tokens == num_tokens[-1]) | (saving >= min_saving - 1e-12)


@register
class DenseFallback(DCut):
    """D-Cut buckets (``ratios``; full always a candidate) where a compact bucket counts only if it saves
    ``min_saving`` in [0, 1) of the full verify cost (the SGLang port: 0.12).
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
