"""The simulator runs the online controller's step code (controller/step_driver.py: StepDriver).

- step by step, a simulated run and a RatioController fed the same confidences and outcomes choose
  the same lengths (also with online calibration and a policy that learns from outcomes);
- controller-only features now shape the simulation: the graph bank's captured token counts
  (fine's candidate budgets, the padded cell charged per step) and the sanitising of bad confidences.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

from dcut_sched import OnlineCalibrator, RatioController, policies
from dcut_sched.calibration import CalibrationPrior, LogisticCalibrator
from dcut_sched.controller import GraphCells
from dcut_sched.simulator import SimulationError, run_closed_loop, run_open_loop, simulate

from .conftest import build_trace, random_trace


def _replay_through_controller(trace, curve, run, ctrl):
    """Feed a recorded simulator run's per-step inputs to ``ctrl``; returns its lengths per step."""
    out = []
    for n, log in enumerate(run.log):
        rows = trace.starts[log["request"]] + log["cursor"]
        bs = len(rows)
        if log["drafted"]:
            accept = trace.accept_len[rows].astype(np.int64)
            plan = ctrl.plan(trace.conf[rows], accept_len=accept)
            out.append(np.asarray(plan.lengths).tolist())
            ctrl.observe(accept)  # raw "whole block" acceptance: the controller clips it to L - 1
        else:
            plan = ctrl.plan_without_draft(bs)
            out.append([1] * bs)
            ctrl.observe(np.zeros(bs, dtype=np.int64))
        if n + 1 < len(run.log):
            assert plan.draft_next == run.log[n + 1]["drafted"], f"step {n}: draft_next differs"
    return out


@pytest.mark.parametrize("policy", ["fine", "dcut", "smartspec", "threshold", "oracle"])
@pytest.mark.parametrize("calibrate", [False, "isotonic", "logistic"])
def test_simulator_and_controller_choose_the_same_lengths(make_curve, policy, calibrate):
    trace = random_trace(num_requests=10, block_size=8, seed=3)
    curve = make_curve(batch_sizes=(1, 2, 4, 8), block_size=8, base_ms=5.0, per_token_ms=0.4, draft_base_ms=1.0)
    calibrator = {False: None, "isotonic": OnlineCalibrator(8, refit_every=16),  # refits during the run
                  "logistic": LogisticCalibrator(8, prior=CalibrationPrior(intercepts=[-0.5], slope=1.2),
                                                 refit_every=16)}[calibrate]
    run = run_closed_loop(trace, curve, policies.get(policy), 4, num_steps=80, shuffle=False,
                          calibrator=copy.deepcopy(calibrator), record=True)
    ctrl = RatioController(curve, 8, policy=policy, calibrate=bool(calibrate), calibrator=copy.deepcopy(calibrator))
    assert _replay_through_controller(trace, curve, run, ctrl) == [log["lengths"].tolist() for log in run.log]
    sim, online = run.controller_metrics, ctrl.metrics
    for key in ("steps", "drafted_steps", "num_tokens", "accepted_drafts", "observed_steps", "bad_conf_requests"):
        assert sim[key] == online[key], key
    assert sim["expected_tokens"] == pytest.approx(online["expected_tokens"])
    assert sim["bad_accept_requests"] == 0  # the simulator hands the driver in-range counts
    assert int(run.steps.num_tokens.sum()) == sim["num_tokens"]


@pytest.mark.parametrize("policy", ["fine", "dcut"])
def test_same_lengths_on_a_shipped_trace(policy):
    from dcut_sched import CostCurve
    from dcut_sched.simulator import defaults
    from dcut_sched.traces import Trace

    trace = Trace.load(defaults.default_trace_path())
    curve = CostCurve.load(defaults.default_cost_path(), check_hardware=False)
    cal = OnlineCalibrator(trace.block_size, refit_every=64)
    run = run_closed_loop(trace, curve, policies.get(policy), 16, num_steps=60, seed=1,
                          calibrator=copy.deepcopy(cal), record=True)
    ctrl = RatioController(curve, trace.block_size, policy=policy, calibrator=copy.deepcopy(cal))
    assert _replay_through_controller(trace, curve, run, ctrl) == [log["lengths"].tolist() for log in run.log]


