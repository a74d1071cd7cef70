"""VerifyGraphBank: cell choice, padding, eager path on CPU; CUDA capture where a GPU exists."""

from __future__ import annotations

import pytest
import torch

from dcut_sched.controller import VerifyGraphBank, cells_from_curve

CELLS = [(2, 2), (2, 8), (4, 4), (4, 8), (4, 16)]


def verify_fn(ids, weight):
    """A stand-in verification: per-token score = id * weight[row] + cumulative sum along tokens."""
    return ids.float() * weight[:, None] + torch.cumsum(ids.float(), dim=1), ids.sum(1)


def make_inputs(device):
    def make(bs, num_tokens):
        per_request = -(-num_tokens // bs)  # tokens per request of the padded [bs, T] layout
        return (torch.zeros(bs, per_request, dtype=torch.int64, device=device), torch.ones(bs, device=device))

    return make


def test_cell_for_pads_up():
    bank = VerifyGraphBank(verify_fn, CELLS, make_inputs=make_inputs("cpu"), enabled=False)
    assert bank.cell_for(2, 2) == (2, 2)
    assert bank.cell_for(2, 3) == (2, 8)
    assert bank.cell_for(3, 5) == (4, 8)  # batch size padded to 4, then tokens to 8
    assert bank.cell_for(2, 9) == (4, 16)  # no bs-2 cell holds 9 tokens: next batch size
    assert bank.cell_for(1, 1) == (2, 2)
    with pytest.raises(ValueError, match="no captured cell"):
        bank.cell_for(4, 17)
    with pytest.raises(ValueError, match="no captured cell"):
        bank.cell_for(5, 5)
    assert bank.token_counts() == [2, 4, 8, 16]
    assert bank.token_counts(4) == [4, 8, 16]


def test_eager_call_pads_inputs_and_matches_fn():
    bank = VerifyGraphBank(verify_fn, CELLS, make_inputs=make_inputs("cpu"), enabled=False, pad_values=[0, 1])
    assert not bank.enabled and repr(bank).startswith("VerifyGraphBank(eager")
    ids = torch.tensor([[3, 1], [2, 5], [7, 0]])
    weight = torch.tensor([2.0, 3.0, 4.0])
    scores, sums = bank(3, 6, ids, weight)  # cell (4, 8): buffers [4, 2] and [4]
    assert scores.shape == (4, 2)
    expected_scores, expected_sums = verify_fn(ids, weight)
    torch.testing.assert_close(scores[:3], expected_scores)
    torch.testing.assert_close(sums[:3], expected_sums)
    # the padded request row holds the pad values: ids 0, weight 1
    assert scores[3].tolist() == [0.0, 0.0] and int(sums[3]) == 0


def test_eager_buffers_are_reset_between_calls():
    bank = VerifyGraphBank(verify_fn, CELLS, make_inputs=make_inputs("cpu"), enabled=False)
    big = torch.full((4, 4), 9)
    bank(4, 16, big, torch.ones(4))
    small = torch.tensor([[1], [2]])
    scores, sums = bank(2, 7, small, torch.ones(2))  # cell (2, 8): buffers [2, 4]
    assert sums.tolist() == [1, 2]  # the earlier call's values did not leak into the pad
    scores, sums = bank(4, 13, small, torch.ones(2))  # cell (4, 16): pad fills rows 2-3 and cols 1-3
    assert sums.tolist() == [1, 2, 0, 0]


def test_rows_longer_than_the_first_cell_are_served_by_a_larger_cell():
    """Regression: cell_for padded the batch size before the token count and returned the first cell
    large enough in (batch_size, num_tokens), whose [bs, ceil(K / bs)] buffers may be too short for the
    request's rows; the call was then refused ("does not fit") although a larger cell holds it."""
    cells = CELLS + [(4, 32)]
    bank = VerifyGraphBank(verify_fn, cells, make_inputs=make_inputs("cpu"), enabled=False, pad_values=[0, 1])
    ids = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8], [8, 7, 6, 5, 4, 3, 2, 1]])  # 2 requests x 8 slots
    weight = torch.tensor([2.0, 3.0])
    # no bs-2 cell holds 16 tokens; (4, 16) is the first candidate but its buffers are [4, 4]
    assert bank.cell_for(2, 16) == (4, 16)
    assert bank.cell_for(2, 16, [(2, 8), (2,)]) == (4, 32)  # buffers [4, 8]
    scores, sums = bank(2, 16, ids, weight)
    assert scores.shape == (4, 8)
    want_scores, want_sums = verify_fn(ids, weight)
    torch.testing.assert_close(scores[:2], want_scores)
    assert sums.tolist() == [36, 36, 0, 0]
    # the bs-2 request of 3 slots per row: (2, 8) holds it ([2, 4]); nothing changes for fitting requests
    assert bank.cell_for(2, 6, [(2, 3), (2,)]) == bank.cell_for(2, 6) == (2, 8)


def test_bad_inputs():
    bank = VerifyGraphBank(verify_fn, CELLS, make_inputs=make_inputs("cpu"), enabled=False)
    # rows of 5 tokens: no cell's buffers are that long ((4, 16) is [4, 4], (2, 8) is [2, 4])
    with pytest.raises(ValueError, match="does not fit"):
        bank(2, 2, torch.zeros(2, 5, dtype=torch.int64), torch.ones(2))
    # [2, 3] inputs declared as 2 tokens: served by (2, 8), whose buffers [2, 4] hold them
    scores, _ = bank(2, 2, torch.ones(2, 3, dtype=torch.int64), torch.ones(2))
    assert scores.shape == (2, 4)
    with pytest.raises(ValueError, match="inputs"):
        bank(2, 2, torch.zeros(2, 1, dtype=torch.int64))
    with pytest.raises(ValueError, match="no cells"):
        VerifyGraphBank(verify_fn, [], make_inputs=make_inputs("cpu"))
    with pytest.raises(ValueError, match="batch_size <= num_tokens"):
        VerifyGraphBank(verify_fn, [(4, 2)], make_inputs=make_inputs("cpu"))


def test_auto_mode_is_eager_on_cpu_buffers():
    bank = VerifyGraphBank(verify_fn, CELLS, make_inputs=make_inputs("cpu"))
    assert not bank.enabled
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="enabled=True needs CUDA"):
            VerifyGraphBank(verify_fn, CELLS, make_inputs=make_inputs("cpu"), enabled=True)


def test_cells_from_curve(make_curve):
    curve = make_curve(batch_sizes=(1, 2), block_size=2)
    assert cells_from_curve(curve) == [(1, 1), (1, 2), (2, 2), (2, 3), (2, 4)]
    assert cells_from_curve(curve, batch_sizes=[2]) == [(2, 2), (2, 3), (2, 4)]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_graph_replay_matches_eager():
    cuda_bank = VerifyGraphBank(verify_fn, CELLS, make_inputs=make_inputs("cuda"), pad_values=[0, 1])
    eager_bank = VerifyGraphBank(verify_fn, CELLS, make_inputs=make_inputs("cuda"), enabled=False, pad_values=[0, 1])
    assert cuda_bank.enabled and cuda_bank.pool is not None
    gen = torch.Generator().manual_seed(0)
    for bs, k in [(2, 2), (3, 5), (4, 16), (2, 7), (4, 9)]:
        t = -(-k // bs)
        ids = torch.randint(0, 50, (bs, t), generator=gen).cuda()
        weight = torch.rand(bs, generator=gen).cuda()
        got = [x.clone() for x in cuda_bank(bs, k, ids, weight)]
        want = eager_bank(bs, k, ids, weight)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w)
