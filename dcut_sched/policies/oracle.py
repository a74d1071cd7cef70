"""``oracle``: verifies exactly what will be accepted (an upper bound, not deployable)."""

from __future__ import annotations

from ..scores import Array
from .base import Policy, VerifyPlan, check_accept_len, check_conf_shape, register


@register
class Oracle(Policy):
    """Verify exactly ``1 + a[i]`` slots, where ``a[i]`` is the number of drafts the target accepts.

    Nothing verified is wasted and nothing acceptable is cut; only a replayed trace knows ``a``.
    """

    name = "oracle"
    needs_accept_len = True

    def plan(self, conf: Array, cost=None, *, accept_len: Array | None = None, validate: bool = True) -> VerifyPlan:
        bs, block = check_conf_shape(conf, validate)
        accept = check_accept_len(accept_len, bs, block, like=conf)
        scores = self._scores(conf, validate=False)
        return self._make_plan(scores, accept + 1)
