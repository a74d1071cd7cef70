"""The calibrator hook: transform before the policy, observe after each drafted step."""

from __future__ import annotations

import numpy as np

from dcut_sched import policies
from dcut_sched.simulator import run_closed_loop, simulate


class Constant:
    """Stand-in calibrator: replaces every confidence by ``value`` and records what it observes."""

    def __init__(self, value: float):
        self.value = value
        self.observed: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []

    def transform(self, conf):
        return np.full_like(conf, self.value)

    def observe(self, conf, num_accepted, lengths):
        self.observed.append((conf.copy(), np.asarray(num_accepted).copy(), np.asarray(lengths).copy()))


def test_transform_reaches_the_policy(hand_trace, hand_curve):
    # threshold tau=0.5: all-ones confidences -> verify all 4 slots; all-zeros -> anchors only.
    ones = run_closed_loop(hand_trace, hand_curve, policies.get("threshold"), 2, num_steps=1, shuffle=False,
                           calibrator=Constant(1.0), record=True)
    zeros = run_closed_loop(hand_trace, hand_curve, policies.get("threshold"), 2, num_steps=1, shuffle=False,
                            calibrator=Constant(0.0), record=True)
    assert ones.log[0]["lengths"].tolist() == [4, 4]
    assert zeros.log[0]["lengths"].tolist() == [1, 1]


def test_observe_gets_raw_conf_and_accepted_drafts(hand_trace, hand_curve, monkeypatch):
    seen = []
    calib = Constant(0.5)
    # Record from the run's private copy (each run deep-copies the calibrator).
    monkeypatch.setattr(Constant, "observe", lambda self, c, a, l: seen.append((c.copy(), a.copy(), l.copy())))
    run_closed_loop(hand_trace, hand_curve, policies.get("uniform", rho=0.5), 2, num_steps=1, shuffle=False,
                    calibrator=calib)
    conf, accepted, lengths = seen[0]
    # Raw step-1 confidences of A p0 and B p0; L = 2 each, accept_len (2, 3) -> min(a, L-1) = (1, 1).
    np.testing.assert_allclose(conf, [[0.9, 0.5, 0.2], [0.95, 0.9, 0.9]], rtol=1e-6)
    assert lengths.tolist() == [2, 2]
    assert accepted.tolist() == [1, 1]


def test_each_run_starts_from_the_given_state(hand_trace, hand_curve):
    calib = Constant(0.5)
    simulate(hand_trace, hand_curve, policies=["dcut"], batch_sizes=[2], num_steps=10, warmup_steps=0,
             calibrator=calib)
    assert calib.observed == []  # runs used deep copies


def test_ar_never_calls_the_calibrator(hand_trace, hand_curve):
    class Exploding(Constant):
        def transform(self, conf):
            raise AssertionError("ar must not draft")

    run_closed_loop(hand_trace, hand_curve, policies.get("ar"), 2, num_steps=5, calibrator=Exploding(0.5))


def test_observe_once_per_drafted_step(hand_trace, hand_curve):
    counts = []

    class Counting(Constant):
        def observe(self, conf, num_accepted, lengths):
            counts.append(len(lengths))

    run = run_closed_loop(hand_trace, hand_curve, policies.get("fine"), 2, num_steps=6, calibrator=Counting(0.9))
    assert len(counts) == int(run.steps.drafted.sum())
