"""``vllm_adaptive``: vLLM's adaptive verifier step length (vLLM pull request 44885, "[Spec Decode]
Adaptive verifier step-length for DFlash/PARD (D-Cut-style)"; the rule: docs/design.md §2.4). The
ITL table is the curve's measured verify cells at the profiled level ``bs' >= bs``; ``Q = argmax
E(Q) / ITL(bs', Q)`` on the *previous* step's confidences (``lag_steps=0``: the current ones), the
lengths their global top-Q; without cached confidences of the same shape, the whole block.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..cost_curve import CostCurveRangeError
from ..scores import Array, ScoreRanking, is_tensor
from ..step_costs import StepCosts
from .base import Policy, VerifyPlan, check_conf_shape, constant_lengths, register


def profiled_level(batch_size: int, levels: list[int] | np.ndarray) -> int:
    """The smallest profiled batch size ``>= batch_size`` (vLLM rounds up); :class:`CostCurveRangeError`
    when none is.
    """
    levels = np.sort(np.asarray(levels, dtype=np.int64))
    j = int(np.searchsorted(levels, int(batch_size), side="left"))
    if j >= len(levels):
        raise CostCurveRangeError(
            f"batch_size={batch_size} is above the largest profiled batch size {int(levels[-1])}; "
            f"profile that batch size"
        )
    return int(levels[j])


def best_query_len(expected: np.ndarray, itl_ms: np.ndarray) -> int:
    """Index of ``argmax expected / itl_ms`` (ties: the smaller query length, listed first)."""
    return int(np.argmax(np.asarray(expected, dtype=np.float64) / np.asarray(itl_ms, dtype=np.float64)))


@dataclass
class LaggedConfidences:
    """The confidences ``[bs, B-1]`` of the previous drafted step (None before the first)."""

    conf: Array | None = None


@register
class VllmAdaptive(Policy):
    """Best total query length ``Q`` from a profiled ITL table, lengths by global top-K, one step late;
    ``lag_steps`` 1 (published) or 0 (the ablation that isolates the lag).
    """

    name = "vllm_adaptive"
    needs_cost = True

    def __init__(self, lag_steps: int = 1):
        if lag_steps not in (0, 1):
            raise ValueError(f"vllm_adaptive: lag_steps={lag_steps} must be 0 or 1")
        self.lag_steps = int(lag_steps)
        self.reset()

    def params(self) -> dict:
        return {"lag_steps": self.lag_steps}

    def reset(self) -> None:
        self.state = LaggedConfidences()

    def table(self, batch_size: int, block_size: int, costs: StepCosts) -> tuple[int, np.ndarray, np.ndarray]:
        """``(bs', candidate Q ascending, ITL(bs', Q) ms)``: the measured cells at the profiled level with
        ``bs <= Q <= bs * B``; :class:`CostCurveRangeError` when no level or no ``Q`` fits.
        """
        costs = self._check_costs(costs, block_size)
        level = profiled_level(batch_size, costs.measured_batch_sizes)
        qs, itl = costs.measured_verify(level)
        keep = (qs >= batch_size) & (qs <= batch_size * block_size)
        if not keep.any():
            raise CostCurveRangeError(
                f"vllm_adaptive: the cost curve profiles no query length in [{batch_size}, "
                f"{batch_size * block_size}] at batch_size={level} (the level batch_size={batch_size} rounds up to)"
            )
        return level, qs[keep], itl[keep]

    def plan(self, conf: Array, cost: StepCosts | None = None, *, accept_len=None, validate: bool = True) -> VerifyPlan:
        bs, block = check_conf_shape(conf, validate)
        _, qs, itl = self.table(bs, block, cost)
        scores = self._scores(conf, validate=False)
        stale = self.state.conf
        self.state.conf = conf.clone() if is_tensor(conf) else np.array(conf, copy=True)
        decide_on = conf if self.lag_steps == 0 else stale
        if decide_on is None or tuple(decide_on.shape) != tuple(conf.shape):
            # no cached decision for this batch: the scheduled (full) query lengths stand
            return self._make_plan(scores, constant_lengths(bs, block, like=conf), num_tokens=bs * block)
        ranking = ScoreRanking(self._scores(decide_on, validate=False))
        expected = ranking.expected_tokens_at(qs)  # the one host sync of the step
        q = int(qs[best_query_len(expected, itl)])
        return self._make_plan(scores, ranking.lengths(q), num_tokens=q)
