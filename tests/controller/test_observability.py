"""Predicted against actual in RequestBatch: accepted drafts (calibration) and step time (cost curve),
the drift warnings, the metrics line the engines log, and where the calibration prior comes from."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from dcut_sched.calibration import CalibrationPrior, LogisticCalibrator
from dcut_sched.controller.request_batch import DriftMonitor, RequestBatch, metrics_line, summarize_metrics

B = 4


class FakeCosts:
    def drafted_ms(self, bs, k):
        return 10.0 + k

    def undrafted_ms(self, bs):
        return 5.0 + bs


class FakeController:
    """Plans every request to full length with a given expected token count."""

    block_size = B

    def __init__(self, expected_tokens=3.0, calibrate=True, costs=None):
        self.expected_tokens, self.calibrate, self.costs = expected_tokens, calibrate, costs

    def plan(self, conf, accept_len=None):
        n = conf.shape[0]
        return SimpleNamespace(lengths=np.full(n, B, dtype=np.int64), batch_size=n, draft_next=True,
                               ratio=1.0, expected_tokens=self.expected_tokens, num_tokens=n * B)

    def plan_without_draft(self, batch_size, device=None):
        return SimpleNamespace(lengths=np.ones(batch_size, dtype=np.int64), batch_size=batch_size, draft_next=True,
                               ratio=1 / B, expected_tokens=float(batch_size), num_tokens=batch_size)

    def observe(self, accept_len, step_ms=None):
        self.step_ms = step_ms


def drafted_step(rb, accepted, step_ms=None, ids=("a", "b")):
    plan = rb.plan(list(ids), [[1, 2, 3]] * len(ids), np.full((len(ids), B - 1), 0.5, np.float32))
    return rb.observe(rb.schedule(plan, list(ids), {r: 3 for r in ids}), dict(zip(ids, accepted)), step_ms=step_ms)


def test_predicted_and_actual_drafts_and_step_time_are_summed():
    # 2 requests, expected 5 tokens -> 3 drafts predicted per step; 1 + 2 accepted
    ctrl = FakeController(expected_tokens=5.0, costs=FakeCosts())
    rb = RequestBatch(ctrl, on_warning=lambda line: None)
    rec = drafted_step(rb, [1, 2], step_ms=20.0)
    assert rec["step_ms"] == 20.0 and rec["predicted_ms"] == 10.0 + 2 * B
    assert rb.controller.step_ms == 20.0  # the measured time reaches the controller (fine plans with it)
    drafted_step(rb, [0, 1], step_ms=18.0)
    p = rb.plan_without_draft(2)
    rb.observe(rb.schedule(p, ["a", "b"], {}), {}, step_ms=7.0)
    m = rb.metrics
    assert m["predicted_drafts_per_step"] == 3.0 and m["actual_drafts_per_step"] == 2.0
    assert m["calibration_error"] == pytest.approx(3.0 / 2.0 - 1)
    assert m["predicted_ms_per_step"] == pytest.approx((18 + 18 + 7) / 3)
    assert m["measured_ms_per_step"] == pytest.approx((20 + 18 + 7) / 3)
    assert m["cost_error"] == pytest.approx(43 / 45 - 1)


def test_steps_without_timing_curve_or_with_drops_are_left_out():
    ctrl = FakeController(expected_tokens=5.0, costs=None)
    rb = RequestBatch(ctrl)
    rec = drafted_step(rb, [1, 1], step_ms=12.0)
    assert rec["predicted_ms"] is None
    plan = rb.plan(["a", "b"], [[1, 2, 3]] * 2, np.full((2, B - 1), 0.5, np.float32))
    rb.observe(rb.schedule(plan, ["a"], {"a": 3}), {"a": 3})  # b dropped: not a calibration sample
    m = rb.metrics
    assert m["actual_drafts_per_step"] == 2.0 and math.isnan(m["cost_error"])
    assert "step_ms" not in drafted_step(rb, [0, 0])  # not timed: no timing fields in the record


def test_calibration_drift_warns_once_per_episode_and_names_the_fix():
    lines = []
    ctrl = FakeController(expected_tokens=2.0 + 2.0, calibrate=False)  # 2 drafts predicted per step
    rb = RequestBatch(ctrl, on_warning=lines.append, drift_window=8)
    for _ in range(7):
        drafted_step(rb, [1, 0])  # 1 accepted: +100 %
    assert lines == []  # the window is not full yet
    for _ in range(20):
        drafted_step(rb, [1, 0])
    assert len(lines) == 1
    assert lines[0].startswith("D-Cut: predicted accepted drafts are +100% off the actual over the last 8 drafted steps")
    assert "enable calibration" in lines[0] and "\n" not in lines[0]
    for _ in range(8):
        drafted_step(rb, [1, 1])  # back within the threshold: the episode ends
    for _ in range(8):
        drafted_step(rb, [0, 1])
    assert len(lines) == 2
    ctrl.calibrate = True
    rb2 = RequestBatch(ctrl, on_warning=lines.append, drift_window=4)
    for _ in range(4):
        drafted_step(rb2, [2, 2])  # 4 accepted, 2 predicted: -50 %
    assert "-50%" in lines[-1] and "dcut-drafter calibrate" in lines[-1]


def test_cost_drift_warns_with_the_profiling_fix():
    lines = []
    rb = RequestBatch(FakeController(expected_tokens=4.0, costs=FakeCosts()), on_warning=lines.append, drift_window=4)
    for _ in range(6):
        drafted_step(rb, [1, 1], step_ms=36.0)  # priced 18 ms: -50 %
    assert len(lines) == 1 and "cost curve prices steps -50% off the measured step time" in lines[0]
    assert "re-profile the cost curve with dcut-profile" in lines[0] and f"--block-size {B}" in lines[0]


def test_drift_monitor_floor_and_quiet_within_threshold():
    d = DriftMonitor(window=2, threshold=0.25, floor=1.0)
    assert d.add(0.5, 0.0) is None  # window not full
    assert d.add(0.5, 0.0) == pytest.approx(-0.5)  # actual floored at 1 per step: 1 / 2 - 1
    assert d.add(0.5, 0.0) is None and d.drifting  # same episode
    with pytest.raises(ValueError, match="window"):
        DriftMonitor(window=0)


def test_metrics_line_format():
    ctrl = FakeController(expected_tokens=5.0, costs=FakeCosts())
    rb = RequestBatch(ctrl)
    drafted_step(rb, [1, 2], step_ms=20.0)
    line = metrics_line("fine", rb.metrics)
    assert line == ("D-Cut metrics: policy fine, steps 1 (drafted 1), keep ratio 1.000, accepted drafts per "
                    "request-step 1.50, tokens per request-step 2.50, plan time "
                    f"{rb.metrics['plan_ms_per_step']:.3f} ms/step, accepted drafts per step predicted 3.00 / actual "
                    "3.00 (calibration error +0%), step time predicted 18.0 / measured 20.0 ms (cost-curve error -10%)")
    empty = summarize_metrics({k: 0 for k in rb.window.totals})
    assert "(calibration error n/a)" in metrics_line("dcut", empty) and "(cost-curve error n/a)" in metrics_line("dcut", empty)


def test_vllm_prior_comes_from_the_drafter_folder(tmp_path):
    from dcut_sched.integrations.vllm.config import DCutConfigError, DCutVllmConfig
    from dcut_sched.integrations.vllm.startup import drafter_prior

    cfg = DCutVllmConfig(source="test")
    vc = SimpleNamespace(speculative_config=SimpleNamespace(model=str(tmp_path)))
    assert drafter_prior(cfg, vc) is None
    assert drafter_prior(cfg, SimpleNamespace(speculative_config=SimpleNamespace(model="org/hub-name"))) is None
    CalibrationPrior(intercepts=[-0.5], slope=1.1).save(tmp_path / "calibration.json")
    assert drafter_prior(cfg, vc).intercepts == [-0.5]
    (tmp_path / "calibration.json").write_text("{}")
    with pytest.raises(DCutConfigError, match=r"test: the drafter's .*calibration.json: field intercepts"):
        drafter_prior(cfg, vc)
    assert DCutVllmConfig().calibrate is True


def test_controller_calibrates_by_default_from_the_prior():
    from dcut_sched import RatioController

    prior = CalibrationPrior(intercepts=[-1.0], slope=1.0)
    ctrl = RatioController(None, B, policy="full", calibration_prior=prior)
    assert isinstance(ctrl.calibrator, LogisticCalibrator) and ctrl.calibrator.prior == prior
    assert RatioController(None, B, policy="full", calibrate=False).calibrator is None
