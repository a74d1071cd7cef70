"""OnlineCalibrator: censoring, identity prior, recovery of a known miscalibration, kinds."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dcut_sched.calibration import OnlineCalibrator, censored_outcomes, expected_calibration_error


def simulate(rng, steps, bs, block, truth, conf_ab=(2.0, 1.0), full_lengths=False):
    """Synthetic drafted steps: conf ~ Beta(a, b); draft t accepted w.p. truth(conf, t) while all
    earlier drafts were accepted; a random verified length per request. Returns a list of
    (conf, num_accepted, lengths, accept_mask) where accept_mask[i, t] is the latent outcome."""
    out = []
    depth = np.arange(1, block)[None, :]
    for _ in range(steps):
        conf = rng.beta(*conf_ab, size=(bs, block - 1))
        p = truth(conf, depth)
        latent = rng.random((bs, block - 1)) < p
        accept_len = np.cumprod(latent, axis=1).sum(1)
        lengths = np.full(bs, block) if full_lengths else rng.integers(1, block + 1, size=bs)
        num_accepted = np.minimum(accept_len, lengths - 1)
        out.append((conf, num_accepted, lengths, latent))
    return out


def overconfident(conf, depth):
    return conf**2


def depth_dependent(conf, depth):
    # Deeper drafts are less trustworthy at equal confidence.
    return conf ** (1.0 + 0.25 * (depth - 1))


def test_censored_outcomes_hand_case():
    # B = 5 (4 drafts). Request 0: 2 accepted of 3 verified drafts -> slots 1,2 accepted, 3 rejected.
    # Request 1: anchor only -> nothing observed. Request 2: all 3 verified drafts accepted, slot 4
    # not verified -> unobserved. Request 3: 0 accepted of 4 -> slot 1 rejected.
    num_accepted = np.array([2, 0, 3, 0])
    lengths = np.array([4, 1, 4, 5])
    observed, accepted = censored_outcomes(num_accepted, lengths, 4)
    np.testing.assert_array_equal(
        observed, [[1, 1, 1, 0], [0, 0, 0, 0], [1, 1, 1, 0], [1, 0, 0, 0]]
    )
    np.testing.assert_array_equal(
        accepted, [[1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 0], [0, 0, 0, 0]]
    )
    obs_t, acc_t = censored_outcomes(torch.as_tensor(num_accepted), torch.as_tensor(lengths), 4)
    np.testing.assert_array_equal(obs_t.numpy(), observed)
    np.testing.assert_array_equal(acc_t.numpy(), accepted)


def test_observe_counts_hand_case():
    cal = OnlineCalibrator(5, num_bins=4, depth_bands=(1, 3), refit_every=10**6)
    conf = np.array([[0.9, 0.6, 0.1, 0.8], [0.3, 0.3, 0.3, 0.3]])
    # Request 0: slots 1, 2 accepted, slot 3 rejected. Request 1: slot 1 rejected.
    cal.observe(conf, np.array([2, 0]), np.array([4, 5]))
    acc, obs = cal.counts()
    # bands: {1, 2} and {3, 4}; bins of width 0.25: 0.9 -> 3, 0.6 -> 2, 0.1 -> 0, 0.3 -> 1.
    np.testing.assert_array_equal(acc, [[0, 0, 1, 1], [0, 0, 0, 0]])
    np.testing.assert_array_equal(obs, [[0, 1, 1, 1], [1, 0, 0, 0]])
    # torch input lands in the same counts
    cal_t = OnlineCalibrator(5, num_bins=4, depth_bands=(1, 3), refit_every=10**6)
    cal_t.observe(torch.tensor(conf), torch.tensor([2, 0]), torch.tensor([4, 5]))
    acc_t, obs_t = cal_t.counts()
    np.testing.assert_array_equal(acc_t, acc)
    np.testing.assert_array_equal(obs_t, obs)


def test_num_accepted_is_clipped_to_verified_drafts():
    cal = OnlineCalibrator(5, num_bins=2, depth_bands=None, refit_every=10**6)
    # accept_len 4 but only 2 slots verified: 1 draft accepted, nothing rejected.
    cal.observe(np.full((1, 4), 0.9), np.array([4]), np.array([2]))
    acc, obs = cal.counts()
    np.testing.assert_array_equal(acc, [[0, 1]])
    np.testing.assert_array_equal(obs, [[0, 1]])


def test_identity_prior():
    cal = OnlineCalibrator(16)
    x = np.linspace(0, 1, 1001).reshape(-1, 1).repeat(15, axis=1)
    np.testing.assert_allclose(cal.transform(x), x, atol=1.0 / (cal.resolution - 1))


@pytest.mark.parametrize("kind", ["numpy32", "numpy64", "torch32", "torch64"])
def test_transform_keeps_shape_kind_dtype(kind):
    cal = OnlineCalibrator(8)
    x = np.random.default_rng(0).random((3, 7))
    if kind.startswith("numpy"):
        x = x.astype(np.float32 if kind == "numpy32" else np.float64)
        y = cal.transform(x)
        assert isinstance(y, np.ndarray) and y.dtype == x.dtype and y.shape == x.shape
    else:
        x = torch.tensor(x, dtype=torch.float32 if kind == "torch32" else torch.float64)
        y = cal.transform(x)
        assert isinstance(y, torch.Tensor) and y.dtype == x.dtype and y.shape == x.shape
        assert y.device == x.device


def test_block_size_mismatch_raises():
    cal = OnlineCalibrator(8)
    with pytest.raises(ValueError, match="block size 8"):
        cal.transform(np.zeros((2, 15)))
    lazy = OnlineCalibrator()
    lazy.transform(np.zeros((2, 15)))
    assert lazy.block_size == 16


def test_bad_parameters():
    with pytest.raises(ValueError, match="depth_bands"):
        OnlineCalibrator(depth_bands=(2, 4))
    with pytest.raises(ValueError, match="prior_strength"):
        OnlineCalibrator(prior_strength=0)
    with pytest.raises(ValueError, match="refit_every"):
        OnlineCalibrator(refit_every=0)


def test_refit_every_n_observed_requests():
    cal = OnlineCalibrator(4, refit_every=10, depth_bands=BANDS)
    conf = np.full((4, 3), 0.5)
    for step in range(6):
        cal.observe(conf, np.zeros(4, dtype=int), np.full(4, 4))
    # 24 requests in steps of 4: the counter reaches 12 -> refit (reset to 0), then 12 again at 24.
    assert cal.num_observed_requests == 24
    assert cal.num_refits == 2
    # every observed draft at 0.5 was rejected, so the map at 0.5 has dropped well below 0.5
    assert cal.transform(np.full((1, 3), 0.5))[0, 0] < 0.25


def _fit(rng, truth, **kw):
    cal = OnlineCalibrator(16, refit_every=512, **kw)
    for conf, num_accepted, lengths, _ in simulate(rng, 600, 16, 16, truth):
        cal.observe(conf, num_accepted, lengths)
    cal.refit()
    return cal


def _held_out(rng, truth):
    """Observed (conf, depth, outcome) slots of fresh steps, all slots verified."""
    confs, depths, outcomes = [], [], []
    for conf, num_accepted, lengths, _ in simulate(rng, 300, 16, 16, truth, full_lengths=True):
        observed, accepted = censored_outcomes(num_accepted, lengths, 15)
        confs.append(conf)
        depths.append(np.broadcast_to(np.arange(1, 16), conf.shape))
        outcomes.append(np.where(observed, accepted, -1))
    return np.concatenate(confs), np.concatenate(depths), np.concatenate(outcomes)


def test_recovers_overconfident_map_and_ece_drops():
    rng = np.random.default_rng(7)
    cal = _fit(rng, overconfident)
    grid = np.linspace(0.3, 0.97, 50)
    x = np.broadcast_to(grid[:, None], (50, 15)).copy()
    got = cal.transform(x)
    # the first draft slot is observed most; the map there is within 0.05 of the truth c^2
    np.testing.assert_allclose(got[:, 0], grid**2, atol=0.05)
    conf, depth, outcome = _held_out(np.random.default_rng(8), overconfident)
    keep = outcome >= 0
    raw_ece = expected_calibration_error(conf[keep], outcome[keep])
    cal_ece = expected_calibration_error(cal.transform(conf)[keep], outcome[keep])
    assert raw_ece > 0.1  # c vs c^2 is badly miscalibrated
    assert cal_ece < raw_ece / 4
    assert cal_ece < 0.03


BANDS = (1, 2, 4, 8)


def test_depth_bands_help_when_truth_depends_on_depth():
    rng = np.random.default_rng(11)
    banded = _fit(rng, depth_dependent, depth_bands=BANDS)
    pooled = _fit(np.random.default_rng(11), depth_dependent, depth_bands=None)
    conf, depth, outcome = _held_out(np.random.default_rng(12), depth_dependent)
    keep = outcome >= 0
    truth = depth_dependent(conf, depth)
    err_banded = np.abs(banded.transform(conf) - truth)[keep].mean()
    err_pooled = np.abs(pooled.transform(conf) - truth)[keep].mean()
    assert err_banded < 0.75 * err_pooled


def test_depth_bands_cost_little_when_truth_ignores_depth():
    banded = _fit(np.random.default_rng(3), overconfident, depth_bands=BANDS)
    pooled = _fit(np.random.default_rng(3), overconfident, depth_bands=None)
    conf, depth, outcome = _held_out(np.random.default_rng(4), overconfident)
    keep = outcome >= 0
    truth = overconfident(conf, depth)
    err_banded = np.abs(banded.transform(conf) - truth)[keep].mean()
    err_pooled = np.abs(pooled.transform(conf) - truth)[keep].mean()
    assert err_banded < err_pooled + 0.01


def test_torch_and_numpy_observations_fit_the_same_map():
    rng = np.random.default_rng(5)
    steps = simulate(rng, 50, 8, 8, overconfident)
    cal_np, cal_t = OnlineCalibrator(8, refit_every=64), OnlineCalibrator(8, refit_every=64)
    for conf, num_accepted, lengths, _ in steps:
        cal_np.observe(conf, num_accepted, lengths)
        cal_t.observe(torch.tensor(conf), torch.tensor(num_accepted), torch.tensor(lengths))
    x = np.random.default_rng(6).random((5, 7))
    np.testing.assert_allclose(cal_t.transform(torch.tensor(x)).numpy(), cal_np.transform(x))
    assert cal_t.num_refits == cal_np.num_refits > 0


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    steps=st.integers(1, 20),
    bands=st.sampled_from([None, (1,), (1, 2), (1, 3, 5)]),
)
def test_map_is_monotone_and_in_unit_interval(seed, steps, bands):
    rng = np.random.default_rng(seed)
    cal = OnlineCalibrator(8, num_bins=10, depth_bands=bands, refit_every=1)
    for _ in range(steps):
        bs = int(rng.integers(1, 6))
        conf = rng.random((bs, 7))
        lengths = rng.integers(1, 9, size=bs)
        num_accepted = np.minimum(rng.integers(0, 8, size=bs), lengths - 1)
        cal.observe(conf, num_accepted, lengths)
    grid = np.linspace(0, 1, 257)
    mapped = cal.transform(np.broadcast_to(grid[:, None], (257, 7)).copy())
    assert np.all(np.diff(mapped, axis=0) >= -1e-12)
    assert mapped.min() >= 0 and mapped.max() <= 1
