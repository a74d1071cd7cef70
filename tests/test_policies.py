import itertools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import dcut_sched as d
from dcut_sched import expected_tokens, global_topk, slot_scores
from dcut_sched.policies import budget_from_ratio
from dcut_sched.step_costs import StepCosts

# scores: r0 = [1, .9, .72, .36], r1 = [1, .2, .18, .162]; sorted: 1,1,.9,.72,.36,.2,.18,.162
CONF = np.array([[0.9, 0.8, 0.5], [0.2, 0.9, 0.9]])


def test_registry_lists_the_design_policies_then_the_peers():
    assert d.policies.names()[:8] == ["ar", "full", "uniform", "threshold", "topk", "dcut", "fine", "oracle"]
    assert d.policies.names()[8:] == list(d.policies.PEERS)
    with pytest.raises(KeyError, match="unknown policy 'nope'; known policies: ar, full"):
        d.policies.get("nope")
    with pytest.raises(ValueError, match="policy full: parameter 'rho': is not a parameter"):
        d.policies.get("full", rho=0.5)
    with pytest.raises(ValueError, match="rho"):
        d.policies.get("uniform", rho=0)


@pytest.mark.parametrize(
    "name, params, lengths, expected",
    [
        ("ar", {}, [1, 1], 2.0),
        ("full", {}, [4, 4], 2.98 + 1.542),
        ("uniform", {"rho": 0.5}, [2, 2], 1.9 + 1.2),
        ("uniform", {"rho": 0.3}, [2, 2], 1.9 + 1.2),  # ceil(1.2) = 2
        ("threshold", {"tau": 0.5}, [3, 1], 2.62 + 1),
        ("threshold", {"tau": 0.19}, [4, 2], 2.98 + 1.2),
        ("topk", {"rho": 0.5}, [3, 1], 3.62),
        ("topk", {"rho": 0.625}, [4, 1], 3.98),
    ],
)
def test_hand_computed_plans(name, params, lengths, expected):
    plan = d.policies.get(name, **params).plan(CONF)
    assert plan.lengths.tolist() == lengths
    assert plan.num_tokens == sum(lengths)
    assert plan.expected_tokens == pytest.approx(expected)
    assert plan.ratio == pytest.approx(sum(lengths) / 8)
    assert plan.draft_next is (name != "ar")


def test_oracle_hand_computed():
    plan = d.policies.get("oracle").plan(CONF, accept_len=np.array([1, 0]))
    assert plan.lengths.tolist() == [2, 1] and plan.expected_tokens == pytest.approx(2.9)
    with pytest.raises(ValueError, match="needs accept_len"):
        d.policies.get("oracle").plan(CONF)
    with pytest.raises(ValueError, match=r"in \[0, 3\]"):
        d.policies.get("oracle").plan(CONF, accept_len=np.array([4, 0]))


def test_dcut_hand_computed(make_curve):
    # C_verify = 2 + K: K in {2, 4, 6, 8} -> E {2, 3.62, 4.18, 4.522}, U {.5, .603, .5225, .4522}
    curve = StepCosts(make_curve(batch_sizes=(2,), base_ms=2.0, per_token_ms=1.0), 4)
    plan = d.policies.get("dcut").plan(CONF, curve)
    assert plan.num_tokens == 4 and plan.lengths.tolist() == [3, 1]
    assert plan.expected_tokens == pytest.approx(3.62)
    # verification nearly free beyond a fixed cost -> the largest bucket
    flat = StepCosts(make_curve(batch_sizes=(2,), base_ms=10.0, per_token_ms=0.01), 4)
    assert d.policies.get("dcut").plan(CONF, flat).num_tokens == 8
    with pytest.raises(ValueError, match="needs a cost curve"):
        d.policies.get("dcut").plan(CONF)
    with pytest.raises(ValueError, match="block size 4, not 3"):
        d.policies.get("dcut").plan(CONF[:, :2], curve)
    # a policy takes only StepCosts: a bare curve is refused with the fix, never converted
    with pytest.raises(TypeError, match=r"plans with StepCosts, got CostCurve; build StepCosts\(curve, block_size\)"):
        d.policies.get("dcut").plan(CONF, curve.cost)


