"""RatioController: plan invariants (hypothesis, CPU torch), layouts, sanitising, feedback."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dcut_sched import CostCurveError, RatioController, policies
from dcut_sched.controller import slot_layout
from dcut_sched.step_costs import StepCosts

B = 8
BATCH_SIZES = (1, 2, 4, 8)
POLICIES = ["ar", "full", "uniform", "threshold", "topk", "dcut", "fine"]


@pytest.fixture(scope="module")
def curve8():
    from tests.conftest import linear_curve

    return linear_curve(batch_sizes=BATCH_SIZES, block_size=B)


def conf_batches(max_bs=8):
    return st.integers(1, max_bs).flatmap(
        lambda bs: st.lists(
            st.lists(st.floats(0.0, 1.0, allow_nan=False, width=32), min_size=B - 1, max_size=B - 1),
            min_size=bs,
            max_size=bs,
        )
    )


def check_invariants(plan, bs):
    lengths = plan.lengths
    assert isinstance(lengths, torch.Tensor) and lengths.dtype == torch.int64 and lengths.shape == (bs,)
    assert int(lengths.min()) >= 1 and int(lengths.max()) <= B
    assert int(lengths.sum()) == plan.num_tokens
    assert bs <= plan.num_tokens <= bs * B
    assert math.isclose(plan.ratio, plan.num_tokens / (bs * B))
    mask = plan.slot_mask
    assert mask.shape == (bs, B) and mask.dtype == torch.bool
    # prefix closure: a kept slot's predecessor is kept; row sums are the lengths
    assert not bool((mask[:, 1:] & ~mask[:, :-1]).any())
    assert torch.equal(mask.sum(1), lengths)
    # gather indices: request-major flat indices of the kept slots
    assert torch.equal(plan.gather_indices, torch.nonzero(mask.reshape(-1)).reshape(-1))
    # vLLM layout
    assert plan.num_draft_tokens.dtype == torch.int32
    assert torch.equal(plan.num_draft_tokens.long(), lengths - 1)
    assert torch.equal(plan.cu_num_draft_tokens.long(), torch.cumsum(lengths - 1, 0))
    assert plan.graph_cell == (bs, plan.num_tokens)


@pytest.mark.parametrize("name", POLICIES)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=conf_batches())
def test_plan_invariants_and_policy_equivalence(curve8, name, rows):
    conf = torch.tensor(rows, dtype=torch.float32)
    bs = conf.shape[0]
    ctrl = RatioController(curve8 if policies.get(name).needs_cost else None, B, policy=name)
    plan = ctrl.plan(conf)
    check_invariants(plan, bs)
    # the controller adds nothing to the policy's decision: same lengths as the registry policy on
    # the same arithmetic (a CPU tensor is planned through its numpy view; torch and numpy float32
    # products can differ in the subnormal range, which reorders near-zero ties)
    direct = policies.get(name).plan(conf.numpy(), StepCosts(curve8, B))
    assert torch.equal(plan.lengths, torch.as_tensor(direct.lengths))
    assert plan.num_tokens == direct.num_tokens
    assert plan.draft_next == direct.draft_next
    assert math.isclose(plan.expected_tokens, direct.expected_tokens, rel_tol=1e-5)  # float32 sums


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=conf_batches(), rho=st.sampled_from([0.25, 0.5, 0.75, 1.0]))
def test_topk_budget(curve8, rows, rho):
    conf = torch.tensor(rows, dtype=torch.float32)
    bs = conf.shape[0]
    plan = RatioController(None, B, policy="topk", rho=rho).plan(conf)
    check_invariants(plan, bs)
    assert plan.num_tokens == max(bs, math.ceil(rho * bs * B - 1e-9))


def test_layout_hand_case():
    lengths = torch.tensor([2, 1, 3])
    layout = slot_layout(lengths, 4, 6)
    assert layout.slot_mask.tolist() == [
        [True, True, False, False],
        [True, False, False, False],
        [True, True, True, False],
    ]
    assert layout.gather_indices.tolist() == [0, 1, 4, 8, 9, 10]
    assert layout.num_draft_tokens.tolist() == [1, 0, 2]
    assert layout.cu_num_draft_tokens.tolist() == [1, 1, 3]
    np_layout = slot_layout(lengths.numpy(), 4, 6)
    assert np_layout.gather_indices.tolist() == [0, 1, 4, 8, 9, 10]
    assert np_layout.cu_num_draft_tokens.tolist() == [1, 1, 3]


def test_numpy_confidences_give_numpy_plans(curve8):
    conf = np.random.default_rng(0).random((4, B - 1))
    plan = RatioController(curve8, B, policy="dcut").plan(conf)
    assert isinstance(plan.lengths, np.ndarray)
    assert plan.gather_indices.tolist() == np.flatnonzero(plan.slot_mask).tolist()
    assert plan.cu_num_draft_tokens.tolist() == np.cumsum(plan.lengths - 1).tolist()


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), 1.5, -0.1])
def test_bad_confidences_are_zeroed_and_counted(curve8, bad):
    conf = torch.full((4, B - 1), 0.95)
    conf[2, 3] = bad
    ctrl = RatioController(curve8, B, policy="topk", rho=0.5)
    plan = ctrl.plan(conf)  # never raises
    check_invariants(plan, 4)
    # request 2 has zero confidence: its drafts score 0 and lose to every other request's slots
    assert int(plan.lengths[2]) == 1
    assert ctrl.metrics["bad_conf_requests"] == 1
    # same plan as the policy on the zeroed row
    zeroed = conf.clone()
    zeroed[2] = 0
    assert torch.equal(plan.lengths, policies.get("topk", rho=0.5).plan(zeroed).lengths)
    ctrl.plan(conf)
    assert ctrl.metrics["bad_conf_requests"] == 2


def test_all_bad_batch_plans_anchor_for_fine(curve8):
    conf = torch.full((2, B - 1), float("nan"))
    plan = RatioController(curve8, B, policy="fine").plan(conf)
    assert plan.lengths.tolist() == [1, 1]


def test_block_size_refusal(curve8):
    with pytest.raises(CostCurveError, match="block size 8, not 16"):
        RatioController(curve8, 16, policy="fine")


def test_missing_cost_and_bad_shape(curve8):
    with pytest.raises(ValueError, match="needs a cost curve"):
        RatioController(None, B, policy="dcut")
    ctrl = RatioController(curve8, B, policy="full")
    with pytest.raises(ValueError, match=r"\[batch_size >= 1, 7\]"):
        ctrl.plan(torch.rand(2, 15))


def test_oracle_passes_accept_len(curve8):
    ctrl = RatioController(None, B, policy="oracle")
    plan = ctrl.plan(torch.rand(3, B - 1), accept_len=torch.tensor([0, 7, 3]))
    assert plan.lengths.tolist() == [1, 8, 4]


def test_observe_feeds_calibrator_with_censored_outcomes(curve8):
    ctrl = RatioController(curve8, B, policy="full", calibrate=True)
    ctrl.calibrator.refit_every = 10**6
    conf = torch.full((2, B - 1), 0.9)
    ctrl.plan(conf)
    ctrl.observe(torch.tensor([2, 7]))  # full verification: request 0 rejects draft 3
    acc, obs = ctrl.calibrator.counts()
    assert acc.sum() == 2 + 7 and obs.sum() == 3 + 7
    assert ctrl.metrics["accepted_drafts"] == 9
    with pytest.raises(ValueError, match="shape"):
        ctrl.plan(conf)
        ctrl.observe(torch.tensor([1, 2, 3]))


def test_calibration_changes_scores(curve8):
    ctrl = RatioController(curve8, B, policy="threshold", tau=0.5, calibrate=True)
    conf = torch.full((8, B - 1), 0.9)
    before = ctrl.plan(conf)
    ctrl.observe(torch.zeros(8, dtype=torch.int64))  # every first draft rejected
    for _ in range(9):
        ctrl.plan(conf)
        ctrl.observe(torch.zeros(8, dtype=torch.int64))
    ctrl.calibrator.refit()
    after = ctrl.plan(conf)
    assert before.lengths.tolist() == [B - 1] * 8  # 0.9^6 = 0.53 >= 0.5 > 0.9^7
    assert after.lengths.tolist() == [1] * 8  # the learnt map puts 0.9 well under 0.5


def test_plan_without_draft_and_metrics(curve8):
    ctrl = RatioController(curve8, B, policy="ar")
    plan = ctrl.plan_without_draft(4, device="cpu")
    assert plan.lengths.tolist() == [1, 1, 1, 1] and not plan.drafted and not plan.draft_next
    assert plan.cu_num_draft_tokens.tolist() == [0, 0, 0, 0]
    ctrl.observe(torch.zeros(4, dtype=torch.int64))  # no drafts: nothing to learn
    m = ctrl.metrics
    assert (m["steps"], m["drafted_steps"], m["plain_steps"], m["num_tokens"]) == (1, 0, 1, 4)


def test_graph_bank_cell_in_plan(curve8):
    from dcut_sched import VerifyGraphBank

    bank = VerifyGraphBank(
        lambda x: x * 2, [(4, 4), (4, 12), (4, 32)], make_inputs=lambda bs, k: (torch.zeros(k),), enabled=False
    )
    ctrl = RatioController(curve8, B, policy="topk", rho=0.25, graph_bank=bank)
    plan = ctrl.plan(torch.rand(4, B - 1))
    assert plan.num_tokens == 8 and plan.graph_cell == (4, 12)
    fine = RatioController(curve8, B, policy="fine", graph_bank=bank)
    assert fine.policy.allowed_num_tokens == (4, 12, 32)
    assert fine.plan(torch.rand(4, B - 1)).num_tokens in (4, 12, 32)


def test_plan_refuses_non_floating_confidences_and_observe_non_integer_counts(curve4):
    import numpy as np
    import pytest
    import torch

    from dcut_sched import RatioController

    ctrl = RatioController(curve4, 4, policy="dcut")
    for bad in (np.array([["0.5", "0.5", "0.5"]]), np.array([[1, 0, 1]]), torch.ones(1, 3, dtype=torch.int64),
                np.array([[True, False, True]])):
        with pytest.raises(TypeError, match="floating"):
            ctrl.plan(bad)
    ctrl.plan(np.full((2, 3), 0.5))
    for bad in (np.array([1.5, 0.0]), torch.tensor([1.0, 0.0]), np.array([True, False])):
        with pytest.raises(TypeError, match="integer"):
            ctrl.observe(bad)
    ctrl.observe(np.array([1, 0]))
