"""``full``: verify every slot of every block (the DFlash baseline)."""

from __future__ import annotations

from ..scores import Array
from .base import Policy, VerifyPlan, check_conf_shape, constant_lengths, register


@register
class Full(Policy):
    """Verify all B slots of every request: K = bs * B, rho = 1."""

    name = "full"

    def plan(self, conf: Array, cost=None, *, accept_len=None, validate: bool = True) -> VerifyPlan:
        bs, block = check_conf_shape(conf, validate)
        scores = self._scores(conf, validate=False)
        return self._make_plan(scores, constant_lengths(bs, block, like=conf), num_tokens=bs * block)
