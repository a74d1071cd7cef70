"""Cells, device figures, model shapes and the analytic formulas, against hand-computed values."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dcut_sched.model.config import PRESETS
from dcut_sched.profiler.analytic import (
    DraftSpec,
    Efficiency,
    draft_ms,
    forward_bytes,
    forward_flops,
    forward_ms,
    parse_draft_spec,
)
from dcut_sched.profiler.devices import DeviceSpec, get_device
from dcut_sched.profiler.grid import Cell, bucket_tokens, build_cells, verify_tokens
from dcut_sched.profiler.shapes import ModelShape, resolve_model


# ---------------------------------------------------------------- grid
@pytest.mark.parametrize("bs, B, step, expected", [
    (4, 16, 0, [4, 16, 32, 48, 64]),
    (4, 16, 16, [4, 16, 32, 48, 64]),
    (4, 16, 8, [4, 8, 16, 24, 32, 40, 48, 56, 64]),
    (1, 16, 8, [1, 4, 8, 12, 16]),
    (3, 4, 0, [3, 6, 9, 12]),          # ceil(0.25*12)=3 coincides with the AR point
    (5, 8, 16, [5, 10, 16, 20, 30, 32, 40]),
])
def test_verify_tokens_hand_cases(bs, B, step, expected):
    assert verify_tokens(bs, B, grid_step=step) == expected


def test_buckets_and_cells():
    assert bucket_tokens(16, 16) == [64, 128, 192, 256]
    assert bucket_tokens(1, 8, (0.3,)) == [3]  # ceil(2.4)
    cells = build_cells([1, 2], 4)
    assert [c.key for c in cells] == ["verify:1:1", "verify:1:2", "verify:1:3", "verify:1:4",
                                      "verify:2:2", "verify:2:4", "verify:2:6", "verify:2:8", "ar:1", "ar:2",
                                      "draft:1", "draft:2"]
    assert Cell("draft", 2, 8).size() == 8 and Cell("ar", 2, 2).size() == 2
    assert len(build_cells([1, 2], 4, draft=False)) == 10 and len(build_cells([1, 2], 4, draft=False, ar=False)) == 8


# ---------------------------------------------------------------- devices and shapes
def test_devices():
    h200 = get_device("H200")
    assert (h200.peak_bf16_tflops, h200.hbm_tb_per_s) == (989.0, 4.8)
    assert get_device("h20").peak_flops == 148e12 and get_device("a100").bytes_per_s == pytest.approx(2.039e12)
    with pytest.raises(KeyError, match="known devices: h200, h100, h20, a100"):
        get_device("b200")


def test_active_params_match_llama_config_count():
    # Independent count: LlamaConfig.num_params minus the embedding table (a lookup, not a matmul) and norms.
    for name in ("qwen3-8b", "llama-3.1-8b", "smollm2-135m"):
        cfg = PRESETS[name]
        shape, _ = resolve_model(name)
        norms = cfg.num_layers * (2 * cfg.hidden_size + (2 * cfg.head_dim if cfg.qk_norm else 0)) + cfg.hidden_size
        untied_head = 0 if cfg.tie_word_embeddings else cfg.vocab_size * cfg.hidden_size
        # num_params = layer matmuls + norms + embedding (+ untied LM head); active = layer matmuls + one
        # V x h LM head, so active = num_params - norms - (the second V x h matrix when untied)
        assert shape.active_matmul_params == cfg.num_params - norms - untied_head


def test_resolve_hf_configs(tmp_path):
    dense = {"model_type": "qwen3", "vocab_size": 100, "hidden_size": 64, "intermediate_size": 128,
             "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16}
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "config.json").write_text(json.dumps(dense))
    shape, cfg = resolve_model(str(tmp_path / "d"))
    assert cfg is not None and cfg.qk_norm and shape.num_layers == 3 and not shape.is_moe
    moe = {**dense, "model_type": "qwen3_moe", "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32}
    (tmp_path / "m.json").write_text(json.dumps(moe))
    shape, cfg = resolve_model(str(tmp_path / "m.json"))
    assert cfg is None and shape.num_experts == 8 and shape.expert_params == 3 * 64 * 32
    with pytest.raises(ValueError, match="not a preset"):
        resolve_model("qwen9-1t")
    assert resolve_model("qwen3.5-35b-a3b")[0].approximate


# ---------------------------------------------------------------- formulas
SMALL = ModelShape(name="small", vocab_size=10, hidden_size=4, intermediate_size=8, num_layers=2, num_heads=2,
                   num_kv_heads=1, head_dim=2)
UNIT = DeviceSpec("unit", "unit", peak_bf16_tflops=1e-9, hbm_tb_per_s=1e-9, memory_gb=1, source="test")  # 1e3 /s


def test_flops_and_bytes_by_hand():
    # attn = 4*2*(2+2) + 2*2*4 = 48, mlp = 3*4*8 = 96, layers 2*144, LM head 40 -> 328 per token.
    assert SMALL.active_matmul_params == 328
    # bs=2, N=6 (T=3), c=10: 2*6*328 + 4*2 layers*2 heads*2 dim*6*(10 + 2) = 3936 + 2304
    assert forward_flops(SMALL, 2, 6, 10) == pytest.approx(6240)
    # weights 2*(2*144+40)=656; KV 16 B/token*(2*10 + 2*6)=512; act 2*6*2*(40+16+48) + 4*6*10 = 2736
    assert forward_bytes(SMALL, 2, 6, 10) == pytest.approx(656 + 512 + 2736)


def test_forward_ms_limits():
    # UNIT device: 1e3 FLOP/s and 1e3 B/s, so t[s] = count / 1e3 and ms = count.
    t_c, t_m, t_attn = 3936.0, 656 + 2736.0, max(2304.0, 512.0)
    eff_sum = Efficiency(1.0, 1.0, 1.0, 0.0, smoothness=1.0)
    assert forward_ms(SMALL, UNIT, eff_sum, 2, 6, 10) == pytest.approx(t_c + t_m + t_attn)
    eff_max = Efficiency(1.0, 1.0, 1.0, 0.5, smoothness=400.0)
    assert forward_ms(SMALL, UNIT, eff_max, 2, 6, 10) == pytest.approx(0.5 + max(t_c, t_m) + t_attn, rel=2e-3)
    half = Efficiency(0.5, 1.0, 1.0, 0.0, smoothness=1.0)
    assert forward_ms(SMALL, UNIT, half, 2, 6, 10) == pytest.approx(2 * t_c + t_m + 2 * 2304.0)


@settings(max_examples=30, deadline=None)
@given(bs=st.sampled_from([1, 2, 4, 8, 16, 32, 64]), ctx=st.integers(0, 8192),
       model=st.sampled_from(["qwen3-8b", "smollm2-135m", "qwen3.5-35b-a3b"]))
def test_forward_ms_monotone_in_tokens(bs, ctx, model):
    shape, _ = resolve_model(model)
    tokens = np.arange(bs, bs * 16 + 1)
    ms = forward_ms(shape, get_device("h200"), Efficiency(), bs, tokens, ctx)
    assert np.all(np.diff(ms) > 0)


def test_moe_touched_experts():
    shape, _ = resolve_model("qwen3-30b-a3b")
    e = shape.expert_params * 2 * shape.num_layers
    one = forward_bytes(shape, 1, 1, 0)
    many = forward_bytes(shape, 64, 4096, 0)
    dense_part = 2 * (shape.num_layers * (shape.attn_params_per_layer + shape.hidden_size * shape.num_experts)
                      + shape.lm_head_params)
    # one token touches exactly k experts; thousands touch (almost) all E
    assert (one - dense_part) > 8 * e and (one - dense_part) < 9 * e
    assert (many - dense_part) > 0.999 * shape.num_experts * e


def test_draft_specs_and_draft_ms():
    assert parse_draft_spec("self-skip:15,14") == DraftSpec("self-skip", skip_layers=(14, 15))
    assert parse_draft_spec("dflash:5") == DraftSpec("dflash", num_layers=5)
    assert parse_draft_spec("dflash:tiny").config == "tiny" and parse_draft_spec("none").kind == "none"
    for bad in ("self-skip:", "self-skip:a", "dflash:", "eagle:3", "dflash:0"):
        with pytest.raises(ValueError, match="draft spec"):
            parse_draft_spec(bad)
    shape, _ = resolve_model("smollm2-135m")
    dev, eff = get_device("h100"), Efficiency()
    skip = draft_ms(shape, parse_draft_spec("self-skip:14,15"), dev, eff, 4, 16, 256)
    one_step = forward_ms(shape.with_layers(28), dev, eff, 4, 4, 256 + 8)
    assert skip == pytest.approx(15 * one_step)
    block = draft_ms(shape, parse_draft_spec("dflash:2"), dev, eff, 4, 16, 256)
    assert block == pytest.approx(forward_ms(shape.with_layers(2), dev, eff, 4, 64, 256))
    with pytest.raises(ValueError, match="out of range"):
        draft_ms(shape, parse_draft_spec("self-skip:30"), dev, eff, 4, 16, 256)


def test_core_never_imports_profiler():
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "dcut_sched"
    pattern = re.compile(r"^\s*(from\s+profiler[\s.]|import\s+profiler\b)", re.M)
    offenders = [str(p) for p in root.rglob("*.py") if pattern.search(p.read_text(encoding="utf-8"))]
    assert offenders == []
