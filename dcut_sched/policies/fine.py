"""``fine``: global top-K over every replayable token count, by expected tokens per full step time
(the rules and their derivations: docs/design.md §2.1). Per drafted step it picks the budget
(:func:`choose_budget`), decides whether the next step drafts against plain decoding, holds probes
to a budget of the run's time, and, with ``feedback``, plans with what the engine delivered
(:class:`FineState`, :class:`Realization`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Sequence

import numpy as np

from ..scores import (
    Array,
    ScoreRanking,
    drain_progress,
    drain_slots,
    expected_tokens,
    host_remaining,
    is_tensor,
    tensor_module,
)
from ..step_costs import StepCosts
from .base import Policy, VerifyPlan, check_conf_shape, register

OBJECTIVES = ("ratio", "marginal")
#: One step's measured time counts at most this factor above (or below) the time its plan booked (the
#: price times the running measured/priced ratio): a stall (a pause of the process, a page fault) is
#: not what drafting costs, and one 10 s stall booked in full held probes back for ~10^5 steps. A
#: curve that prices every step wrong is still followed: the running ratio moves by up to this factor
#: per step.
STEP_TIME_OUTLIER = 4.0
#: A timed engine's *plain probe* (docs/design.md §2.1, "Plain probes"): after this many drafted steps
#: without a plain step (doubling after each plain probe), a few plain steps measure plain decoding, so
#: the plain rate drafting is compared with is the host's, not only the curve's. Never without measured
#: step times (the simulator). The default of ``fine``'s ``plain_probe_after``.
PLAIN_PROBE_AFTER = 64
#: The gap between plain probes doubles up to this many drafted steps (3 plain steps in 1024 forgo
#: 0.3 % of drafting's gain), so a long-running server keeps checking.
PLAIN_PROBE_MAX_GAP = 1024
#: A plain probe ends when its measured plain steps agree (two on the same side of the decision) or on
#: the median of three, or, short of that, after this many plain steps (untimed steps: prefill, vLLM's
#: transitions), on the median of what it measured; with none measured, drafting resumes.
PLAIN_PROBE_MAX_STEPS = 8
#: ``granularity=None`` (the default) takes the finest step that keeps about this many candidate
#: budgets (one more where bs * B is not a multiple of the step): every token count up to bs * B = 128,
#: every 2nd at bs 16, B 16, every 8th at bs 64, B 16 (as the former default there). The draining-batch plan costs about linearly in the candidates
#: (docs/controller.md, "Overhead").
MAX_CANDIDATES = 128


def choose_budget(expected: np.ndarray, verify_ms: np.ndarray, drafted_fixed_ms: float, objective: str = "ratio",
                  rate: float | None = None) -> tuple[int, np.ndarray]:
    """The budget choice of ``fine``, pure: for ``[n]`` candidates with expected tokens ``expected`` and
    ``verify_ms``, ``"ratio"`` takes ``argmax E / (drafted_fixed_ms + verify_ms)``; ``"marginal"`` takes
    ``argmax E - rate * verify_ms`` (``ratio`` while ``rate`` is None). Returns ``(j, per_ms)``: the
    chosen index (ties: the smaller budget) and the expected tokens per ms of the full step at each.
    """
    per_ms = expected / (drafted_fixed_ms + verify_ms)
    if objective == "marginal" and rate is not None:
        return int(np.argmax(expected - rate * verify_ms)), per_ms
    return int(np.argmax(per_ms)), per_ms


@dataclass
class Booked:
    """One planned step as ``fine`` booked it, awaiting the engine's report (:meth:`FineState.settle`):
    its price (``priced_ms``) and the price the plan used (``booked_ms``), the expected drafts and
    tokens it counted on, the plain rate it compared against (``plain_rate``, measured over priced
    ``plain_time`` in force), whether its loss estimates the next probe's, and, once reported,
    ``accepted`` (a host number or a device scalar read at settling) and ``measured_ms``.
    """

    drafted: bool
    batch_size: int
    priced_ms: float
    booked_ms: float
    expected_drafts: float = 0.0
    booked_tokens: float = 0.0
    plain_rate: float = 0.0
    plain_time: float = 1.0
    sets_probe_loss: bool = False
    remaining: np.ndarray | None = None
    accepted: Any = None
    realized_tokens: float | None = None
    measured_ms: float | None = None


@dataclass
class DecayedRatio:
    """``(num + 1) / (den + 1)``: sums decayed by ``decay`` per observation, beside one
    pseudo-observation at 1, so the ratio starts neutral and follows the last ``~1 / (1 - decay)``
    observations."""

    decay: float
    num: float = 0.0
    den: float = 0.0

    @property
    def value(self) -> float:
        return (self.num + 1.0) / (self.den + 1.0)

    def add(self, num: float, den: float) -> None:
        self.num = self.decay * self.num + num
        self.den = self.decay * self.den + den

    def age(self) -> None:
        self.num *= self.decay
        self.den *= self.decay

    def lower_to(self, value: float) -> None:
        """Bring the ratio down to ``value`` (> 0) if above it, raising the observed weight where the
        pseudo-observation alone keeps it above."""
        if self.value > value:
            self.den = max(self.den, 1.0 / value - 1.0)
            self.num = max(value * (self.den + 1.0) - 1.0, 0.0)


class Realization:
    """Running ratios of delivered to priced (docs/design.md §2.1, "Realized outcomes"): accepted over
    expected drafts, measured over priced time of drafted and of undrafted steps, each a
    :class:`DecayedRatio` with weight ``decay``; a step without a draft ages the drafted ones that plans
    are judged by, not ``drafted_booked``, the drafted steps' time ratio an untimed step is booked at.
    """

    def __init__(self, decay: float = 0.95):
        self.drafts = DecayedRatio(decay)  # accepted drafts / the plans' expected accepted drafts
        self.drafted = DecayedRatio(decay)  # sum of measured/priced of drafted steps / their count
        self.plain = DecayedRatio(decay)  # the same for steps without a draft
        self.drafted_booked = DecayedRatio(decay)  # ``drafted`` without ageing

    @property
    def tokens(self) -> float:
        """rho_real: accepted drafts per expected accepted draft."""
        return self.drafts.value

    @property
    def drafted_time(self) -> float:
        """Measured over priced time of a drafted step."""
        return self.drafted.value

    @property
    def drafted_booked_time(self) -> float:
        """Measured over priced time of a drafted step, not aged by steps without a draft: what a
        drafted step the engine does not time is booked at."""
        return self.drafted_booked.value

    @property
    def plain_time(self) -> float:
        """Measured over priced time of a step without a draft."""
        return self.plain.value

    def add_drafts(self, expected: float, actual: float) -> None:
        self.drafts.add(actual, expected)

    def add_time(self, drafted: bool, ratio: float) -> None:
        (self.drafted if drafted else self.plain).add(ratio, 1.0)
        if drafted:
            self.drafted_booked.add(ratio, 1.0)

    def lower_plain_time(self, ratio: float) -> None:
        """Bring ``plain_time`` down to ``ratio`` (a plain probe's median that found drafting losing)."""
        self.plain.lower_to(ratio)

    def age(self) -> None:
        """One step without a draft: what drafted steps taught weighs ``decay`` less."""
        self.drafts.age()
        self.drafted.age()


@dataclass
class FineState:
    """What ``fine`` carries from step to step: the running utility ``rate``, ``plain_steps`` since the
    last draft, ``probing``, the run's ``elapsed_ms`` and ``debt_ms`` (what drafting lost against
    plain decoding, realized once reported), ``probe_loss_ms`` (the next probe's estimated loss, signed),
    the ``realization`` ratios (``None`` without feedback) and the ``booked`` step awaiting
    :meth:`settle`. ``open_plain_ms`` and ``probe_plain_ms`` are the priced plain-decoding time of the
    tokens behind the current drafting stretch's unclamped losses (cleared when a stretch starts) and
    behind ``probe_loss_ms``: both losses are re-priced as plain steps are measured (docs/design.md
    §2.1, "A host slower than its curve"). ``timed`` (the engine has reported a step time),
    ``drafted_run`` (drafted steps since the last plain step), ``plain_probe_after`` (``None``: never),
    ``plain_probes`` (run so far), and, while one runs, ``plain_probe`` (its settled plain steps'
    measured/priced ratios), ``plain_probe_steps`` and ``plain_probe_gain`` (``gain``, the running
    average of each drafted step's rate over its batch size's priced plain rate, when it began) run the
    plain probes (docs/design.md §2.1, "Plain probes").
    """

    rate: float | None = None
    plain_steps: int = 0
    probing: bool = False
    elapsed_ms: float = 0.0
    debt_ms: float = 0.0
    probe_loss_ms: float = 0.0
    realization: Realization | None = None
    booked: Booked | None = None
    open_plain_ms: float = 0.0
    probe_plain_ms: float = 0.0
    timed: bool = False
    drafted_run: int = 0
    plain_probe_after: int | None = PLAIN_PROBE_AFTER
    plain_probe: list[float] | None = None
    plain_probe_steps: int = 0
    plain_probe_gain: float = 0.0
    gain: float = 0.0
    plain_probes: int = 0

    @property
    def next_probe_loss_ms(self) -> float:
        """What the next probe is estimated to lose (>= 0)."""
        return max(self.probe_loss_ms, 0.0)

    def drafted(self, best_per_ms: float, step_ms: float, loss_ms: float, plain_ms: float, ema_decay: float,
                plain_rate: float, speculate_margin: float, probe_budget: float, t_plain: float = 1.0) -> tuple[bool, bool]:
        """Account for one drafted step (``plain_ms``: its tokens' priced plain-decoding time; ``plain_rate``:
        plain decoding's priced rate over ``t_plain``); returns whether the next step should draft and
        whether this step's loss estimates the next probe's."""
        gain = best_per_ms / (plain_rate * t_plain)  # over the priced plain rate: per batch size alike
        if self.rate is None or self.plain_steps > 0:
            # first drafted step, or first after a plain stretch: start afresh; the last stretch's open
            # losses were priced at the plain rate that stretch measured (settled before this plan)
            self.rate, self.gain, self.open_plain_ms = best_per_ms, gain, 0.0
        else:
            self.rate = ema_decay * self.rate + (1.0 - ema_decay) * best_per_ms
            self.gain = ema_decay * self.gain + (1.0 - ema_decay) * gain
        self.plain_steps, self.plain_probe = 0, None  # a drafted step ends any plain probe
        self.drafted_run += 1
        draft_next = self.rate > (1.0 + speculate_margin) * plain_rate
        if draft_next and self.timed and self.plain_probe_after and self.drafted_run >= self.plain_probe_after:
            draft_next = False  # a plain probe: measure plain decoding while drafting pays
            self.plain_probe, self.plain_probe_steps, self.plain_probes = [], 0, self.plain_probes + 1
            self.plain_probe_gain = self.gain
            self.plain_probe_after = min(2 * self.plain_probe_after, max(PLAIN_PROBE_MAX_GAP, self.plain_probe_after))
        self.elapsed_ms += step_ms
        self._book(loss_ms, 0.0, probe_budget)  # an estimate the floor swallows closes the open losses
        sets_probe_loss = self.probing or not draft_next  # a probe, or the step that stops drafting
        if sets_probe_loss:
            self.probe_loss_ms, self.probe_plain_ms = loss_ms, plain_ms
        self.probing = False
        return draft_next, sets_probe_loss

    def plain(self, plain_ms: float, probe_interval: int, probe_budget: float, speculate_margin: float) -> bool:
        """Account for one plain step; returns whether the next step should draft: a probe, or the end of
        a plain probe that found drafting still pays."""
        self.plain_steps += 1
        self.drafted_run = 0
        self.elapsed_ms += plain_ms
        if self.plain_probe is not None:
            self.plain_probe_steps += 1
            resume = self._plain_probe_verdict(speculate_margin)
            if resume is None:  # still measuring: the usual probe rule waits
                self.probing = False
                return False
            ratios, self.plain_probe = self.plain_probe, None
            if resume:
                self.probing = True  # drafting again, judged afresh; its loss estimates the next probe's
                return True
            # drafting loses at the measured plain rate: the plans go on from at most the probe's median
            # (a stalled step in the decayed ratio must not start the next stretch), and a credit the
            # stretch earned at the plain rate it assumed is withdrawn (design §2.1, "Plain probes")
            rz = self.realization
            if rz is not None:
                before = rz.plain_time
                rz.lower_plain_time(float(np.median(ratios)))
                self._reprice(rz.plain_time - before, probe_budget)
            self.debt_ms = max(self.debt_ms, 0.0)
        self.probing = (self.plain_steps >= probe_interval
                        and self.debt_ms + self.next_probe_loss_ms <= probe_budget * self.elapsed_ms)
        return self.probing

    def _plain_probe_verdict(self, speculate_margin: float) -> bool | None:
        """Whether drafting (``plain_probe_gain`` over the priced plain rate) beats plain decoding at the
        plain probe's measured ratios (measured over priced): two that agree, else their median once
        three or the step cap are in; ``None`` while undecided; nothing measured by the cap: resume."""
        ratios = self.plain_probe

        def pays(ratio: float) -> bool:
            return self.plain_probe_gain * ratio > 1.0 + speculate_margin

        if len(ratios) >= 3 or (ratios and self.plain_probe_steps >= PLAIN_PROBE_MAX_STEPS):
            return pays(float(np.median(ratios)))
        if len(ratios) == 2 and pays(min(ratios)) == pays(max(ratios)):
            return pays(ratios[0])
        return True if self.plain_probe_steps >= PLAIN_PROBE_MAX_STEPS else None

    def settle(self, probe_budget: float) -> None:
        """Replace the booked step's estimates by what the engine reported: the accepted drafts
        (the realized tokens) and the measured time, in the account and in the realization ratios.
        A measured plain step re-prices the losses still open at the new plain ratio."""
        b, self.booked = self.booked, None
        if b is None:
            return
        measured = None if b.measured_ms is None else min(max(b.measured_ms, b.booked_ms / STEP_TIME_OUTLIER),
                                                          b.booked_ms * STEP_TIME_OUTLIER)
        real_ms = b.booked_ms if measured is None else measured
        self.timed = self.timed or measured is not None
        ratio = None if measured is None else measured / b.priced_ms
        if ratio is not None and not b.drafted and self.plain_probe is not None:
            self.plain_probe.append(ratio)
        rz = self.realization
        t_plain = 1.0 if rz is None else rz.plain_time
        if ratio is not None and rz is not None:
            rz.add_time(b.drafted, ratio)
        self.elapsed_ms += real_ms - b.booked_ms
        if not b.drafted:
            if rz is not None and rz.plain_time != t_plain:
                self._reprice(rz.plain_time - t_plain, probe_budget)
            return
        tokens = b.booked_tokens
        if b.accepted is not None:
            accepted = float(b.accepted)
            tokens = b.batch_size + accepted if b.realized_tokens is None else b.realized_tokens
            if rz is not None:
                rz.add_drafts(b.expected_drafts, accepted)
        booked_loss = b.booked_ms - b.booked_tokens / b.plain_rate
        real_loss = real_ms - tokens / b.plain_rate
        plain_ms = tokens / (b.plain_rate * b.plain_time)
        self._book(real_loss - booked_loss, plain_ms, probe_budget)
        if b.sets_probe_loss:
            self.probe_loss_ms, self.probe_plain_ms = real_loss, plain_ms

    def _book(self, loss_ms: float, plain_ms: float, probe_budget: float) -> None:
        """Add ``loss_ms`` to the debt, down to the credit floor; a loss the floor swallowed is closed,
        one it did not stays open to re-pricing with ``plain_ms``."""
        floor = -probe_budget * self.elapsed_ms
        if self.debt_ms + loss_ms <= floor:
            self.debt_ms, self.open_plain_ms = floor, 0.0
        else:
            self.debt_ms += loss_ms
            self.open_plain_ms += plain_ms

    def _reprice(self, delta_t_plain: float, probe_budget: float) -> None:
        """The plain ratio moved by ``delta_t_plain``: plain decoding would have taken that much more of
        each open loss's priced plain time."""
        self.probe_loss_ms -= delta_t_plain * self.probe_plain_ms
        if self.open_plain_ms:
            self._book(-delta_t_plain * self.open_plain_ms, 0.0, probe_budget)


@register
class Fine(Policy):
    """Fine-grained global top-K with a full-step-time objective and optional plain steps.

    Parameters (their rules: docs/design.md §2.1): ``granularity`` or ``allowed_num_tokens`` (the
    candidate budgets: by default every token count, about :data:`MAX_CANDIDATES` of them at most;
    ``allowed_num_tokens``, when given, replaces the grid and ``granularity`` is ignored; a graph bank's
    captured counts when the controller replays CUDA graphs), ``objective`` (``"ratio"`` or
    ``"marginal"``), ``ema_decay`` (the running
    utility), ``probe_interval`` (>= 1 plain steps between probes), ``probe_budget`` (in (0, 1): the
    share of the run drafting may lose), ``speculate_margin`` (the relative gain drafting needs),
    ``feedback`` and ``feedback_decay`` (plan with realized outcomes), ``plain_probe_after`` (drafted steps
    in a row before a plain probe, doubling; ``None``: none). Given ``remaining`` (a draining
    batch), a step is valued by how much closer it brings the batch's end (:func:`drain_progress`).
    """

    name = "fine"
    needs_cost = True
    reads_remaining = True
    cost_terms = frozenset({"drafted", "undrafted"})

    def __init__(
        self,
        granularity: int | None = None,
        allowed_num_tokens: Sequence[int] | None = None,
        objective: str = "ratio",
        ema_decay: float = 0.8,
        probe_interval: int = 16,
        probe_budget: float = 0.005,
        speculate_margin: float = 0.05,
        feedback: bool = True,
        feedback_decay: float = 0.95,
        plain_probe_after: int | None = PLAIN_PROBE_AFTER,
    ):
        if granularity is not None and granularity < 1:
            raise ValueError(f"fine: granularity={granularity} must be >= 1 (or None: every count, about "
                             f"{MAX_CANDIDATES} budgets at most)")
        if objective not in OBJECTIVES:
            raise ValueError(f"fine: objective={objective!r} must be one of {OBJECTIVES}")
        if not (0.0 <= ema_decay < 1.0):
            raise ValueError(f"fine: ema_decay={ema_decay} must be in [0, 1)")
        if probe_interval < 1:
            raise ValueError(f"fine: probe_interval={probe_interval} must be >= 1")
        if not (0.0 < probe_budget < 1.0):
            raise ValueError(f"fine: probe_budget={probe_budget} must be in (0, 1)")
        if not (0.0 <= feedback_decay < 1.0):
            raise ValueError(f"fine: feedback_decay={feedback_decay} must be in [0, 1)")
        if plain_probe_after is not None and plain_probe_after < 1:
            raise ValueError(f"fine: plain_probe_after={plain_probe_after} must be >= 1 (or None: no plain probe)")
        self.granularity = None if granularity is None else int(granularity)
        self.allowed_num_tokens = None if allowed_num_tokens is None else tuple(int(k) for k in allowed_num_tokens)
        if self.allowed_num_tokens is not None and (not self.allowed_num_tokens or min(self.allowed_num_tokens) < 1):
            raise ValueError(f"fine: allowed_num_tokens must be token counts >= 1, got "
                             f"{list(self.allowed_num_tokens)[:8]}")
        self.objective = objective
        self.ema_decay = float(ema_decay)
        self.probe_interval = int(probe_interval)
        self.probe_budget = float(probe_budget)
        self.speculate_margin = float(speculate_margin)
        self.feedback = bool(feedback)
        self.feedback_decay = float(feedback_decay)
        self.plain_probe_after = None if plain_probe_after is None else int(plain_probe_after)
        self.reset()

    def params(self) -> dict:
        return {
            "granularity": self.granularity,
            "allowed_num_tokens": self.allowed_num_tokens,
            "objective": self.objective,
            "ema_decay": self.ema_decay,
            "probe_interval": self.probe_interval,
            "probe_budget": self.probe_budget,
            "speculate_margin": self.speculate_margin,
            "feedback": self.feedback,
            "feedback_decay": self.feedback_decay,
            "plain_probe_after": self.plain_probe_after,
        }

    def reset(self) -> None:
        self.state = FineState(realization=Realization(self.feedback_decay) if self.feedback else None,
                               plain_probe_after=self.plain_probe_after)

    def candidates(self, batch_size: int, block_size: int, costs: StepCosts) -> np.ndarray:
        """Candidate budgets (ascending int64) for this batch shape and step costs."""
        first, last = self._check_costs(costs, block_size).token_range(batch_size)
        return self._candidates(batch_size, block_size, first, last)

    def _candidates(self, bs: int, block: int, first: int, last: int) -> np.ndarray:
        ks = _candidate_budgets(bs, block, self.granularity, self.allowed_num_tokens, first, last)
        if ks.size == 0:
            raise ValueError(
                f"fine: no candidate budget for batch_size={bs}, B={block}: the allowed token counts do "
                f"not meet the cost curve's range {first}..{last} within [{bs}, {bs * block}]"
            )
        return ks

    def plan(
        self, conf: Array, cost: StepCosts | None = None, *, accept_len=None, remaining=None, validate: bool = True
    ) -> VerifyPlan:
        """See :meth:`Policy.plan`. ``remaining [bs]`` (host ints >= 1, or ``None``): given while no request
        waits, each request's tokens still to generate at most; the step is then valued by its expected
        progress on the batch's end (``bs * drain_progress``, in tokens), over the slots that can bring
        it closer (:func:`drain_slots`; docs/design.md §2.1, "A draining batch").
        """
        bs, block = check_conf_shape(conf, validate)
        costs = self._check_costs(cost, block)
        ks = self._candidates(bs, block, *costs.token_range(bs))
        st = self.state
        st.settle(self.probe_budget)
        rz = st.realization
        rho, t_drafted, t_plain = (1.0, 1.0, 1.0) if rz is None else (rz.tokens, rz.drafted_time, rz.plain_time)
        verify_ms = costs.budget_ms_at(bs, ks)  # C_verify(K) (+ the drafter's first pass beyond anchors)
        plain_rate = costs.undrafted_tokens_per_ms(bs) / t_plain  # the step it would run instead of drafting
        scores = self._scores(conf, validate=False)
        drain = None
        if remaining is None:
            ranking = ScoreRanking(scores)
            expected = ranking.expected_tokens_at(ks)  # the one host sync of the step
            counted = expected if rho == 1.0 else bs + rho * (expected - bs)  # the anchors are sure
        else:  # a draining batch: host scores (one copy), the useful slots ranked
            drain = host_remaining(remaining, bs, "fine")  # checked: a wrong shape would broadcast
            host = scores.double().cpu().numpy() if is_tensor(scores) else np.asarray(scores, dtype=np.float64)
            ranking = ScoreRanking(np.where(drain_slots(drain, block), host, 0.0))
            lengths_at = ranking.lengths_at(ks)
            scaled = host if rho == 1.0 else np.concatenate([host[:, :1], np.minimum(rho * host[:, 1:], 1.0)], axis=1)
            counted = bs * drain_progress(scaled, lengths_at, drain)
        fixed_ms = costs.drafted_fixed_ms(bs)
        j, per_ms = choose_budget(counted, verify_ms * t_drafted, fixed_ms * t_drafted, self.objective, st.rate)
        priced_ms = fixed_ms + float(verify_ms[j])
        step_ms = priced_ms * (1.0 if rz is None else rz.drafted_booked_time)  # booked until measured
        loss_ms = step_ms - float(counted[j]) / plain_rate
        draft_next, sets_probe_loss = st.drafted(float(per_ms.max()), step_ms, loss_ms,
                                                 float(counted[j]) / (plain_rate * t_plain), self.ema_decay,
                                                 plain_rate, self.speculate_margin, self.probe_budget, t_plain)
        k = int(ks[j])
        if drain is None:
            lengths, expected_k = ranking.lengths(k), float(expected[j])
        else:  # the chosen lengths' expected tokens over every slot (the masked ones may be accepted too)
            lengths, expected_k = lengths_at[j], expected_tokens(host, lengths_at[j], validate=False)
            if is_tensor(scores):
                lengths = tensor_module().as_tensor(lengths, device=scores.device)
        if rz is not None:
            st.booked = Booked(True, bs, priced_ms, step_ms, expected_k - bs, float(counted[j]), plain_rate,
                               t_plain, sets_probe_loss, drain)
        return self._make_plan(scores, lengths, num_tokens=k, expected=expected_k, draft_next=draft_next)

    def observe(self, lengths: Array, num_accepted: Array) -> None:
        """Keep the drafts accepted in the booked step (summed; read when the next plan settles it) and, for
        a draining step, its realized progress on the batch's end, in tokens (``bs`` per step)."""
        b = self.state.booked
        if b is not None and b.drafted:
            b.accepted = num_accepted.sum()
            if b.remaining is not None:
                a = num_accepted.cpu().numpy() if is_tensor(num_accepted) else np.asarray(num_accepted)
                r = b.remaining
                b.realized_tokens = float(b.batch_size * (r.max() - np.maximum(r - 1 - a, 0).max()))

    def observe_time(self, step_ms: float) -> None:
        """Keep the engine's measured time of the booked step."""
        b = self.state.booked
        if b is not None:
            b.measured_ms = float(step_ms)

    def plan_without_draft(self, batch_size: int, block_size: int, cost: StepCosts | None = None) -> VerifyPlan:
        """A step without draft (``StepCosts.undrafted_ms``); asks for a probe when the probe budget
        allows. ``ValueError`` without step costs (the budget is kept in time).
        """
        costs = self._check_costs(cost, block_size)
        st = self.state
        st.settle(self.probe_budget)
        rz = st.realization
        priced_ms = booked_ms = costs.undrafted_ms(batch_size)
        if rz is not None:
            booked_ms = priced_ms * rz.plain_time
            if st.plain_probe is None:  # a plain probe interrupts drafting: what it taught still holds
                rz.age()
            st.booked = Booked(False, batch_size, priced_ms, booked_ms)
        probe = st.plain(booked_ms, self.probe_interval, self.probe_budget, self.speculate_margin)
        plan = super().plan_without_draft(batch_size, block_size, cost)
        return VerifyPlan(plan.lengths, plan.num_tokens, block_size, plan.expected_tokens, probe, False)


@lru_cache(maxsize=1024)
def _candidate_budgets(bs: int, block: int, granularity: int | None, allowed: tuple[int, ...] | None,
                       first: int, last: int) -> np.ndarray:
    """Ascending int64 candidate budgets in ``[first, last]`` (read-only; shared by every instance)."""
    hi = bs * block
    if allowed is not None:
        ks = np.array(sorted(set(allowed)), dtype=np.int64)
    else:
        step = granularity if granularity is not None else -(-hi // MAX_CANDIDATES)
        ks = np.union1d(np.arange(0, hi + 1, step, dtype=np.int64), [bs, hi])
    ks = ks[(ks >= max(bs, first)) & (ks <= min(hi, last))]
    ks.setflags(write=False)
    return ks
