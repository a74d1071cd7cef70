"""Engine step times from a cost curve: the one owner of "what does this step cost" (the drafted,
plain and undrafted sums: docs/design.md §1). The simulator charges these times and every policy
reads them from the same object, so an objective and the time charged cannot drift apart; a step is
an index into a per-batch-size table, and :meth:`StepCosts.check` refuses, before a run's first
step, a curve that cannot price the steps the run can take.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Sequence

import numpy as np

from .cost_curve import CostCurve, CostCurveError, CostCurveRangeError

__all__ = ["StepCosts"]


class StepCosts:
    """Step times in ms for one cost curve and block size (each lookup cached per instance).

    ``overhead_ms`` (>= 0) is added to every drafted step; ``draft_scale`` (finite, > 0) multiplies the
    draft terms. Raises :class:`CostCurveError` for a curve of another block size, ``ValueError`` for
    bad options; lookups raise :class:`CostCurveRangeError` outside the curve's measured cells.
    """

    def __init__(self, cost: CostCurve, block_size: int, overhead_ms: float = 0.0, draft_scale: float = 1.0):
        cost.require_block_size(block_size)
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
        self._undrafted: dict[int, float] = {}
        self._drafted_overhead: dict[int, float] = {}
        self._drafted_at: dict[tuple[int, tuple[int, ...]], np.ndarray] = {}
        self._measured: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        # a negative drafted residual can price a drafted step at <= 0 ms: only then is each checked
        self._check_drafted = any(r.kind == "drafted" and r.median_ms < 0 for r in cost.step_overhead)
        self._check_negative_rows()

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
        """``[len(budgets)]`` float64 ``C_verify(bs, k)`` for each budget (cached per (bs, budgets));
        :class:`CostCurveRangeError` for a budget outside :meth:`token_range`.
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
        """``draft_scale * C_draft(batch_size)`` in ms (the draft step at the anchor-only budget)."""
        hit = self._draft.get(batch_size)
        if hit is None:
            hit = self._draft[batch_size] = self.draft_scale * self.cost.draft_ms(batch_size)
        return hit

    def draft_first_excess_ms(self, batch_size: int, num_tokens: int) -> float:
        """``draft_scale * (C_draft_first(bs, K) - C_draft_first(bs, bs))``: the drafter's first forward
        beyond the anchor-only one (0 without ``draft_first`` rows).
        """
        if not self.cost.has_draft_first():
            return 0.0
        c = self.cost.draft_first_ms
        return self.draft_scale * (c(batch_size, num_tokens) - c(batch_size, batch_size))

    def drafted_ms(self, batch_size: int, num_tokens: int) -> float:
        """A drafted step: ``draft_ms(bs) + draft_first_excess_ms(bs, K) + C_verify(bs, K) + O_drafted +
        overhead_ms``.
        """
        out = self.draft_ms(batch_size) + self.verify_ms(batch_size, num_tokens) + self._drafted_overhead_ms(batch_size)
        if self.cost.has_draft_first():
            out += self.draft_first_excess_ms(batch_size, num_tokens)
        if self.cost.overhead_by_tokens():
            out += float(self.cost.overhead_ms("drafted", batch_size, num_tokens))
        if self._check_drafted:
            self._require_positive(out, "drafted", batch_size, num_tokens)
        return out

    def _drafted_overhead_ms(self, batch_size: int) -> float:
        """``overhead_ms + O_drafted(bs)`` (``overhead_ms`` alone when ``O_drafted`` is keyed by K), once per
        batch size.
        """
        hit = self._drafted_overhead.get(batch_size)
        if hit is None:
            by_bs = 0.0 if self.cost.overhead_by_tokens() else self.cost.overhead_ms("drafted", batch_size)
            hit = self._drafted_overhead[batch_size] = self.overhead_ms + by_bs
        return hit

    def _check_negative_rows(self) -> None:
        """Price the step of every negative ``step_overhead`` row at its cell (where the curve covers it),
        so that a broken curve is refused before the first step.
        """
        for row in self.cost.step_overhead:
            if row.median_ms >= 0:
                continue
            try:
                if row.kind == "plain":
                    self.plain_ms(row.batch_size)
                elif row.kind == "undrafted":
                    self.undrafted_ms(row.batch_size)
                else:
                    k = row.num_tokens if row.num_tokens is not None else self.token_range(row.batch_size)[0]
                    self.drafted_ms(row.batch_size, k)
            except CostCurveRangeError:  # a cell the curve's other rows do not cover: priced (and checked) if used
                continue

    def check(self, batch_sizes: Iterable[int], *, drafted: bool = True, undrafted: bool = True,
              plain: bool = False, every_budget: bool = False,
              budgets: Callable[[int], Sequence[int] | np.ndarray] | None = None) -> None:
        """Price, once, every step a run can take at each of ``batch_sizes``: the drafted step at every budget
        the verify cells cover in ``[bs, bs*B]`` (``drafted``), the ``plain`` and ``undrafted`` steps.
        ``every_budget``: every budget ``bs..bs*B`` must be covered (the simulator); ``budgets(bs)``: the
        budgets a policy verifies at ``bs``, each of which must be covered. Budget tables are not cached.

        Raises:
            CostCurveRangeError: a batch size, budget or step outside the curve's cells (named).
            CostCurveError: a step priced at <= 0 ms (a negative ``step_overhead`` residual).
        """
        for bs in batch_sizes:
            bs = int(bs)
            hi = bs * self.block_size
            lo_curve, hi_curve = self.cost.token_range(bs)
            first, last = max(lo_curve, bs), min(hi_curve, hi)
            if first > last or (every_budget and (first > bs or last < hi)):
                raise CostCurveRangeError(
                    f"{self._where()}: at batch_size={bs} it covers num_tokens {lo_curve}..{hi_curve}, not "
                    f"{bs}..{hi} (every request verifies 1..B={self.block_size} slots); profile those token counts")
            if budgets is not None:
                ks = np.asarray(budgets(bs), dtype=np.int64)
                missing = ks[(ks < first) | (ks > last)]
                if missing.size:
                    raise CostCurveRangeError(
                        f"{self._where()}: the policy verifies num_tokens={int(missing[0])} at batch_size={bs}, "
                        f"and the curve covers {first}..{last} there; profile that token count (the K bucket)")
            if drafted:
                ks = np.arange(first, last + 1, dtype=np.int64)
                self._require_positive(self.drafted_fixed_ms(bs) + self._budget_ms(bs, ks), "drafted", bs, ks)
            if plain and not self._assumed_plain_covered(bs, first):
                self.plain_ms(bs)
            if undrafted and not (self.truly_skips and self._assumed_plain_covered(bs, first)):
                self.undrafted_ms(bs)

    def _assumed_plain_covered(self, batch_size: int, first: int) -> bool:
        """Whether the plain step at ``batch_size`` is the assumed ``C_verify(bs, bs)`` (no ``ar`` or ``plain``
        rows) and the verify cells cover it, so that pricing it would only warn early.
        """
        return self.cost.ar_assumed and not self.cost.has_overhead("plain") and first == batch_size

    def _budget_ms(self, batch_size: int, ks: np.ndarray) -> np.ndarray:
        """:meth:`budget_ms_at` at each budget of ``ks``, uncached and unchecked."""
        return np.asarray(self.cost.verify_ms(batch_size, ks), dtype=np.float64) + self._budget_extra_ms(batch_size, ks)

    def _budget_extra_ms(self, batch_size: int, ks: np.ndarray) -> np.ndarray | float:
        """What a drafted step adds to ``C_verify(bs, K)`` at each budget of ``ks``: the ``draft_first`` excess
        and the K-keyed drafted overhead (0 without them).
        """
        out: np.ndarray | float = 0.0
        if self.cost.has_draft_first():
            c = self.cost.draft_first_ms
            out = out + self.draft_scale * (np.asarray(c(batch_size, ks), dtype=np.float64) - c(batch_size, batch_size))
        if self.cost.overhead_by_tokens():
            out = out + np.asarray(self.cost.overhead_ms("drafted", batch_size, ks), dtype=np.float64)
        return out

    def _require_positive(self, total: Any, kind: str, batch_size: int, num_tokens: Any = None) -> None:
        """Raise :class:`CostCurveError` for a step priced at <= 0 ms (a negative residual that outweighs
        the forwards it corrects: a broken curve, not a free step).
        """
        worst = float(np.min(total))
        if not worst > 0.0:
            at = "" if num_tokens is None else f", num_tokens={np.asarray(num_tokens).ravel()[int(np.argmin(total))]}"
            raise CostCurveError(f"{self._where()}: a {kind} step at batch_size={batch_size}{at} is priced at "
                                 f"{worst:g} ms; its step_overhead residual outweighs the forwards: re-profile "
                                 f"the engine steps (dcut-profile --vllm ... --vllm-draft ...)")

    def drafted_ms_at(self, batch_size: int, budgets: Sequence[int] | np.ndarray) -> np.ndarray:
        """``[len(budgets)]`` float64 :meth:`drafted_ms` at each budget (cached): the whole drafted step a
        budget-choosing policy compares; :class:`CostCurveRangeError` for a budget out of range.
        """
        return self.drafted_fixed_ms(batch_size) + self.budget_ms_at(batch_size, budgets)

    def budget_ms_at(self, batch_size: int, budgets: Sequence[int] | np.ndarray) -> np.ndarray:
        """``[len(budgets)]`` float64, read-only, cached: the budget-dependent part of a drafted step,
        ``C_verify(bs, K) + draft_first_excess_ms(bs, K)`` (plus K-keyed ``O_drafted``).

        Raises:
            CostCurveRangeError: a budget outside :meth:`token_range` (or the ``draft_first`` range).
            CostCurveError: a drafted step (this part plus :meth:`drafted_fixed_ms`) priced at <= 0 ms.
        """
        verify = self.verify_ms_at(batch_size, budgets)
        if not (self.cost.has_draft_first() or self.cost.overhead_by_tokens() or self._check_drafted):
            return verify
        key = (int(batch_size), tuple(np.asarray(budgets, dtype=np.int64).tolist()))
        hit = self._drafted_at.get(key)
        if hit is None:
            ks = np.asarray(key[1], dtype=np.int64)
            hit = verify + self._budget_extra_ms(batch_size, ks)
            if self._check_drafted and ks.size:  # the whole drafted step, once per (bs, budgets)
                self._require_positive(hit + self.drafted_fixed_ms(batch_size), "drafted", batch_size, ks)
            hit = self._drafted_at[key] = np.asarray(hit, dtype=np.float64)
            hit.setflags(write=False)
        return hit

    def drafted_fixed_ms(self, batch_size: int) -> float:
        """The budget-independent part of a drafted step: ``draft_ms(bs) + O_drafted(bs) + overhead_ms``."""
        return self.draft_ms(batch_size) + self._drafted_overhead_ms(batch_size)

    def plain_ms(self, batch_size: int) -> float:
        """A step of the engine without speculation: ``C_ar(bs) + O_plain(bs)``."""
        hit = self._plain.get(batch_size)
        if hit is None:
            hit = float(self.cost.ar_ms(batch_size))
            if self.cost.has_overhead("plain"):
                hit += self.cost.overhead_ms("plain", batch_size)
                self._require_positive(hit, "plain", batch_size)
            self._plain[batch_size] = hit
        return hit

    def plain_tokens_per_ms(self, batch_size: int) -> float:
        """Output tokens per ms of plain decoding (the engine without speculation): ``bs / plain_ms(bs)``."""
        return batch_size / self.plain_ms(batch_size)

    @property
    def truly_skips(self) -> bool:
        """Whether an undrafted step is a plain step (no ``undrafted`` overhead rows in the curve)."""
        return not self.cost.has_overhead("undrafted")

    def undrafted_ms(self, batch_size: int) -> float:
        """A speculative engine's anchor-only step: ``C_ar(bs) + draft_scale * C_draft_first(bs, bs) +
        O_undrafted(bs)`` on a curve with ``undrafted`` rows, else :meth:`plain_ms`.
        """
        if self.truly_skips:
            return self.plain_ms(batch_size)
        hit = self._undrafted.get(batch_size)
        if hit is None:
            first = self.draft_scale * float(self.cost.draft_first_ms(batch_size, batch_size))
            hit = (float(self.cost.ar_ms(batch_size)) + first + self.cost.overhead_ms("undrafted", batch_size))
            self._require_positive(hit, "undrafted", batch_size)
            self._undrafted[batch_size] = hit
        return hit

    def undrafted_tokens_per_ms(self, batch_size: int) -> float:
        """``bs / undrafted_ms(bs)``: output tokens per ms of a speculative engine that skips drafting."""
        return batch_size / self.undrafted_ms(batch_size)

    # ------------------------------------------------------------------ beside decode steps
    def prefill_ms(self, num_requests: int, prompt_len: int) -> float:
        """An open-loop prefill of ``num_requests`` prompts of ``prompt_len`` tokens, batched:
        ``C_verify(k, k * prompt_len)`` (no draft, overhead or draft scale).
        """
        return self.cost.verify_ms(num_requests, num_requests * int(prompt_len))

    @property
    def measured_batch_sizes(self) -> list[int]:
        """The batch sizes the curve measured verification at (ascending)."""
        return self.cost.batch_sizes

    def measured_verify(self, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
        """``(token counts, C_verify ms)`` of the cells measured at ``batch_size``, read without interpolation
        as a profiled table (cached; read-only arrays).
        """
        hit = self._measured.get(batch_size)
        if hit is None:
            qs = np.asarray(self.cost.token_counts(batch_size), dtype=np.int64)
            ms = np.asarray(self.cost.verify_ms(batch_size, qs), dtype=np.float64)
            qs.setflags(write=False)
            ms.setflags(write=False)
            hit = self._measured[batch_size] = (qs, ms)
        return hit

    def _where(self) -> str:
        return f"cost curve {self.cost.path}" if self.cost.path else "cost curve"

    def __repr__(self) -> str:
        extra = "".join(
            f", {k}={v}" for k, v in (("overhead_ms", self.overhead_ms), ("draft_scale", self.draft_scale))
            if v != (0.0 if k == "overhead_ms" else 1.0)
        )
        return f"StepCosts({self.cost!r}, block_size={self.block_size}{extra})"

