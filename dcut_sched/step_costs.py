"""Engine step times from a cost curve: the one owner of "what does this step cost".

Three kinds of step, with ``K`` the step's verified tokens; the sums, what each term is and why an
undrafted step of vLLM 0.32 is not a plain step are in docs/design.md §1:

- a **drafted** step (:meth:`StepCosts.drafted_ms`): ``draft_scale * (C_draft(bs) + C_draft_first(bs, K)
  - C_draft_first(bs, bs)) + C_verify(bs, K) + O_drafted(bs[, K]) + overhead_ms`` (``O_drafted`` keyed
  by K when the curve's drafted rows give ``num_tokens``);
- a **plain** step (:meth:`StepCosts.plain_ms`, the engine without speculation, ``ar``):
  ``C_ar(bs) + O_plain(bs)``, with ``C_ar`` the curve's plain decode step (not ``C_verify(bs, bs)``);
- an **undrafted** step (:meth:`StepCosts.undrafted_ms`, a speculative engine's anchor-only step):
  ``C_ar(bs) + draft_scale * C_draft_first(bs, bs) + O_undrafted(bs)`` where the curve has
  ``undrafted`` rows, else the plain step.

``O_kind`` are the curve's ``step_overhead`` rows (signed residuals; a step priced at <= 0 ms is a
``CostCurveError``) and ``C_draft_first`` its ``draft_first`` rows (0
where absent), so a curve without the optional rows prices every step as ``C_draft + C_verify +
overhead_ms`` and ``C_ar``. ``overhead_ms`` (default 0) is a per-step controller overhead and
``draft_scale`` (default 1) a what-if multiplier on the draft terms (the sensitivity analysis).

The simulator charges these times, and the policies (``ar``, ``dcut``, ``fine``, ...) read them from
the same object, so a policy's objective and the time the simulator charges cannot drift apart.
Each batch size's table (every budget ``bs..bs*B`` the curve covers) is built once, so a step is
answered by an array index and never calls the interpolator in an inner loop.
:meth:`StepCosts.check` prices every step a run can take at the batch sizes it reaches, once, where
the run starts (the simulator's checks, :class:`~dcut_sched.controller.RatioController`), so a curve
that cannot price one is refused before the first step rather than in the middle of a run.

:class:`StepCosts` is the only cost type a policy sees. It is built once where a cost curve enters:
:class:`~dcut_sched.controller.RatioController` (and with it the vLLM plugin and ``dcut-engine``),
and the simulator's run set-up (with the run's ``overhead_ms`` and ``draft_scale``). It also
prices what is not a decode step but is read from the same curve: an open-loop prefill
(:meth:`StepCosts.prefill_ms`) and the curve's measured cells read as a profiled table, without
interpolation (:meth:`StepCosts.measured_verify`, what ``vllm_adaptive`` reads).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Sequence

import numpy as np

from .cost_curve import CostCurve, CostCurveError, CostCurveRangeError

__all__ = ["StepCosts"]


class StepCosts:
    """Step times in ms for one cost curve and block size.

    Args:
        cost: the cost curve.
        block_size: B (the curve must have been measured for it).
        overhead_ms: fixed time added to every drafted step (>= 0).
        draft_scale: multiplier on ``C_draft`` (> 0; 1 = the curve's draft step).

    Caches (explicit, per instance; a lookup is computed at most once): ``_verify`` (per batch size,
    the verify table), ``_at`` and ``_drafted_at`` (per batch size and budget tuple), ``_draft``,
    ``_plain``, ``_undrafted``, ``_drafted_overhead`` (per batch size), ``_measured`` (per measured
    batch size, :meth:`measured_verify`).

    Raises:
        CostCurveError: the curve was measured for another block size.
        ValueError: a negative ``overhead_ms`` or a ``draft_scale`` that is not a finite number > 0.

    Raises (from the lookups):
        CostCurveRangeError: a batch size or budget outside the curve's measured range, or a drafted
            step on a curve without draft rows.
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
        """``draft_scale * C_draft(batch_size)`` in ms (the draft step at the anchor-only budget)."""
        hit = self._draft.get(batch_size)
        if hit is None:
            hit = self._draft[batch_size] = self.draft_scale * self.cost.draft_ms(batch_size)
        return hit

    def draft_first_excess_ms(self, batch_size: int, num_tokens: int) -> float:
        """``draft_scale * (C_draft_first(bs, K) - C_draft_first(bs, bs))``: what the drafter's first
        forward over K verified tokens costs beyond the anchor-only one (0 without ``draft_first`` rows)."""
        if not self.cost.has_draft_first():
            return 0.0
        c = self.cost.draft_first_ms
        return self.draft_scale * (c(batch_size, num_tokens) - c(batch_size, batch_size))

    def drafted_ms(self, batch_size: int, num_tokens: int) -> float:
        """A drafted step (module docstring): ``draft_ms(bs) + draft_first_excess_ms(bs, K) +
        C_verify(bs, K) + O_drafted(bs) + overhead_ms``."""
        out = self.draft_ms(batch_size) + self.verify_ms(batch_size, num_tokens) + self._drafted_overhead_ms(batch_size)
        if self.cost.has_draft_first():
            out += self.draft_first_excess_ms(batch_size, num_tokens)
        if self.cost.overhead_by_tokens():
            out += float(self.cost.overhead_ms("drafted", batch_size, num_tokens))
        if self._check_drafted:
            self._require_positive(out, "drafted", batch_size, num_tokens)
        return out

    def _drafted_overhead_ms(self, batch_size: int) -> float:
        """``overhead_ms + O_drafted(bs)`` (the K-independent part: ``overhead_ms`` alone when the curve
        keys the drafted overhead by K), looked up once per batch size (a drafted step asks every time)."""
        hit = self._drafted_overhead.get(batch_size)
        if hit is None:
            by_bs = 0.0 if self.cost.overhead_by_tokens() else self.cost.overhead_ms("drafted", batch_size)
            hit = self._drafted_overhead[batch_size] = self.overhead_ms + by_bs
        return hit

    def _check_negative_rows(self) -> None:
        """At construction, every step a negative ``step_overhead`` row prices, at that row's cell
        (where the curve covers it): so an engine refuses a broken curve before its first step,
        whatever its policy looks up."""
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
        """Price, once, every step a run can take at each of ``batch_sizes``, so that a curve that
        cannot answer one of them is refused before the run's first step, not in the middle of it.

        At each batch size ``bs``: the verify cells must cover some budget in ``[bs, bs*B]``; with
        ``drafted``, the draft step and the whole drafted step at every budget the verify cells cover
        there (``draft_first`` and K-keyed ``step_overhead`` cells must cover those budgets too, and
        every one must be priced > 0 ms, between measured cells included); with ``plain`` /
        ``undrafted``, those steps (their ``step_overhead`` rows must reach ``bs``, priced > 0 ms).
        ``every_budget``: every budget ``bs..bs*B`` must be covered (a run that charges whatever a
        policy picks, the simulator). ``budgets``: ``budgets(bs)``, the budgets a policy verifies at
        ``bs`` (e.g. ``dcut``'s ratio buckets), each of which must be covered. The budget tables are
        not cached (only the per-batch-size step times are): a controller checks every batch size
        of its curve without keeping a table for each.

        Raises:
            CostCurveRangeError: a batch size, budget or step outside the curve's cells (the message
                names the batch size and the missing rows).
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
        """Whether the plain step at ``batch_size`` is the assumed ``C_verify(bs, bs)`` of a curve
        without ``ar`` and ``plain`` overhead rows, and the verify cells cover it (so pricing it would
        only add the assumed-step warning, which the first plain step gives)."""
        return self.cost.ar_assumed and not self.cost.has_overhead("plain") and first == batch_size

    def _budget_ms(self, batch_size: int, ks: np.ndarray) -> np.ndarray:
        """The budget-dependent part of a drafted step at each budget of ``ks`` (see
        :meth:`budget_ms_at`), uncached and unchecked."""
        return np.asarray(self.cost.verify_ms(batch_size, ks), dtype=np.float64) + self._budget_extra_ms(batch_size, ks)

    def _budget_extra_ms(self, batch_size: int, ks: np.ndarray) -> np.ndarray | float:
        """What a drafted step adds to ``C_verify(bs, K)`` at each budget of ``ks``: the drafter's first
        forward beyond the anchors (``draft_first``) and the K-keyed drafted overhead (0 without them)."""
        out: np.ndarray | float = 0.0
        if self.cost.has_draft_first():
            c = self.cost.draft_first_ms
            out = out + self.draft_scale * (np.asarray(c(batch_size, ks), dtype=np.float64) - c(batch_size, batch_size))
        if self.cost.overhead_by_tokens():
            out = out + np.asarray(self.cost.overhead_ms("drafted", batch_size, ks), dtype=np.float64)
        return out

    def _require_positive(self, total: Any, kind: str, batch_size: int, num_tokens: Any = None) -> None:
        """A step priced at <= 0 ms (a negative ``step_overhead`` residual larger than the forwards it
        corrects) is a broken curve, not a free step."""
        worst = float(np.min(total))
        if not worst > 0.0:
            at = "" if num_tokens is None else f", num_tokens={np.asarray(num_tokens).ravel()[int(np.argmin(total))]}"
            raise CostCurveError(f"{self._where()}: a {kind} step at batch_size={batch_size}{at} is priced at "
                                 f"{worst:g} ms; its step_overhead residual outweighs the forwards: re-profile "
                                 f"the engine steps (dcut-profile --vllm ... --vllm-draft ...)")

    def drafted_ms_at(self, batch_size: int, budgets: Sequence[int] | np.ndarray) -> np.ndarray:
        """``[len(budgets)]`` float64 :meth:`drafted_ms` at each budget (cached per (bs, budgets)); the
        whole drafted step a budget-choosing policy compares (``fine``, smartspec, dspark, ...).

        Raises:
            CostCurveRangeError: a budget outside :meth:`token_range` (or the ``draft_first`` range).
        """
        return self.drafted_fixed_ms(batch_size) + self.budget_ms_at(batch_size, budgets)

    def budget_ms_at(self, batch_size: int, budgets: Sequence[int] | np.ndarray) -> np.ndarray:
        """``[len(budgets)]`` float64: the part of a drafted step that depends on the budget K,
        ``C_verify(bs, K) + draft_first_excess_ms(bs, K)`` (``+ O_drafted(bs, K)`` for K-keyed rows;
        just :meth:`verify_ms_at` on a curve with neither); cached per (bs, budgets), read-only.

        Raises:
            CostCurveRangeError: a budget outside :meth:`token_range` (or the ``draft_first`` range).
            CostCurveError: a negative drafted ``step_overhead`` residual prices a drafted step
                (this part plus :meth:`drafted_fixed_ms`) at <= 0 ms.
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
        """The part of a drafted step that does not depend on the budget:
        ``draft_ms(bs) + O_drafted(bs) + overhead_ms``."""
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
        """A speculative engine's step that verifies anchors only (module docstring):
        ``C_ar(bs) + draft_scale * C_draft_first(bs, bs) + O_undrafted(bs)`` on a curve with
        ``undrafted`` rows, else :meth:`plain_ms`."""
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
        """Output tokens per ms of a speculative engine that skips drafting: ``bs / undrafted_ms(bs)``
        (what a policy that stops drafting gets; equals :meth:`plain_tokens_per_ms` on an engine
        that truly skips)."""
        return batch_size / self.undrafted_ms(batch_size)

    # ------------------------------------------------------------------ beside decode steps
    def prefill_ms(self, num_requests: int, prompt_len: int) -> float:
        """An open-loop prefill of ``num_requests`` prompts of ``prompt_len`` tokens, batched:
        ``C_verify(k, k * prompt_len)`` (the curve's verify forward at that shape; no draft, no
        overhead, no draft scale).

        Raises:
            CostCurveRangeError: the shape is outside the curve's measured range.
        """
        return self.cost.verify_ms(num_requests, num_requests * int(prompt_len))

    @property
    def measured_batch_sizes(self) -> list[int]:
        """The batch sizes the curve measured verification at (ascending)."""
        return self.cost.batch_sizes

    def measured_verify(self, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
        """``(token counts ascending, C_verify ms at each)``: the verify cells measured at
        ``batch_size`` (one of :attr:`measured_batch_sizes`), read without interpolation as a
        profiled table is (cached per batch size; read-only arrays)."""
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

