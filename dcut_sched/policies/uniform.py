"""``uniform``: the same fixed cutoff for every request (per-request truncation)."""

from __future__ import annotations

import math

from ..scores import Array
from .base import Policy, VerifyPlan, check_conf_shape, constant_lengths, register


@register
class Uniform(Policy):
    """Verify the first ``ceil(rho * B)`` slots of every request, whatever the confidences.

    Args:
        rho: verification ratio in (0, 1]; ``rho=1`` is ``full``.
    """

    name = "uniform"

    def __init__(self, rho: float = 0.5):
        if not (0.0 < rho <= 1.0):
            raise ValueError(f"uniform: rho={rho} must be in (0, 1]")
        self.rho = float(rho)

    def params(self) -> dict:
        return {"rho": self.rho}

    def plan(self, conf: Array, cost=None, *, accept_len=None, validate: bool = True) -> VerifyPlan:
        bs, block = check_conf_shape(conf, validate)
        length = min(max(math.ceil(self.rho * block - 1e-9), 1), block)
        scores = self._scores(conf, validate=False)
        return self._make_plan(scores, constant_lengths(bs, length, like=conf), num_tokens=bs * length)
