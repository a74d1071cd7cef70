"""Model shapes the profiler understands: dense Llama-family configs and (analytic-only) MoE shapes.

A model is named on the command line by a preset (``qwen3-8b``, ``smollm2-135m``, ``tiny``,
``llama-3.1-8b``, ``qwen3.5-27b``; MoE ``qwen3.5-35b-a3b``, ``qwen3-30b-a3b``), a Hugging Face
``config.json`` or a checkpoint directory holding one. :func:`resolve_model` turns that into a
:class:`ModelShape` (what the analytic model needs) and, for dense models, the
:class:`dcut_sched.model.config.LlamaConfig` the measured modes build their forward from.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any, Mapping

from dcut_sched.model.config import PRESETS, LlamaConfig
from dcut_sched.util.inputs import read_json

__all__ = ["MOE_PRESETS", "ModelShape", "resolve_model", "model_names"]


@dataclass(frozen=True)
class ModelShape:
    """The sizes that fix a decoder's cost (dense or MoE).

    Attributes:
        name: preset or file name.
        vocab_size, hidden_size, intermediate_size, num_layers, num_heads, num_kv_heads, head_dim,
        tie_word_embeddings: as in ``LlamaConfig``; ``intermediate_size`` is the dense MLP width
            (unused where every layer is MoE).
        num_experts: routed experts per MoE layer (0 = dense model).
        experts_per_token: routed experts each token uses (top-k).
        expert_intermediate_size: SwiGLU width of one routed expert.
        shared_expert_intermediate_size: SwiGLU width of the always-on shared expert (0 = none).
        full_attention_layers: layers whose KV cache grows with the context (hybrid models with
            linear-attention layers have fewer; ``None`` = all).
        approximate: the shape is a stand-in, not verified against the released checkpoint.
    """

    name: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    tie_word_embeddings: bool = False
    num_experts: int = 0
    experts_per_token: int = 0
    expert_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    full_attention_layers: int | None = None
    approximate: bool = False

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def kv_layers(self) -> int:
        """Layers with a KV cache that grows with the context."""
        return self.num_layers if self.full_attention_layers is None else self.full_attention_layers

    @property
    def attn_params_per_layer(self) -> int:
        """q, k, v, o projection weights of one layer: ``h*d*(n_q + 2 n_kv) + n_q*d*h``."""
        h, d = self.hidden_size, self.head_dim
        return h * d * (self.num_heads + 2 * self.num_kv_heads) + self.num_heads * d * h

    @property
    def mlp_params_per_layer_active(self) -> int:
        """MLP weights one token multiplies with in one layer (SwiGLU = 3 matrices of h x I)."""
        h = self.hidden_size
        if not self.is_moe:
            return 3 * h * self.intermediate_size
        return (h * self.num_experts  # router
                + 3 * h * self.expert_intermediate_size * self.experts_per_token
                + 3 * h * self.shared_expert_intermediate_size)

    @property
    def expert_params(self) -> int:
        """Weights of one routed expert (0 for dense models)."""
        return 3 * self.hidden_size * self.expert_intermediate_size

    @property
    def lm_head_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def active_matmul_params(self) -> int:
        """Matmul weights one token multiplies with, all layers plus the LM head."""
        return self.num_layers * (self.attn_params_per_layer + self.mlp_params_per_layer_active) + self.lm_head_params

    def kv_bytes_per_token(self, bytes_per_elem: int = 2) -> int:
        """KV-cache bytes of one token over all full-attention layers (K and V)."""
        return 2 * self.kv_layers * self.num_kv_heads * self.head_dim * bytes_per_elem

    def with_layers(self, num_layers: int) -> "ModelShape":
        """The same width with ``num_layers`` layers (a DFlash-style drafter, a layer-skip drafter)."""
        full = None if self.full_attention_layers is None else min(self.full_attention_layers, num_layers)
        return ModelShape(**{**asdict(self), "num_layers": int(num_layers), "full_attention_layers": full,
                             "name": f"{self.name}[{num_layers} layers]"})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_llama_config(cls, cfg: LlamaConfig) -> "ModelShape":
        return cls(name=cfg.name, vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
                   intermediate_size=cfg.intermediate_size, num_layers=cfg.num_layers,
                   num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
                   tie_word_embeddings=cfg.tie_word_embeddings)

    @classmethod
    def from_hf_moe_config(cls, cfg: Mapping[str, Any], name: str) -> "ModelShape":
        """An MoE Hugging Face config (Qwen3-MoE / Mixtral keys) as an analytic shape.

        Raises:
            ValueError: a required key is missing (named).
        """
        if "text_config" in cfg and "hidden_size" not in cfg:
            cfg = cfg["text_config"]

        def need(*keys: str) -> Any:
            for k in keys:
                if cfg.get(k) is not None:
                    return cfg[k]
            raise ValueError(f"{name}: missing required key {keys[0]!r} for an MoE config")

        hidden = int(need("hidden_size"))
        heads = int(need("num_attention_heads"))
        layer_types = cfg.get("layer_types")
        full = sum(1 for t in layer_types if t == "full_attention") if layer_types else None
        return cls(
            name=name, vocab_size=int(need("vocab_size")), hidden_size=hidden,
            intermediate_size=int(cfg.get("intermediate_size") or 0), num_layers=int(need("num_hidden_layers")),
            num_heads=heads, num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            num_experts=int(need("num_experts", "num_local_experts")),
            experts_per_token=int(need("num_experts_per_tok")),
            expert_intermediate_size=int(need("moe_intermediate_size", "intermediate_size")),
            shared_expert_intermediate_size=int(cfg.get("shared_expert_intermediate_size") or 0),
            full_attention_layers=full,
        )


#: MoE shapes for the analytic mode only (the project's forward is dense).
MOE_PRESETS: dict[str, ModelShape] = {
    # Qwen/Qwen3-30B-A3B config.json: 48 layers, hidden 2048, 32 q / 4 kv heads of 128,
    # 128 experts, top-8, expert width 768, no shared expert.
    "qwen3-30b-a3b": ModelShape(
        name="qwen3-30b-a3b", vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_layers=48,
        num_heads=32, num_kv_heads=4, head_dim=128, num_experts=128, experts_per_token=8,
        expert_intermediate_size=768),
    # APPROXIMATE: public model cards give 40 layers (30 linear-attention + 10 full-attention),
    # hidden 2048, 256 experts with top-8 routing, ~35B total / ~3B active. The expert widths, the
    # attention heads and the vocabulary below are assumed (Qwen3-Next-like: expert and shared-expert
    # width 512, 16 q / 2 kv heads of 256, vocab 248320) and linear-attention layers are costed
    # like attention projections without a growing KV cache. Replace with the real config.json
    # (``--model path/to/config.json``) when available.
    "qwen3.5-35b-a3b": ModelShape(
        name="qwen3.5-35b-a3b", vocab_size=248320, hidden_size=2048, intermediate_size=0, num_layers=40,
        num_heads=16, num_kv_heads=2, head_dim=256, num_experts=256, experts_per_token=8,
        expert_intermediate_size=512, shared_expert_intermediate_size=512, full_attention_layers=10,
        approximate=True),
}


def model_names() -> list[str]:
    """Every preset name :func:`resolve_model` accepts."""
    return sorted(PRESETS) + sorted(MOE_PRESETS)


def resolve_model(spec: str) -> tuple[ModelShape, LlamaConfig | None]:
    """Turn a preset name, a ``config.json`` path or a checkpoint directory into shapes.

    Returns:
        ``(shape, llama_config)``; ``llama_config`` is ``None`` for MoE models (analytic only).

    Raises:
        ValueError: unknown preset or unreadable/invalid config (the message names it and lists the
            presets).
    """
    if spec in PRESETS:
        cfg = PRESETS[spec]
        return ModelShape.from_llama_config(cfg), cfg
    if spec in MOE_PRESETS:
        return MOE_PRESETS[spec], None
    path = spec
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    if not os.path.isfile(path):
        raise ValueError(f"model {spec!r}: not a preset ({', '.join(model_names())}) and no config.json "
                         f"at {path}")

    raw = read_json(path, "a Hugging Face config.json (or a preset name)")  # InputFileError is a ValueError
    if not isinstance(raw, dict):
        raise ValueError(f"model config {path}: top level must be a JSON object")
    inner = raw.get("text_config", raw) if "hidden_size" not in raw else raw
    if not isinstance(inner, dict):
        raise ValueError(f"model config {path}: field 'text_config' must be a JSON object")
    name = str(raw.get("_name_or_path") or os.path.basename(os.path.dirname(os.path.abspath(path))) or path)
    try:
        if inner.get("num_experts") or inner.get("num_local_experts"):
            return ModelShape.from_hf_moe_config(raw, name), None
        cfg = LlamaConfig.from_hf_config(raw).replace(name=name)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ValueError(f"model config {path}: missing or invalid field ({type(exc).__name__}: {exc})") from None
    return ModelShape.from_llama_config(cfg), cfg
