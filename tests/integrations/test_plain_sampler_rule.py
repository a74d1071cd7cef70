"""Which verification steps the vLLM plugin samples with vLLM's plain sampler (``hooks._plain_sampler``).

Only a step where no request carries a draft, with D-Cut's ``skip_undrafted_block`` on, and no request
wanting logprobs (``logprobs`` or ``logprob_token_ids``) or tracking a thinking budget: the rejection
sampler returns no ``logprob_token_ids`` logprobs, so the plain sampler would return them on undrafted
steps only, misaligned with the tokens (found by the hostile probe ``tests/reliability/probe_plain_sampler.py``).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from dcut_sched.integrations.vllm.hooks import _plain_sampler


class _Holder:
    def __init__(self, tracked: bool) -> None:
        self.tracked = tracked

    def has_tracked_requests(self) -> bool:
        return self.tracked


def _runner(**meta):
    fields = {"max_num_logprobs": None, "logprob_token_ids": None, "thinking_budget_state_holder": None, **meta}
    return SimpleNamespace(input_batch=SimpleNamespace(sampling_metadata=SimpleNamespace(**fields)))


ON = SimpleNamespace(skip_undrafted_block=True)


@pytest.mark.parametrize(("cfg", "max_drafts", "meta", "plain"), [
    (ON, 0, {}, True),
    (ON, 0, {"thinking_budget_state_holder": _Holder(False)}, True),
    (ON, 0, {"logprob_token_ids": {}}, True),
    (ON, 3, {}, False),
    (None, 0, {}, False),
    (SimpleNamespace(skip_undrafted_block=False), 0, {}, False),
    (ON, 0, {"max_num_logprobs": 0}, False),
    (ON, 0, {"max_num_logprobs": 2}, False),
    (ON, 0, {"logprob_token_ids": {1: [10, 20, 30]}}, False),
    (ON, 0, {"thinking_budget_state_holder": _Holder(True)}, False),
])
def test_plain_sampler_only_on_an_undrafted_step_without_logprobs(cfg, max_drafts, meta, plain):
    assert _plain_sampler(_runner(**meta), cfg, max_drafts) is plain