def test_fine_hand_computed_and_skips_drafting(make_curve):
    # step = C_draft(2) + C_verify = 2 + (2 + K): E/step peaks at K=4 (3.62/8 = .4525);
    # plain decoding: 2 tokens per C_ar(2) = 4 ms -> .5 > .4525 -> stop drafting next step.
    curve = make_curve(batch_sizes=(2,), base_ms=2.0, per_token_ms=1.0, draft_base_ms=1.0, draft_per_request_ms=0.5)
    costs = StepCosts(curve, 4)
    assert costs.plain_ms(2) == pytest.approx(4.0)
    fine = d.policies.get("fine", granularity=1, probe_interval=3, probe_budget=0.01)
    plan = fine.plan(CONF, costs)
    assert plan.num_tokens == 4 and plan.lengths.tolist() == [3, 1]
    assert fine.state.rate == pytest.approx(3.62 / 8)
    assert plan.draft_next is False
    # that step lost 8 - 3.62 / .5 = 0.76 ms against plain decoding: the account, and the estimate of
    # a probe's loss
    assert fine.state.debt_ms == pytest.approx(0.76) and fine.state.next_probe_loss_ms == pytest.approx(0.76)
    # first probe once 0.76 + 0.76 ms fit in 1 % of the run: 152 ms = the 8 ms step + 36 plain steps of 4 ms
    flags = [fine.plan_without_draft(2, 4, costs).draft_next for _ in range(36)]
    assert flags == [False] * 35 + [True]
    assert fine.state.elapsed_ms == pytest.approx(152.0)
    p = d.policies.get("fine").plan_without_draft(2, 4, costs)
    assert p.lengths.tolist() == [1, 1] and not p.drafted and p.num_tokens == 2


def test_fine_probe_budget_bounds_the_loss_and_resumes(make_curve):
    curve = StepCosts(make_curve(batch_sizes=(2,), base_ms=2.0, per_token_ms=1.0, draft_base_ms=1.0,
                                 draft_per_request_ms=0.5), 4)
    fine = d.policies.get("fine", granularity=1, probe_interval=3, probe_budget=0.01)
    fine.plan(CONF, curve)
    intervals = []
    for _ in range(5):
        steps = 1
        while not fine.plan_without_draft(2, 4, curve).draft_next:
            steps += 1
        intervals.append(steps)
        assert fine.plan(CONF, curve).draft_next is False  # failed probe, loses 0.76 ms
        # what drafting lost never exceeds the budget's share of the run
        assert fine.state.debt_ms <= 0.01 * fine.state.elapsed_ms + 1e-9
    # 0.76 ms per probe in 1 % of the time: 76 ms per cycle = one 8 ms probe + 17 plain steps of 4 ms
    assert intervals == [36, 17, 17, 17, 17]
    assert fine.state.debt_ms == pytest.approx(6 * 0.76)
    # drafting starts to pay: the next probe (at most 17 plain steps away) resumes drafting
    steps = 1
    while not fine.plan_without_draft(2, 4, curve).draft_next:
        steps += 1
    assert steps <= 17
    assert fine.plan(np.full((2, 3), 0.999), curve).draft_next is True
    # the probe interval is a floor: a tiny loss still waits probe_interval plain steps
    fine = d.policies.get("fine", granularity=1, probe_interval=3, probe_budget=0.9)
    fine.plan(CONF, curve)
    assert [fine.plan_without_draft(2, 4, curve).draft_next for _ in range(3)] == [False, False, True]
    with pytest.raises(ValueError, match="probe_budget"):
        d.policies.get("fine", probe_budget=0.0)
    # a cheap draft makes speculation worth it
    cheap = StepCosts(make_curve(batch_sizes=(2,), base_ms=2.0, per_token_ms=0.2, draft_base_ms=0.1,
                                 draft_per_request_ms=0.0), 4)
    assert d.policies.get("fine", granularity=1).plan(CONF, cheap).draft_next is True


