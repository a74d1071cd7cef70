"""A draining batch (docs/design.md §2.1, "A draining batch"): once no request waits and none will
arrive, ``fine`` values a step by how much closer it brings the batch's end, from each request's
remaining tokens. The pure parts by hand, the policy by hand, and the plumbing of the controller,
the simulator's open loop and the project's engine."""

from __future__ import annotations

import numpy as np
import pytest

import dcut_sched as d
from dcut_sched.engine.decode_step import DecodeBatch
from dcut_sched.policies.fine import Fine
from dcut_sched.scores import ScoreRanking, drain_progress, drain_slots, slot_scores
from dcut_sched.simulator import run_open_loop
from dcut_sched.step_costs import StepCosts

from .conftest import build_trace

# conf .9 everywhere, B = 4: scores per request 1, .9, .81, .729
CONF = np.full((2, 3), 0.9)


def _costs(make_curve):
    # C_draft(2) = 2 ms, C_verify(2, K) = 2 + K ms, plain step C_ar(2) = 4 ms: plain rate .5 token/ms
    return StepCosts(make_curve(batch_sizes=(2,), base_ms=2.0, per_token_ms=1.0, draft_base_ms=1.0,
                                draft_per_request_ms=0.5), 4)


def test_drain_progress_by_hand():
    s = slot_scores(CONF)
    # both requests 10 tokens from their end, 4 slots each: the end moves by 1 + sum_d prod_i s[i, d]
    both = 1 + 0.81 + 0.81 ** 2 + 0.729 ** 2
    assert drain_progress(s, np.array([[4, 4]]), np.array([10, 10]))[0] == pytest.approx(both)
    # lengths [3, 2]: from d = 2 on the second request cannot be within reach -> 1 + .81
    assert drain_progress(s, np.array([[3, 2]]), np.array([10, 10]))[0] == pytest.approx(1.81)
    # the second request 7 tokens behind (>= B): only the first one's tokens count
    assert drain_progress(s, np.array([[4, 1]]), np.array([10, 3]))[0] == pytest.approx(1 + 0.9 + 0.81 + 0.729)
    # one behind by 1: d = 0, 1 are sure for it; at d = 2 it needs one accepted draft
    assert drain_progress(s, np.array([[4, 4]]), np.array([10, 9]))[0] == pytest.approx(1 + 0.9 + 0.81 * 0.9
                                                                                         + 0.729 * 0.81)
    # one request: its expected tokens, capped at its remaining tokens
    assert drain_progress(s[:1], np.array([[4]]), np.array([2]))[0] == pytest.approx(1.9)
    assert drain_progress(s[:1], np.array([[4]]), np.array([50]))[0] == pytest.approx(3.439)


def test_drain_progress_matches_sampling():
    rng = np.random.default_rng(7)
    conf = rng.random((5, 7))
    s = slot_scores(conf)
    remaining = np.array([12, 12, 10, 14, 13])
    lengths = ScoreRanking(s).lengths_at([5, 12, 20, 40])
    exact = drain_progress(s, lengths, remaining)
    u = rng.random((200_000, 5, 7))
    accepted = np.cumprod(u < conf[None], axis=2).sum(axis=2)
    for c, row in enumerate(lengths):
        end = np.maximum(remaining - 1 - np.minimum(accepted, row - 1), 0).max(axis=1)
        assert exact[c] == pytest.approx(remaining.max() - end.mean(), abs=0.01)


def test_lengths_at_equals_lengths_and_drain_slots_by_hand():
    rng = np.random.default_rng(3)
    ranking = ScoreRanking(slot_scores(rng.random((6, 7))))
    ks = [6, 7, 19, 48]
    assert ranking.lengths_at(ks).tolist() == [ranking.lengths(k).tolist() for k in ks]
    # B = 4; R_max = 10: a request d tokens behind keeps 4 - d slots (at least its anchor)
    assert drain_slots(np.array([10, 9, 7, 3]), 4).astype(int).tolist() == [
        [1, 1, 1, 1], [1, 1, 1, 0], [1, 0, 0, 0], [1, 0, 0, 0]]
    # R_max = 2 < B: slots beyond the end are of no use
    assert drain_slots(np.array([2, 1]), 4).astype(int).tolist() == [[1, 1, 0, 0], [1, 0, 0, 0]]


