"""The engine plans and observes through RequestBatch (its second client, after vLLM's scheduler)."""

from __future__ import annotations

import json

import pytest

from dcut_sched import RatioController
from dcut_sched.controller.request_batch import RequestBatch
from dcut_sched.engine import SpecEngine, spec_engine
from dcut_sched.model import greedy_generate

B = 4


@pytest.mark.parametrize("policy", ["full", "uniform", "ar", "oracle"])
def test_engine_steps_go_through_the_request_batch(tiny, monkeypatch, tmp_path, policy):
    prompts = [[5, 9, 2], [7], [3, 3, 3, 3], [11, 4], [8, 1, 6]]
    batches: list[RequestBatch] = []

    class Spy(RequestBatch):  # the engine's own RequestBatch, writing the records vLLM's scheduler writes
        def __init__(self, controller, **kw):
            super().__init__(controller, record_path=tmp_path / f"{policy}.jsonl", **kw)
            batches.append(self)

    monkeypatch.setattr(spec_engine, "RequestBatch", Spy)
    ctrl = RatioController(None, B, policy=policy, **({"rho": 0.5} if policy == "uniform" else {}))
    result = SpecEngine(tiny, ctrl, batch_size=3, max_new_tokens=6, skip_layers=(2,)).generate(prompts)
    assert result.outputs == greedy_generate(tiny, prompts, 6, eos_id=None, batch_size=1)
    assert len(batches) == 1
    batches[0].close()
    records = [json.loads(line) for line in (tmp_path / f"{policy}.jsonl").read_text().splitlines()]
    assert len(records) == len(result.steps)
    for rec, step in zip(records, result.steps):
        ids = [str(q) for q in step.request_ids]  # JSON keys
        assert rec["step"] == step.step and rec["batch_size"] == step.batch_size
        assert rec["drafted"] == step.drafted and rec["dropped"] == [] and rec["unplanned"] == {}
        if step.drafted:
            assert rec["planned"] == dict(zip(ids, step.lengths)) == rec["verified"]
            assert rec["accepted"] == dict(zip(ids, step.accepted))
            assert rec["num_tokens"] == step.num_tokens and rec["ratio"] == pytest.approx(step.ratio)
        else:
            assert rec["planned"] == {} and rec["ratio"] is None
    # the controller was fed once per step, the drafts accepted the steps report
    m = ctrl.metrics
    assert m["observed_steps"] == len(result.steps) == batches[0].metrics["steps"]
    assert m["accepted_drafts"] == sum(a for s in result.steps if s.drafted for a in s.accepted)
    assert batches[0].metrics["drafted_steps"] == sum(s.drafted for s in result.steps)
