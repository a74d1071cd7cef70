"""``smartspec``: SmartSpec (Liu et al., "Optimizing Speculative Decoding for Serving Large Language
Models Using Goodput", arXiv 2406.14066; derivation: docs/design.md §2.2). Each drafted step every
request verifies ``k + 1`` slots, ``k`` in ``[1, n]`` the argmax of :func:`smartspec_goodput` under
the decayed acceptance rate of :class:`SmartSpecState` (the whole block until an outcome is known);
``draft_next`` is whether that beats ``k = 0``. Needs the accepted counts, not the confidences.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..scores import Array, is_tensor, tensor_module
from ..step_costs import StepCosts
from .base import Policy, VerifyPlan, check_conf_shape, constant_lengths, register


def geometric_expected_tokens(acceptance_rate: float, draft_len: np.ndarray | int) -> np.ndarray:
    """Expected tokens per request verifying ``k = draft_len`` drafts at acceptance rate ``a``:
    ``(1 - a^(k+1)) / (1 - a)``, ``k + 1`` when ``a == 1`` (float64, the shape of ``draft_len``).
    """
    a = float(acceptance_rate)
    if not (0.0 <= a <= 1.0):
        raise ValueError(f"acceptance rate {a} must be in [0, 1]")
    k = np.asarray(draft_len, dtype=np.float64)
    if a == 1.0:
        return k + 1.0
    return (1.0 - a ** (k + 1.0)) / (1.0 - a)


def smartspec_goodput(acceptance_rate: float, batch_size: int, step_ms: np.ndarray) -> np.ndarray:
    """Goodput (tokens/ms) of every draft length ``k = 0..len(step_ms)-1``: ``bs * E[tokens | k] / T(k)``."""
    step_ms = np.asarray(step_ms, dtype=np.float64)
    ks = np.arange(step_ms.shape[0])
    return batch_size * geometric_expected_tokens(acceptance_rate, ks) / step_ms


@dataclass
class SmartSpecState:
    """Decayed sums of recent drafted steps: ``accepted`` drafts and ``trials`` (drafts examined: the
    accepted ones plus the first rejected one).
    """

    accepted: float = 0.0
    trials: float = 0.0

    @property
    def acceptance_rate(self) -> float | None:
        """The estimate ``accepted / trials``; None before any outcome."""
        return None if self.trials <= 0.0 else self.accepted / self.trials

    def update(self, accepted: float, trials: float, decay: float) -> None:
        self.accepted = decay * self.accepted + accepted
        self.trials = decay * self.trials + trials


@register
class SmartSpec(Policy):
    """One draft length ``k`` for every request, argmax of goodput under a running acceptance rate;
    ``history_decay`` in [0, 1) per drafted step, ``max_draft_len`` ``n`` (None: ``B - 1``).
    """

    name = "smartspec"
    needs_cost = True
    cost_terms = frozenset({"drafted", "undrafted", "budgets"})

    def __init__(self, history_decay: float = 0.9, max_draft_len: int | None = None):
        if not (0.0 <= history_decay < 1.0):
            raise ValueError(f"smartspec: history_decay={history_decay} must be in [0, 1)")
        if max_draft_len is not None and (int(max_draft_len) != max_draft_len or max_draft_len < 1):
            raise ValueError(f"smartspec: max_draft_len={max_draft_len} must be an integer >= 1 or None")
        self.history_decay = float(history_decay)
        self.max_draft_len = None if max_draft_len is None else int(max_draft_len)
        self.reset()

    def params(self) -> dict:
        return {"history_decay": self.history_decay, "max_draft_len": self.max_draft_len}

    def reset(self) -> None:
        self.state = SmartSpecState()

    def budgets(self, batch_size: int, block_size: int) -> np.ndarray:
        """The budgets ``bs (k+1)``, ``k = 1..n`` (ascending int64), each priced every step, so a curve must
        cover them all.
        """
        n = block_size - 1 if self.max_draft_len is None else min(self.max_draft_len, block_size - 1)
        return int(batch_size) * np.arange(2, n + 2, dtype=np.int64)

    def step_ms(self, batch_size: int, block_size: int, costs: StepCosts) -> np.ndarray:
        """``T(k)`` in ms for ``k = 0..n``: ``StepCosts.undrafted_ms`` at 0, ``drafted_ms(bs, bs (k+1))`` after."""
        costs = self._check_costs(costs, block_size)
        verify = costs.budget_ms_at(batch_size, self.budgets(batch_size, block_size))
        return np.concatenate([[costs.undrafted_ms(batch_size)], costs.drafted_fixed_ms(batch_size) + verify])

    def _choose(self, batch_size: int, block_size: int, costs: StepCosts) -> tuple[int, bool]:
        """(draft length for a drafted step, whether drafting beats plain decoding) from the state."""
        step = self.step_ms(batch_size, block_size, costs)
        rate = self.state.acceptance_rate
        if rate is None:
            return len(step) - 1, True  # no outcome yet: verify the whole block to measure a
        goodput = smartspec_goodput(rate, batch_size, step)
        k = 1 + int(np.argmax(goodput[1:]))
        return k, bool(goodput[k] > goodput[0])

    def plan(self, conf: Array, cost: StepCosts | None = None, *, accept_len=None, validate: bool = True) -> VerifyPlan:
        bs, block = check_conf_shape(conf, validate)
        costs = self._check_costs(cost, block)
        k, draft_next = self._choose(bs, block, costs)
        scores = self._scores(conf, validate=False)
        return self._make_plan(scores, constant_lengths(bs, k + 1, like=conf), num_tokens=bs * (k + 1),
                               draft_next=draft_next)

    def plan_without_draft(self, batch_size: int, block_size: int, cost: StepCosts | None = None) -> VerifyPlan:
        costs = self._check_costs(cost, block_size)
        plan = super().plan_without_draft(batch_size, block_size, costs)
        _, draft_next = self._choose(batch_size, block_size, costs)
        return VerifyPlan(plan.lengths, plan.num_tokens, block_size, plan.expected_tokens, draft_next, False)

    def observe(self, lengths: Array, num_accepted: Array) -> None:
        if is_tensor(lengths):
            torch = tensor_module()
            trials_t = torch.minimum(torch.as_tensor(num_accepted, device=lengths.device) + 1, lengths - 1)
            accepted, trials = float(torch.as_tensor(num_accepted).sum()), float(trials_t.sum())
        else:
            lengths = np.asarray(lengths, dtype=np.int64)
            num_accepted = np.asarray(num_accepted, dtype=np.int64)
            accepted, trials = float(num_accepted.sum()), float(np.minimum(num_accepted + 1, lengths - 1).sum())
        if trials > 0:
            self.state.update(accepted, trials, self.history_decay)
