"""``dcut``: the published D-Cut method: global top-K with K from a few captured buckets."""

from __future__ import annotations

from functools import lru_cache
from typing import Sequence

import numpy as np

from ..scores import Array, Budgets, ScoreRanking
from ..step_costs import StepCosts
from .base import Policy, VerifyPlan, budget_from_ratio, check_conf_shape, register


@lru_cache(maxsize=256)
def _bucket_budgets(ratios: tuple[float, ...], batch_size: int, block_size: int) -> Budgets:
    return Budgets(np.unique([budget_from_ratio(r, batch_size, block_size) for r in ratios]))


@register
class DCut(Policy):
    """Global top-K with ``K_q`` chosen per step among the bucket ``ratios`` (each in (0, 1]) by
    ``U_q = E_q / C_verify(bs, K_q)`` (ties: the smaller budget), as published: docs/design.md §1,
    "D-Cut's bucket choice".
    """

    name = "dcut"
    needs_cost = True
    cost_terms = frozenset({"budgets"})

    def __init__(self, ratios: Sequence[float] = (0.25, 0.5, 0.75, 1.0)):
        ratios = tuple(float(r) for r in ratios)
        if not ratios:
            raise ValueError("dcut: ratios must not be empty")
        for r in ratios:
            budget_from_ratio(r, 1, 1)
        self.ratios = tuple(sorted(set(ratios)))

    def params(self) -> dict:
        return {"ratios": self.ratios}

    def budgets(self, batch_size: int, block_size: int) -> np.ndarray:
        """The distinct bucket budgets ``K_q`` (ascending, int64, read-only) for this batch shape."""
        return _bucket_budgets(self.ratios, int(batch_size), int(block_size)).array

    def plan(
        self, conf: Array, cost: StepCosts | None = None, *, accept_len=None, validate: bool = True
    ) -> VerifyPlan:
        bs, block = check_conf_shape(conf, validate)
        costs = self._check_costs(cost, block)
        scores = self._scores(conf, validate=False)
        ranking = ScoreRanking(scores)
        ks = _bucket_budgets(self.ratios, bs, block)
        verify_ms = costs.verify_ms_at(bs, ks.array)
        expected = ranking.expected_tokens_at(ks).tolist()  # the one host sync of the step
        # q* = argmax_q E_q / C_verify(bs, K_q), the first (smaller budget) on ties; a handful of
        # buckets, so plain floats (the same float64 division) beat numpy's per-call overhead.
        utility = [e / v for e, v in zip(expected, verify_ms.tolist())]
        q = utility.index(max(utility))
        k = ks.values[q]
        return self._make_plan(scores, ranking.lengths(k), num_tokens=k, expected=expected[q])
