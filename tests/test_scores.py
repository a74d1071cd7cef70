import itertools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from dcut_sched import ScoreRanking, expected_tokens, global_topk, slot_scores


def test_slot_scores_hand_computed():
    conf = np.array([[0.5, 0.5, 1.0], [0.9, 0.0, 0.3]])
    want = np.array([[1, 0.5, 0.25, 0.25], [1, 0.9, 0.0, 0.0]])
    np.testing.assert_allclose(slot_scores(conf), want)
    got = slot_scores(torch.tensor(conf))
    assert isinstance(got, torch.Tensor) and got.dtype == torch.float64
    np.testing.assert_allclose(got.numpy(), want)


def test_global_topk_hand_computed_with_ties():
    # scores: r0 = [1, .5, .25, .25], r1 = [1, .9, 0, 0]
    scores = slot_scores(np.array([[0.5, 0.5, 1.0], [0.9, 0.0, 0.3]]))
    assert global_topk(scores, 2).tolist() == [1, 1]
    assert global_topk(scores, 3).tolist() == [1, 2]  # .9 first
    assert global_topk(scores, 4).tolist() == [2, 2]
    assert global_topk(scores, 5).tolist() == [3, 2]
    # r0 slot 4 (.25) ties r0 slot 3 only after it: earlier slot first
    assert global_topk(scores, 6).tolist() == [4, 2]
    # zeros tie: earlier slot first, then lower request index -> r1 slot 3 before r1 slot 4
    assert global_topk(scores, 7).tolist() == [4, 3]
    assert global_topk(scores, 8).tolist() == [4, 4]


def test_ties_broken_by_request_index():
    scores = slot_scores(np.full((3, 2), 0.5))
    assert global_topk(scores, 4).tolist() == [2, 1, 1]
    assert global_topk(scores, 5).tolist() == [2, 2, 1]


@pytest.mark.parametrize("k", [1, 9, 0, 2.5])
def test_budget_out_of_range(k):
    scores = slot_scores(np.full((2, 3), 0.5))  # bs=2, B=4
    with pytest.raises(ValueError, match=r"2 <= k <= 8"):
        global_topk(scores, k)


@pytest.mark.parametrize(
    "conf, match",
    [
        (np.array([0.5, 0.5]), "shape"),
        (np.zeros((0, 3)), "empty batch"),
        (np.zeros((2, 0)), "no draft slots"),
        (np.array([[0.5, np.nan]]), r"conf\[0, 1\] = nan is not finite"),
        (np.array([[0.5, np.inf]]), "not finite"),
        (np.array([[0.5, 1.5]]), r"outside \[0, 1\]"),
        (np.array([[-0.1, 0.5]]), r"outside \[0, 1\]"),
        (np.array([[1, 0]]), "floating"),
    ],
)
def test_bad_confidences(conf, match):
    with pytest.raises(ValueError, match=match):
        slot_scores(conf)
    with pytest.raises(ValueError, match=match):
        slot_scores(torch.as_tensor(conf))


def _brute_force_best(scores: np.ndarray, k: int) -> float:
    bs, block = scores.shape
    best = -np.inf
    for lengths in itertools.product(range(1, block + 1), repeat=bs):
        if sum(lengths) == k:
            best = max(best, expected_tokens(scores, np.array(lengths)))
    return best


@pytest.mark.parametrize("seed", range(6))
def test_global_topk_is_brute_force_optimal(seed):
    """Over every length vector with sum k (prefix per request), global top-K maximises E."""
    rng = np.random.default_rng(seed)
    bs, block = rng.integers(1, 5), rng.integers(2, 6)
    conf = rng.uniform(size=(bs, block - 1)) ** rng.uniform(0.3, 3)
    scores = slot_scores(conf)
    for k in range(bs, bs * block + 1):
        lengths = global_topk(scores, k)
        assert lengths.sum() == k and lengths.min() >= 1
        assert expected_tokens(scores, lengths) == pytest.approx(_brute_force_best(scores, k), rel=1e-12)


conf_batches = st.integers(1, 12).flatmap(
    lambda bs: st.integers(2, 17).flatmap(
        lambda block: arrays(np.float64, (bs, block - 1), elements=st.floats(0, 1))
    )
)


