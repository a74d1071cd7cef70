"""Rotary position embeddings, Hugging Face "rotate-half" convention, computed on the fly.

cos/sin are computed from `position_ids` in every forward (a [bs, T, head_dim/2] outer product:
negligible cost, no table sized by max_position, and no data-dependent control flow, so it is
CUDA-graph friendly). Matches transformers' LlamaRotaryEmbedding bit for bit in fp32.
"""

from __future__ import annotations

import math

import torch

from dcut_sched.model.config import LlamaConfig


def rope_inv_freq(config: LlamaConfig, device: torch.device | str | None = None) -> torch.Tensor:
    """Inverse frequencies [head_dim/2] float32, with Llama-3.1 ("llama3") scaling if configured.

    Raises:
        NotImplementedError: a `rope_scaling` type other than None/"default"/"llama3".
    """
    d = config.head_dim
    inv = 1.0 / (config.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64, device=device).float() / d))
    rs = config.rope_scaling
    if not rs:
        return inv
    kind = rs.get("rope_type", rs.get("type", "default"))
    if kind == "default":
        return inv
    if kind != "llama3":
        raise NotImplementedError(f"rope_scaling type {kind!r} (config {config.name!r}) is not "
                                  "implemented; supported: default, llama3")
    factor = float(rs["factor"])
    low, high = float(rs.get("low_freq_factor", 1.0)), float(rs.get("high_freq_factor", 4.0))
    old_ctx = float(rs.get("original_max_position_embeddings", 8192))
    low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old_ctx / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


def rope_cos_sin(inv_freq: torch.Tensor, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape [bs, T, 1, head_dim] in `dtype` for int64 `position_ids` [bs, T]
    (the singleton axis broadcasts over heads in the [bs, T, heads, head_dim] layout)."""
    freqs = position_ids[..., None].float() * inv_freq  # [bs, T, D/2], fp32
    emb = torch.cat((freqs, freqs), dim=-1)[:, :, None, :]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate `x` [bs, T, heads, head_dim] by position (rotate-half convention)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
