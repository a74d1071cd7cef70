"""Per-depth calibration of a trace: hand-computed on a tiny trace; ~0 gap on a calibrated synthetic one."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from dcut_sched.traces import Trace
from dcut_sched.traces.stats import calibration_by_depth
from dcut_sched.traces.synth import generate, get_preset


def test_hand_computed_depths():
    # one request, 4 positions, B = 3 (2 drafts): accept_len 2, 0, 1, 0
    tr = Trace(request_id=np.zeros(4, dtype=np.int32), pos=np.arange(4, dtype=np.int32),
               accept_len=np.array([2, 0, 1, 0], dtype=np.int8),
               conf=np.array([[0.9, 0.8], [0.5, 0.4], [0.7, 0.6], [0.2, 0.1]], dtype=np.float32),
               metadata={"block_size": 3, "source": "test"})
    rows = calibration_by_depth(tr, bins=10)
    # depth 1: positions 0..2 reach it (position 3 is the last: nothing after it to accept); accepted 0, 2
    assert rows[0]["reached"] == 3 and rows[0]["accept_rate"] == pytest.approx(2 / 3)
    assert rows[0]["mean_conf"] == pytest.approx((0.9 + 0.5 + 0.7) / 3)
    # depth 2: positions 0 and 2 accepted draft 1; position 2 has one token after it -> only position 0
    assert rows[1]["reached"] == 1 and rows[1]["accept_rate"] == 1.0
    assert rows[1]["gap"] == pytest.approx(0.8 - 1.0)


def test_calibrated_synthetic_trace_has_no_gap_at_any_depth():
    params = dataclasses.replace(get_preset("dflash-qwen3-8b-gsm8k").params, calibration_gap=0.0)
    rows = calibration_by_depth(generate(params, num_requests=200, seed=1))
    for r in rows[:8]:
        assert r["reached"] > 500 and abs(r["gap"]) < 0.03, r
