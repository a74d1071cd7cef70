"""``ar``: plain autoregressive decoding, the baseline every speedup is measured against."""

from __future__ import annotations

from ..scores import Array
from .base import Policy, VerifyPlan, check_conf_shape, constant_lengths, register


@register
class Autoregressive(Policy):
    """Verify slot 1 (the anchor) only and never draft: one token per request per step.

    A step costs ``C_verify(bs, bs)`` and produces exactly ``bs`` tokens.
    """

    name = "ar"
    drafts_first_step = False
    speculative = False  # the engine without speculation: StepCosts.plain_ms

    def plan(self, conf: Array, cost=None, *, accept_len=None, validate: bool = True) -> VerifyPlan:
        bs, block = check_conf_shape(conf, validate)
        lengths = constant_lengths(bs, 1, like=conf)
        return VerifyPlan(lengths, bs, block, float(bs), draft_next=False)

    def plan_without_draft(self, batch_size: int, block_size: int, cost=None) -> VerifyPlan:
        plan = super().plan_without_draft(batch_size, block_size, cost)
        return VerifyPlan(plan.lengths, plan.num_tokens, block_size, plan.expected_tokens, False, False)
