"""Open loop: a hand-worked schedule with explicit arrival times, prefill, and the latency figures."""

from __future__ import annotations

import numpy as np
import pytest

from dcut_sched import policies
from dcut_sched.simulator import SimulationError, run_open_loop, simulate
from dcut_sched.simulator.results import open_loop_row

from .conftest import build_trace


@pytest.fixture
def two_requests():
    # A: 4 positions, B: 2 positions, B = 4, accept_len 0 everywhere (drafts never accepted).
    conf = [[0.5, 0.5, 0.5]]
    return build_trace([([0, 0, 0, 0], conf * 4), ([0, 0], conf * 2)])


def test_ar_schedule_by_hand(two_requests, hand_curve):
    # C_verify(bs, bs) = 2 + bs: 3 ms at bs 1, 4 ms at bs 2. Arrivals at 0 and 1 ms, max batch 2.
    # t=0: A admitted, step bs 1 -> t=3 (A p1). B waiting since 1 -> admitted at 3;
    # t=3: step bs 2 -> t=7 (A p2, B p1); t=7 -> 11 (A p3, B p2 finished); t=11: bs 1 -> 14 (A done).
    run = run_open_loop(two_requests, hand_curve, policies.get("ar"), 2, rate_rps=1.0, num_requests=2,
                        shuffle=False, arrival_ms=np.array([0.0, 1.0]))
    assert run.steps.step_ms.tolist() == [3.0, 4.0, 4.0, 3.0]
    assert run.steps.batch_size.tolist() == [1, 2, 2, 1]
    assert run.start_ms.tolist() == [0.0, 3.0]
    assert run.first_token_ms.tolist() == [3.0, 7.0]
    assert run.finish_ms.tolist() == [14.0, 11.0]
    assert run.output_tokens.tolist() == [4, 2]
    row = open_loop_row(run)
    # TPOT = decode time / output tokens: A 14 / 4 = 3.5, B (11 - 3) / 2 = 4.
    assert row["tpot_ms_mean"] == pytest.approx(3.75)
    assert row["e2e_ms_p50"] == pytest.approx(12.0)  # e2e 14 and 10
    assert row["ttft_ms_p50"] == pytest.approx(4.5)  # ttft 3 and 6
    # Goodput: 6 tokens over 14 ms; with a 3.75 ms TPOT objective only A (4 tokens) counts.
    assert row["goodput_tokens_per_s"] == pytest.approx(1000 * 6 / 14)
    assert open_loop_row(run, slo_tpot_ms=3.75)["goodput_tokens_per_s"] == pytest.approx(1000 * 4 / 14)
    assert row["mean_batch_size"] == 1.5


def test_prefill_costs(two_requests, hand_curve):
    # prompt_len 2: admitting one request costs C_verify(1, 2) = 4 ms before its first decode step.
    run = run_open_loop(two_requests, hand_curve, policies.get("ar"), 2, rate_rps=1.0, num_requests=2,
                        shuffle=False, arrival_ms=np.array([0.0, 100.0]), prompt_len=2)
    assert run.start_ms.tolist() == [4.0, 104.0]
    assert run.prefill_ms_total == 8.0
    run = run_open_loop(two_requests, hand_curve, policies.get("ar"), 2, rate_rps=1.0, num_requests=2,
                        shuffle=False, arrival_ms=np.array([0.0, 100.0]), prefill_ms=2.5)
    assert run.start_ms.tolist() == [2.5, 102.5]


def test_idle_engine_waits_for_arrivals(two_requests, hand_curve):
    run = run_open_loop(two_requests, hand_curve, policies.get("full"), 2, rate_rps=1.0, num_requests=2,
                        shuffle=False, arrival_ms=np.array([5.0, 50.0]))
    assert run.start_ms.tolist() == [5.0, 50.0]
    assert np.all(run.steps.batch_size == 1)


def test_simulate_open_loop_columns(hand_trace, hand_curve):
    df = simulate(hand_trace, hand_curve, mode="open", batch_sizes=[2, 4], num_requests=12, policies=["full", "dcut"])
    for col in ("goodput_tokens_per_s", "tpot_ms_p50", "tpot_ms_p90", "tpot_ms_p99", "e2e_ms_p50", "e2e_ms_p99"):
        assert df[col].notna().all() and (df[col] > 0).all()
    assert (df.loc[df.policy == "ar", "speedup_vs_ar"] == 1.0).all()
    assert (df["prefill"] == "none (free)").all()


def test_open_loop_needs_every_batch_size_in_the_curve(hand_trace, make_curve):
    curve = make_curve(batch_sizes=(2, 4, 8), block_size=4)
    with pytest.raises(SimulationError, match=r"batch size 1 .*open loop"):
        simulate(hand_trace, curve, mode="open", batch_sizes=[4], num_requests=5)


def test_prefill_outside_curve_is_clear(hand_trace, hand_curve):
    with pytest.raises(SimulationError, match="prompt_len=100.*--prefill-ms"):
        simulate(hand_trace, hand_curve, mode="open", batch_sizes=[2], num_requests=5, prompt_len=100)
