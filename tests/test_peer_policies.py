"""The published peer policies: hand-computed cases against each source's formula, and the invariants.

Shared hand case (as tests/test_policies.py): CONF gives scores r0 = [1, .9, .72, .36],
r1 = [1, .2, .18, .162]; sorted: 1, 1, .9, .72, .36, .2, .18, .162 (bs = 2, B = 4).
"""

import copy

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import dcut_sched as d
from dcut_sched import expected_tokens, global_topk, slot_scores
from dcut_sched.cost_curve import CostCurveRangeError
from dcut_sched.policies import PEERS
from dcut_sched.policies.dense_fallback import eligible_buckets
from dcut_sched.policies.dspark import padded_num_tokens, vllm_capture_sizes
from dcut_sched.policies.smartspec import geometric_expected_tokens, smartspec_goodput
from dcut_sched.policies.tetris import tetris_budget
from dcut_sched.policies.vllm_adaptive import best_query_len, profiled_level
from dcut_sched.step_costs import StepCosts

CONF = np.array([[0.9, 0.8, 0.5], [0.2, 0.9, 0.9]])
HALF = np.full((2, 3), 0.5)  # scores [1, .5, .25, .125] for both requests
SURE = np.full((2, 3), 0.99)


@pytest.fixture
def curve(make_curve):
    """C_verify(bs, K) = 2 + K, C_draft(2) = 1 + 0.5 * 2 = 2 ms; bs 1, 2, 4; B = 4."""
    return make_curve(batch_sizes=(1, 2, 4), block_size=4, base_ms=2.0, per_token_ms=1.0,
                      draft_base_ms=1.0, draft_per_request_ms=0.5)


@pytest.fixture
def costs(curve):
    """The step costs of ``curve`` (B = 4): what a policy plans with."""
    return StepCosts(curve, 4)


def test_registry_lists_the_peers_after_the_design_policies():
    assert d.policies.names()[-5:] == list(PEERS)
    assert PEERS == ("tetris", "smartspec", "vllm_adaptive", "dspark", "dense_fallback")


# ---------------------------------------------------------------- TETRIS
@pytest.mark.parametrize("capacity, lengths, expected", [
    (0, [1, 1], 2.0),
    (1, [3, 1], 3.62),           # K = 2 * 2 = 4: 1, 1, .9, .72
    (2, [4, 2], 4.18),           # K = 6: + .36, .2
    (3, [4, 4], 4.522),          # K = 8: the whole block
    (9, [4, 4], 4.522),          # capped at B - 1 drafts per request
])
def test_tetris_hand_computed(capacity, lengths, expected):
    plan = d.policies.get("tetris", draft_capacity=capacity).plan(CONF)
    assert plan.lengths.tolist() == lengths
    assert plan.num_tokens == tetris_budget(2, 4, capacity) == sum(lengths)
    assert plan.expected_tokens == pytest.approx(expected)
    with pytest.raises(ValueError, match="draft_capacity"):
        d.policies.get("tetris", draft_capacity=-1)


def test_tetris_default_is_half_a_b16_block():
    assert tetris_budget(4, 16, d.policies.get("tetris").draft_capacity) == 32  # rho = 0.5


# ---------------------------------------------------------------- SmartSpec
def test_geometric_expected_tokens():
    assert geometric_expected_tokens(0.5, np.array([0, 1, 2])).tolist() == [1.0, 1.5, 1.75]
    assert geometric_expected_tokens(1.0, 3) == 4.0
    assert geometric_expected_tokens(0.0, 5) == 1.0
    with pytest.raises(ValueError):
        geometric_expected_tokens(1.5, 1)