def test_fine_default_grid_is_every_count_and_granularity_coarsens_it(make_curve):
    curve = StepCosts(make_curve(batch_sizes=(4,), block_size=16), 16)
    assert d.policies.get("fine").candidates(4, 16, curve).tolist() == list(range(4, 65))
    # above MAX_CANDIDATES (128) budgets, every ceil(bs*B / 128)-th count, both ends kept
    wide = StepCosts(make_curve(batch_sizes=(16, 64), block_size=16), 16)
    assert d.policies.get("fine").candidates(16, 16, wide).tolist() == list(range(16, 257, 2))
    assert d.policies.get("fine").candidates(64, 16, wide).tolist() == list(range(64, 1025, 8))
    fine = d.policies.get("fine", granularity=8)
    assert fine.candidates(4, 16, curve).tolist() == [4, 8, 16, 24, 32, 40, 48, 56, 64]
    fine = d.policies.get("fine", allowed_num_tokens=[2, 4, 10, 64, 100])
    assert fine.candidates(4, 16, curve).tolist() == [4, 10, 64]


def _best_expected(scores, k):
    bs, block = scores.shape
    return max(
        expected_tokens(scores, np.array(ls))
        for ls in itertools.product(range(1, block + 1), repeat=bs)
        if sum(ls) == k
    )


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("objective", ["ratio", "marginal"])
def test_fine_matches_brute_force(make_curve, seed, objective):
    rng = np.random.default_rng(seed)
    bs, block = int(rng.integers(1, 4)), int(rng.integers(2, 6))
    curve = make_curve(batch_sizes=(bs,), block_size=block, base_ms=float(rng.uniform(1, 5)),
                       per_token_ms=float(rng.uniform(0.1, 2)), draft_base_ms=float(rng.uniform(0, 3)))
    fine = d.policies.get("fine", granularity=1, objective=objective)
    for _ in range(3):  # several steps so "marginal" uses its running rate
        conf = rng.uniform(size=(bs, block - 1)) ** rng.uniform(0.2, 2)
        scores = slot_scores(conf)
        rate = fine.state.rate
        plan = fine.plan(conf, StepCosts(curve, block))
        ks = list(range(bs, bs * block + 1))
        best = {k: _best_expected(scores, k) for k in ks}
        if objective == "marginal" and rate is not None:
            value = {k: best[k] - rate * curve.verify_ms(bs, k) for k in ks}
        else:
            value = {k: best[k] / (curve.draft_ms(bs) + curve.verify_ms(bs, k)) for k in ks}
        assert value[plan.num_tokens] == pytest.approx(max(value.values()), rel=1e-9)
        assert plan.expected_tokens == pytest.approx(best[plan.num_tokens])


@pytest.mark.parametrize("seed", range(5))
def test_dcut_matches_brute_force(make_curve, seed):
    rng = np.random.default_rng(100 + seed)
    bs, block = int(rng.integers(1, 5)), int(rng.integers(2, 6))
    curve = make_curve(batch_sizes=(bs,), block_size=block, base_ms=float(rng.uniform(1, 5)),
                       per_token_ms=float(rng.uniform(0.1, 2)))
    conf = rng.uniform(size=(bs, block - 1))
    scores = slot_scores(conf)
    plan = d.policies.get("dcut").plan(conf, StepCosts(curve, block))
    utility = {}
    for rho in (0.25, 0.5, 0.75, 1.0):
        k = budget_from_ratio(rho, bs, block)
        utility[k] = _best_expected(scores, k) / curve.verify_ms(bs, k)
    assert utility[plan.num_tokens] == pytest.approx(max(utility.values()), rel=1e-12)
    assert plan.lengths.tolist() == global_topk(scores, plan.num_tokens).tolist()


