"""``topk``: global top-K over the batch at a fixed ratio (budget-matched comparisons)."""

from __future__ import annotations

from ..scores import Array, ScoreRanking
from .base import Policy, VerifyPlan, budget_from_ratio, check_conf_shape, register


@register
class TopK(Policy):
    """Verify the ``K = ceil(rho * bs * B)`` highest-scoring slots of the whole batch (``rho`` in (0, 1]),
    a prefix per request.
    """

    name = "topk"

    def __init__(self, rho: float = 0.5):
        budget_from_ratio(rho, 1, 1)  # validates rho
        self.rho = float(rho)

    def params(self) -> dict:
        return {"rho": self.rho}

    def plan(self, conf: Array, cost=None, *, accept_len=None, validate: bool = True) -> VerifyPlan:
        bs, block = check_conf_shape(conf, validate)
        scores = self._scores(conf, validate=False)
        ranking = ScoreRanking(scores)
        k = budget_from_ratio(self.rho, bs, block)
        expected = float(ranking.expected_tokens_at([k])[0])
        return self._make_plan(scores, ranking.lengths(k), num_tokens=k, expected=expected)
