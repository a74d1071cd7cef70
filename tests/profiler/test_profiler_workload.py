"""The forward each cell times: padded layout, cache writes, drafters (tiny shapes on CPU)."""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from dcut_sched.model.config import LlamaConfig
from dcut_sched.profiler.analytic import parse_draft_spec
from dcut_sched.profiler.grid import Cell
from dcut_sched.profiler.workload import ForwardWorkload, padded_layout

CFG = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=4, num_heads=4, num_kv_heads=2,
                  head_dim=8, name="micro")


def test_padded_layout_hand_cases():
    assert padded_layout(4, 16) == (4, [4, 4, 4, 4])
    assert padded_layout(4, 6) == (2, [2, 2, 1, 1])
    assert padded_layout(3, 3) == (1, [1, 1, 1])
    with pytest.raises(ValueError, match="num_tokens=2 must be >= batch_size=3"):
        padded_layout(3, 2)


@given(bs=st.integers(1, 64), extra=st.integers(0, 15 * 64))
def test_padded_layout_properties(bs, extra):
    k = bs + extra
    t, per = padded_layout(bs, k)
    assert t == math.ceil(k / bs) and len(per) == bs and sum(per) == k
    assert max(per) == t and min(per) >= t - 1 and per == sorted(per, reverse=True)


def test_verify_cell_writes_real_slots_only_and_padding_is_invisible():
    ctx, B = 5, 4
    w = ForwardWorkload(CFG, B, ctx, max_batch_size=3, draft=parse_draft_spec("none"), seed=3)
    before = w.cache.k.clone()
    logits = w.verify_fn(3, 7)()  # T=3, per request [3, 2, 2]
    assert logits.shape == (3, 3, 64) and torch.isfinite(logits).all()
    k = w.cache.k
    assert torch.equal(k[:, :, :, :ctx], before[:, :, :, :ctx])               # context untouched
    assert not torch.equal(k[:, 0, :, ctx + 2], before[:, 0, :, ctx + 2])     # request 0 wrote its 3rd slot
    assert torch.equal(k[:, 1, :, ctx + 2], before[:, 1, :, ctx + 2])         # request 1's pad did not
    assert not torch.equal(k[:, 1, :, w.scratch_slot], before[:, 1, :, w.scratch_slot])  # ... it hit the scratch slot
    with pytest.raises(ValueError, match="exceeds"):
        w.verify_fn(2, 9)


def test_padded_request_logits_equal_its_unpadded_forward():
    """A padded request's real slots see exactly what they would see alone (same context, same ids)."""
    ctx, B = 6, 4
    w = ForwardWorkload(CFG, B, ctx, max_batch_size=2, draft=parse_draft_spec("none"), seed=1)
    fn = w.verify_fn(2, 7)  # T=4, per request [4, 3]
    assert fn.inputs["per_request"] == [4, 3] and fn.inputs["kv_len"] == ctx + 4
    logits = fn()
    input_ids = fn.inputs["input_ids"]
    # Rerun request 1 alone: same context K/V (its cache row), its 3 real tokens.
    alone_cache = w.model.new_cache(1, w.max_seq_len)
    alone_cache.k[:, 0] = w.cache.k[:, 1]
    alone_cache.v[:, 0] = w.cache.v[:, 1]
    pos = torch.arange(ctx, ctx + 3)[None]
    with torch.inference_mode():
        alone = w.model(input_ids[1:2, :3], pos, alone_cache, kv_len=ctx + 3)
    torch.testing.assert_close(logits[1, :3], alone[0], rtol=1e-5, atol=1e-5)


def test_draft_steps():
    ctx, B = 4, 5
    skip = ForwardWorkload(CFG, B, ctx, max_batch_size=2, draft=parse_draft_spec("self-skip:1,2"))
    toks, conf = skip.fn_for(Cell("draft", 2, 2 * B))()
    assert toks.shape == (2, B - 1) and conf.shape == (2, B - 1) and ((conf > 0) & (conf <= 1)).all()
    assert skip.drafter.layers == (0, 3)
    block = ForwardWorkload(CFG, B, ctx, max_batch_size=2, draft=parse_draft_spec("dflash:1"))
    assert block.drafter.config.num_layers == 1 and block.drafter.embed_tokens is block.model.embed_tokens
    assert block.fn_for(Cell("draft", 2, 2 * B))().shape == (2, B, 64)
    assert block.describe()["draft"] == "dflash:1" and block.describe()["draft_config"]["num_layers"] == 1
    none = ForwardWorkload(CFG, B, ctx, max_batch_size=2, draft=parse_draft_spec("none"))
    with pytest.raises(ValueError, match="no draft step"):
        none.draft_fn(1)
    with pytest.raises(ValueError, match="out of range"):
        ForwardWorkload(CFG, B, ctx, max_batch_size=2, draft=parse_draft_spec("self-skip:9"))


def test_ar_cell_is_the_plain_decode_step():
    """One token per request at position ctx over ctx cached slots: writes slot ctx only, and its logits
    are the plain greedy step's (the same forward as dcut_sched.model.generate runs)."""
    ctx, B = 5, 4
    w = ForwardWorkload(CFG, B, ctx, max_batch_size=3, draft=parse_draft_spec("none"), seed=2)
    before = w.cache.k.clone()
    fn = w.fn_for(Cell("ar", 3, 3))
    assert fn.inputs["kv_len"] == ctx + 1 and fn.inputs["input_ids"].shape == (3, 1)
    logits = fn()
    assert logits.shape == (3, 1, 64) and torch.isfinite(logits).all()
    k = w.cache.k
    assert torch.equal(k[:, :, :, :ctx], before[:, :, :, :ctx])  # context untouched
    assert not torch.equal(k[:, :3, :, ctx], before[:, :3, :, ctx])  # the new token's K/V at slot ctx
    assert torch.equal(k[:, :, :, ctx + 1:], before[:, :, :, ctx + 1:])  # nothing else written
    # the same step through the full-length default mask (what greedy_generate does) gives the same logits
    with torch.inference_mode():
        full = w.model(fn.inputs["input_ids"], fn.inputs["position_ids"], w.cache)
    torch.testing.assert_close(logits, full, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="max_batch_size"):
        w.ar_fn(4)