@settings(max_examples=1500, deadline=None)
@given(conf=conf_batches, data=st.data())
def test_topk_properties(conf, data):
    bs, block = conf.shape[0], conf.shape[1] + 1
    scores = slot_scores(conf)
    ranking = ScoreRanking(scores)
    k = data.draw(st.integers(bs, bs * block))
    lengths = ranking.lengths(k)
    # budget respected, anchors kept, at most B
    assert lengths.sum() == k and lengths.min() >= 1 and lengths.max() <= block
    # top-K as prefixes: every kept slot scores >= every dropped slot, of any request
    kept = np.arange(block)[None, :] < lengths[:, None]
    if (~kept).any():
        assert scores[kept].min() >= scores[~kept].max()
    # expected tokens from the ranking equals the helper
    assert ranking.expected_tokens_at([k])[0] == pytest.approx(expected_tokens(scores, lengths), abs=1e-9)
    # monotone in k: more budget never lowers expected tokens, and lengths only grow
    if k < bs * block:
        bigger = ranking.lengths(k + 1)
        assert (bigger >= lengths).all()
        assert expected_tokens(scores, bigger) >= expected_tokens(scores, lengths) - 1e-12
    # numpy == torch
    t_lengths = global_topk(slot_scores(torch.as_tensor(conf)), k)
    assert t_lengths.tolist() == lengths.tolist()


def test_expected_tokens_per_request():
    scores = slot_scores(np.array([[0.5, 0.5], [0.2, 1.0]]))
    per = expected_tokens(scores, np.array([3, 2]), per_request=True)
    np.testing.assert_allclose(per, [1 + 0.5 + 0.25, 1 + 0.2])
    assert expected_tokens(torch.as_tensor(scores), torch.tensor([3, 2])) == pytest.approx(2.95)


# Confidences on a coarse grid (0, 0.5, 1 and a few in between) make many exactly equal scores.
tied_conf = arrays(np.float32, st.tuples(st.integers(1, 6), st.integers(1, 6)),
                   elements=st.sampled_from([0.0, 0.25, 0.5, 1.0]))


@settings(max_examples=300, deadline=None)
@given(conf=tied_conf)
def test_partition_path_equals_the_sort_path(conf):
    """The numpy ranking answers few budgets with np.partition and a threshold count, many with one
    stable sort: both give the same lengths (tie order included) and E(K) for every budget."""
    scores = slot_scores(conf)
    bs, block = scores.shape
    every_k = np.arange(bs, bs * block + 1)
    sorted_ranking = ScoreRanking(scores)
    sorted_ranking._sort()
    expected_sorted = sorted_ranking.expected_tokens_at(every_k)
    for k in every_k:
        fresh = ScoreRanking(scores)  # partition path: one budget at a time
        assert fresh.expected_tokens_at([k])[0] == pytest.approx(expected_sorted[k - bs], abs=1e-9)
        assert fresh.lengths(int(k)).tolist() == sorted_ranking.lengths(int(k)).tolist()
        assert ScoreRanking(scores).lengths(int(k)).tolist() == sorted_ranking.lengths(int(k)).tolist()


@settings(max_examples=200, deadline=None)
@given(conf=tied_conf, data=st.data())
def test_prepared_budgets_answer_like_any_array(conf, data):
    """A Budgets query (the dcut fast path) gives the E(K) of the sort path, and the lengths after it."""
    from dcut_sched.scores import Budgets

    scores = slot_scores(conf)
    bs, block = scores.shape
    ks = sorted(data.draw(st.sets(st.integers(bs, bs * block), min_size=1, max_size=8)))
    full = ScoreRanking(scores)
    full._sort()
    fast = ScoreRanking(scores)
    got = fast.expected_tokens_at(Budgets(ks))
    assert got.tolist() == pytest.approx(full.expected_tokens_at(ks).tolist(), abs=1e-9)
    for k in ks:
        assert fast.lengths(k).tolist() == full.lengths(k).tolist()


def test_budgets_refuse_bad_input_and_out_of_range():
    from dcut_sched.scores import Budgets

    for bad in ([], [4, 4], [8, 4]):
        with pytest.raises(ValueError, match="ascending distinct"):
            Budgets(bad)
    ranking = ScoreRanking(slot_scores(np.full((2, 3), 0.5, dtype=np.float32)))  # bs 2, B 4: 2..8
    assert ranking.expected_tokens_at(Budgets([2, 8])).tolist() == [2.0, 2.0 + 2 * (0.5 + 0.25 + 0.125)]
    for bad in ([1, 4], [4, 9]):
        with pytest.raises(ValueError, match="out of range"):
            ranking.expected_tokens_at(Budgets(bad))
