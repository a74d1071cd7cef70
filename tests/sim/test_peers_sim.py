"""The peer policies in the simulator: conservation, the one-step lag and SmartSpec's feedback as online."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dcut_sched import global_topk, policies, slot_scores
from dcut_sched.cli import sim as cli
from dcut_sched.simulator import RequestFeed, output_lengths, run_closed_loop, run_open_loop

from .conftest import random_trace

B = 8


@pytest.fixture(scope="module")
def curve():
    from tests.conftest import linear_curve

    return linear_curve(batch_sizes=(1, 2, 3, 4), block_size=B, base_ms=5.0, per_token_ms=0.2)


@pytest.mark.parametrize("name", policies.PEERS)
def test_closed_and_open_loop_conservation(trace, curve, name):
    run = run_closed_loop(trace, curve, policies.get(name), 4, num_steps=120, seed=7)
    assert run.steps.tokens.sum() == run.finished_tokens + run.inflight_tokens and run.finished_requests > 0
    run = run_open_loop(trace, curve, policies.get(name), 4, rate_rps=200.0, num_requests=20, seed=1)
    feed = RequestFeed(trace.num_requests, seed=1).take(20)
    assert np.all(run.output_tokens == output_lengths(trace)[feed])


def test_vllm_adaptive_lag_replays_the_previous_steps_confidences(trace, curve):
    """Step t verifies the top-K of step t-1's scores (same rows: the requests that sat there)."""
    run = run_closed_loop(trace, curve, policies.get("vllm_adaptive"), 3, num_steps=40, shuffle=False, record=True)
    assert run.log[0]["lengths"].tolist() == [B] * 3  # nothing cached on the first step
    for prev, log in zip(run.log, run.log[1:]):
        stale = trace.conf[trace.starts[prev["request"]] + prev["cursor"]]
        assert log["lengths"].tolist() == global_topk(slot_scores(stale), int(log["lengths"].sum())).tolist()


def test_smartspec_learns_from_the_simulated_outcomes(trace, curve):
    run = run_closed_loop(trace, curve, policies.get("smartspec"), 4, num_steps=60, seed=2, record=True)
    lengths = [set(log["lengths"].tolist()) for log in run.log if log["drafted"]]
    assert lengths[0] == {B} and all(len(s) == 1 for s in lengths)  # the first step measures, one k per step
    # on a drafter as expensive as this one the estimate can turn drafting off: a plain step then costs C_ar
    dear = __import__("tests.conftest", fromlist=["linear_curve"]).linear_curve(
        batch_sizes=(4,), block_size=B, base_ms=5.0, per_token_ms=0.2, draft_base_ms=50.0)
    run = run_closed_loop(trace, dear, policies.get("smartspec"), 4, num_steps=30, seed=2)
    assert run.steps.drafted[0] and not run.steps.drafted[5:].any()
    assert run.steps.step_ms[5:] == pytest.approx(dear.ar_ms(4))


def test_cli_accepts_the_peers(tmp_path, capsys, make_curve):
    trace_path, cost_path, out = tmp_path / "t.parquet", tmp_path / "c.json", tmp_path / "r.csv"
    random_trace(num_requests=6, block_size=4, max_len=20, seed=2).save(trace_path)
    make_curve(block_size=4).save(cost_path)
    rc = cli.main(["--trace", str(trace_path), "--cost", str(cost_path), "--policies", ",".join(policies.PEERS),
                   "--batch-sizes", "2,4", "--steps", "30", "--warmup", "5", "--quiet", "--out", str(out),
                   "--param", "tetris.draft_capacity=2", "--param", "dense_fallback.min_saving=0.2"])
    capsys.readouterr()
    assert rc == 0
    df = pd.read_csv(out)
    assert set(df["policy"]) == {"ar", "tetris(draft_capacity=2)", "smartspec", "vllm_adaptive", "dspark",
                                 "dense_fallback(min_saving=0.2)"}
