"""``tetris``: TETRIS (Wu et al., "TETRIS: Optimal Draft Token Selection for Batch Speculative
Decoding", ACL 2025, arXiv 2502.15197; why greedy is optimal: docs/design.md §2.3). Each step
verifies the global top-K of the slot scores, ``K = bs * (1 + min(draft_capacity, B - 1))``
(:func:`tetris_budget`): a fixed capacity, so no cost curve and no host sync for the decision.
"""

from __future__ import annotations

from ..scores import Array, ScoreRanking
from .base import Policy, VerifyPlan, check_conf_shape, register


def tetris_budget(batch_size: int, block_size: int, draft_capacity: int) -> int:
    """TETRIS's budget ``K = bs * (1 + min(draft_capacity, B - 1))`` slots: every anchor, plus
    ``bs * draft_capacity`` draft slots shared by the batch (capped at the block's drafts).
    """
    return int(batch_size) * (1 + min(int(draft_capacity), int(block_size) - 1))


@register
class Tetris(Policy):
    """Global greedy choice of ``bs * draft_capacity`` draft slots by cumulative acceptance probability.
    ``draft_capacity`` (>= 0): the fixed draft window whose capacity is redistributed; the default 7
    is a DFlash B=8 deployment's capacity spent on B=16 drafts (``rho = 0.5``).
    """

    name = "tetris"

    def __init__(self, draft_capacity: int = 7):
        if int(draft_capacity) != draft_capacity or draft_capacity < 0:
            raise ValueError(f"tetris: draft_capacity={draft_capacity} must be an integer >= 0")
        self.draft_capacity = int(draft_capacity)

    def params(self) -> dict:
        return {"draft_capacity": self.draft_capacity}

    def plan(self, conf: Array, cost=None, *, accept_len=None, validate: bool = True) -> VerifyPlan:
        bs, block = check_conf_shape(conf, validate)
        scores = self._scores(conf, validate=False)
        ranking = ScoreRanking(scores)
        k = tetris_budget(bs, block, self.draft_capacity)
        expected = float(ranking.expected_tokens_at([k])[0])
        return self._make_plan(scores, ranking.lengths(k), num_tokens=k, expected=expected)
