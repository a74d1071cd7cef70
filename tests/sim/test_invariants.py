"""Invariants of the replay that hold for any trace: checked against independent brute force."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dcut_sched import policies
from dcut_sched.simulator import RequestFeed, output_lengths, run_closed_loop, run_open_loop, simulate

from .conftest import build_trace, random_trace

B = 8


@pytest.fixture(scope="module")
def curve():
    from tests.conftest import linear_curve

    return linear_curve(batch_sizes=(1, 2, 4, 8), block_size=B, base_ms=5.0, per_token_ms=0.2)


def test_full_follows_the_trace_acceptance(trace, curve):
    """Under ``full`` each request walks p -> p + 1 + accept_len[p] (computed here by a plain loop)."""
    run = run_closed_loop(trace, curve, policies.get("full"), 3, num_steps=60, shuffle=False, record=True)
    for log in run.log:
        rows = trace.starts[log["request"]] + log["cursor"]
        assert log["tokens"].tolist() == (1 + trace.accept_len[rows].astype(int)).tolist()
    # Steps each request spends in the batch == length of its acceptance chain.
    chain_steps = []
    for r in range(trace.num_requests):
        p, n, steps = 0, trace.num_positions[r], 0
        while p < n:
            p += 1 + int(trace.accept_len[trace.starts[r] + p])
            steps += 1
        chain_steps.append(steps)
    seen: dict[int, int] = {}
    for log in run.log:
        for uid, req in zip(log["uid"], log["request"]):
            seen.setdefault(int(uid), 0)
            seen[int(uid)] += 1
    first_uid_of = {}
    for log in run.log:
        for uid, req in zip(log["uid"], log["request"]):
            first_uid_of.setdefault(int(uid), int(req))
    last_uids = set(int(u) for u in run.log[-1]["uid"])  # still running at the end: chain not complete
    for uid, count in seen.items():
        if uid not in last_uids:
            assert count == chain_steps[first_uid_of[uid]]


def test_full_tokens_per_step_is_one_plus_tau(trace, curve):
    """Mean tokens per request-step of ``full`` == mean of 1 + accept_len over the visited rows."""
    run = run_closed_loop(trace, curve, policies.get("full"), 4, num_steps=80, record=True)
    visited = np.concatenate([trace.starts[log["request"]] + log["cursor"] for log in run.log])
    assert run.steps.tokens.sum() / run.steps.batch_size.sum() == pytest.approx(
        1 + trace.accept_len[visited].astype(float).mean())


def test_ar_one_token_per_request_per_step(trace, curve):
    df = simulate(trace, curve, policies=["ar"], batch_sizes=[1, 4, 8], num_steps=50, warmup_steps=5)
    assert (df["mean_tokens_per_step"] == 1.0).all()
    assert (df["verified_tokens_per_step"] == 1.0).all()
    assert (df["draft_frac"] == 0.0).all() and (df["waste_frac"] == 0.0).all()
    for bs, tps in zip(df["batch_size"], df["tokens_per_s"]):
        assert tps == pytest.approx(1000.0 * bs / curve.verify_ms(bs, bs))


def test_oracle_wastes_nothing(trace, curve):
    run = run_closed_loop(trace, curve, policies.get("oracle"), 4, num_steps=60)
    assert np.array_equal(run.steps.tokens, run.steps.num_tokens)
    df = simulate(trace, curve, policies=["oracle", "full"], batch_sizes=[4], num_steps=60, warmup_steps=10)
    by = df.set_index("policy")
    assert by.loc["oracle", "waste_frac"] == 0.0
    # Same tokens per step as full (both accept everything the draft would get), fewer verified.
    assert by.loc["oracle", "mean_tokens_per_step"] == pytest.approx(by.loc["full", "mean_tokens_per_step"])


def test_uniform_rho_one_equals_full(trace, curve):
    full = run_closed_loop(trace, curve, policies.get("full"), 4, num_steps=70)
    uni = run_closed_loop(trace, curve, policies.get("uniform", rho=1.0), 4, num_steps=70)
    for name in ("step_ms", "tokens", "num_tokens", "drafted"):
        assert np.array_equal(getattr(full.steps, name), getattr(uni.steps, name)), name
    df = simulate(trace, curve, policies=["full", ("uniform", {"rho": 1.0})], batch_sizes=[4], num_steps=70,
                  warmup_steps=10)
    a, b = df[df.policy == "full"].iloc[0], df[df.policy == "uniform(rho=1.0)"].iloc[0]
    for col in ("tokens_per_s", "speedup_vs_ar", "mean_tokens_per_step", "waste_frac"):
        assert a[col] == b[col]


@pytest.mark.parametrize("name", policies.names())
def test_closed_loop_conservation(trace, curve, name):
    """Tokens produced == output lengths of finished requests + progress of those still running."""
    run = run_closed_loop(trace, curve, policies.get(name), 4, num_steps=120, seed=7)
    assert run.steps.tokens.sum() == run.finished_tokens + run.inflight_tokens
    assert run.finished_requests > 0


@pytest.mark.parametrize("name", ["ar", "full", "dcut", "fine", "oracle"])
def test_open_loop_conservation(trace, curve, name):
    run = run_open_loop(trace, curve, policies.get(name), 4, rate_rps=200.0, num_requests=20, seed=1)
    feed = RequestFeed(trace.num_requests, seed=1).take(20)  # the same seeded sequence the run admitted
    assert run.output_tokens.sum() == run.steps.tokens.sum() == output_lengths(trace)[feed].sum()
    assert np.all(run.output_tokens == output_lengths(trace)[feed])
    assert np.all(run.steps.batch_size <= 4) and np.all(run.steps.batch_size >= 1)
    assert np.all(run.finish_ms >= run.first_token_ms) and np.all(run.first_token_ms > run.start_ms)
    assert np.all(run.start_ms >= run.arrival_ms)


def test_same_requests_for_every_policy(trace, curve):
    """The request feed does not depend on the policy: with one slot, requests come in the same order."""
    orders = []
    for name in ("ar", "full", "dcut"):
        run = run_closed_loop(trace, curve, policies.get(name), 1, num_steps=150, seed=11, record=True)
        seq = list(dict.fromkeys(int(log["uid"][0]) * 1000 + int(log["request"][0]) for log in run.log))
        orders.append([s % 1000 for s in seq])
    shortest = min(len(o) for o in orders)
    assert shortest >= 3
    assert orders[0][:shortest] == orders[1][:shortest] == orders[2][:shortest]


def test_seed_reproducible(trace, curve):
    a = simulate(trace, curve, policies=["dcut"], batch_sizes=[4], num_steps=60, warmup_steps=5, seed=5)
    b = simulate(trace, curve, policies=["dcut"], batch_sizes=[4], num_steps=60, warmup_steps=5, seed=5)
    c = simulate(trace, curve, policies=["dcut"], batch_sizes=[4], num_steps=60, warmup_steps=5, seed=6)
    assert a.equals(b)
    assert not a["tokens_per_s"].equals(c["tokens_per_s"])


def test_warmup_excluded(trace, curve):
    run = run_closed_loop(trace, curve, policies.get("dcut"), 4, num_steps=50, warmup_steps=10)
    df = simulate(trace, curve, policies=["dcut"], batch_sizes=[4], num_steps=50, warmup_steps=10)
    row = df[df.policy == "dcut"].iloc[0]
    assert row["steps"] == 40
    assert row["tokens_per_s"] == pytest.approx(1000 * run.steps.tokens[10:].sum() / run.steps.step_ms[10:].sum())


def test_feed_cycles_with_fresh_offset():
    feed = RequestFeed(5, seed=0, shuffle=True)
    first = feed.take(5)
    assert sorted(first.tolist()) == [0, 1, 2, 3, 4] and feed.cycles == 0
    second = feed.take(5)
    assert sorted(second.tolist()) == [0, 1, 2, 3, 4] and feed.cycles == 1
    # A pass is the same order rotated by an offset.
    order = first.tolist()
    k = order.index(int(second[0]))
    assert second.tolist() == order[k:] + order[:k]
    assert RequestFeed(5, shuffle=False).take(7).tolist()[:5] == [0, 1, 2, 3, 4]


def test_cycling_is_reported(curve):
    small = random_trace(num_requests=2, block_size=B, min_len=3, max_len=4, seed=1)
    df = simulate(small, curve, policies=["ar"], batch_sizes=[2], num_steps=40, warmup_steps=0)
    assert df["trace_cycles"].iat[0] > 0 and df.attrs["trace_cycles"] > 0


def test_step_indexed_replay_is_approximate(make_curve):
    """Records consumed one per step; output length = sum(1 + accept_len); last step clipped."""
    curve = make_curve(block_size=4)
    # Request 0: records a = (2, 0) -> output length 3 + 1 = 4. Request 1: a = (3,) -> 4.
    trace = build_trace([([2, 0], [[0.9, 0.9, 0.9], [0.1, 0.1, 0.1]]), ([3], [[0.9, 0.9, 0.9]])], indexing="step")
    assert output_lengths(trace).tolist() == [4, 4]
    # full: request 0: 3 then 1 token (2 steps); request 1: 4 tokens in one step.
    run = run_closed_loop(trace, curve, policies.get("full"), 2, num_steps=1, shuffle=False, record=True)
    assert run.log[0]["tokens"].tolist() == [3, 4]
    # uniform rho = 0.5 (L = 2): request 0: 2 (record 0), then record 1: 1 token, then record 0 again
    # (wrapped): 2 tokens clipped to the 1 remaining -> 2 + 1 + 1 = 4 in 3 steps.
    run = run_closed_loop(trace, curve, policies.get("uniform", rho=0.5), 1, num_steps=3, shuffle=False, record=True)
    assert [log["tokens"].tolist() for log in run.log] == [[2], [1], [1]]
    assert [log["cursor"].tolist() for log in run.log] == [[0], [1], [0]]
    assert run.finished_tokens == 4 and run.approximate
    df = simulate(trace, curve, policies=["full"], batch_sizes=[2], num_steps=20, warmup_steps=2)
    assert df["approximate"].all() and df.attrs["approximate"] is True


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), bs=st.sampled_from([1, 2, 4, 8]),
       name=st.sampled_from(policies.names()))
def test_property_bounds_and_conservation(seed, bs, name):
    from tests.conftest import linear_curve

    trace = random_trace(num_requests=5, block_size=4, max_len=15, seed=seed)
    curve = linear_curve(block_size=4)
    run = run_closed_loop(trace, curve, policies.get(name), bs, num_steps=25, seed=seed, record=True)
    assert run.steps.tokens.sum() == run.finished_tokens + run.inflight_tokens
    for log in run.log:
        assert np.all(log["tokens"] >= 1) and np.all(log["tokens"] <= log["lengths"])
        assert np.all((log["lengths"] >= 1) & (log["lengths"] <= 4))
    assert np.all(run.steps.num_tokens >= run.steps.tokens)


def test_trace_built_in_code_is_validated(curve):
    from dcut_sched.traces import TraceError

    trace = random_trace(num_requests=3, block_size=B, seed=1)
    trace.conf[2, 1] = 2.0
    with pytest.raises(TraceError, match="c2"):
        simulate(trace, curve, policies=["full"], batch_sizes=[2], num_steps=10, warmup_steps=1)
