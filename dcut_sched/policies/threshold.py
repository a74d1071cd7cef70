"""``threshold``: per request, every slot whose score reaches a threshold (no global budget)."""

from __future__ import annotations

from ..scores import Array
from .base import Policy, VerifyPlan, check_conf_shape, register


@register
class Threshold(Policy):
    """Verify, per request, the slots with score ``s[i,k] >= tau`` (``tau`` in [0, 1]): a prefix of at
    least the anchor; the budget floats with the batch's confidence.
    """

    name = "threshold"

    def __init__(self, tau: float = 0.5):
        if not (0.0 <= tau <= 1.0):
            raise ValueError(f"threshold: tau={tau} must be in [0, 1]")
        self.tau = float(tau)

    def params(self) -> dict:
        return {"tau": self.tau}

    def plan(self, conf: Array, cost=None, *, accept_len=None, validate: bool = True) -> VerifyPlan:
        check_conf_shape(conf, validate)
        scores = self._scores(conf, validate=False)
        # Sum of a bool mask: int64 for numpy and torch alike; >= 1 because the anchor scores 1.
        lengths = (scores >= self.tau).sum(1)
        return self._make_plan(scores, lengths)
