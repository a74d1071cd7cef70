"""Synthetic generator: exact special cases, calibration by construction, determinism, parameter files."""

import json

import numpy as np
import pytest
from scipy.special import expit

from dcut_sched.traces import Trace
from dcut_sched.traces.stats import trace_stats
from dcut_sched.traces.synth import PRESETS, SynthParams, SynthParamsError, generate, get_preset


def test_no_noise_and_no_separation_gives_the_prior_as_confidence():
    p = SynthParams(block_size=6, accept_logit=1.0, depth_decay=0.5, request_sd=0.0, position_sd=0.0,
                    separation=0.0)
    t = generate(p, num_requests=3, seed=1)
    expected = expit(1.0 - 0.5 * np.arange(5))
    np.testing.assert_allclose(t.conf, np.broadcast_to(expected, t.conf.shape), rtol=1e-6)


def test_acceptance_lengths_follow_the_product_of_conditional_rates():
    # q_t = sigmoid(a - d (t-1)) for everyone: P(accept_len >= t) = prod_{s<=t} q_s (before the cap).
    p = SynthParams(block_size=5, accept_logit=1.2, depth_decay=0.4, request_sd=0.0, position_sd=0.0,
                    separation=1.0, length_median=2000, length_sd=0.0, max_length=2000)
    t = generate(p, num_requests=10, seed=2)
    far = t.pos < t.num_positions[0] - 5  # rows unaffected by the end-of-request cap
    a = t.accept_len[far].astype(int)
    q = expit(1.2 - 0.4 * np.arange(4))
    for depth in range(1, 5):
        assert (a >= depth).mean() == pytest.approx(np.prod(q[:depth]), abs=0.01)


def test_calibrated_by_construction_and_bias_shows_in_ece():
    base = SynthParams(block_size=8, accept_logit=1.0, depth_decay=0.1, request_sd=0.5, position_sd=1.0,
                       separation=1.0, length_median=400, length_sd=0.0)
    calibrated = trace_stats(generate(base, num_requests=30, seed=3))
    over = trace_stats(generate(base.replace(calibration_bias=1.5), num_requests=30, seed=3))
    assert calibrated["ece"] < 0.02
    assert over["ece"] > 0.1
    # over-confident: every bin's accept rate is below its mean confidence
    assert all(r["accept_rate"] < r["mean_conf"] for r in over["reliability"] if r["count"] > 200)


def test_calibration_gap_is_a_power_of_the_calibrated_confidence():
    base = SynthParams(block_size=8, accept_logit=1.0, depth_decay=0.1, request_sd=0.5, position_sd=1.0,
                       separation=1.0, length_median=300, length_sd=0.0)
    cal = generate(base, num_requests=20, seed=4)
    gap = generate(base.replace(calibration_gap=0.5), num_requests=20, seed=4)
    # same outcomes (same random draws), confidence = calibrated ** 1.5 exactly
    np.testing.assert_array_equal(gap.accept_len, cal.accept_len)
    np.testing.assert_allclose(gap.conf, cal.conf.astype(np.float64) ** 1.5, rtol=1e-5)
    # the order of every prefix product is kept, so the slot ranking is unchanged
    # (up to float32 rounding of near-ties)
    s_cal = np.cumprod(cal.conf.astype(np.float64), axis=1).ravel()
    s_gap = np.cumprod(gap.conf.astype(np.float64), axis=1).ravel()
    assert np.all(np.diff(s_gap[np.argsort(s_cal)]) >= -1e-6)
    # under-confident: every well-populated bin accepts more often than it says
    st = trace_stats(gap)
    assert st["ece"] > 0.03
    assert all(r["accept_rate"] > r["mean_conf"] for r in st["reliability"] if r["count"] > 200)
    with pytest.raises(SynthParamsError, match="calibration_gap"):
        base.replace(calibration_gap=-1.0)
    assert SynthParams().calibration_gap == 0.0 and all(p.params.calibration_gap == 0.0 for p in PRESETS.values())


def test_separation_sharpens_confidence():
    base = SynthParams(block_size=8, accept_logit=1.0, request_sd=0.0, position_sd=0.0, separation=0.0,
                       length_median=300, length_sd=0.0)
    conf = {}
    for mu in (0.0, 2.0):
        t = generate(base.replace(separation=mu), num_requests=20, seed=4)
        c, a = t.conf[:, 0], t.accept_len >= 1
        conf[mu] = c[a].mean() - c[~a].mean()
    assert conf[0.0] == pytest.approx(0.0, abs=1e-6)
    assert conf[2.0] > 0.5


def test_lengths_cap_and_validity(tmp_path):
    p = SynthParams(block_size=16, accept_logit=4.0, min_length=20, max_length=40, length_median=30)
    t = generate(p, num_requests=12, seed=5)
    assert t.num_positions.min() >= 20 and t.num_positions.max() <= 40
    t.save(tmp_path / "s.parquet")
    back = Trace.load(tmp_path / "s.parquet")  # validates: accept_len never runs past the end
    assert back.metadata["source"] == "synthetic"
    params = json.loads(back.metadata["generator_params"])
    assert params["accept_logit"] == 4.0 and params["seed"] == 5 and params["num_requests"] == 12


def test_same_seed_same_trace_other_seed_differs():
    p = SynthParams()
    a, b, c = generate(p, 4, seed=9), generate(p, 4, seed=9), generate(p, 4, seed=10)
    np.testing.assert_array_equal(a.conf, b.conf)
    np.testing.assert_array_equal(a.accept_len, b.accept_len)
    assert a.num_rows != c.num_rows or not np.array_equal(a.conf, c.conf)


def test_params_file_roundtrip_and_errors(tmp_path):
    p = SynthParams(accept_logit=0.3, separation=2.0)
    p.save(tmp_path / "p.json")
    assert SynthParams.load(tmp_path / "p.json") == p
    (tmp_path / "bad.json").write_text(json.dumps({"params": {"acceptlogit": 1}}))
    with pytest.raises(SynthParamsError, match="acceptlogit"):
        SynthParams.load(tmp_path / "bad.json")
    with pytest.raises(SynthParamsError, match="no such parameter file"):
        SynthParams.load(tmp_path / "none.json")
    with pytest.raises(SynthParamsError, match="separation"):
        SynthParams(separation=-1)
    with pytest.raises(SynthParamsError, match="block_size"):
        SynthParams(block_size=1)


def test_presets_cover_gsm8k_and_two_more_datasets_and_reproduce_their_tau():
    assert "dflash-qwen3-8b-gsm8k" in PRESETS and len(PRESETS) >= 3
    for name, preset in PRESETS.items():
        assert preset.params.block_size == 16 and "DFlash" in preset.source and preset.fit_error
        tau = trace_stats(generate(preset.params, num_requests=200, seed=0))["tau"]
        assert tau == pytest.approx(preset.target_tau, rel=0.06), name
    with pytest.raises(KeyError, match="known presets"):
        get_preset("nope")
