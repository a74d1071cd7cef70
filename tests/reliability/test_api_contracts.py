"""API contracts: misuse raises ValueError naming the expected shape/range; value faults the serving
loop must survive are clipped and counted."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dcut_sched import RatioController
from dcut_sched.scores import expected_tokens, global_topk, slot_scores

B = 4


@pytest.fixture
def ctrl(curve4):
    return RatioController(curve4, B, policy="fine")


CONF = np.full((2, B - 1), 0.8, np.float32)


def test_observe_before_any_plan_raises(ctrl):
    with pytest.raises(ValueError, match="no plan to observe; call plan"):
        ctrl.observe(np.zeros(2, np.int64))


def test_observe_twice_for_one_plan_raises_and_counts_once(ctrl):
    ctrl.plan(CONF)
    ctrl.observe(np.array([1, 0]))
    with pytest.raises(ValueError, match="once per plan"):
        ctrl.observe(np.array([1, 0]))
    m = ctrl.metrics
    assert m["observed_steps"] == 1 and m["accepted_drafts"] <= 1


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_negative_and_too_long_accept_counts_are_clipped_and_counted(curve4, kind):
    ctrl = RatioController(curve4, B, policy="full")
    conf = CONF if kind == "numpy" else torch.from_numpy(CONF)
    plan = ctrl.plan(conf)
    assert np.asarray(plan.lengths).tolist() == [4, 4]
    accept = np.array([-3, 9])
    ctrl.observe(accept if kind == "numpy" else torch.from_numpy(accept))
    m = ctrl.metrics
    assert m["accepted_drafts"] == 0 + 3  # clipped to [0, lengths - 1]: never negative
    assert m["bad_accept_requests"] == 2


def test_observe_with_wrong_shape_names_the_expected_shape(ctrl):
    ctrl.plan(CONF)
    with pytest.raises(ValueError, match=r"shape \[2\]"):
        ctrl.observe(np.zeros(3, np.int64))
    with pytest.raises(ValueError, match=r"shape \[2\]"):
        ctrl.observe([0, 0])


def test_plan_given_a_list_raises_value_error(ctrl):
    with pytest.raises(ValueError, match=r"numpy array or torch tensor of shape \[batch_size, 3\]; got list"):
        ctrl.plan(CONF.tolist())


@pytest.mark.parametrize("bs", [0, -1, 1.5, float("nan"), float("inf"), None, "4", True])
def test_plan_without_draft_needs_a_positive_batch(ctrl, bs):
    with pytest.raises(ValueError, match="batch_size=.* must be an integer >= 1"):
        ctrl.plan_without_draft(bs)


def test_plan_without_draft_then_observe_is_fine(ctrl):
    ctrl.plan_without_draft(2)
    ctrl.observe(np.zeros(2, np.int64))
    assert ctrl.metrics["observed_steps"] == 1


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_global_topk_rejects_nan_and_rising_scores(kind):
    wrap = (lambda a: a) if kind == "numpy" else torch.from_numpy
    nan = np.array([[1.0, 0.5, np.nan, 0.1]])
    with pytest.raises(ValueError, match=r"scores\[0, 2\] is NaN"):
        global_topk(wrap(nan), 2)
    rising = np.array([[1.0, 0.2, 0.9, 0.1], [1.0, 0.5, 0.4, 0.3]])
    with pytest.raises(ValueError, match=r"rise along row 0: scores\[0, 1\] = 0.2 < scores\[0, 2\] = 0.9"):
        global_topk(wrap(rising), 4)
    ok = slot_scores(wrap(np.array([[0.5, 0.5, 0.5]])))
    assert np.asarray(global_topk(ok, 3)).tolist() == [3]


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_expected_tokens_checks_lengths(kind):
    scores = slot_scores(np.full((2, B - 1), 0.5))
    wrap = (lambda a: a) if kind == "numpy" else torch.as_tensor
    scores = wrap(scores)
    assert expected_tokens(scores, wrap(np.array([1, 2]))) == pytest.approx(1 + 1.5)
    with pytest.raises(ValueError, match=r"lengths must have shape \[2\]"):
        expected_tokens(scores, wrap(np.array([1])))  # would broadcast
    with pytest.raises(ValueError, match=r"lengths must have shape \[2\]"):
        expected_tokens(scores, wrap(np.array([[1, 2], [1, 2]])))
    with pytest.raises(ValueError, match=r"lengths must be in \[0, 4\].*\[1, 5\]"):
        expected_tokens(scores, wrap(np.array([1, 5])))
    with pytest.raises(ValueError, match=r"\[-1, 2\]"):
        expected_tokens(scores, wrap(np.array([-1, 2])))


@pytest.mark.parametrize("step_ms", ["5", [5.0], np.array([5.0, 6.0]), True, torch.tensor([5.0, 6.0]), {"ms": 5}])
def test_observe_refuses_a_step_time_that_is_not_one_number(ctrl, step_ms):
    """A string, a list, a boolean or several values: a TypeError naming step_ms (they raised from
    inside the driver, or a boolean counted as 1 ms), and the plan still awaits its observation."""
    ctrl.plan(CONF)
    with pytest.raises(TypeError, match="step_ms must be a number of milliseconds"):
        ctrl.observe(np.zeros(2, np.int64), step_ms=step_ms)
    ctrl.observe(np.zeros(2, np.int64), step_ms=12.0)
    assert ctrl.metrics["observed_steps"] == 1


@pytest.mark.parametrize("step_ms", [12, np.float32(12.0), np.array(12.0), torch.tensor(12.0), torch.tensor([12])])
def test_observe_takes_one_number_of_any_kind(ctrl, step_ms):
    ctrl.plan(CONF)
    ctrl.observe(np.zeros(2, np.int64), step_ms=step_ms)
    assert ctrl.policy.state.booked.measured_ms == 12.0


@pytest.mark.parametrize("block_size", [2.5, "4", None, float("nan"), True])
def test_a_block_size_that_is_not_an_integer_is_a_type_error(curve4, block_size):
    """2.5 was truncated to 2 (then refused as a curve 'measured for 4, not 2'), "4" was accepted."""
    with pytest.raises(TypeError, match="block_size=.* must be an integer"):
        RatioController(curve4, block_size)
    assert RatioController(curve4, np.int64(B)).block_size == B
