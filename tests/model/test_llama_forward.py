"""Fast core tests of the Llama forward / KV cache / drafter contracts on a tiny random model."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from dcut_sched.model.config import PRESETS, LlamaConfig
from dcut_sched.model.drafter import SelfSpecDrafter, confidence
from dcut_sched.model.generate import greedy_generate
from dcut_sched.model.gguf_weights import hf_name, unpermute_rope_rows
from dcut_sched.model.kv_cache import KVCache
from dcut_sched.model.llama import LlamaModel
from dcut_sched.model.reference_spec import speculative_greedy

ATOL, RTOL = 1e-4, 1e-5  # fp32; logits here are O(10)


@pytest.fixture(scope="module")
def tiny() -> LlamaModel:
    # std 0.1 (not 0.02) so logits are far from uniform and argmax ties are rare.
    return LlamaModel.random_init(LlamaConfig.preset("tiny"), seed=1, std=0.1)


def _full(model, ids, layers=None):
    """Logits of a fresh full recompute of ids [bs, T]."""
    bs, T = ids.shape
    cache = model.new_cache(bs, T)
    pos = torch.arange(T)[None].expand(bs, T)
    with torch.inference_mode():
        return model(ids, pos, cache, layers=layers)


def test_random_init_shapes_and_finite(tiny):
    cfg = tiny.config
    ids = torch.randint(0, cfg.vocab_size, (2, 7))
    out = _full(tiny, ids)
    assert out.shape == (2, 7, cfg.vocab_size) and out.dtype == torch.float32
    assert torch.isfinite(out).all()
    assert sum(p.numel() for p in tiny.parameters()) == cfg.num_params


def test_random_init_variants_qwen_style():
    base = LlamaConfig.preset("tiny")
    for cfg in (base.replace(qk_norm=True, head_dim=48),  # head_dim != hidden/heads, as Qwen3
                base.replace(attention_bias=True, tie_word_embeddings=False),  # Qwen2-like
                base.replace(num_kv_heads=4),  # MHA
                PRESETS["llama-3.1-8b"].replace(vocab_size=512, hidden_size=128, intermediate_size=256,
                                                num_layers=2, num_heads=4, num_kv_heads=2, head_dim=32)):
        m = LlamaModel.random_init(cfg, seed=0, std=0.1)
        assert sum(p.numel() for p in m.parameters()) == cfg.num_params
        out = _full(m, torch.randint(0, cfg.vocab_size, (2, 5)))
        assert out.shape == (2, 5, cfg.vocab_size) and torch.isfinite(out).all()
        # KV-cached decode still equals full recompute for these variants.
        ids = torch.randint(0, cfg.vocab_size, (1, 6))
        cache = m.new_cache(1, 6)
        with torch.inference_mode():
            m(ids[:, :4], torch.arange(4)[None], cache)
            inc = m(ids[:, 4:], torch.arange(4, 6)[None], cache)
        torch.testing.assert_close(inc, _full(m, ids)[:, 4:], atol=ATOL, rtol=RTOL)


def test_random_init_bf16_no_fp32_detour():
    m = LlamaModel.random_init(LlamaConfig.preset("tiny"), seed=0, dtype=torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in m.parameters())
    cache = m.new_cache(1, 8)
    assert cache.dtype == torch.bfloat16
    with torch.inference_mode():
        out = m(torch.tensor([[1, 2, 3]]), torch.arange(3)[None], cache)
    assert out.dtype == torch.float32 and torch.isfinite(out).all()


def test_incremental_decode_equals_full_recompute(tiny):
    torch.manual_seed(0)
    ids = torch.randint(0, tiny.config.vocab_size, (2, 12))
    full = _full(tiny, ids)
    cache = tiny.new_cache(2, 32)
    with torch.inference_mode():
        first = tiny(ids[:, :5], torch.arange(5)[None].expand(2, 5), cache)
        steps = [tiny(ids[:, t:t + 1], torch.full((2, 1), t), cache) for t in range(5, 12)]
    inc = torch.cat([first] + steps, dim=1)
    torch.testing.assert_close(inc, full, atol=ATOL, rtol=RTOL)


def test_logits_at_and_last_only(tiny):
    ids = torch.randint(0, tiny.config.vocab_size, (2, 6))
    full = _full(tiny, ids)
    pos = torch.arange(6)[None].expand(2, 6)
    with torch.inference_mode():
        at = tiny(ids, pos, tiny.new_cache(2, 6), logits_at=torch.tensor([[1, 5], [3, 0]]))
        last = tiny(ids, pos, tiny.new_cache(2, 6), last_only=True)
        kv = tiny(ids, pos, tiny.new_cache(2, 64), kv_len=6)
    torch.testing.assert_close(at, torch.stack([full[0, [1, 5]], full[1, [3, 0]]]), atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(last, full[:, -1:], atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(kv, full, atol=ATOL, rtol=RTOL)


def test_ragged_batch_equals_each_alone(tiny):
    torch.manual_seed(1)
    a = torch.randint(0, tiny.config.vocab_size, (9,))
    b = torch.randint(0, tiny.config.vocab_size, (4,))
    ids = torch.zeros(2, 9, dtype=torch.long)
    ids[0], ids[1, :4] = a, b
    cache = tiny.new_cache(2, 16)
    with torch.inference_mode():
        last = tiny.prefill(ids, cache, lengths=torch.tensor([9, 4]))
        # One decode step each at its own position (b's padding at slots 4..8 gets overwritten / hidden).
        nxt = torch.tensor([[3], [7]])
        step = tiny(nxt, torch.tensor([[9], [4]]), cache)[:, 0]
    alone_a = _full(tiny, torch.cat([a, nxt[0]])[None])[0]
    alone_b = _full(tiny, torch.cat([b, nxt[1]])[None])[0]
    torch.testing.assert_close(last[0], alone_a[8], atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(last[1], alone_b[3], atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(step[0], alone_a[9], atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(step[1], alone_b[4], atol=ATOL, rtol=RTOL)


def test_rollback_is_resetting_length(tiny):
    """Write 4 speculative tokens, 'reject' the last 3, continue: equals never having written them."""
    torch.manual_seed(2)
    ids = torch.randint(0, tiny.config.vocab_size, (1, 8))
    cache = tiny.new_cache(1, 16)
    with torch.inference_mode():
        tiny.prefill(ids[:, :5], cache)
        tiny(torch.tensor([[ids[0, 5], 11, 12, 13]]), torch.arange(5, 9)[None], cache)  # positions 5..8
        out = tiny(ids[:, 6:8], torch.arange(6, 8)[None], cache)  # rollback to valid length 6
    torch.testing.assert_close(out, _full(tiny, ids)[:, 6:8], atol=ATOL, rtol=RTOL)


def test_explicit_causal_mask_equals_default(tiny):
    ids = torch.randint(0, tiny.config.vocab_size, (2, 7))
    pos = torch.arange(7)[None].expand(2, 7)
    S = 10
    mask = torch.arange(S)[None, None, :] <= pos[:, :, None]
    with torch.inference_mode():
        a = tiny(ids, pos, tiny.new_cache(2, S))
        b = tiny(ids, pos, tiny.new_cache(2, S), attn_mask=mask, cache_slots=pos.clone())
    torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_tree_mask_two_branches_in_one_call(tiny):
    """Two 3-token branches from one 5-token prefix, written side by side in one call."""
    torch.manual_seed(3)
    V = tiny.config.vocab_size
    prefix = torch.randint(0, V, (1, 5))
    br1, br2 = torch.randint(0, V, (3,)), torch.randint(0, V, (3,))
    S = 16
    cache = tiny.new_cache(1, S)
    with torch.inference_mode():
        tiny.prefill(prefix, cache)
        ids = torch.cat([br1, br2])[None]
        pos = torch.tensor([[5, 6, 7, 5, 6, 7]])
        slots = torch.tensor([[5, 6, 7, 8, 9, 10]])
        mask = torch.zeros(1, 6, S, dtype=torch.bool)
        mask[..., :5] = True  # prefix visible to all
        for t in range(3):
            mask[0, t, 5:5 + t + 1] = True  # branch 1 sees its own ancestors + itself
            mask[0, 3 + t, 8:8 + t + 1] = True  # branch 2 likewise
        tree = tiny(ids, pos, cache, cache_slots=slots, attn_mask=mask)[0]
    ref1 = _full(tiny, torch.cat([prefix[0], br1])[None])[0, 5:]
    ref2 = _full(tiny, torch.cat([prefix[0], br2])[None])[0, 5:]
    torch.testing.assert_close(tree[:3], ref1, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(tree[3:], ref2, atol=ATOL, rtol=RTOL)


def test_batch_index_uses_given_cache_rows(tiny):
    torch.manual_seed(4)
    ids = torch.randint(0, tiny.config.vocab_size, (2, 6))
    cache = tiny.new_cache(4, 8)
    bi = torch.tensor([3, 1])
    with torch.inference_mode():
        tiny(ids[:, :4], torch.arange(4)[None].expand(2, 4), cache, batch_index=bi)
        out = tiny(ids[:, 4:], torch.arange(4, 6)[None].expand(2, 2), cache, batch_index=bi)
    torch.testing.assert_close(out, _full(tiny, ids)[:, 4:], atol=ATOL, rtol=RTOL)
    assert cache.k[:, [0, 2]].abs().sum() == 0  # untouched rows


def test_layer_subset_and_drafter(tiny):
    skip = (1, 2)
    layers = [0, 3]
    drafter = SelfSpecDrafter(tiny, skip_layers=skip, max_seq_len=32)
    assert drafter.layers == (0, 3)
    with pytest.raises(KeyError):
        drafter.cache.layer(1)
    seq = torch.randint(0, tiny.config.vocab_size, (7,)).tolist()
    toks, conf = drafter.draft([seq], num_draft=4)
    # Reference: greedy decoding of the layer-subset model by full recompute.
    cur, ref_t, ref_c = list(seq), [], []
    for _ in range(4):
        lg = _full(tiny, torch.tensor([cur]), layers=layers)[0, -1]
        ref_t.append(int(lg.argmax()))
        ref_c.append(float(torch.softmax(lg, -1).max()))
        cur.append(ref_t[-1])
    assert toks.shape == (1, 4) and toks.dtype == torch.int64 and conf.dtype == torch.float32
    assert toks[0].tolist() == ref_t
    np.testing.assert_allclose(conf[0].numpy(), ref_c, rtol=1e-4)


def test_drafter_sync_protocol_matches_fresh_drafter(tiny):
    """After drafting and a partial / full acceptance + bonus, incremental drafting equals a
    drafter that sees the whole committed sequence from scratch; ragged batch with row mapping."""
    V = tiny.config.vocab_size
    torch.manual_seed(5)
    d = SelfSpecDrafter(tiny, skip_layers=(2,), max_batch_size=3, max_seq_len=64)
    seqs = [torch.randint(0, V, (n,)).tolist() for n in (9, 3)]
    rows = [2, 0]
    k = 4
    toks, _ = d.draft(seqs, k, rows=rows)
    # request 0 accepts 2 drafts + bonus 5; request 1 accepts all 4 + bonus 6
    seqs = [seqs[0] + toks[0, :2].tolist() + [5], seqs[1] + toks[1].tolist() + [6]]
    assert d.synced_length(2, seqs[0]) == 9 + 2
    assert d.synced_length(0, seqs[1]) == 3 + k - 1
    inc_t, inc_c = d.draft(seqs, k, rows=rows)
    fresh = SelfSpecDrafter(tiny, skip_layers=(2,), max_batch_size=1, max_seq_len=64)
    for b in range(2):
        fresh.reset()
        ft, fc = fresh.draft([seqs[b]], k)
        assert inc_t[b].tolist() == ft[0].tolist()
        torch.testing.assert_close(inc_c[b], fc[0], atol=1e-5, rtol=1e-4)


def test_confidence_is_max_softmax():
    lg = torch.randn(3, 5, 50)
    torch.testing.assert_close(confidence(lg), torch.softmax(lg, -1).max(-1).values)


def test_greedy_generate_batched_equals_unbatched_and_spec_loop(tiny):
    torch.manual_seed(6)
    V = tiny.config.vocab_size
    prompts = [torch.randint(0, V, (n,)).tolist() for n in (5, 11, 1)]
    eos = 17
    batched = greedy_generate(tiny, prompts, 12, eos)
    single = [greedy_generate(tiny, [p], 12, eos)[0] for p in prompts]
    assert batched == single
    assert all(1 <= len(o) <= 12 for o in batched)
    # The speculative reference loop reproduces greedy decoding exactly.
    drafter = SelfSpecDrafter(tiny, skip_layers=(1,), max_seq_len=64)
    for p, ref in zip(prompts, single):
        assert speculative_greedy(tiny, drafter, p, 12, eos, num_draft=3).tokens == ref


def test_kv_cache_layout_and_errors():
    cfg = LlamaConfig.preset("tiny")
    c = KVCache(cfg, 2, 10, layers=[3, 0])
    assert c.layers == (0, 3) and c.k.shape == (2, 2, cfg.num_kv_heads, 10, cfg.head_dim)
    assert c.layer(3)[0].shape == (2, cfg.num_kv_heads, 10, cfg.head_dim)
    with pytest.raises(KeyError, match="not layer 1"):
        c.layer(1)
    with pytest.raises(ValueError):
        KVCache(cfg, 1, 4, layers=[4])


def test_from_hf_config_qwen3_llama_qwen2(tmp_path):
    qwen3 = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936,
             "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
             "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
             "rope_theta": 1000000, "rms_norm_eps": 1e-06, "tie_word_embeddings": False,
             "max_position_embeddings": 40960, "attention_bias": False}
    cfg = LlamaConfig.from_hf_config(qwen3)
    assert cfg.qk_norm and cfg.head_dim == 128 and cfg.num_kv_heads == 8
    assert cfg.replace(name="qwen3-8b") == PRESETS["qwen3-8b"]
    p = tmp_path / "config.json"
    p.write_text(json.dumps(qwen3))
    assert LlamaConfig.from_hf_config(tmp_path) == cfg == LlamaConfig.from_hf_config(p)
    llama = {"model_type": "llama", "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336,
             "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
             "rms_norm_eps": 1e-05, "max_position_embeddings": 131072,
             "rope_parameters": {"rope_theta": 500000.0, "rope_type": "llama3", "factor": 8.0,
                                 "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                 "original_max_position_embeddings": 8192}}  # transformers>=5 style
    lc = LlamaConfig.from_hf_config(llama)
    assert lc.head_dim == 128 and not lc.qk_norm and lc.rope_theta == 500000.0
    assert lc.rope_scaling["rope_type"] == "llama3"
    assert lc.replace(name="llama-3.1-8b") == PRESETS["llama-3.1-8b"]
    qwen2 = dict(qwen3, model_type="qwen2", head_dim=None)
    del qwen2["attention_bias"]
    q2 = LlamaConfig.from_hf_config(qwen2)
    assert q2.attention_bias and not q2.qk_norm
    with pytest.raises(ValueError, match="hidden_size"):
        LlamaConfig.from_hf_config({"model_type": "llama", "vocab_size": 5})
    with pytest.raises(KeyError, match="known presets"):
        LlamaConfig.preset("nope")


def test_presets_param_counts():
    assert abs(PRESETS["smollm2-135m"].num_params / 1e6 - 134.5) < 1
    assert abs(PRESETS["llama-3.1-8b"].num_params / 1e9 - 8.03) < 0.05
    assert abs(PRESETS["qwen3-8b"].num_params / 1e9 - 8.19) < 0.05


def test_unpermute_inverts_llama_cpp_permute():
    def permute(w, n_head):  # llama.cpp convert_hf_to_gguf.py LlamaModel.permute
        return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    w = np.random.default_rng(0).standard_normal((3 * 64, 10)).astype(np.float32)
    np.testing.assert_array_equal(unpermute_rope_rows(permute(w, 3), 3), w)
    assert hf_name("blk.7.attn_q.weight") == "layers.7.self_attn.q_proj.weight"
    assert hf_name("output_norm.weight") == "norm.weight"
