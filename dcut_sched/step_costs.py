"""Engine step times from a cost curve: the one owner of "what does this step cost".

Two kinds of step (docs/design.md §1):

- a **drafted** step costs ``draft_scale * C_draft(bs) + C_verify(bs, num_tokens) + overhead_ms``
  (``overhead_ms``: optional per-step controller overhead, default 0; ``draft_scale``: a what-if
  multiplier on the draft step, default 1, used by the sensitivity analysis);
- a **plain** step (no draft, every request verifies its anchor only) costs ``C_ar(bs)``, the plain
  autoregressive decode step the serving engine runs without speculation
  (:meth:`CostCurve.ar_ms`). It is *not* ``C_verify(bs, bs)``: plain decode runs another engine path.

The simulator charges these times, and the policies (``ar``, ``dcut``, ``fine``, ...) read them from
the same object, so a policy's objective and the time the simulator charges cannot drift apart.
Each batch size's table (every budget ``bs..bs*B`` the curve covers) is built once, so a step is
answered by an array index and never calls the interpolator in an inner loop.

:func:`step_costs` turns what a caller passes to a policy (a :class:`CostCurve` or a
:class:`StepCosts`) into a :class:`StepCosts`; the default one of a curve is built once per block
size and kept with the curve.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .cost_curve import CostCurve, CostCurveRangeError

__all__ = ["StepCosts", "step_costs"]


class StepCosts:
    """Step times in ms for one cost curve and block size.

    Args:
        cost: the cost curve.
        block_size: B.
        overhead_ms: fixed time added to every drafted step (>= 0).
        draft_scale: multiplier on ``C_draft`` (> 0; 1 = the curve's draft step).

    Raises (from the lookups):
        CostCurveRangeError: a batch size or budget outside the curve's measured range, or a drafted
            step on a curve without draft rows.
    """

    def __init__(self, cost: CostCurve, block_size: int, overhead_ms: float = 0.0, draft_scale: float = 1.0):
        if not (overhead_ms >= 0.0):
            raise ValueError(f"overhead_ms={overhead_ms} must be >= 0")
        if not (draft_scale > 0.0 and np.isfinite(draft_scale)):
            raise ValueError(f"draft_scale={draft_scale} must be a finite number > 0")
        self.cost = cost
        self.block_size = int(block_size)
        self.overhead_ms = float(overhead_ms)
        self.draft_scale = float(draft_scale)
        self._verify: dict[int, tuple[int, np.ndarray]] = {}
        self._at: dict[tuple[int, tuple[int, ...]], np.ndarray] = {}
        self._draft: dict[int, float] = {}
        self._plain: dict[int, float] = {}

    # ------------------------------------------------------------------ verification
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

    def token_range(self, batch_size: int) -> tuple[int, int]:
        """``(first, last)``: the budgets in ``[bs, bs*B]`` the curve covers at ``batch_size``."""
        first, table = self.verify_table(batch_size)
        return first, first + len(table) - 1

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

    def verify_ms_at(self, batch_size: int, budgets: Sequence[int] | np.ndarray) -> np.ndarray:
        """``[len(budgets)]`` float64 ``C_verify(bs, k)`` for each budget k (cached per (bs, budgets)).

        Raises:
            CostCurveRangeError: a budget outside :meth:`token_range`.
        """
        key = (int(batch_size), tuple(np.asarray(budgets, dtype=np.int64).tolist()))
        hit = self._at.get(key)
        if hit is None:
            first, last = self.token_range(batch_size)
            ks = np.asarray(key[1], dtype=np.int64)
            if ks.size and (ks.min() < first or ks.max() > last):
                bad = int(ks[(ks < first) | (ks > last)][0])
                raise CostCurveRangeError(
                    f"{self._where()}: num_tokens={bad} at batch_size={batch_size} is outside the measured "
                    f"range {first}..{last}"
                )
            hit = self._at[key] = self.verify_table(batch_size)[1][ks - first]
            hit.setflags(write=False)
        return hit

    # ------------------------------------------------------------------ whole steps
    def draft_ms(self, batch_size: int) -> float:
        """``draft_scale * C_draft(batch_size)`` in ms."""
        hit = self._draft.get(batch_size)
        if hit is None:
            hit = self._draft[batch_size] = self.draft_scale * self.cost.draft_ms(batch_size)
        return hit

    def drafted_ms(self, batch_size: int, num_tokens: int) -> float:
        """A drafted step: ``draft_ms(bs) + C_verify(bs, num_tokens) + overhead_ms``."""
        return self.draft_ms(batch_size) + self.verify_ms(batch_size, num_tokens) + self.overhead_ms

    def drafted_fixed_ms(self, batch_size: int) -> float:
        """The part of a drafted step that does not depend on the budget: ``draft_ms(bs) + overhead_ms``."""
        return self.draft_ms(batch_size) + self.overhead_ms

    def plain_ms(self, batch_size: int) -> float:
        """A step without draft: ``C_ar(bs)``, the plain autoregressive decode step."""
        hit = self._plain.get(batch_size)
        if hit is None:
            hit = self._plain[batch_size] = float(self.cost.ar_ms(batch_size))
        return hit

    def plain_tokens_per_ms(self, batch_size: int) -> float:
        """Output tokens per ms of plain decoding: ``bs / C_ar(bs)``."""
        return batch_size / self.plain_ms(batch_size)

    def _where(self) -> str:
        return f"cost curve {self.cost.path}" if self.cost.path else "cost curve"

    def __repr__(self) -> str:
        extra = "".join(
            f", {k}={v}" for k, v in (("overhead_ms", self.overhead_ms), ("draft_scale", self.draft_scale))
            if v != (0.0 if k == "overhead_ms" else 1.0)
        )
        return f"StepCosts({self.cost!r}, block_size={self.block_size}{extra})"


def step_costs(cost: CostCurve | StepCosts, block_size: int) -> StepCosts:
    """The :class:`StepCosts` for ``cost`` at ``block_size``.

    A :class:`StepCosts` is returned as is (its block size must match); for a :class:`CostCurve` the
    default one (no overhead, draft scale 1) is built once per block size and kept with the curve, so
    a serving loop pays the curve lookups once per batch shape.

    Raises:
        CostCurveError: the curve (or the StepCosts' curve) was measured for another block size.
        ValueError: a StepCosts built for another block size.
    """
    if isinstance(cost, StepCosts):
        if cost.block_size != int(block_size):
            raise ValueError(f"step costs are for block size {cost.block_size}, the batch has B={block_size}")
        return cost
    cost.require_block_size(block_size)
    cache = cost.__dict__.setdefault("_step_costs_cache", {})
    hit = cache.get(int(block_size))
    if hit is None:
        hit = cache[int(block_size)] = StepCosts(cost, block_size)
    return hit
