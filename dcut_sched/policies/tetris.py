"""``tetris``: TETRIS, greedy batch-wide draft-slot selection under a fixed capacity per step.

Source: Z. Wu, Z. Zhou, A. Verma, A. Prakash, D. Rus, B. K. H. Low, "TETRIS: Optimal Draft Token
Selection for Batch Speculative Decoding", ACL 2025 (arXiv 2502.15197). Why a greedy pick is optimal
for a fixed capacity, and how the draft window maps onto a block: docs/design.md §2.3; the reading of
the source: docs/policies.md.

Contract: each step verifies ``K = bs * (1 + min(draft_capacity, B - 1))`` slots
(:func:`tetris_budget`), the global top-K of the slot scores (what ``topk`` does at
``rho = (1 + draft_capacity) / B``): every request keeps its anchor and a prefix of its drafts. No
cost curve is read; the capacity is a parameter, fixed per step.

Engine needs: per-token confidences (one ``[bs, B-1]`` tensor per step), no cost curve, no lag. The
decision needs no host sync (K follows from the batch size); the plan's expected-token figure is
one device-to-host read, as for ``topk``.
"""

from __future__ import annotations

from ..scores import Array, ScoreRanking
from .base import Policy, VerifyPlan, check_conf_shape, register


def tetris_budget(batch_size: int, block_size: int, draft_capacity: int) -> int:
    """TETRIS's verification budget ``K = bs * (1 + min(draft_capacity, B - 1))`` in slots.

    Each request keeps its anchor; ``bs * draft_capacity`` draft slots are shared by the batch.
    ``draft_capacity`` is capped at ``B - 1`` (a block cannot verify more than its drafts).
    """
    return int(batch_size) * (1 + min(int(draft_capacity), int(block_size) - 1))


@register
class Tetris(Policy):
    """Global greedy choice of ``bs * draft_capacity`` draft slots by cumulative acceptance probability.

    Args:
        draft_capacity: the fixed draft window ``k`` whose capacity (``bs * k`` draft slots per step)
            TETRIS redistributes over the batch (>= 0). The paper sets it from the server's
            inference capacity; the default 7 is the capacity of a DFlash B=8 deployment (7 drafts
            per request) spent on B=16 drafts, i.e. ``rho = 0.5`` at B = 16.
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