def test_graph_bank_restricts_fine_budgets_to_captured_counts(make_curve):
    trace = random_trace(num_requests=10, block_size=8, seed=5)
    curve = make_curve(batch_sizes=(1, 2, 4, 8), block_size=8, base_ms=5.0, per_token_ms=0.4, draft_base_ms=1.0)
    counts = (8, 12, 20, 32)
    free = run_closed_loop(trace, curve, policies.get("fine"), 4, num_steps=150)
    banked = run_closed_loop(trace, curve, policies.get("fine"), 4, num_steps=150, graph_token_counts=counts,
                             record=True)
    drafted = banked.steps.drafted
    assert set(banked.steps.num_tokens[drafted].tolist()) <= set(counts)
    assert not set(free.steps.num_tokens[free.steps.drafted].tolist()) <= set(counts)  # the bank changed the run
    # The same choice as the online controller holding a bank with these cells.
    ctrl = RatioController(curve, 8, policy="fine", calibrate=False, graph_bank=GraphCells.at_batch_sizes(counts, [4]))
    assert _replay_through_controller(trace, curve, banked, ctrl) == [log["lengths"].tolist() for log in banked.log]


def test_graph_bank_pads_the_charged_cell(hand_trace, hand_curve):
    # uniform rho = 0.5 at bs 2, B = 4: L = (2, 2), K = 4; captured counts (2, 6, 8) -> the step replays
    # cell (2, 6): C_draft(2) + C_verify(2, 6) = 2.5 + (2 + 6) = 10.5 ms instead of 2.5 + 6 = 8.5 ms.
    p = policies.get("uniform", rho=0.5)
    plain = run_closed_loop(hand_trace, hand_curve, p, 2, num_steps=1, shuffle=False)
    banked = run_closed_loop(hand_trace, hand_curve, p, 2, num_steps=1, shuffle=False, graph_token_counts=[2, 6, 8])
    assert plain.steps.step_ms.tolist() == [8.5]
    assert banked.steps.step_ms.tolist() == [10.5]
    assert banked.steps.num_tokens.tolist() == [4]  # slots verified: the plan's K, not the padding
    # ar never drafts: its plain step C_ar(2) = 4 ms is not a verification cell
    ar = run_closed_loop(hand_trace, hand_curve, policies.get("ar"), 2, num_steps=1, graph_token_counts=[6])
    assert ar.steps.step_ms.tolist() == [4.0]


def test_graph_bank_without_a_large_enough_cell_is_a_simulation_error(hand_trace, hand_curve):
    # full verifies K = bs * B = 8 at bs 2; the largest captured count is 6.
    with pytest.raises(SimulationError, match=r"policy 'full' at batch size 2: .*no captured cell.*graph_token_counts"):
        simulate(hand_trace, hand_curve, policies=["full"], batch_sizes=[2], num_steps=3, warmup_steps=0,
                 graph_token_counts=[2, 6])


def test_graph_bank_in_open_loop(make_curve):
    trace = random_trace(num_requests=12, block_size=8, seed=2)
    curve = make_curve(batch_sizes=(1, 2, 4, 8), block_size=8, base_ms=5.0, per_token_ms=0.4, draft_base_ms=1.0)
    counts = (1, 2, 4, 8, 16, 32, 64)
    run = run_open_loop(trace, curve, policies.get("fine"), 8, rate_rps=200.0, num_requests=30,
                        graph_token_counts=counts)
    assert set(run.steps.num_tokens[run.steps.drafted].tolist()) <= set(counts)
    assert int(run.output_tokens.sum()) == int(run.steps.tokens.sum())


def test_bad_confidences_are_sanitised_as_online(make_curve):
    # A trace built in code (not validated) with a NaN in request A's first row: the controller's
    # sanitising zeroes that row, so threshold verifies only A's anchor; B (clean) verifies all 4.
    # (Before the simulator ran the controller's step code, the NaN reached the policy: threshold
    # kept A's first two slots, dcut and fine planned invalid zero lengths.)
    a = ([2, 0, 0], [[0.9, np.nan, 0.9], [0.9, 0.9, 0.9], [0.9, 0.9, 0.9]])
    b = ([3, 0, 0], [[0.95, 0.9, 0.9], [0.9, 0.9, 0.9], [0.9, 0.9, 0.9]])
    trace = build_trace([a, b])
    curve = make_curve(block_size=4)
    run = run_closed_loop(trace, curve, policies.get("threshold", tau=0.5), 2, num_steps=1, shuffle=False,
                          record=True)
    assert run.log[0]["lengths"].tolist() == [1, 4]
    assert run.log[0]["tokens"].tolist() == [1, 4]
    assert run.controller_metrics["bad_conf_requests"] == 1
    ctrl = RatioController(curve, 4, policy="threshold", calibrate=False, tau=0.5)
    assert ctrl.plan(trace.conf[[0, 3]]).lengths.tolist() == [1, 4]
    assert ctrl.metrics["bad_conf_requests"] == 1
    for name in ("dcut", "fine"):
        run = run_closed_loop(trace, curve, policies.get(name), 2, num_steps=3, shuffle=False, record=True)
        assert all(int(log["lengths"].min()) >= 1 for log in run.log), name