def test_fine_stops_drafting_an_equal_wave_that_plain_steps_end_as_soon(make_curve):
    costs = _costs(make_curve)
    queued = d.policies.get("fine", granularity=1)
    plan = queued.plan(CONF, costs)
    # every token counts: K = 8, 2 + 2 (1.9 + .81 ... ) = 6.878 tokens in 12 ms = .573 > 1.05 x .5
    assert plan.num_tokens == 8 and plan.draft_next is True
    draining = d.policies.get("fine", granularity=1)
    plan = draining.plan(CONF, costs, remaining=np.array([10, 10]))
    # the end moves 2.9975 steps = 5.995 tokens in 12 ms = .4996 < .525: the next step is plain
    assert plan.num_tokens == 8 and plan.draft_next is False
    assert draining.state.booked.booked_tokens == pytest.approx(2 * (1 + 0.81 + 0.81 ** 2 + 0.729 ** 2))
    # realized: one request accepted 3, the other none, so the end moved one step (2 tokens)
    draining.observe(plan.lengths, np.array([3, 0]))
    assert draining.state.booked.realized_tokens == 2.0
    assert float(draining.state.booked.accepted) == 3.0


def test_fine_drafts_only_the_request_that_sets_the_end(make_curve):
    fine = d.policies.get("fine", granularity=1)
    plan = fine.plan(CONF, _costs(make_curve), remaining=np.array([10, 3]))
    # the second request is 7 >= B tokens ahead: only the first one's drafts can bring the end closer
    assert plan.lengths.tolist() == [4, 1] and plan.num_tokens == 5 and plan.draft_next is True
    assert plan.expected_tokens == pytest.approx(3.439 + 1)


def test_one_request_far_from_its_end_plans_as_without_remaining(curve4):
    costs = StepCosts(curve4, 4)
    rng = np.random.default_rng(11)
    for _ in range(20):
        conf = rng.random((1, 3))
        a, b = d.policies.get("fine"), d.policies.get("fine")
        pa, pb = a.plan(conf, costs), b.plan(conf, costs, remaining=np.array([40]))
        assert (pa.lengths.tolist(), pa.num_tokens, pa.draft_next) == (pb.lengths.tolist(), pb.num_tokens,
                                                                       pb.draft_next)
        assert pa.expected_tokens == pytest.approx(pb.expected_tokens)


def test_controller_checks_remaining(make_curve):
    ctrl = d.RatioController(make_curve(batch_sizes=(2,), base_ms=2.0, per_token_ms=1.0), 4, policy="fine",
                             calibrate=False, granularity=1)
    with pytest.raises(TypeError, match="remaining must be integers"):
        ctrl.plan(CONF, remaining=np.array([1.5, 2.0]))
    with pytest.raises(ValueError, match=r"remaining must have shape \[2\]"):
        ctrl.plan(CONF, remaining=np.array([3, 3, 3]))
    plan = ctrl.plan(CONF, remaining=[0, 10])  # a value below 1 counts as 1 (the request ends this step)
    assert plan.lengths.tolist() == [1, 4]  # the first request ends this step: only the second sets the end
    assert ctrl.policy.state.booked.remaining.tolist() == [1, 10]


class _SpyFine(Fine):
    """``fine`` that keeps the ``remaining`` of every plan (class-level: the simulator plans on a copy)."""

    seen: list = []

    def plan(self, conf, cost=None, *, accept_len=None, remaining=None, validate=True):
        _SpyFine.seen.append(None if remaining is None else remaining.tolist())
        return super().plan(conf, cost, accept_len=accept_len, remaining=remaining, validate=validate)


def test_open_loop_passes_remaining_once_the_last_request_arrived(hand_curve):
    # A: 4 positions, B: 2, arrivals at 0 and 1 ms; drafts never accepted
    trace = build_trace([([0, 0, 0, 0], [[0.5, 0.5, 0.5]] * 4), ([0, 0], [[0.5, 0.5, 0.5]] * 2)])
    _SpyFine.seen = []
    policy = _SpyFine(probe_interval=1, probe_budget=0.9, speculate_margin=-1.0)  # drafts every step
    run_open_loop(trace, hand_curve, policy, 2, rate_rps=1.0, num_requests=2, shuffle=False,
                  arrival_ms=np.array([0.0, 1.0]))
    # step 1: A alone, B not arrived -> no remaining; then both in, none waiting: A 3 left, B 2, ...
    assert _SpyFine.seen[0] is None
    assert _SpyFine.seen[1] == [3, 2]
    assert all(s is not None for s in _SpyFine.seen[1:])


def test_engine_batch_gives_remaining_only_when_none_waits():
    batch = DecodeBatch([[1, 2], [3], [4]], num_rows=2, max_new_tokens=5, eos_id=None)
    batch.admit()
    assert batch.remaining([0, 1]) is None  # the third prompt waits
    batch.commit(0, [7, 8])
    batch.commit(1, [9, 9, 9, 9, 9])  # the second request ends: its row is free
    batch.admit()
    assert batch.remaining([0, 1]) == [3, 5]
