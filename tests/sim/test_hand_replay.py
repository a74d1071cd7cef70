"""Closed-loop replays of the 3-request hand trace (conftest.hand_trace), worked out by hand.

Setup: bs = 2, trace order (no shuffle): slot 0 starts with A, slot 1 with B; the first request to
finish is replaced by C. Cost: C_verify(2, K) = 2 + K ms, C_draft(2) = 2.5 ms, C_verify(1, K) = 2 + K.

Step 1 scores (prefix products of the confidences):
  A p0 conf (0.9, 0.5, 0.2)   -> (1, 0.9, 0.45, 0.09),       accept_len 2
  B p0 conf (0.95, 0.9, 0.9)  -> (1, 0.95, 0.855, 0.7695),   accept_len 3
Sorted over the batch: 1, 1, .95 (B), .9 (A), .855 (B), .7695 (B), .45 (A), .09 (A).
A request verifying L slots produces 1 + min(accept_len, L - 1) tokens.
"""

from __future__ import annotations

import numpy as np
import pytest

from dcut_sched import policies
from dcut_sched.simulator import run_closed_loop


def replay(trace, curve, policy, steps, **params):
    p = policies.get(policy, **params) if isinstance(policy, str) else policy
    return run_closed_loop(trace, curve, p, 2, num_steps=steps, shuffle=False, record=True)


def lengths(run):
    return [log["lengths"].tolist() for log in run.log]


def tokens(run):
    return [log["tokens"].tolist() for log in run.log]


def test_ar(hand_trace, hand_curve):
    # Every step: anchor only, 1 token each, C_verify(2, 2) = 4 ms, never drafts.
    run = replay(hand_trace, hand_curve, "ar", 5)
    assert lengths(run) == [[1, 1]] * 5
    assert tokens(run) == [[1, 1]] * 5
    assert run.steps.step_ms.tolist() == [4.0] * 5
    assert not run.steps.drafted.any()
    # B (4 positions) finishes at step 4 and C takes its slot at position 0.
    assert [log["request"].tolist() for log in run.log] == [[0, 1]] * 4 + [[0, 2]]
    assert run.log[4]["cursor"].tolist() == [4, 0]


def test_full(hand_trace, hand_curve):
    # Step 1: L = (4, 4); A 1+min(2,3) = 3 -> p3, B 1+3 = 4 -> finished; 2.5 + C_verify(2, 8) = 12.5 ms.
    # Step 2: A p3 (accept 2) -> 3 tokens, finished; C p0 (accept 1) -> 2 tokens.
    run = replay(hand_trace, hand_curve, "full", 2)
    assert lengths(run) == [[4, 4], [4, 4]]
    assert tokens(run) == [[3, 4], [3, 2]]
    assert run.steps.step_ms.tolist() == [12.5, 12.5]
    assert run.log[1]["request"].tolist() == [0, 2]
    assert run.finished_requests == 2 and run.finished_tokens == 6 + 4
    assert run.inflight_tokens == 2  # C at position 2


def test_uniform(hand_trace, hand_curve):
    # rho = 0.5 -> ceil(0.5 * 4) = 2 slots each, K = 4, 2.5 + 6 = 8.5 ms.
    # Step 1: A a=2 -> 2, B a=3 -> 2.  Step 2: A p2 a=1 -> 2 (p4), B p2 a=1 -> 2 (p4, finished).
    # Step 3: A p4 a=1 -> 2 (finished), C p0 a=1 -> 2.
    run = replay(hand_trace, hand_curve, "uniform", 3, rho=0.5)
    assert lengths(run) == [[2, 2]] * 3
    assert tokens(run) == [[2, 2]] * 3
    assert run.steps.step_ms.tolist() == [8.5] * 3
    assert [log["request"].tolist() for log in run.log] == [[0, 1], [0, 1], [0, 2]]
    assert [log["cursor"].tolist() for log in run.log] == [[0, 0], [2, 2], [4, 0]]


def test_threshold(hand_trace, hand_curve):
    # tau = 0.5. Step 1: A keeps (1, .9) -> 2; B keeps all 4. Tokens 2, 4. K = 6: 2.5 + 8 = 10.5 ms.
    # Step 2: A p2 (1, .6, .36, .216) -> 2; C p0 (1, .5, .25, .125) -> 2 (0.5 >= 0.5).
    #   Tokens: A 1+min(1,1) = 2, C 1+min(1,1) = 2. K = 4: 8.5 ms.
    run = replay(hand_trace, hand_curve, "threshold", 2, tau=0.5)
    assert lengths(run) == [[2, 4], [2, 2]]
    assert tokens(run) == [[2, 4], [2, 2]]
    assert run.steps.step_ms.tolist() == [10.5, 8.5]
    assert run.log[1]["cursor"].tolist() == [2, 0]


