"""The engine's verification runtime (VerifyRuntime over a VerifyGraphBank): exact eagerly, padding harmless."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dcut_sched import RatioController
from dcut_sched.engine import SpecEngine, pack_rows
from dcut_sched.engine.verify_runtime import VerifyRuntime, graph_row_counts
from dcut_sched.model import LlamaConfig, LlamaModel, greedy_generate

B = 4


@pytest.fixture(scope="module")
def tiny():
    return LlamaModel.random_init(LlamaConfig.preset("tiny"), seed=3, std=0.1)


def test_graph_row_counts():
    assert graph_row_counts(1) == [1]
    assert graph_row_counts(8) == [1, 2, 4, 8]
    assert graph_row_counts(12) == [1, 2, 4, 8, 12]
    with pytest.raises(ValueError):
        graph_row_counts(0)


def _packed(lengths, context, scratch, rows_of):
    """Packed verification inputs of requests with `context` cached tokens each (engine layout)."""
    packing = pack_rows(lengths)
    n, t = packing.num_rows, packing.tokens_per_row
    rng = np.random.default_rng(0)
    ids = np.zeros((n, t), np.int64)
    pos = np.zeros((n, t), np.int64)
    slots = np.full((n, t), scratch, np.int64)
    bidx = np.zeros(n, np.int64)
    for r, (j, start, length) in enumerate(zip(packing.request, packing.start, packing.length)):
        first = context[j] + start
        ids[r, :length] = rng.integers(0, 4096, length)
        pos[r, :length] = np.arange(first, first + length)
        pos[r, length:] = first + length - 1
        slots[r, :length] = pos[r, :length]
        bidx[r] = rows_of[j]
    return [torch.from_numpy(a) for a in (ids, pos, slots, bidx)]


def _cache_with_context(model, rows, max_len, context):
    cache = model.new_cache(rows, max_len + 1)
    g = torch.Generator().manual_seed(1)
    for t in (cache.k, cache.v):
        t.normal_(0.0, 1.0, generator=g)
    return cache


@pytest.mark.parametrize("lengths", [[4, 1, 1, 2], [3, 3, 3], [1], [4, 4, 1]])
def test_eager_runtime_is_the_direct_forward_bit_for_bit(tiny, lengths):
    bs, max_len = len(lengths), 40
    context = [11, 7, 20, 3][:bs]
    inputs = _packed(lengths, context, max_len, list(range(bs)))
    cache = _cache_with_context(tiny, bs, max_len, context)
    snapshot = (cache.k.clone(), cache.v.clone())
    rt = VerifyRuntime(tiny, cache, max_rows=bs * B, block_size=B, scratch_slot=max_len, cuda_graphs=False)
    assert not rt.bank.enabled
    rows, t = inputs[0].shape
    assert rt.bank.cell_for(rows, rows * t, [x.shape for x in inputs]) == (rows, rows * t)  # no padding
    with torch.inference_mode():
        got = rt(*inputs).clone()
        cache.k.copy_(snapshot[0]); cache.v.copy_(snapshot[1])
        ids, pos, slots, bidx = inputs
        want = tiny(ids, pos, cache, cache_slots=slots, batch_index=bidx, kv_len=int(pos.max()) + 1)
    assert torch.equal(got, want)


@pytest.mark.parametrize("lengths", [[4, 1, 1], [3, 2, 2, 1, 4], [2]])
def test_graph_layout_padding_leaves_real_rows_and_context_unchanged(tiny, lengths):
    """The CUDA-graph cell set, run eagerly: padded rows/tokens write only the scratch slot and the real
    rows' logits equal the unpadded forward's."""
    bs, max_len = len(lengths), 40
    context = [9, 15, 4, 22, 6][:bs]
    inputs = _packed(lengths, context, max_len, list(range(bs)))
    rows, t = inputs[0].shape
    cache = _cache_with_context(tiny, bs, max_len, context)
    snapshot = (cache.k.clone(), cache.v.clone())
    rt = VerifyRuntime(tiny, cache, max_rows=bs * B, block_size=B, scratch_slot=max_len, cuda_graphs=False,
                       row_counts=graph_row_counts(bs * B))
    with torch.inference_mode():
        got = rt(*inputs).clone()
        after = (cache.k.clone(), cache.v.clone())
        cache.k.copy_(snapshot[0]); cache.v.copy_(snapshot[1])
        ids, pos, slots, bidx = inputs
        want = tiny(ids, pos, cache, cache_slots=slots, batch_index=bidx, kv_len=int(pos.max()) + 1)
        direct = (cache.k.clone(), cache.v.clone())
    assert got.shape == want.shape == (rows, t, tiny.config.vocab_size)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # every slot but the scratch slot holds what the unpadded forward wrote
    torch.testing.assert_close(after[0][..., :max_len, :], direct[0][..., :max_len, :])
    torch.testing.assert_close(after[1][..., :max_len, :], direct[1][..., :max_len, :])


def test_engine_verifies_through_the_runtime(tiny, make_curve, monkeypatch):
    calls = []
    orig = VerifyRuntime.__call__

    def spy(self, *inputs):
        calls.append(tuple(inputs[0].shape))
        return orig(self, *inputs)

    monkeypatch.setattr(VerifyRuntime, "__call__", spy)
    rng = np.random.default_rng(2)
    prompts = [rng.integers(0, 4096, size=int(n)).tolist() for n in (5, 3, 8)]
    ctrl = RatioController(make_curve(batch_sizes=(1, 2, 3), block_size=B), B, policy="dcut")
    res = SpecEngine(tiny, ctrl, batch_size=3, max_new_tokens=6, skip_layers=(2,)).generate(prompts)
    assert res.outputs == greedy_generate(tiny, prompts, 6, eos_id=None, batch_size=1)
    assert len(calls) == len(res.steps)
    assert [r * t for r, t in calls] == [s.packed_tokens for s in res.steps]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("policy", ["full", "dcut", "oracle"])
def test_cuda_graph_engine_is_lossless(make_curve, policy):
    model = LlamaModel.random_init(LlamaConfig.preset("tiny"), seed=3, std=0.1, device="cuda")
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 4096, size=int(n)).tolist() for n in (5, 9, 1, 7, 12)]
    ctrl = RatioController(make_curve(batch_sizes=(1, 2, 3), block_size=B), B, policy=policy)
    engine = SpecEngine(model, ctrl, batch_size=3, max_new_tokens=10, skip_layers=(2,))
    res = engine.generate(prompts)
    assert res.outputs == greedy_generate(model, prompts, 10, eos_id=None, batch_size=1)
