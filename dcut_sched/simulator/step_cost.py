"""Engine step times from a cost curve, tabulated once per batch size.

A drafted step costs ``C_draft(bs) + C_verify(bs, num_tokens) + overhead_ms`` and a step without a
draft (plain autoregressive decoding) costs ``C_verify(bs, bs)`` (DESIGN.md §1; ``overhead_ms`` is the
optional per-step controller overhead of a drafted step, default 0). The cost curve interpolates
between its measured cells (``CostCurve.verify_ms``); this class asks it once per batch size for every
budget ``bs..bs*B`` and then answers each step with an array index, so the simulator never calls the
interpolator in its inner loop.
"""

from __future__ import annotations

import numpy as np

from ..cost_curve import CostCurve, CostCurveRangeError

__all__ = ["StepCosts"]


class StepCosts:
    """Step times in ms for one cost curve and block size.

    Args:
        cost: the cost curve.
        block_size: B.
        overhead_ms: fixed time added to every drafted step (>= 0).

    Raises (from the lookups):
        CostCurveRangeError: a batch size or budget outside the curve's measured range, or a drafted
            step on a curve without draft rows.
    """

    def __init__(self, cost: CostCurve, block_size: int, overhead_ms: float = 0.0):
        if not (overhead_ms >= 0.0):
            raise ValueError(f"overhead_ms={overhead_ms} must be >= 0")
        self.cost = cost
        self.block_size = int(block_size)
        self.overhead_ms = float(overhead_ms)
        self._verify: dict[int, tuple[int, np.ndarray]] = {}
        self._draft: dict[int, float] = {}

    def verify_table(self, batch_size: int) -> tuple[int, np.ndarray]:
        """``(first, ms)``: ``ms[k - first] = C_verify(bs, k)`` for every k the curve covers in ``[bs, bs*B]``."""
        hit = self._verify.get(batch_size)
        if hit is None:
            lo, hi = self.cost.token_range(batch_size)
            first, last = max(lo, batch_size), min(hi, batch_size * self.block_size)
            if first > last:
                raise CostCurveRangeError(
                    f"{self._where()}: no num_tokens in [{batch_size}, {batch_size * self.block_size}] is "
                    f"measured at batch_size={batch_size} (curve covers {lo}..{hi})"
                )
            ks = np.arange(first, last + 1)
            hit = self._verify[batch_size] = (first, np.asarray(self.cost.verify_ms(batch_size, ks), dtype=np.float64))
        return hit

    def verify_ms(self, batch_size: int, num_tokens: int) -> float:
        """``C_verify(batch_size, num_tokens)`` in ms."""
        first, table = self.verify_table(batch_size)
        j = num_tokens - first
        if j < 0 or j >= len(table):
            raise CostCurveRangeError(
                f"{self._where()}: num_tokens={num_tokens} at batch_size={batch_size} is outside the measured "
                f"range {first}..{first + len(table) - 1}"
            )
        return float(table[j])

    def draft_ms(self, batch_size: int) -> float:
        """``C_draft(batch_size)`` in ms."""
        hit = self._draft.get(batch_size)
        if hit is None:
            hit = self._draft[batch_size] = self.cost.draft_ms(batch_size)
        return hit

    def drafted_ms(self, batch_size: int, num_tokens: int) -> float:
        """A drafted step: ``C_draft(bs) + C_verify(bs, num_tokens) + overhead_ms``."""
        return self.draft_ms(batch_size) + self.verify_ms(batch_size, num_tokens) + self.overhead_ms

    def plain_ms(self, batch_size: int) -> float:
        """A step without draft: ``C_verify(bs, bs)``."""
        return self.verify_ms(batch_size, batch_size)

    def _where(self) -> str:
        return f"cost curve {self.cost.path}" if self.cost.path else "cost curve"
