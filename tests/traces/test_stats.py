"""Trace statistics: replay, tau, per-depth acceptance, reliability/ECE, selection curve (hand-computed)."""

import itertools
import math

import numpy as np
import pytest

from dcut_sched.traces import Trace
from dcut_sched.traces.stats import reliability, replay_rows, selection_curve_arrays, trace_stats


def hand_trace() -> Trace:
    # B = 4. request 0: 6 positions, request 1: 3 positions.
    return Trace(
        request_id=np.array([0, 0, 0, 0, 0, 0, 1, 1, 1], np.int32),
        pos=np.array([0, 1, 2, 3, 4, 5, 0, 1, 2], np.int32),
        accept_len=np.array([2, 1, 0, 1, 1, 0, 0, 1, 0], np.int8),
        conf=np.array([[0.9, 0.8, 0.2], [0.7, 0.1, 0.5], [0.3, 0.3, 0.3], [0.6, 0.4, 0.4],
                       [0.9, 0.6, 0.1], [0.5, 0.5, 0.5], [0.2, 0.9, 0.9], [0.8, 0.3, 0.2],
                       [0.4, 0.4, 0.4]], np.float32),
        metadata={"indexing": "position", "source": "synthetic"},
    )


def test_replay_and_tau_by_hand():
    t = hand_trace()
    # request 0: p0 (a=2) -> p3 (a=1) -> p5 (a=0) -> end; request 1: p0 (a=0) -> p1 (a=1) -> end
    assert replay_rows(t).tolist() == [0, 3, 5, 6, 7]
    s = trace_stats(t, bins=2)
    assert s["num_steps"] == 5
    assert s["tau"] == pytest.approx((3 + 2 + 1 + 1 + 2) / 5)
    assert s["tau_per_position"] == pytest.approx(1 + 6 / 9)
    # steps' accept lengths: 2, 1, 0, 0, 1 -> hist [2, 2, 1, 0]
    assert s["accept_len_hist"] == [2, 2, 1, 0]
    # depth 1: 3 of 5 steps accept; depth 2: 1 of 3; depth 3: 0 of 1
    assert s["accept_rate_by_depth"][:3] == pytest.approx([3 / 5, 1 / 3, 0.0])


def test_reliability_by_hand():
    conf = np.array([0.1, 0.2, 0.3, 0.7, 0.8, 0.9])
    ok = np.array([0, 0, 1, 1, 1, 0], bool)
    rows, ece = reliability(conf, ok, bins=2)
    assert [r["count"] for r in rows] == [3, 3]
    assert rows[0]["mean_conf"] == pytest.approx(0.2) and rows[0]["accept_rate"] == pytest.approx(1 / 3)
    assert rows[1]["mean_conf"] == pytest.approx(0.8) and rows[1]["accept_rate"] == pytest.approx(2 / 3)
    assert ece == pytest.approx(0.5 * abs(1 / 3 - 0.2) + 0.5 * abs(2 / 3 - 0.8))


def test_reached_slots_respect_the_length_cap():
    t = hand_trace()
    s = trace_stats(t, bins=1)
    # reached slots: depth t reached iff a >= t-1 and t <= positions remaining after p
    a = t.accept_len.astype(int)
    remaining = np.array([5, 4, 3, 2, 1, 0, 2, 1, 0])
    expected = sum(1 for i in range(9) for d in (1, 2, 3) if a[i] >= d - 1 and d <= remaining[i])
    assert s["num_reached_slots"] == expected


def brute_topk_tokens(conf, acc, k):
    """Best prefix-length vector by exhaustive search (max total score), tokens it produces."""
    bs, b = conf.shape[0], conf.shape[1] + 1
    scores = np.concatenate([np.ones((bs, 1)), np.cumprod(conf, axis=1)], axis=1)
    best, best_lengths = -1.0, None
    for lengths in itertools.product(range(1, b + 1), repeat=bs):
        if sum(lengths) != k:
            continue
        val = sum(scores[i, :lengths[i]].sum() for i in range(bs))
        if val > best + 1e-12:
            best, best_lengths = val, lengths
    return sum(1 + min(acc[i], best_lengths[i] - 1) for i in range(bs))


def test_selection_curve_matches_brute_force(rng):
    # Request r has a[r] + 1 positions and accepts a[r] drafts at position 0, so the full-verification
    # replay visits position 0 only and every batch of bs = 4 requests is the same four rows: exact.
    a0 = np.array([3, 1, 2, 0])
    conf0 = rng.uniform(0.05, 0.95, size=(4, 3)).astype(np.float32)
    lengths = a0 + 1
    rid = np.repeat(np.arange(4), lengths).astype(np.int32)
    pos = np.concatenate([np.arange(n) for n in lengths]).astype(np.int32)
    acc = np.concatenate([[a] + [0] * a for a in a0]).astype(np.int8)
    conf = np.repeat(conf0, lengths, axis=0)
    t = Trace(rid, pos, acc, conf, {"indexing": "position", "source": "synthetic"})
    assert replay_rows(t).tolist() == [0, 4, 6, 9]
    ratios = (0.25, 0.5, 0.75, 1.0)
    curve = selection_curve_arrays(t, batch_size=4, ratios=ratios, num_batches=5, seed=3)
    assert curve["num_tokens"].tolist() == [4, 8, 12, 16]
    exp_u = [sum(1 + min(a, math.ceil(rho * 4) - 1) for a in a0) for rho in ratios]
    exp_k = [brute_topk_tokens(conf0, a0, math.ceil(rho * 16)) for rho in ratios]
    assert curve["uniform"].tolist() == pytest.approx(exp_u)
    assert curve["topk"].tolist() == pytest.approx(exp_k)
    assert exp_k[-1] == exp_u[-1] == int((a0 + 1).sum())
