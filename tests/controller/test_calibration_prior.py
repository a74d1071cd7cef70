"""The per-depth calibration prior (calibration.json), its ML fit, and LogisticCalibrator online."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from dcut_sched.calibration import (
    PRIOR_NAME,
    CalibrationPrior,
    CalibrationPriorError,
    LogisticCalibrator,
    calibration_report,
    fit_prior,
    reached_slots,
)

B = 8
D = B - 1
A_TRUE = np.array([-1.0, -0.6, -0.3, -0.1, 0.0, 0.0, 0.0])
B_TRUE = 1.4


def sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def blocks(rng, n, a=A_TRUE, b=B_TRUE):
    """n fully verified blocks whose draft t is accepted w.p. sigmoid(a_t + b logit(c_t)) given drafts < t."""
    conf = rng.beta(2.0, 2.0, size=(n, D))
    p = sigmoid(a + b * np.log(conf / (1 - conf)))
    latent = rng.random((n, D)) < p
    return conf, np.cumprod(latent, axis=1).sum(1)


def test_reached_slots_hand_case():
    reached, accepted = reached_slots(np.array([0, 2, 3]), 3, num_slots=np.array([3, 3, 2]))
    assert reached.tolist() == [[1, 0, 0], [1, 1, 1], [1, 1, 0]]
    assert accepted.tolist() == [[0, 0, 0], [1, 1, 0], [1, 1, 1]]


def test_identity_and_depths_beyond_the_prior_reuse_the_last_intercept():
    ident = CalibrationPrior.identity()
    assert ident.is_identity
    c = np.array([[0.0, 0.2, 0.5, 0.9, 1.0]])
    np.testing.assert_allclose(ident.probability(c), c, atol=1e-9)
    p = CalibrationPrior(intercepts=[-1.0, 0.5], slope=2.0)
    assert p.intercepts_for(4).tolist() == [-1.0, 0.5, 0.5, 0.5]
    got = p.probability(np.full((1, 4), 0.5))  # logit 0: sigmoid(intercept)
    np.testing.assert_allclose(got, sigmoid(np.array([[-1.0, 0.5, 0.5, 0.5]])))


def test_prior_file_round_trip_and_malformed_files_name_file_and_field(tmp_path):
    p = CalibrationPrior(intercepts=[-0.5, -0.25], slope=1.2, provenance={"seed": 3})
    path = tmp_path / PRIOR_NAME
    p.save(path)
    assert CalibrationPrior.load(path) == p
    assert CalibrationPrior.from_folder(tmp_path) == p
    assert CalibrationPrior.from_folder(tmp_path / "missing") is None
    good = json.loads(path.read_text())
    for edit, match in [
        ({"slope": -1.0}, "field slope: Input should be greater than 0"),
        ({"slope": "1"}, "field slope: Input should be a valid number"),
        ({"intercepts": []}, "field intercepts: List should have at least 1 item"),
        ({"intercepts": [True]}, "field intercepts.0: Input should be a valid number"),
        ({"format": "other/1"}, "field format"),
        ({"extra": 1}, "field extra: is not a field of a calibration prior"),
    ]:
        path.write_text(json.dumps({**good, **edit}))
        with pytest.raises(CalibrationPriorError, match=match) as exc:
            CalibrationPrior.load(path)
        assert str(path) in str(exc.value) and "dcut-drafter calibrate" in str(exc.value)
        assert "\n" not in str(exc.value)
    path.write_text('{"intercepts": [0.0], "slope": NaN}')
    with pytest.raises(CalibrationPriorError, match=str(path)):
        CalibrationPrior.load(path)


def test_fit_prior_recovers_a_known_per_depth_logistic():
    rng = np.random.default_rng(0)
    conf, acc = blocks(rng, 30_000)
    prior = fit_prior(conf, acc, provenance={"seed": 0})
    n_fit = len(prior.intercepts)
    assert n_fit >= 4 and prior.provenance == {"seed": 0}
    np.testing.assert_allclose(prior.intercepts[:3], A_TRUE[:3], atol=0.1)
    assert prior.slope == pytest.approx(B_TRUE, abs=0.08)
    rep = calibration_report(conf, acc, prior=prior)
    assert rep["ece_calibrated"] < 0.02 < rep["ece_raw"]
    assert rep["log_loss_calibrated"] < rep["log_loss_raw"]
    assert [r["depth"] for r in rep["by_depth"]][:3] == [1, 2, 3]
    d1 = rep["by_depth"][0]
    assert d1["ece_calibrated"] < d1["ece_raw"] and d1["reached"] == len(conf)


def test_fit_prior_shares_the_last_intercept_beyond_thin_depths_and_refuses_too_little():
    rng = np.random.default_rng(1)
    conf, acc = blocks(rng, 400, a=np.full(D, -2.0))  # acceptance ~0.2: deep depths are rarely reached
    prior = fit_prior(conf, acc, min_reached=60)
    assert 1 <= len(prior.intercepts) < D
    with pytest.raises(ValueError, match="min_reached"):
        fit_prior(conf[:10], acc[:10])


def test_logistic_calibrator_starts_at_the_prior_and_identity_is_exact():
    x = np.random.default_rng(2).random((5, D)).astype(np.float32)
    assert LogisticCalibrator(B).transform(x) is x  # identity prior, nothing learnt
    prior = CalibrationPrior(intercepts=[-1.0, -0.5], slope=1.5)
    cal = LogisticCalibrator(B, prior=prior)
    y = cal.transform(x)
    assert y.dtype == np.float32 and y.shape == x.shape
    np.testing.assert_allclose(y, prior.probability(x), rtol=1e-5)
    edge = np.array([[0.0, 1.0] + [0.5] * (D - 2)], dtype=np.float32)
    assert cal.transform(edge)[0, :2].tolist() == [0.0, 1.0]
    t = cal.transform(torch.from_numpy(x).double())
    assert isinstance(t, torch.Tensor) and t.dtype == torch.float64
    np.testing.assert_allclose(t.numpy(), prior.probability(x), rtol=1e-9)


def _run(cal, rng, steps, bs=16, a=A_TRUE, b=B_TRUE):
    for _ in range(steps):
        conf, acc = blocks(rng, bs, a, b)
        cal.observe(conf.astype(np.float32), acc, np.full(bs, B))


def test_logistic_calibrator_learns_the_truth_from_a_wrong_prior():
    rng = np.random.default_rng(3)
    cal = LogisticCalibrator(B, prior=CalibrationPrior(intercepts=[1.0], slope=0.7), refit_every=128)
    _run(cal, rng, 300)
    grid = np.linspace(0.05, 0.95, 19)[:, None].repeat(D, 1)
    truth = sigmoid(A_TRUE + B_TRUE * np.log(grid / (1 - grid)))
    err = np.abs(cal.transform(grid) - truth).mean(0)
    assert err[:3].max() < 0.05, err  # the depths the data reaches most
    before = np.abs(CalibrationPrior(intercepts=[1.0], slope=0.7).probability(grid) - truth).mean(0)
    assert (err[:3] < 0.3 * before[:3]).all()
    assert np.all(np.diff(cal.transform(grid), axis=0) >= 0)  # monotone in the confidence


def test_forgetting_returns_the_map_to_the_prior_and_memory_is_bounded():
    rng = np.random.default_rng(4)
    prior = CalibrationPrior(intercepts=[0.0], slope=1.0)
    cal = LogisticCalibrator(B, prior=prior, refit_every=64, half_life=256)
    _run(cal, rng, 200, a=np.full(D, -6.0))  # almost nothing is accepted
    c = np.full((1, D), 0.8)
    assert cal.transform(c)[0, 0] < 0.15
    size = cal._stats.size
    for _ in range(400):  # steps without a draft: the clock runs, the observations fade
        cal.observe_plain(16)
    assert cal.transform(c)[0, 0] == pytest.approx(0.8, abs=0.05)
    assert cal._stats.size == size and cal.num_observed_requests == 200 * 16


def test_torch_and_numpy_observations_give_the_same_map():
    rng = np.random.default_rng(5)
    cals = [LogisticCalibrator(B, refit_every=10**6) for _ in range(2)]
    for _ in range(50):
        conf, acc = blocks(rng, 8)
        lengths = rng.integers(1, B + 1, size=8)
        cals[0].observe(conf, acc, lengths)
        cals[1].observe(torch.from_numpy(conf), torch.from_numpy(acc), torch.from_numpy(lengths))
    for c in cals:
        c.refit()
    np.testing.assert_allclose(cals[0].a, cals[1].a, rtol=1e-9)
    np.testing.assert_allclose(cals[0].b, cals[1].b, rtol=1e-9)
    acc_n, obs_n = cals[0].counts()
    assert obs_n.sum() > 0 and acc_n.sum() <= obs_n.sum()


def test_bad_parameters_are_named():
    for kw, match in [({"prior_strength": 0}, "prior_strength"), ({"refit_every": 0}, "refit_every"),
                      ({"half_life": 0}, "half_life"), ({"num_bins": 1}, "num_bins")]:
        with pytest.raises(ValueError, match=match):
            LogisticCalibrator(B, **kw)
    with pytest.raises(ValueError, match="block size 8"):
        LogisticCalibrator(B).transform(np.zeros((2, 3)))


def test_refits_come_early_then_every_refit_every_requests():
    cal = LogisticCalibrator(B, refit_every=128)
    conf = np.full((4, D), 0.5)
    refits_at = []
    for step in range(1, 101):
        before = cal.num_refits
        cal.observe(conf, np.zeros(4, dtype=np.int64), np.full(4, B))
        if cal.num_refits > before:
            refits_at.append(4 * step)
    assert refits_at == [16, 32, 64, 128, 256, 384]  # after 16, doubling, then every 128
    assert cal.transform(conf)[0, 0] < 0.2  # every first draft at 0.5 was rejected
