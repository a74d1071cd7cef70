"""RequestBatch (dcut_sched/controller/request_batch.py), by hand: plans by request id, clipping to
the drafts available, dropped and unplanned accounting, the metrics window, the step records."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest

from dcut_sched import RatioController
from dcut_sched.controller.request_batch import (
    DraftDepth,
    MetricsWindow,
    RequestBatch,
    confidence_matrix,
    summarize_metrics,
)

B = 4

#: The step record's keys, in the order the vLLM scheduler has always written them (docs/vllm.md).
RECORD_KEYS = ["step", "batch_size", "num_spec_tokens_to_schedule", "planned", "verified", "dropped", "drafted",
               "draft_next", "draining", "ratio", "num_tokens", "plan_ms", "expected_tokens", "conf", "drafts", "num_output",
               "unplanned", "accepted"]


class FakeController:
    """Hands out the lengths it is told to and remembers what it was fed."""

    block_size = B

    def __init__(self):
        self.next_lengths: list[int] = []
        self.draft_next = True
        self.planned: list[np.ndarray] = []
        self.observed: list[list[int]] = []

    def plan(self, conf, accept_len=None):
        self.planned.append(np.asarray(conf))
        n = len(self.next_lengths)
        return SimpleNamespace(lengths=np.array(self.next_lengths, dtype=np.int64), batch_size=n,
                               draft_next=self.draft_next, ratio=sum(self.next_lengths) / (n * B),
                               expected_tokens=1.5)

    def plan_without_draft(self, batch_size, device=None):
        return SimpleNamespace(lengths=np.ones(batch_size, dtype=np.int64), batch_size=batch_size,
                               draft_next=self.draft_next, ratio=1 / B, expected_tokens=float(batch_size))

    def observe(self, accept_len, step_ms=None):
        assert accept_len.dtype == np.int64
        self.observed.append(accept_len.tolist())
        self.step_ms = step_ms


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def make(tmp_path=None, **kw):
    ctrl = FakeController()
    clock, timer = Clock(), Clock()
    rb = RequestBatch(ctrl, record_path=tmp_path / "steps.jsonl" if tmp_path else None, clock=clock, timer=timer, **kw)
    return ctrl, rb, clock, timer


def test_confidence_matrix_pads_and_cuts_rows():
    m = confidence_matrix([[0.5], [0.1, 0.2, 0.3, 0.4], []], 3)
    assert m.dtype == np.float32 and m.shape == (3, 3)
    assert m.tolist() == [[0.5, 0.0, 0.0], [np.float32(0.1), np.float32(0.2), np.float32(0.3)], [0.0, 0.0, 0.0]]


def test_plan_maps_ids_and_clips_to_the_drafts_available():
    ctrl, rb, _, timer = make()
    ctrl.next_lengths = [4, 2, 3]
    timer.t = 1.0
    plan = rb.plan(["a", "b", "c"], [[1, 2, 3], [4, 5, 6], [7]], confidence_matrix([[.9] * 3, [.5] * 3, [.8]], 3),
                   started=0.998)
    # c planned 3 slots but has one draft: 1 + 1 = 2 slots
    assert plan.req_ids == ["a", "b", "c"] and plan.lengths == [4, 2, 2] and plan.num_tokens == 8
    assert plan.kept == [[1, 2, 3], [4], [7]]
    assert plan.drafted and plan.draft_next and plan.plan_batch_size == 3
    assert plan.plan_ms == pytest.approx(2.0)
    assert plan.conf is None and plan.drafts is None  # not recording
    assert ctrl.planned[0].shape == (3, 3)


def test_schedule_and_observe_account_verified_dropped_and_unplanned():
    ctrl, rb, _, _ = make()
    ctrl.next_lengths = [4, 2, 3]
    plan = rb.plan(["a", "b", "c"], [[1, 2, 3], [4, 5, 6], [7, 8, 9]], np.full((3, 3), 0.5, np.float32))
    # b finished before the step ran; a runs its 3 drafts, c runs 2, d was not planned but runs 3 drafts
    flight = rb.schedule(plan, ["a", "c", "d", "e"], {"a": 3, "c": 2, "d": 3})
    assert flight.verified == {"a": 4, "c": 3} and flight.dropped == ["b"]
    assert flight.unplanned == {"d": 4} and flight.batch_size == 4
    rec = rb.observe(flight, {"a": 2, "c": 0, "d": 1})
    assert ctrl.observed == [[2, 0, 0]]  # in plan order; dropped b counts 0; d is not the plan's
    assert rec["planned"] == {"a": 4, "b": 2, "c": 3} and rec["dropped"] == ["b"]
    assert rec["unplanned"] == {"d": 4} and rec["accepted"] == {"a": 2, "c": 0, "d": 1}
    assert rec["num_tokens"] == 9 and rec["ratio"] == 9 / 12 and rec["expected_tokens"] == 1.5


def test_requests_join_and_leave_between_steps():
    ctrl, rb, _, _ = make()
    ctrl.next_lengths = [2, 3]
    p1 = rb.plan(["a", "b"], [[1, 2, 3], [4, 5, 6]], np.full((2, 3), 0.5, np.float32))
    r1 = rb.observe(rb.schedule(p1, ["a", "b", "c"], {"a": 1, "b": 2}), {"a": 1, "b": 2})  # c: its prefill
    ctrl.next_lengths = [3, 1]
    p2 = rb.plan(["b", "c"], [[7, 8, 9], [10, 11, 12]], np.full((2, 3), 0.5, np.float32))  # a left, c joined
    r2 = rb.observe(rb.schedule(p2, ["b", "c"], {"b": 2}), {"b": 0})
    assert (r1["step"], r2["step"]) == (0, 1)
    assert r1["planned"] == {"a": 2, "b": 3} and r1["verified"] == {"a": 2, "b": 3} and r1["batch_size"] == 3
    assert r2["planned"] == {"b": 3, "c": 1} and r2["verified"] == {"b": 3, "c": 1} and r2["dropped"] == []
    assert ctrl.observed == [[1, 2], [0, 0]]


def test_plan_without_draft_and_a_step_without_plan():
    ctrl, rb, _, _ = make()
    ctrl.draft_next = False
    plain = rb.plan_without_draft(3)
    assert plain.req_ids == [] and plain.kept == [] and not plain.drafted and not plain.draft_next
    rec = rb.observe(rb.schedule(plain, ["a", "b", "c"], {}), {})
    assert ctrl.observed == [[0, 0, 0]]  # observed once per plan, at the plan's batch size
    assert rec == {"step": 0, "batch_size": 3, "planned": {}, "verified": {}, "dropped": [], "drafted": False,
                   "draft_next": False, "draining": False, "ratio": None, "num_tokens": 0, "plan_ms": rec["plan_ms"],
                   "expected_tokens": None, "unplanned": {}, "accepted": {}}
    # vLLM resumed a preempted request with drafts but there was no plan: no feedback, no plan fields
    rec = rb.observe(rb.schedule(None, ["a"], {"a": 3}), {"a": 1})
    assert rec == {"step": 1, "batch_size": 1, "unplanned": {"a": 4}, "accepted": {"a": 1}}
    assert len(ctrl.observed) == 1


def test_metrics_window_by_hand():
    windows = []
    ctrl, rb, clock, timer = make(log_interval_s=10.0, on_window=windows.append)
    ctrl.next_lengths = [4, 2]
    timer.t = 0.002  # every plan takes 2 ms
    p = rb.plan(["a", "b"], [[1, 2, 3], [4, 5, 6]], np.full((2, 3), 0.5, np.float32), started=0.0)
    rb.observe(rb.schedule(p, ["a", "b"], {"a": 3, "b": 1}), {"a": 3, "b": 0})
    ctrl.next_lengths = [3, 3]
    p = rb.plan(["a", "b"], [[1, 2, 3], [4, 5, 6]], np.full((2, 3), 0.5, np.float32), started=0.0)
    clock.t = 10.0  # the window is due at this step
    rb.observe(rb.schedule(p, ["a"], {"a": 2}), {"a": 1})  # b dropped
    # window: 2 steps, 2 drafted; verified slots 4+2+3 = 9 of 4*3 = 12 drafted; 3 verified request-steps
    # accepted 3+0+1 = 4: 4/3 per request-step, (4+3)/3 tokens per request-step; 4 ms / 2 steps
    assert len(windows) == 1
    w = windows[0]
    assert (w["steps"], w["drafted_steps"], w["keep_ratio"]) == (2, 2, 0.75)
    assert w["accepted_per_request_step"] == pytest.approx(4 / 3)
    assert w["tokens_per_request_step"] == pytest.approx(7 / 3)
    assert w["plan_ms_per_step"] == pytest.approx(2.0)
    # the next window starts empty; totals keep counting
    p = rb.plan_without_draft(1, started=0.0)
    clock.t = 15.0
    rb.observe(rb.schedule(p, ["a"], {}), {})
    assert len(windows) == 1  # 5 s old: not due
    m = rb.metrics
    assert (m["steps"], m["drafted_steps"], m["keep_ratio"]) == (3, 2, 0.75)
    assert m["plan_ms_per_step"] == pytest.approx(6.0 / 3)
    rb.close()  # shutdown hands over the open window
    assert len(windows) == 2 and windows[1]["steps"] == 1 and windows[1]["drafted_steps"] == 0
    assert math.isnan(windows[1]["keep_ratio"])


def test_empty_window_is_not_handed_over():
    w = MetricsWindow(Clock())
    assert w.roll() is None
    s = summarize_metrics(w.totals)
    assert s["steps"] == 0 and math.isnan(s["keep_ratio"]) and s["plan_ms_per_step"] == 0


def test_records_written_in_todays_format(tmp_path):
    ctrl, rb, _, timer = make(tmp_path)
    assert rb.recording
    ctrl.next_lengths = [2, 4]
    timer.t = 0.0005
    plan = rb.plan(["0-x", "1-y"], [[11, 12, 13], [21, 22]], confidence_matrix([[0.1234567, 0.5, 0.25], [0.9, 1.0]], 3),
                   num_output=[5, 7], started=0.0)
    flight = rb.schedule(plan, ["0-x", "1-y"], {"0-x": 1, "1-y": 2}, num_spec_tokens_to_schedule=3)
    rec = rb.observe(flight, {"0-x": 1, "1-y": 2})
    rb.close()
    lines = (tmp_path / "steps.jsonl").read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0]) == rec
    assert list(rec) == RECORD_KEYS
    assert rec == {
        "step": 0, "batch_size": 2, "num_spec_tokens_to_schedule": 3,
        "planned": {"0-x": 2, "1-y": 3}, "verified": {"0-x": 2, "1-y": 3}, "dropped": [], "drafted": True,
        "draft_next": True, "draining": False, "ratio": 6 / 8, "num_tokens": 5, "plan_ms": pytest.approx(0.5),
        "expected_tokens": 1.5,
        "conf": {"0-x": [0.123457, 0.5, 0.25], "1-y": [0.9, 1.0, 0.0]},  # float32, 6 decimals, padded
        "drafts": {"0-x": [11, 12, 13], "1-y": [21, 22]},  # every draft, not only the kept ones
        "num_output": {"0-x": 5, "1-y": 7},
        "unplanned": {}, "accepted": {"0-x": 1, "1-y": 2},
    }
    # a plan without draft records the per-request maps empty
    rb = RequestBatch(ctrl, record_path=tmp_path / "plain.jsonl")
    rec = rb.observe(rb.schedule(rb.plan_without_draft(2), ["0-x", "1-y"], {}, num_spec_tokens_to_schedule=0), {})
    assert list(rec) == RECORD_KEYS and rec["conf"] == rec["drafts"] == rec["num_output"] == {}
    rb.close()
    # appended, never truncated
    rb2 = RequestBatch(ctrl, record_path=tmp_path / "steps.jsonl")
    rb2.observe(rb2.schedule(None, [], {}), {})
    rb2.close()
    assert len((tmp_path / "steps.jsonl").read_text().splitlines()) == 2


def test_with_the_real_controller():
    ctrl = RatioController(None, B, policy="full")
    rb = RequestBatch(ctrl)
    plan = rb.plan([7, 3], [[1, 2, 3], [4]], np.full((2, B - 1), 0.5, np.float32))
    assert plan.lengths == [4, 2] and plan.kept == [[1, 2, 3], [4]]  # full plans 4; 3 has one draft
    rb.observe(rb.schedule(plan, [7, 3], {7: 3, 3: 1}), {7: 2, 3: 1})
    m = ctrl.metrics
    assert m["observed_steps"] == 1 and m["accepted_drafts"] == 3 and m["bad_accept_requests"] == 0


def test_draft_depth_follows_the_deepest_kept_draft_with_full_blocks_to_look_deeper():
    depth = DraftDepth(8, window=3, refresh=6)
    # the whole block (7 slots) until the window holds 3 drafted plans, then its deepest kept draft
    assert [depth.next(k) for k in (2, 3, 1)] == [7, 7, 3]
    assert [depth.next(k) for k in (1, 1)] == [3, 1]  # the 3 leaves the window
    assert depth.next(0) == 1  # no draft kept still drafts one slot
    assert depth.next(9) == 7  # clipped to the block
    assert depth.next(2) == 7  # the 6th plan since the last full block: a full one (refresh)
    assert depth.next(None) == 7  # a plan without draft (a probe follows): the whole block, window emptied
    assert [depth.next(k) for k in (4, 2, 2, 2)] == [7, 7, 4, 2]
    with pytest.raises(ValueError, match="window"):
        DraftDepth(8, window=0)


def test_request_batch_gives_each_plan_its_draft_depth():
    ctrl = FakeController()
    rb = RequestBatch(ctrl, draft_depth=DraftDepth(B, window=1, refresh=100))
    ctrl.next_lengths = [2, 3]
    plan = rb.plan(["a", "b"], [[5, 6, 7], [8]], np.full((2, B - 1), 0.9))
    # b has one draft, so its 3 is clipped to 2: the deepest kept draft is 1, the pass drafts 1 slot
    assert plan.lengths == [2, 2] and plan.draft_depth == 1
    assert rb.plan_without_draft(2).draft_depth == B - 1
    assert RequestBatch(ctrl).plan(["a"], [[1]], np.full((1, B - 1), 0.9)).draft_depth is None