def test_smartspec_hand_computed(curve, costs):
    pol = d.policies.get("smartspec")
    # no outcome yet: the whole block, to measure the acceptance rate unbiased
    plan = pol.plan(CONF, costs)
    assert plan.lengths.tolist() == [4, 4] and plan.num_tokens == 8 and plan.draft_next
    assert plan.expected_tokens == pytest.approx(4.522)
    # accepted 3 of 3 and 1 of 3: trials 3 + 2 (the first rejection counts) -> a = 4 / 5
    pol.observe(np.array([4, 4]), np.array([3, 1]))
    assert pol.state.acceptance_rate == pytest.approx(0.8)
    # T(k) = C_draft + C_verify(2, 2(k+1)) = 2 + 4 + 2k; E = (1 - .8^(k+1)) / .2
    step = pol.step_ms(2, 4, costs)
    assert step[1:].tolist() == [8.0, 10.0, 12.0] and step[0] == curve.ar_ms(2)
    goodput = smartspec_goodput(0.8, 2, step)
    assert goodput[1:] == pytest.approx([2 * 1.8 / 8, 2 * 2.44 / 10, 2 * 2.952 / 12])  # .45, .488, .492
    plan = pol.plan(HALF, costs)
    assert plan.lengths.tolist() == [4, 4]  # k = 3 is the best drafted length
    assert plan.draft_next is bool(2 * 2.952 / 12 > 2 / curve.ar_ms(2))
    # a bad outcome: every first draft rejected -> a = 0 -> plain decoding, and it stays there
    pol.observe(np.array([4, 4]), np.array([0, 0]))
    assert pol.state.acceptance_rate == pytest.approx(0.9 * 4 / (0.9 * 5 + 2))
    pol.state.accepted = 0.0
    assert pol.plan(HALF, costs).lengths.tolist() == [2, 2]  # k = 1 if it must draft
    plain = pol.plan_without_draft(2, 4, costs)
    assert plain.draft_next is False and plain.lengths.tolist() == [1, 1] and not plain.drafted


def test_smartspec_history_decay(curve):
    pol = d.policies.get("smartspec", history_decay=0.5)
    pol.observe(np.array([4, 4]), np.array([3, 3]))  # 6 of 6
    pol.observe(np.array([2, 2]), np.array([0, 0]))  # 0 of 2
    assert pol.state.accepted == pytest.approx(3.0) and pol.state.trials == pytest.approx(5.0)
    pol.observe(np.array([1, 1]), np.array([0, 0]))  # nothing verified: nothing learnt
    assert pol.state.trials == pytest.approx(5.0)
    pol.reset()
    assert pol.state.acceptance_rate is None


# ---------------------------------------------------------------- vLLM verify-adaptive
def test_profiled_level_rounds_up():
    assert profiled_level(3, [1, 4, 16]) == 4
    assert profiled_level(4, [1, 4, 16]) == 4
    with pytest.raises(CostCurveRangeError, match="above the largest profiled"):
        profiled_level(17, [1, 4, 16])
    assert best_query_len(np.array([2.0, 4.0]), np.array([1.0, 2.0])) == 0  # tie: the smaller Q


def test_vllm_adaptive_hand_computed(make_curve):
    # profiled at bs 1 and 4 only, every 4th token count: bs = 2 rounds up to 4, Q in {4, 8}
    costs = StepCosts(make_curve(batch_sizes=(1, 4), block_size=4, base_ms=2.0, per_token_ms=1.0, step=4), 4)
    pol = d.policies.get("vllm_adaptive")
    level, qs, itl = pol.table(2, 4, costs)
    assert level == 4 and qs.tolist() == [4, 8] and itl.tolist() == [6.0, 10.0]
    first = pol.plan(CONF, costs)  # nothing cached yet: the scheduled full block
    assert first.lengths.tolist() == [4, 4] and first.num_tokens == 8
    # decided on the previous step's CONF: U(4) = 3.62 / 6 = .603 > U(8) = 4.522 / 10 -> Q = 4, [3, 1];
    # applied to this step's drafts (HALF): expected 1 + .5 + .25 + 1
    plan = pol.plan(HALF, costs)
    assert plan.lengths.tolist() == [3, 1] and plan.num_tokens == 4
    assert plan.expected_tokens == pytest.approx(2.75)
    # without the lag the same step would split the budget evenly (ties: lower slot, lower request)
    now = d.policies.get("vllm_adaptive", lag_steps=0)
    assert now.plan(HALF, costs).lengths.tolist() == [2, 2]
    # a batch of another shape has no cached decision: full again
    assert pol.plan(np.full((1, 3), 0.5), costs).lengths.tolist() == [4]


# ---------------------------------------------------------------- DSpark-style
def test_capture_sizes_and_padding():
    sizes = vllm_capture_sizes(512)
    assert sizes[:5].tolist() == [1, 2, 4, 8, 16] and sizes[-3:].tolist() == [480, 496, 512]
    assert len(sizes) == 3 + 31 + 17
    assert vllm_capture_sizes(500)[-1] == 500  # the limit itself is captured
    assert padded_num_tokens(np.array([3, 9, 256, 257]), sizes).tolist() == [4, 16, 256, 272]