def test_topk(hand_trace, hand_curve):
    # rho = 0.5 -> K = ceil(0.5 * 2 * 4) = 4: anchors, .95 (B), .9 (A) -> L = (2, 2); tokens 2, 2.
    # Step 2: A p2 (1, .6, ...), B p2 (1, .7, .07, ...): anchors, .7 (B), .6 (A) -> (2, 2); tokens 2, 2.
    run = replay(hand_trace, hand_curve, "topk", 2, rho=0.5)
    assert lengths(run) == [[2, 2], [2, 2]]
    assert tokens(run) == [[2, 2], [2, 2]]
    assert run.steps.step_ms.tolist() == [8.5, 8.5]


def test_dcut(hand_trace, hand_curve):
    # Buckets K = 2, 4, 6, 8 cost 4, 6, 8, 10 ms (verify only, as published).
    # Step 1: E = 2, 3.85, 5.4745, 6.0145 -> U = .5, .6417, .6843, .6015 -> K = 6:
    #   top 6 = anchors, .95 B, .9 A, .855 B, .7695 B -> L = (2, 4); tokens 2, 4 (B finished); 10.5 ms.
    # Step 2: A p2 (1, .6, .36, .216), C p0 (1, .5, .25, .125): sorted 1, 1, .6, .5, .36, .25, .216, .125
    #   E = 2, 3.1, 3.71, 4.051 -> U = .5, .5167, .4638, .4051 -> K = 4: L = (2, 2); tokens 2, 2; 8.5 ms.
    run = replay(hand_trace, hand_curve, "dcut", 2)
    assert lengths(run) == [[2, 4], [2, 2]]
    assert tokens(run) == [[2, 4], [2, 2]]
    assert run.steps.step_ms.tolist() == [10.5, 8.5]
    assert run.steps.expected_tokens[0] == pytest.approx(5.4745, abs=1e-5)
    assert run.steps.expected_tokens[1] == pytest.approx(3.1, abs=1e-6)


def test_fine_granularity_eight_stops_drafting(hand_trace, hand_curve):
    # granularity 8 at bs 2, B 4: candidates K in {2, 8}; step time 2.5 + 2 + K = 6.5 or 12.5 ms.
    # Step 1: E(2) = 2, E(8) = 6.0145 -> per ms .3077, .4812 -> K = 8: L = (4, 4), tokens 3, 4.
    #   Running rate .4812 tokens/ms < ar's 2 / C_verify(2, 2) = .5 -> next step plain.
    # Steps 2..: plain (anchor only, 4 ms, 1 token each) until the probe after 16 plain steps.
    run = replay(hand_trace, hand_curve, "fine", 3, granularity=8)
    assert lengths(run) == [[4, 4], [1, 1], [1, 1]]
    assert tokens(run) == [[3, 4], [1, 1], [1, 1]]
    assert run.steps.step_ms.tolist() == [12.5, 4.0, 4.0]
    assert run.steps.drafted.tolist() == [True, False, False]
    assert run.steps.num_tokens.tolist() == [8, 2, 2]


def test_fine_default_every_count(hand_trace, hand_curve):
    # The default (every count, bs*B = 8 <= 128): every K in 2..8: E = 2, 2.95, 3.85, 4.705, 5.4745,
    # 5.9245, 6.0145 over 6.5..12.5 ms;
    # per ms peaks at K = 6 (5.4745 / 10.5 = .5214 > .5): L = (2, 4), tokens 2, 4; keeps drafting.
    run = replay(hand_trace, hand_curve, "fine", 2, speculate_margin=0.0)
    assert lengths(run)[0] == [2, 4]
    assert tokens(run)[0] == [2, 4]
    assert run.steps.step_ms[0] == 10.5
    assert run.steps.drafted.tolist() == [True, True]
    # the default margin (5 %) asks for more than .5214 / .5 = 4.3 %: the next step is plain
    run = replay(hand_trace, hand_curve, "fine", 2, granularity=1)
    assert run.steps.drafted.tolist() == [True, False]


def test_oracle(hand_trace, hand_curve):
    # L = 1 + accept_len: step 1 (3, 4) -> K = 7, 2.5 + 9 = 11.5 ms; step 2: A p3 a=2 -> 3, C p0 a=1 -> 2,
    # K = 5, 9.5 ms. Nothing verified is wasted.
    run = replay(hand_trace, hand_curve, "oracle", 2)
    assert lengths(run) == [[3, 4], [3, 2]]
    assert tokens(run) == [[3, 4], [3, 2]]
    assert run.steps.step_ms.tolist() == [11.5, 9.5]
    assert run.steps.num_tokens.tolist() == run.steps.tokens.tolist()


def test_overhead_only_on_drafted_steps(hand_trace, hand_curve):
    run = run_closed_loop(hand_trace, hand_curve, policies.get("fine", granularity=8), 2, num_steps=2,
                          shuffle=False, overhead_ms=1.5)
    assert run.steps.step_ms.tolist() == [12.5 + 1.5, 4.0]


def test_simulated_clock_is_sum_of_steps(hand_trace, hand_curve):
    run = replay(hand_trace, hand_curve, "dcut", 6)
    assert run.steps.step_ms.sum() == pytest.approx(sum(log["step_ms"] for log in run.log))
    assert np.all(run.steps.batch_size == 2)
