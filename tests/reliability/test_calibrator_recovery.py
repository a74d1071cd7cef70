"""The online calibrator cannot lock itself out: a confidence range that goes unobserved decays back
towards the identity prior, so a calibrated policy that stopped verifying drafts after a stretch with
nothing accepted starts again once acceptance returns (simulator and RatioController)."""

from __future__ import annotations

import numpy as np
import pytest

from dcut_sched import RatioController
from dcut_sched.calibration import OnlineCalibrator
from dcut_sched.simulator import simulate
from dcut_sched.traces import Trace

B = 4


def two_phase_trace(n_bad: int = 8, n_good: int = 64, length: int = 40) -> Trace:
    """All confidences 0.9; the first ``n_bad`` requests accept nothing, the rest accept every draft."""
    rid, pos, acc = [], [], []
    for r in range(n_bad + n_good):
        p = np.arange(length)
        rid.append(np.full(length, r))
        pos.append(p)
        acc.append(np.zeros(length, int) if r < n_bad else np.minimum(B - 1, length - 1 - p))
    n = (n_bad + n_good) * length
    return Trace(np.concatenate(rid).astype(np.int32), np.concatenate(pos).astype(np.int32),
                 np.concatenate(acc).astype(np.int8), np.full((n, B - 1), 0.9, np.float32),
                 {"indexing": "position", "source": "synthetic", "dataset": "two-phase"})


def test_idle_bins_decay_by_the_half_life_and_observed_bins_keep_their_counts():
    cal = OnlineCalibrator(B, num_bins=2, refit_every=8, unobserved_half_life=8.0)
    lo = np.full((8, B - 1), 0.2)
    hi = np.full((8, B - 1), 0.8)
    # 8 requests, each: draft 1 rejected (observed), nothing else -> the 0.8 bin holds 8 observations.
    cal.observe(hi, np.zeros(8, int), np.full(8, B))
    acc, obs = cal.counts()
    assert obs.tolist() == [[0.0, 8.0]] and acc.tolist() == [[0.0, 0.0]]
    # 8 more requests that only touch the 0.2 bin: the idle 0.8 bin halves (8 requests / half-life 8).
    cal.observe(lo, np.zeros(8, int), np.full(8, B))
    acc, obs = cal.counts()
    assert obs.tolist() == [[8.0, 4.0]]
    # 16 requests of plain steps: both bins idle, two half-lives -> a quarter each.
    cal.observe_plain(16)
    acc, obs = cal.counts()
    assert obs.tolist() == [[2.0, 1.0]]
    assert cal.num_decayed_bins == 3


def test_without_decay_the_counts_are_kept():
    cal = OnlineCalibrator(B, num_bins=2, refit_every=8, unobserved_half_life=None)
    cal.observe(np.full((8, B - 1), 0.8), np.zeros(8, int), np.full(8, B))
    cal.observe_plain(64)
    assert cal.counts()[1].tolist() == [[0.0, 8.0]]


def _phase_two_tokens_per_step(policy: str, calibrator, **params) -> float:
    df = simulate(two_phase_trace(), _curve(), policies=[policy], policy_params={policy: params} if params else None,
                  batch_sizes=[4], num_steps=1000, warmup_steps=600, shuffle=False, calibrator=calibrator)
    # the policy's row (its label carries the params: "fine(feedback=False)")
    (value,) = df.loc[df.policy.str.split("(").str[0] == policy, "mean_tokens_per_step"]
    return float(value)


def _curve():
    from tests.conftest import linear_curve

    return linear_curve(block_size=B)


def test_simulator_threshold_recovers_after_a_stretch_with_nothing_accepted():
    locked = _phase_two_tokens_per_step("threshold", OnlineCalibrator(B, unobserved_half_life=None))
    recovered = _phase_two_tokens_per_step("threshold", OnlineCalibrator(B))  # default half-life
    uncalibrated = _phase_two_tokens_per_step("threshold", None)
    assert locked == pytest.approx(1.0)  # anchors only: the lock-out the decay removes
    assert recovered > 2.5 and uncalibrated > 3.0


def test_simulator_fine_recovers_after_a_stretch_with_nothing_accepted():
    # the calibrator's contract, with fine deciding on the calibrated confidences alone
    locked = _phase_two_tokens_per_step("fine", OnlineCalibrator(B, unobserved_half_life=None), feedback=False)
    recovered = _phase_two_tokens_per_step("fine", OnlineCalibrator(B), feedback=False)  # default half-life
    assert locked < 1.1  # plain steps, a drafting probe now and then
    assert recovered > 2.5
    # with its feedback (the default) fine drafts again too, but its realized account of the bad phase
    # holds the probes back for most of this window (docs/design.md §2.1)
    assert 1.2 < _phase_two_tokens_per_step("fine", OnlineCalibrator(B)) < recovered


def _controller_phase_two_tokens_per_step(ctrl: RatioController) -> float:
    """Tokens per request-step over the last 300 of 1500 steps of ``ctrl``'s plan / plan_without_draft /
    observe loop at bs 4: drafts all rejected for 300 steps, then all accepted."""
    conf = np.full((4, B - 1), 0.9, np.float32)
    draft, tokens = True, []
    for step in range(1500):
        accept = np.zeros(4, int) if step < 300 else np.full(4, B - 1)
        if draft:
            plan = ctrl.plan(conf)
            made = 1 + np.minimum(accept, np.asarray(plan.lengths) - 1)
            ctrl.observe(accept)
        else:
            plan = ctrl.plan_without_draft(4)
            made = np.ones(4, int)
            ctrl.observe(np.zeros(4, int))
        draft = plan.draft_next
        tokens.append(made.mean())
    return float(np.mean(tokens[-300:]))


@pytest.mark.parametrize("policy,half_life", [("threshold", 256.0), ("fine", 256.0)])
def test_ratio_controller_recovers(policy, half_life):
    """The same through RatioController's plan / plan_without_draft / observe loop."""
    results = {}
    for hl in (None, half_life):
        ctrl = RatioController(_curve(), B, policy=policy,
                               calibrator=OnlineCalibrator(B, unobserved_half_life=hl))
        results[hl] = _controller_phase_two_tokens_per_step(ctrl)
    if policy == "threshold":
        assert results[None] < 1.1  # anchors only
    else:  # fine's feedback: probes that deliver raise accepted/expected over the locked map's ~0
        assert results[None] > 3.0
    assert results[half_life] > 3.0


@pytest.mark.parametrize("policy", ["threshold", "fine"])
def test_logistic_calibrator_recovers_in_the_simulator(policy):
    """The controller's default calibrator: a depth with no observation returns to the prior."""
    from dcut_sched.calibration import LogisticCalibrator

    # fine without its own feedback: the calibrator's contract alone (with feedback, fine's realized
    # account of the bad phase holds its probes back longer than this window; docs/design.md §2.1)
    params = {"feedback": False} if policy == "fine" else {}
    locked = _phase_two_tokens_per_step(policy, LogisticCalibrator(B, unobserved_half_life=None, half_life=None),
                                        **params)
    recovered = _phase_two_tokens_per_step(policy, LogisticCalibrator(B), **params)  # default half-lives
    if policy == "threshold":
        assert locked == pytest.approx(1.0)  # anchors only
    assert recovered > 2.8


@pytest.mark.parametrize("policy", ["threshold", "fine"])
def test_ratio_controller_default_calibrator_recovers(policy):
    ctrl = RatioController(_curve(), B, policy=policy)  # calibrated by default (LogisticCalibrator)
    assert _controller_phase_two_tokens_per_step(ctrl) > 3.0