def test_dspark_hand_computed(costs):
    pol = d.policies.get("dspark")
    ks, step = pol.table(2, 4, costs)
    assert ks.tolist() == [2, 4, 8] and step.tolist() == [6.0, 8.0, 12.0]  # 2 + (2 + K)
    # first step, no history: E = [2, 3.62, 4.522] / T -> .333, .4525, .377 -> K = 4
    assert pol.plan(CONF, costs).lengths.tolist() == [3, 1]
    # the budget comes from the average (CONF), the allocation from the current drafts (HALF)
    plan = pol.plan(HALF, costs)
    assert plan.num_tokens == 4 and plan.lengths.tolist() == [2, 2] and plan.expected_tokens == pytest.approx(3.0)
    assert pol.state.ema == pytest.approx(0.8 * np.array([2, 3, 3.75]) + 0.2 * np.array([2, 3.62, 4.522]))
    # stale: the average says K = 4 (3.124 / 8 = .39 > 3.904 / 12); the current SURE drafts alone would say K = 8
    assert pol.plan(SURE, costs).num_tokens == 4
    assert d.policies.get("dspark").plan(SURE, costs).num_tokens == 8


def test_dspark_capture_limit_and_staircase(make_curve):
    curve = make_curve(batch_sizes=(3,), block_size=4, base_ms=2.0, per_token_ms=1.0)
    costs = StepCosts(curve, 4)
    pol = d.policies.get("dspark")
    ks, step = pol.table(3, 4, costs)
    # 3 and 12 are not capture sizes: 3 replays the graph of 4; 12 that of 16, clipped to the curve's 12
    assert ks.tolist() == [3, 4, 8, 12]
    assert step.tolist() == pytest.approx(np.array([4, 4, 8, 12]) + 2.0 + curve.draft_ms(3))
    capped = d.policies.get("dspark", capture_limit=4)
    assert capped.table(3, 4, costs)[0].tolist() == [3, 4]
    assert capped.plan(np.full((3, 3), 0.999), costs).num_tokens == 4
    with pytest.raises(CostCurveRangeError, match="capture limit"):
        d.policies.get("dspark", capture_limit=2).plan(np.full((3, 3), 0.5), costs)


# ---------------------------------------------------------------- dense fallback
def test_eligible_buckets():
    ks, ms = np.array([2, 4, 6, 8]), np.array([4.0, 6.0, 8.0, 10.0])  # savings .6, .4, .2, 0
    assert eligible_buckets(ks, ms, 0.12).tolist() == [True, True, True, True]
    assert eligible_buckets(ks, ms, 0.5).tolist() == [True, False, False, True]
    assert eligible_buckets(ks, ms, 0.2).tolist() == [True, True, True, True]  # exactly 20 % counts


@pytest.mark.parametrize("min_saving, lengths", [
    (0.12, [3, 1]),   # every bucket saves >= 12 %: dcut's choice K = 4 (U = .603)
    (0.5, [1, 1]),    # only K = 2 (saves 60 %) and full: U .5 > .4522
    (0.7, [4, 4]),    # nothing saves 70 %: dense
])
def test_dense_fallback_hand_computed(costs, min_saving, lengths):
    plan = d.policies.get("dense_fallback", min_saving=min_saving).plan(CONF, costs)
    assert plan.lengths.tolist() == lengths


def test_dense_fallback_on_a_flat_curve_stays_dense(make_curve):
    # C = 10 + 0.8 K: K 2/4/6/8 -> 11.6/13.2/14.8/16.4 ms, savings 29/20/10/0 %;
    # U = .172/.2742/.2824/.2757: dcut takes K = 6, which saves under 12 %; of the rest full is best
    flat = StepCosts(make_curve(batch_sizes=(2,), block_size=4, base_ms=10.0, per_token_ms=0.8), 4)
    assert d.policies.get("dcut").plan(CONF, flat).num_tokens == 6
    assert d.policies.get("dense_fallback").plan(CONF, flat).lengths.tolist() == [4, 4]
    zero = d.policies.get("dense_fallback", min_saving=0.0)
    assert zero.plan(CONF, flat).lengths.tolist() == d.policies.get("dcut").plan(CONF, flat).lengths.tolist()


