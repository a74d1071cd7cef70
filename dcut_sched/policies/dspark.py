"""``dspark``: DSpark-style adaptive verification (vLLM pull request 47808, "[Spec Decode] DSpark
confidence-scheduled verification"; the DSpark paper, arXiv 2607.05147; the rule: docs/design.md
§2.5). Candidates are vLLM's capture sizes in ``[bs, bs * B]`` up to ``capture_limit``, priced at
the padded budget; ``K* = argmax ema(K) / T(K)`` with the EMA of the expected tokens before this
step (the current ones on a first step or a new batch size); the lengths are the current top-K*.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..cost_curve import CostCurveRangeError
from ..scores import Array, ScoreRanking
from ..step_costs import StepCosts
from .base import Policy, VerifyPlan, check_conf_shape, register

#: The largest ``capture_limit``: far above any CUDA-graph capture size, and the candidate list
#: (one size per 16 above 256) stays small.
MAX_CAPTURE_LIMIT = 1 << 20


def vllm_capture_sizes(capture_limit: int) -> np.ndarray:
    """vLLM's default CUDA-graph capture sizes up to ``capture_limit``: 1, 2, 4, 8..256 by 8, 272.. by 16,
    and the limit itself.
    """
    sizes = [1, 2, 4, *range(8, 256, 8), *range(256, max(int(capture_limit), 256) + 1, 16)]
    return np.union1d([s for s in sizes if s <= capture_limit], [int(capture_limit)]).astype(np.int64)


def padded_num_tokens(num_tokens: np.ndarray, capture_sizes: np.ndarray) -> np.ndarray:
    """The smallest capture size ``>= num_tokens`` for each entry (the graph a budget replays); the
    caller keeps every ``num_tokens`` within the largest size (:meth:`DSpark.plan` caps budgets at it)."""
    sizes = np.sort(np.asarray(capture_sizes, dtype=np.int64))
    j = np.searchsorted(sizes, np.asarray(num_tokens, dtype=np.int64), side="left")
    assert not np.any(j >= len(sizes)), f"num_tokens above the capture limit {int(sizes[-1])}"
    return sizes[j]


@dataclass
class DSparkState:
    """The EMA ``[num candidates]`` of the expected tokens ``E(K)`` and the ``batch_size`` it belongs to."""

    batch_size: int | None = None
    ema: np.ndarray | None = None


@register
class DSpark(Policy):
    """Batch budget from stale, EMA-smoothed confidences over a stepped graph cost, allocation from the
    current ones; ``ema_alpha`` in (0, 1] weighs the newest step, ``capture_limit`` caps the budgets.
    """

    name = "dspark"
    needs_cost = True
    cost_terms = frozenset({"drafted"})

    def __init__(self, ema_alpha: float = 0.8, capture_limit: int = 512):
        if not (0.0 < ema_alpha <= 1.0):
            raise ValueError(f"dspark: ema_alpha={ema_alpha} must be in (0, 1]")
        if int(capture_limit) != capture_limit or not 1 <= capture_limit <= MAX_CAPTURE_LIMIT:
            raise ValueError(f"dspark: capture_limit={capture_limit} must be an integer in [1, {MAX_CAPTURE_LIMIT:,}] "
                             f"(a CUDA-graph capture size; vLLM's default largest is 512)")
        self.ema_alpha = float(ema_alpha)
        self.capture_limit = int(capture_limit)
        self.reset()

    def params(self) -> dict:
        return {"ema_alpha": self.ema_alpha, "capture_limit": self.capture_limit}

    def reset(self) -> None:
        self.state = DSparkState()

    def table(self, batch_size: int, block_size: int, costs: StepCosts) -> tuple[np.ndarray, np.ndarray]:
        """``(candidate budgets ascending, step ms at each)``: ``StepCosts.drafted_ms`` at the padded budget."""
        costs = self._check_costs(costs, block_size)
        hi = min(batch_size * block_size, self.capture_limit)
        if hi < batch_size:
            raise CostCurveRangeError(f"dspark: batch_size={batch_size} exceeds the capture limit {self.capture_limit}")
        sizes = vllm_capture_sizes(self.capture_limit)
        ks = np.union1d(sizes[(sizes >= batch_size) & (sizes <= hi)], [batch_size, hi]).astype(np.int64)
        lo_curve, hi_curve = costs.token_range(batch_size)
        graph = np.clip(padded_num_tokens(ks, sizes), lo_curve, hi_curve)
        return ks, costs.drafted_fixed_ms(batch_size) + costs.budget_ms_at(batch_size, graph)

    def plan(self, conf: Array, cost: StepCosts | None = None, *, accept_len=None, validate: bool = True) -> VerifyPlan:
        bs, block = check_conf_shape(conf, validate)
        costs = self._check_costs(cost, block)
        ks, step_ms = self.table(bs, block, costs)
        scores = self._scores(conf, validate=False)
        ranking = ScoreRanking(scores)
        expected_now = ranking.expected_tokens_at(ks)  # the one host sync of the step
        st = self.state
        fresh = st.ema is None or st.batch_size != bs
        sizing = expected_now if fresh else st.ema
        j = int(np.argmax(sizing / step_ms))
        a = self.ema_alpha
        st.ema = expected_now.copy() if fresh else a * expected_now + (1.0 - a) * st.ema
        st.batch_size = bs
        k = int(ks[j])
        return self._make_plan(scores, ranking.lengths(k), num_tokens=k, expected=float(expected_now[j]))