def test_budget_from_ratio():
    assert budget_from_ratio(0.25, 4, 16) == 16
    assert budget_from_ratio(0.25, 4, 2) == 4  # clamped up to bs
    assert budget_from_ratio(0.3, 3, 5) == 5  # ceil(4.5)
    with pytest.raises(ValueError):
        budget_from_ratio(1.5, 4, 16)


@settings(max_examples=300, deadline=None)
@given(
    bs=st.integers(1, 8), block=st.sampled_from([2, 4, 8, 16]), seed=st.integers(0, 2**31 - 1),
    name=st.sampled_from(["ar", "full", "uniform", "threshold", "topk", "dcut", "fine", "oracle"]),
)
def test_numpy_and_torch_agree_and_invariants(bs, block, seed, name):
    from tests.conftest import linear_curve

    rng = np.random.default_rng(seed)
    conf = rng.uniform(size=(bs, block - 1)) ** rng.uniform(0.2, 3)
    accept = rng.integers(0, block, size=bs)
    costs = StepCosts(linear_curve(batch_sizes=(bs,), block_size=block, step=1), block)
    p_np = d.policies.get(name).plan(conf, costs, accept_len=accept)
    p_t = d.policies.get(name).plan(torch.as_tensor(conf), costs, accept_len=torch.as_tensor(accept))
    assert isinstance(p_t.lengths, torch.Tensor) and p_t.lengths.dtype == torch.int64
    assert p_np.lengths.tolist() == p_t.lengths.tolist()
    assert p_np.num_tokens == p_t.num_tokens == int(p_np.lengths.sum())
    assert p_np.expected_tokens == pytest.approx(p_t.expected_tokens)
    assert p_np.lengths.min() >= 1 and p_np.lengths.max() <= block
    assert p_np.expected_tokens == pytest.approx(expected_tokens(slot_scores(conf), p_np.lengths))


def test_fine_choose_budget_is_the_brute_force_argmax():
    """The pure chooser: ratio objective = argmax E/(fixed + C_verify) (ties: smaller K); marginal
    objective = argmax E - rate * C_verify, by hand on three candidates."""
    from dcut_sched.policies.fine import choose_budget

    expected = np.array([4.0, 6.0, 7.0])
    verify_ms = np.array([10.0, 14.0, 20.0])
    j, per_ms = choose_budget(expected, verify_ms, 2.0)
    np.testing.assert_allclose(per_ms, [4 / 12, 6 / 16, 7 / 22])
    assert j == 1
    assert choose_budget(expected, verify_ms, 2.0, "marginal", rate=0.1)[0] == 2  # 3.0, 4.6, 5.0
    assert choose_budget(expected, verify_ms, 2.0, "marginal", rate=0.5)[0] == 0  # -1.0, -1.0, -3.0: tie -> smaller
    assert choose_budget(expected, verify_ms, 2.0, "marginal", rate=None)[0] == 1  # no rate yet: ratio


def test_param_values_of_the_wrong_kind_name_the_parameter():
    import pytest

    from dcut_sched.policies.base import check_params

    for name, params, expected in [("tetris", {"draft_capacity": True}, "an integer"),
                                   ("fine", {"granularity": "x"}, "an integer"),
                                   ("topk", {"rho": False}, "a number"),
                                   ("fine", {"objective": 3}, "a string"),
                                   ("fine", {"granularity": 2.5}, "an integer"),
                                   ("dcut", {"ratios": "1"}, "a list of numbers"),
                                   ("dcut", {"ratios": [True]}, "a list of numbers"),
                                   ("dcut", {"ratios": {"0.5": 1}}, "a list of numbers")]:
        with pytest.raises(ValueError, match=f"parameter {list(params)[0]}: expects {expected}"):
            check_params(name, params)
    check_params("fine", {"granularity": 4, "ema_decay": 1})
    check_params("dcut", {"ratios": [0.5, 1]})
    check_params("topk", {"rho": 1})
