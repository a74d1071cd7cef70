"""``fine``: global top-K over every replayable token count, by expected tokens per full step time.

Beyond D-Cut in two ways:

1. **Budget.** K ranges over every token count the engine can replay (the captured CUDA-graph cells;
   by default every multiple of ``granularity`` in ``[bs, bs*B]`` plus both ends), not 4 buckets, and
   the objective charges the *full* step time ``C_draft(bs) + C_verify(bs, K)``.

   - ``objective="ratio"`` (default): ``K* = argmax_K E(K) / (C_draft + C_verify(K))``. Each step is
     one renewal cycle of the decode loop, so long-run throughput is E[tokens] / E[time]; the per-step
     ratio is the greedy rule for it and needs no state.
   - ``objective="marginal"``: ``K* = argmax_K E(K) - lambda * C_verify(K)`` with ``lambda`` the
     running estimate (tokens/ms) of the achieved rate. By the renewal-reward theorem (Dinkelbach's
     method for ratio objectives) the long-run optimum maximises exactly this with ``lambda`` = the
     optimal rate; it verifies a slot exactly when its score beats what the same verify time earns on
     average. Draft time is sunk once the confidences exist, so it drops out. Falls back to ``ratio``
     until a rate is known.

2. **Whether to draft at all.** When the confidences are known, the draft's cost is already spent,
   so the choice is taken one step ahead: the plan's ``draft_next`` compares an exponential moving
   average of the best expected tokens per ms of recent drafted steps with a plain autoregressive
   step (``bs`` tokens in ``C_verify(bs, bs)``). While not drafting, no confidences arrive, so the
   policy drafts again after ``probe_interval`` plain steps to re-measure; the first drafted step
   after a pause (a probe) restarts the average. A probe that finds plain decoding still better
   doubles the interval (up to ``max_probe_interval``); one that resumes drafting resets it. The
   back-off bounds what probing costs where a draft step is much dearer than a plain one (on a CPU a
   self-speculative draft step can cost 13 plain steps; probing every 16 steps would then waste
   almost half the time, every 1024 steps about 1 %).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..cost_curve import CostCurve
from ..scores import Array, ScoreRanking
from .base import Policy, VerifyPlan, check_conf_shape, register

OBJECTIVES = ("ratio", "marginal")


@register
class Fine(Policy):
    """Fine-grained global top-K with a full-step-time objective and optional plain steps.

    Args:
        granularity: candidate budgets are the multiples of this in ``[bs, bs*B]``, plus ``bs`` and
            ``bs*B`` (ignored when ``allowed_num_tokens`` is given).
        allowed_num_tokens: explicit candidate budgets (e.g. the graph bank's captured cells); those
            in ``[bs, bs*B]`` and in the cost curve's range are used.
        objective: ``"ratio"`` or ``"marginal"`` (module docstring).
        ema_decay: weight of the history in the running utility, in [0, 1).
        probe_interval: plain steps before the first probing drafted step (>= 1).
        max_probe_interval: the back-off's cap on the plain steps between two probes.
        speculate_margin: draft only when the running utility beats autoregressive decoding by this
            relative margin (0 = any gain).
    """

    name = "fine"
    needs_cost = True

    def __init__(
        self,
        granularity: int = 8,
        allowed_num_tokens: Sequence[int] | None = None,
        objective: str = "ratio",
        ema_decay: float = 0.8,
        probe_interval: int = 16,
        max_probe_interval: int = 1024,
        speculate_margin: float = 0.0,
    ):
        if granularity < 1:
            raise ValueError(f"fine: granularity={granularity} must be >= 1")
        if objective not in OBJECTIVES:
            raise ValueError(f"fine: objective={objective!r} must be one of {OBJECTIVES}")
        if not (0.0 <= ema_decay < 1.0):
            raise ValueError(f"fine: ema_decay={ema_decay} must be in [0, 1)")
        if probe_interval < 1 or max_probe_interval < probe_interval:
            raise ValueError(
                f"fine: need 1 <= probe_interval <= max_probe_interval; got {probe_interval}, {max_probe_interval}"
            )
        self.granularity = int(granularity)
        self.allowed_num_tokens = None if allowed_num_tokens is None else tuple(int(k) for k in allowed_num_tokens)
        self.objective = objective
        self.ema_decay = float(ema_decay)
        self.probe_interval = int(probe_interval)
        self.max_probe_interval = int(max_probe_interval)
        self.speculate_margin = float(speculate_margin)
        self.reset()

    def params(self) -> dict:
        return {
            "granularity": self.granularity,
            "allowed_num_tokens": self.allowed_num_tokens,
            "objective": self.objective,
            "ema_decay": self.ema_decay,
            "probe_interval": self.probe_interval,
            "max_probe_interval": self.max_probe_interval,
            "speculate_margin": self.speculate_margin,
        }

    def reset(self) -> None:
        self.rate: float | None = None  # running best expected tokens per ms of drafted steps
        self._plain_steps = 0
        self.current_probe_interval = self.probe_interval  # grows by back-off, see module docstring
        self._probing = False  # the next drafted step is a probe after a plain stretch

    def candidates(self, batch_size: int, block_size: int, cost: CostCurve) -> np.ndarray:
        """Candidate budgets (ascending int64) for this batch shape and curve."""
        return self._table(batch_size, block_size, cost)[0]

    def _table(self, bs: int, block: int, cost: CostCurve) -> tuple[np.ndarray, np.ndarray, float, float]:
        """(candidates, C_verify at each, C_draft, autoregressive tokens/ms), cached per shape."""
        return self._per_shape(bs, block, cost, lambda: self._build_table(bs, block, cost))

    def _build_table(self, bs: int, block: int, cost: CostCurve) -> tuple[np.ndarray, np.ndarray, float, float]:
        hi = bs * block
        if self.allowed_num_tokens is not None:
            ks = np.array(sorted(set(self.allowed_num_tokens)), dtype=np.int64)
        else:
            ks = np.arange(0, hi + 1, self.granularity, dtype=np.int64)
            ks = np.union1d(ks, [bs, hi])
        lo_curve, hi_curve = cost.token_range(bs)
        ks = ks[(ks >= max(bs, lo_curve)) & (ks <= min(hi, hi_curve))]
        if ks.size == 0:
            raise ValueError(
                f"fine: no candidate budget for batch_size={bs}, B={block}: the allowed token counts do "
                f"not meet the cost curve's range {lo_curve}..{hi_curve} within [{bs}, {hi}]"
            )
        verify = np.asarray(cost.verify_ms(bs, ks), dtype=np.float64)
        return ks, verify, cost.draft_ms(bs), bs / cost.ar_ms(bs)

    def plan(
        self, conf: Array, cost: CostCurve | None = None, *, accept_len=None, validate: bool = True
    ) -> VerifyPlan:
        bs, block = check_conf_shape(conf, validate)
        cost = self._require_cost(cost, conf)
        ks, verify_ms, draft_ms, ar_rate = self._table(bs, block, cost)
        scores = self._scores(conf, validate=False)
        ranking = ScoreRanking(scores)
        expected = ranking.expected_tokens_at(ks)  # the one host sync of the step
        step_ms = draft_ms + verify_ms
        per_ms = expected / step_ms
        if self.objective == "marginal" and self.rate is not None:
            j = int(np.argmax(expected - self.rate * verify_ms))
        else:
            j = int(np.argmax(per_ms))
        best = float(per_ms.max())
        if self.rate is None or self._plain_steps > 0:
            self.rate = best  # first drafted step, or first after a plain stretch: start afresh
        else:
            self.rate = self.ema_decay * self.rate + (1.0 - self.ema_decay) * best
        self._plain_steps = 0
        draft_next = self.rate > (1.0 + self.speculate_margin) * ar_rate
        if self._probing:
            self._probing = False
            self.current_probe_interval = (
                self.probe_interval if draft_next
                else min(2 * self.current_probe_interval, self.max_probe_interval)
            )
        k = int(ks[j])
        return self._make_plan(
            scores, ranking.lengths(k), num_tokens=k, expected=float(expected[j]), draft_next=draft_next
        )

    def plan_without_draft(self, batch_size: int, block_size: int, cost: CostCurve | None = None) -> VerifyPlan:
        self._plain_steps += 1
        plan = super().plan_without_draft(batch_size, block_size, cost)
        probe = self._plain_steps >= self.current_probe_interval
        self._probing = probe
        return VerifyPlan(plan.lengths, plan.num_tokens, block_size, plan.expected_tokens, probe, False)
