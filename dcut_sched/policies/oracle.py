"""``oracle``: verifies exactly what will be accepted (not deployable; not an upper bound on speed).

It knows the acceptance and verifies exactly the accepted prefix, so no verified slot is wasted, but
it drafts on every step: where a plain decoding step is cheaper than drafting (large batch sizes,
low acceptance, a slow drafter) it falls below ``fine``, which stops drafting there (main job, mt-bench
at bs 64: 0.81x of ``ar`` against ``fine``'s 1.00x).
"""

from __future__ import annotations

from ..scores import Array
from .base import Policy, VerifyPlan, check_accept_len, check_conf_shape, register


@register
class Oracle(Policy):
    """Verify exactly ``1 + a[i]`` slots, where ``a[i]`` is the number of drafts the target accepts.

    Nothing verified is wasted and nothing acceptable is cut; only a replayed trace knows ``a``. It
    never skips the draft, so it bounds the choice of slots, not the speedup over plain decoding.
    """

    name = "oracle"
    needs_accept_len = True

    def plan(self, conf: Array, cost=None, *, accept_len: Array | None = None, validate: bool = True) -> VerifyPlan:
        bs, block = check_conf_shape(conf, validate)
        accept = check_accept_len(accept_len, bs, block, like=conf)
        scores = self._scores(conf, validate=False)
        return self._make_plan(scores, accept + 1)