# ---------------------------------------------------------------- invariants of all five
def _run(name, confs, costs, kind):
    """Plan a sequence of steps (with observe after each), numpy or torch; returns the plans."""
    pol = d.policies.get(name)
    plans = []
    for c in confs:
        x = torch.as_tensor(c) if kind == "torch" else c
        plan = pol.plan(x, costs)
        plans.append(plan)
        accepted = np.minimum(np.asarray(plan.lengths) - 1, 1)
        pol.observe(plan.lengths, torch.as_tensor(accepted) if kind == "torch" else accepted)
    return plans


@settings(max_examples=150, deadline=None)
@given(bs=st.integers(1, 8), block=st.sampled_from([2, 4, 8, 16]), seed=st.integers(0, 2**31 - 1),
       name=st.sampled_from(list(PEERS)))
def test_invariants_numpy_torch_determinism(bs, block, seed, name):
    from tests.conftest import linear_curve

    rng = np.random.default_rng(seed)
    confs = [rng.uniform(size=(bs, block - 1)) ** rng.uniform(0.2, 3) for _ in range(3)]
    costs = StepCosts(linear_curve(batch_sizes=(bs,), block_size=block, step=1), block)
    p_np = _run(name, confs, costs, "numpy")
    p_again = _run(name, confs, costs, "numpy")
    p_t = _run(name, confs, costs, "torch")
    for t, (a, b, c) in enumerate(zip(p_np, p_again, p_t)):
        assert a.lengths.tolist() == b.lengths.tolist() == c.lengths.tolist()  # deterministic, kinds agree
        assert isinstance(c.lengths, torch.Tensor) and c.lengths.dtype == torch.int64
        assert a.num_tokens == b.num_tokens == c.num_tokens == int(a.lengths.sum())  # budget respected
        assert a.lengths.min() >= 1 and a.lengths.max() <= block
        assert a.expected_tokens == pytest.approx(c.expected_tokens)
        assert a.expected_tokens == pytest.approx(expected_tokens(slot_scores(confs[t]), a.lengths))
        # prefix closure: the verified slots are the top-K of the scores the decision used
        if name in ("tetris", "dspark", "dense_fallback"):
            assert a.lengths.tolist() == global_topk(slot_scores(confs[t]), a.num_tokens).tolist()
        if name == "vllm_adaptive" and t > 0:
            assert a.lengths.tolist() == global_topk(slot_scores(confs[t - 1]), a.num_tokens).tolist()
        if name == "smartspec":
            assert len(set(a.lengths.tolist())) == 1  # one draft length for every request
        if name == "tetris":
            assert a.num_tokens == tetris_budget(bs, block, 7)


def test_reset_and_deepcopy_isolate_state(costs):
    for name in ("smartspec", "vllm_adaptive", "dspark"):
        pol = d.policies.get(name)
        empty = dict(vars(pol.state))
        assert all(v is None or v == 0 for v in empty.values())
        pol.plan(CONF, costs)
        pol.observe(np.array([4, 4]), np.array([1, 0]))
        clone = copy.deepcopy(pol)
        assert any(v is not None and not np.all(v == 0) for v in vars(pol.state).values())
        pol.reset()
        assert dict(vars(pol.state)) == empty
        assert clone.state is not pol.state and any(v is not None for v in vars(clone.state).values())


@pytest.mark.parametrize("name", PEERS)
def test_online_controller_runs_the_peers_and_feeds_back_outcomes(curve, name):
    ctrl = d.RatioController(curve, block_size=4, policy=name)
    plan = ctrl.plan(torch.as_tensor(CONF))
    assert plan.num_tokens == int(plan.lengths.sum()) and isinstance(plan.lengths, torch.Tensor)
    ctrl.observe(torch.tensor([3, 1]))
    again = ctrl.plan(torch.as_tensor(HALF))
    assert 2 <= again.num_tokens <= 8
    if name == "smartspec":  # observe reached the policy: a = 4 / 5 from min(3, L-1) + min(1, L-1) of 3 + 2
        assert ctrl.policy.state.acceptance_rate == pytest.approx(0.8)
