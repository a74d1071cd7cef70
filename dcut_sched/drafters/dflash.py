"""DFlash block drafter: one non-causal forward proposes all B-1 draft slots of a block.

Architecture (docs/drafters.md has the derivation and the diagram):

- **Context features.** The target's residual stream after each layer of ``target_layer_ids`` is
  concatenated per token (``len(target_layer_ids) * hidden`` wide) and projected to the drafter's
  width by ``fc`` (no bias), then normalised by ``hidden_norm``. In every drafter layer these
  context states give the keys (``k_proj``, ``k_norm``, RoPE at the token's position) and values
  (``v_proj``) of the tokens the target has already processed. They are computed once per
  verified token and kept (the drafter's context cache).
- **The block.** The anchor (the request's current token, which the target has not processed)
  at position ``p`` and ``B-1`` mask tokens (``mask_token_id``) at ``p+1 .. p+B-1``, embedded with
  the target's token embedding. The block runs through Qwen3-type decoder layers (pre-norm,
  per-head q/k RMSNorm, RoPE, SwiGLU MLP). Its queries attend to every context key (positions
  ``< p``) and to every key of the block, in both directions (non-causal inside the block).
- **The output.** The final norm, then the target's LM head (SmolLM2 ties it to the embedding): the
  slot at position ``p+j`` predicts the token at ``p+j``, ``j = 1..B-1``. Draft token = argmax,
  confidence = max softmax probability.

The token embedding and the LM head are read from the target at every call, never copied: the
checkpoint holds only the drafter's own weights (``fc``, ``hidden_norm``, the layers, ``norm``),
which is what vLLM 0.32.0's ``DFlashDraftModel`` loader expects of a drafter that shares them
(:func:`save_checkpoint` writes that format; :func:`load_checkpoint` reads it back).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from ..model.config import LlamaConfig
from ..model.llama import RMSNorm
from ..model.mlp import build_mlp
from ..model.rope import apply_rope, rope_cos_sin, rope_inv_freq
from ..util.validation import validate

__all__ = [
    "CONFIG_NAME", "WEIGHTS_NAME", "DFlashConfig", "DFlashDraftModel", "DraftCheckpointError", "DraftTargetError",
    "block_loss_weights", "check_target", "default_target_layer_ids", "describe", "load_checkpoint", "read_config",
    "save_checkpoint",
]

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
#: SmolLM2's ``<empty_output>`` special token: never produced by the chat template or the model,
#: so its (frozen, shared) embedding row can stand for a masked slot.
SMOLLM2_MASK_TOKEN_ID = 16


class DraftCheckpointError(ValueError):
    """A drafter checkpoint folder that cannot be loaded: names the file, the field and the fix."""


class DraftTargetError(DraftCheckpointError):
    """A drafter made for another target (width, vocabulary or layer count; :func:`check_target`)."""


def default_target_layer_ids(num_target_layers: int, count: int = 4) -> tuple[int, ...]:
    """``count`` target layers spread evenly from layer 1 to ``num_target_layers - 3`` (DFlash's rule).

    Raises:
        ValueError: fewer than ``count + 3`` target layers, or ``count < 1``.
    """
    if count < 1 or num_target_layers < count + 3:
        raise ValueError(f"default_target_layer_ids: cannot spread {count} layers over {num_target_layers}")
    first, last = 1, num_target_layers - 3
    if count == 1:
        return (last,)
    return tuple(round(first + i * (last - first) / (count - 1)) for i in range(count))


@dataclass(frozen=True)
class DFlashConfig:
    """Shape of a DFlash drafter and how it attaches to its target.

    Attributes:
        hidden_size: the drafter's width = the target's (the embedding and LM head are shared).
        num_layers: drafter decoder layers.
        num_heads, num_kv_heads, head_dim, intermediate_size: each layer's attention and MLP shape.
        vocab_size: the target's vocabulary.
        rope_theta, rms_norm_eps, max_position: as in the target.
        target_num_layers: layers of the target (checked against the target at attach time).
        target_layer_ids: target layers whose output hidden states form the context features.
        mask_token_id: the token id that embeds a masked slot.
        block_size: B the drafter was trained for (it runs at any B up to this).
        draft_vocab_size: ``None``: the drafter scores the target's whole vocabulary with the
            target's LM head. An integer V: the drafter has its own LM head over V target tokens
            (EAGLE-3 / DFlash's reduced draft vocabulary, ``d2t`` maps a draft id to its target id);
            a token outside it is never drafted, which costs acceptance, never correctness.
        target_name: free-form label of the target (metadata).
    """

    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    target_num_layers: int
    target_layer_ids: tuple[int, ...]
    mask_token_id: int
    block_size: int = 16
    draft_vocab_size: int | None = None
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    max_position: int = 8192
    target_name: str = ""
    extra: dict = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                     "intermediate_size", "vocab_size", "target_num_layers", "max_position"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"DFlashConfig.{name} must be a positive integer, got {value!r}")
        if isinstance(self.block_size, bool) or not isinstance(self.block_size, int) or self.block_size < 2:
            raise ValueError(f"DFlashConfig.block_size must be an integer >= 2, got {self.block_size!r}")
        ids = self.target_layer_ids
        if not ids or any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < self.target_num_layers
                          for i in ids) or len(set(ids)) != len(ids):
            raise ValueError(f"DFlashConfig.target_layer_ids must be distinct layer indices in "
                             f"[0, {self.target_num_layers}), got {ids!r}")
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise ValueError(f"DFlashConfig.mask_token_id {self.mask_token_id} is outside the vocabulary")
        if self.num_heads % self.num_kv_heads:
            raise ValueError("DFlashConfig.num_heads must be a multiple of num_kv_heads")
        v = self.draft_vocab_size
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= self.vocab_size):
            raise ValueError(f"DFlashConfig.draft_vocab_size must be null or an integer in [1, vocab_size], got {v!r}")

    @classmethod
    def for_target(cls, target: LlamaConfig, *, num_layers: int = 2, block_size: int = 16,
                   mask_token_id: int = SMOLLM2_MASK_TOKEN_ID, num_target_features: int = 4,
                   draft_vocab_size: int | None = None) -> "DFlashConfig":
        """A drafter of the target's width and attention shape, reading ``num_target_features`` layers."""
        return cls(hidden_size=target.hidden_size, num_layers=num_layers, num_heads=target.num_heads,
                   num_kv_heads=target.num_kv_heads, head_dim=target.head_dim,
                   intermediate_size=target.intermediate_size, vocab_size=target.vocab_size,
                   target_num_layers=target.num_layers,
                   target_layer_ids=default_target_layer_ids(target.num_layers, num_target_features),
                   mask_token_id=mask_token_id, block_size=block_size, draft_vocab_size=draft_vocab_size,
                   rope_theta=target.rope_theta,
                   rms_norm_eps=target.rms_norm_eps, max_position=target.max_position, target_name=target.name)

    @property
    def feature_size(self) -> int:
        """Width of the concatenated target features ``fc`` reads."""
        return self.hidden_size * len(self.target_layer_ids)

    def layer_config(self) -> LlamaConfig:
        """The Qwen3-type layer shape (q/k norm, no bias) as a ``LlamaConfig`` for the shared building blocks."""
        return LlamaConfig(vocab_size=self.vocab_size, hidden_size=self.hidden_size,
                           intermediate_size=self.intermediate_size, num_layers=self.num_layers,
                           num_heads=self.num_heads, num_kv_heads=self.num_kv_heads, head_dim=self.head_dim,
                           rope_theta=self.rope_theta, rms_norm_eps=self.rms_norm_eps, qk_norm=True,
                           max_position=self.max_position, name="dflash-drafter")

    def hf_config(self, dtype: torch.dtype = torch.float32) -> dict[str, Any]:
        """The ``config.json`` vLLM 0.32.0 reads for architecture ``DFlashDraftModel`` (Qwen3 fields
        plus ``dflash_config``; ``target_layer_ids`` count layers from 0, vLLM adds 1) of weights
        stored in ``dtype``."""
        return {
            "architectures": ["DFlashDraftModel"],
            "model_type": "qwen3",
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "hidden_act": "silu",
            "vocab_size": self.vocab_size,
            "max_position_embeddings": self.max_position,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": None,
            "attention_bias": False,
            "tie_word_embeddings": self.draft_vocab_size is None,
            "draft_vocab_size": self.draft_vocab_size or self.vocab_size,
            "torch_dtype": str(dtype).removeprefix("torch."),
            "num_target_layers": self.target_num_layers,
            "block_size": self.block_size,
            "dflash_config": {
                "mask_token_id": self.mask_token_id,
                "target_layer_ids": list(self.target_layer_ids),
                "block_size": self.block_size,
            },
            "dcut_sched": {"target_name": self.target_name, **self.extra},
        }


def block_loss_weights(block_size: int, gamma: float | None = None) -> torch.Tensor:
    """DFlash's per-slot loss weights ``w_j = exp(-(j - 1) / gamma)`` for draft slots ``j = 1..B-1``.

    A later slot counts only when every slot before it is accepted, so its loss is weighted down.
    ``gamma`` defaults to ``7`` at B = 16 and scales with B (docs/drafters.md).
    """
    g = (7.0 * (block_size - 1) / 15.0) if gamma is None else float(gamma)
    j = torch.arange(1, block_size, dtype=torch.float32)
    return torch.exp(-(j - 1) / g)


class DFlashLayer(nn.Module):
    """One Qwen3-type decoder layer whose queries come from the block and whose keys/values are the
    context's (precomputed) followed by the block's own."""

    def __init__(self, cfg: DFlashConfig):
        super().__init__()
        lc = cfg.layer_config()
        h, nh, nkv, d = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = nh, nkv, d
        self.input_layernorm = RMSNorm(h, cfg.rms_norm_eps)
        self.q_proj = nn.Linear(h, nh * d, bias=False)
        self.k_proj = nn.Linear(h, nkv * d, bias=False)
        self.v_proj = nn.Linear(h, nkv * d, bias=False)
        self.o_proj = nn.Linear(nh * d, h, bias=False)
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(h, cfg.rms_norm_eps)
        self.mlp = build_mlp(lc, 0)

    def context_kv(self, ctx: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values ``[N, kv_heads, T, head_dim]`` of normed context states ``ctx [N, T, hidden]``."""
        n, t, _ = ctx.shape
        k = self.k_norm(self.k_proj(ctx).view(n, t, self.num_kv_heads, self.head_dim))
        v = self.v_proj(ctx).view(n, t, self.num_kv_heads, self.head_dim)
        return apply_rope(k, cos, sin).transpose(1, 2), v.transpose(1, 2)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ctx_k: torch.Tensor,
                ctx_v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """x ``[N, Q, hidden]`` block states; ctx_k/ctx_v ``[N, kv_heads, S, head_dim]``; mask
        ``[N, 1, Q, S + Q]`` bool (True = may attend). Returns ``[N, Q, hidden]``."""
        n, q_len, _ = x.shape
        hx = self.input_layernorm(x)
        q = self.q_norm(self.q_proj(hx).view(n, q_len, self.num_heads, self.head_dim))
        k = self.k_norm(self.k_proj(hx).view(n, q_len, self.num_kv_heads, self.head_dim))
        v = self.v_proj(hx).view(n, q_len, self.num_kv_heads, self.head_dim)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        keys = torch.cat([ctx_k, k.transpose(1, 2)], 2)
        values = torch.cat([ctx_v, v.transpose(1, 2)], 2)
        if self.num_kv_heads != self.num_heads:
            rep = self.num_heads // self.num_kv_heads
            keys, values = keys.repeat_interleave(rep, 1), values.repeat_interleave(rep, 1)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, attn_mask=mask)
        h = x + self.o_proj(out.transpose(1, 2).reshape(n, q_len, self.num_heads * self.head_dim))
        return h + self.mlp(self.post_attention_layernorm(h))


class DFlashDraftModel(nn.Module):
    """The drafter's own weights (module docstring); the target supplies embedding and LM head.

    Parameter names are the checkpoint's: ``fc.weight``, ``hidden_norm.weight``,
    ``layers.{i}.{input_layernorm,self_attn.{q,k,v,o}_proj,self_attn.{q,k}_norm,
    post_attention_layernorm,mlp.{gate,up,down}_proj}.weight``, ``norm.weight``
    (see :meth:`checkpoint_state_dict`).
    """

    def __init__(self, cfg: DFlashConfig):
        super().__init__()
        self.config = cfg
        #: SHA-256 of the checkpoint files it was loaded from (:func:`load_checkpoint`), None otherwise
        self.checkpoint_sha256: str | None = None
        self.fc = nn.Linear(cfg.feature_size, cfg.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(DFlashLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        if cfg.draft_vocab_size is not None:
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
            self.register_buffer("draft_to_target", torch.arange(cfg.draft_vocab_size, dtype=torch.long))
        else:
            self.lm_head = None
            self.draft_to_target = None
        self.register_buffer("inv_freq", rope_inv_freq(cfg.layer_config()), persistent=False)
        #: the folder's calibration prior (:func:`load_checkpoint`), None without one
        self.calibration_prior = None

    def set_draft_vocab(self, target_ids: torch.Tensor, embed: torch.Tensor) -> None:
        """Choose the draft vocabulary (``target_ids [V]``, distinct, ascending) and start its LM head
        from those rows of the target's ``embed`` (SmolLM2's LM head is its embedding)."""
        ids = torch.as_tensor(target_ids, dtype=torch.long)
        if self.lm_head is None or ids.shape != (self.config.draft_vocab_size,):
            raise ValueError("set_draft_vocab: the config's draft_vocab_size and the ids disagree")
        if not bool((ids[1:] > ids[:-1]).all()) or int(ids[0]) < 0 or int(ids[-1]) >= self.config.vocab_size:
            raise ValueError("set_draft_vocab: target ids must be distinct, ascending and in the vocabulary")
        with torch.no_grad():
            self.draft_to_target.copy_(ids)
            self.lm_head.weight.copy_(embed[ids].to(self.lm_head.weight.dtype))

    def target_to_draft(self) -> torch.Tensor:
        """``[vocab]`` int64: each target id's draft id, -1 outside the draft vocabulary."""
        out = torch.full((self.config.vocab_size,), -1, dtype=torch.long)
        if self.draft_to_target is None:
            return torch.arange(self.config.vocab_size)
        out[self.draft_to_target.cpu()] = torch.arange(self.config.draft_vocab_size)
        return out

    def draft_logits(self, h: torch.Tensor, target_lm_head: torch.Tensor) -> torch.Tensor:
        """float32 logits of final-normed states ``h``: over the draft vocabulary with the drafter's
        own LM head, else over the target's with ``target_lm_head [vocab, hidden]``."""
        w = target_lm_head if self.lm_head is None else self.lm_head.weight
        return F.linear(h, w.to(h.dtype)).float()

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Target token ids of draft-vocabulary ids (the identity without a draft vocabulary)."""
        return draft_ids if self.draft_to_target is None else self.draft_to_target[draft_ids]

    @classmethod
    def random_init(cls, cfg: DFlashConfig, seed: int = 0, std: float = 0.02) -> "DFlashDraftModel":
        """Weights N(0, std), norms 1; deterministic for a seed."""
        gen = torch.Generator().manual_seed(int(seed))
        model = cls(cfg)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("norm.weight"):
                    p.fill_(1.0)
                else:
                    p.normal_(0.0, std, generator=gen)
        return model

    # ------------------------------------------------------------------ pieces
    def context_states(self, features: torch.Tensor) -> torch.Tensor:
        """``hidden_norm(fc(features))``: ``[..., feature_size]`` -> ``[..., hidden]``."""
        return self.hidden_norm(self.fc(features.to(self.fc.weight.dtype)))

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return rope_cos_sin(self.inv_freq, positions, self.fc.weight.dtype)

    def context_kv(self, features: torch.Tensor, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer, the context keys and values ``[N, kv_heads, T, head_dim]`` of target features
        ``[N, T, feature_size]`` at ``positions [N, T]``."""
        ctx = self.context_states(features)
        cos, sin = self.rope(positions)
        return [layer.context_kv(ctx, cos, sin) for layer in self.layers]

    def block_hidden(self, block_embeds: torch.Tensor, block_positions: torch.Tensor,
                     ctx_kv: list[tuple[torch.Tensor, torch.Tensor]], mask: torch.Tensor) -> torch.Tensor:
        """Final-normed block states ``[N, Q, hidden]``: block embeddings ``[N, Q, hidden]`` at
        ``block_positions [N, Q]`` over the context ``ctx_kv`` (from :meth:`context_kv`), mask
        ``[N, 1, Q, S + Q]``."""
        cos, sin = self.rope(block_positions)
        x = block_embeds.to(self.fc.weight.dtype)
        for layer, (k, v) in zip(self.layers, ctx_kv):
            x = layer(x, cos, sin, k, v, mask)
        return self.norm(x)

    # ------------------------------------------------------------------ training forward
    def training_logits(self, features: torch.Tensor, tokens: torch.Tensor, anchors: torch.Tensor,
                        block_size: int, embed: torch.Tensor, lm_head: torch.Tensor) -> torch.Tensor:
        """Logits of every draft slot of many blocks per sequence in one forward (training, tracing).

        Args:
            features: ``[N, T, feature_size]`` target features of each sequence's tokens.
            tokens: ``[N, T]`` int64 the sequences.
            anchors: ``[N, nb]`` int64 anchor positions ``p`` (``1 <= p <= T - 1``); block ``b``
                sees the context ``< p`` and its own ``block_size`` slots.
            embed: ``[vocab, hidden]`` the target's token embedding; lm_head: ``[vocab, hidden]`` the
                target's LM head (unused with a draft vocabulary).
        Returns:
            float32 ``[N, nb, block_size - 1, V]``: slot ``j`` predicts the token at ``p + j``, over
            the draft vocabulary (V = draft_vocab_size) or the target's.
        """
        n, t = tokens.shape
        nb = anchors.shape[1]
        dev = tokens.device
        positions = torch.arange(t, device=dev)[None].expand(n, t)
        ctx_kv = self.context_kv(features, positions)
        offs = torch.arange(block_size, device=dev)
        bpos = (anchors[:, :, None] + offs).reshape(n, nb * block_size)  # [N, Q]
        anchor_tok = tokens.gather(1, anchors)  # [N, nb]
        ids = torch.full((n, nb, block_size), self.config.mask_token_id, dtype=torch.long, device=dev)
        ids[:, :, 0] = anchor_tok
        emb = F.embedding(ids.reshape(n, nb * block_size), embed)
        # context key s visible to block b iff s < anchors[b]; block keys visible within the block
        ctx_vis = torch.arange(t, device=dev)[None, None, :] < anchors[:, :, None]  # [N, nb, T]
        ctx_vis = ctx_vis[:, :, None, :].expand(n, nb, block_size, t).reshape(n, nb * block_size, t)
        blk = torch.arange(nb, device=dev).repeat_interleave(block_size)
        blk_vis = (blk[:, None] == blk[None, :])[None].expand(n, -1, -1)
        mask = torch.cat([ctx_vis, blk_vis], -1)[:, None]
        h = self.block_hidden(emb, bpos, ctx_kv, mask).view(n, nb, block_size, -1)[:, :, 1:]
        return self.draft_logits(h, lm_head)

    # ------------------------------------------------------------------ checkpoint names
    def checkpoint_state_dict(self) -> dict[str, torch.Tensor]:
        """Parameters under the checkpoint's (Hugging Face DFlash) names."""
        out = {}
        for name, p in self.state_dict().items():
            if name == "draft_to_target":  # vLLM's d2t: target id = draft id + d2t[draft id]
                out["d2t"] = (p - torch.arange(p.numel())).contiguous()
                continue
            for proj in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm"):
                name = name.replace(f".{proj}.", f".self_attn.{proj}.")
            out[name] = p.detach().contiguous()
        return out

    @staticmethod
    def module_state(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Checkpoint names and tensors back to this module's (inverse of :meth:`checkpoint_state_dict`)."""
        out = {}
        for name, t in tensors.items():
            if name == "d2t":
                out["draft_to_target"] = t.long() + torch.arange(t.numel())
            else:
                out[name.replace(".self_attn.", ".")] = t
        return out


#: The dtype ``dcut-drafter train`` ships weights in (the held-out figures are those weights')
SHIP_DTYPE = torch.bfloat16


def save_checkpoint(model: DFlashDraftModel, folder: str | os.PathLike, *, metadata: dict | None = None,
                    dtype: torch.dtype = torch.float32) -> Path:
    """Write ``config.json`` and ``model.safetensors`` (floating tensors in ``dtype``; the shipped
    drafter is bfloat16, :data:`SHIP_DTYPE`) into ``folder``, each atomically
    (inside :func:`~dcut_sched.util.atomic.all_or_none`, together with the block's other outputs).

    Returns the folder. ``metadata`` goes into the safetensors header (strings only).
    """
    from safetensors.torch import save_file

    from ..util.atomic import atomic_path, atomic_write_text

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with atomic_path(folder / WEIGHTS_NAME, suffix=".safetensors") as tmp:
        tensors = {k: v.to(dtype) if v.is_floating_point() else v for k, v in model.checkpoint_state_dict().items()}
        save_file(tensors, str(tmp), metadata={k: str(v) for k, v in (metadata or {}).items()})
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)  # save_file creates the file 0600
    atomic_write_text(folder / CONFIG_NAME, json.dumps(model.config.hf_config(dtype), indent=2) + "\n")
    return folder


_STRICT = ConfigDict(strict=True, extra="ignore")


class _DFlashSection(BaseModel):
    model_config = _STRICT
    mask_token_id: int = Field(ge=0)
    target_layer_ids: list[int] = Field(min_length=1, max_length=256)
    block_size: int = Field(16, ge=2, le=1024)


class _DcutSection(BaseModel):
    model_config = _STRICT
    target_name: str = ""


class HFDraftConfig(BaseModel):
    """Strict pydantic model of the config.json fields the loader reads (:func:`_config_from_hf`)."""

    model_config = _STRICT
    architectures: list[str]
    hidden_size: int = Field(gt=0, le=1 << 16)
    num_hidden_layers: int = Field(gt=0, le=256)
    num_attention_heads: int = Field(gt=0, le=1024)
    num_key_value_heads: int = Field(gt=0, le=1024)
    head_dim: int = Field(gt=0, le=4096)
    intermediate_size: int = Field(gt=0, le=1 << 20)
    vocab_size: int = Field(gt=0, le=1 << 22)
    num_target_layers: int = Field(gt=0, le=1024)
    max_position_embeddings: int = Field(gt=0, le=1 << 24)
    rope_theta: float = Field(gt=0, allow_inf_nan=False)
    rms_norm_eps: float = Field(gt=0, allow_inf_nan=False)
    tie_word_embeddings: bool = False
    draft_vocab_size: int | None = Field(None, gt=0)
    dflash_config: _DFlashSection
    dcut_sched: _DcutSection | None = None


def _config_from_hf(path: Path, raw: dict) -> DFlashConfig:
    """The :class:`DFlashConfig` of a checkpoint's config.json, every field strictly typed (an
    integer is not a float or a boolean, sizes are bounded, norms' epsilon and RoPE base are positive
    finite numbers), each fault one :class:`DraftCheckpointError` naming the file and the field."""
    fix = "re-save the drafter with dcut-drafter train (or DFlash's save_pretrained)"
    h = validate(HFDraftConfig, raw, str(path), fix, DraftCheckpointError)
    if h.architectures != ["DFlashDraftModel"]:
        raise DraftCheckpointError(f"{path}: field architectures is {h.architectures!r}, expected "
                                   "['DFlashDraftModel'] (not a DFlash drafter checkpoint)")
    dc = h.dflash_config
    try:
        return DFlashConfig(
            hidden_size=h.hidden_size, num_layers=h.num_hidden_layers, num_heads=h.num_attention_heads,
            num_kv_heads=h.num_key_value_heads, head_dim=h.head_dim, intermediate_size=h.intermediate_size,
            vocab_size=h.vocab_size, target_num_layers=h.num_target_layers,
            target_layer_ids=tuple(dc.target_layer_ids), mask_token_id=dc.mask_token_id, block_size=dc.block_size,
            draft_vocab_size=None if h.tie_word_embeddings else h.draft_vocab_size,
            rope_theta=h.rope_theta, rms_norm_eps=h.rms_norm_eps, max_position=h.max_position_embeddings,
            target_name=h.dcut_sched.target_name if h.dcut_sched else "",
        )
    except ValueError as e:
        raise DraftCheckpointError(f"{path}: {e}") from None


def read_config(folder: str | os.PathLike) -> DFlashConfig:
    """The :class:`DFlashConfig` of a drafter folder's ``config.json`` alone (its weights unread).

    Raises:
        DraftCheckpointError: the folder lacks ``config.json`` or ``model.safetensors``, or the config
            is unreadable or malformed (names the file and the field).
    """
    from ..util.inputs import InputFileError, parse_json_strict, read_text

    folder = Path(folder)
    cfg_path, w_path = folder / CONFIG_NAME, folder / WEIGHTS_NAME
    for p in (cfg_path, w_path):
        if not p.is_file():
            raise DraftCheckpointError(f"{p}: not found; a DFlash drafter folder holds {CONFIG_NAME} and "
                                       f"{WEIGHTS_NAME} (train one with `dcut-drafter train`)")
    try:
        raw = parse_json_strict(read_text(cfg_path, "a DFlash drafter config.json"), str(cfg_path))
    except InputFileError as e:
        raise DraftCheckpointError(str(e)) from None
    if not isinstance(raw, dict):
        raise DraftCheckpointError(f"{cfg_path}: expected a JSON object")
    return _config_from_hf(cfg_path, raw)


def check_target(cfg: DFlashConfig, target: LlamaConfig) -> None:
    """The drafter reads ``target``'s embedding, LM head and layer outputs: their width, vocabulary and
    layer count must be the ones it was made for.

    Raises:
        DraftTargetError: they differ (the message gives both shapes; the caller names the drafter).
    """
    made = (cfg.hidden_size, cfg.vocab_size, cfg.target_num_layers)
    have = (target.hidden_size, target.vocab_size, target.num_layers)
    if made != have:
        raise DraftTargetError(
            f"the drafter was made for a target of width {made[0]}, vocabulary {made[1]} and {made[2]} layers "
            f"(it reads target layers {list(cfg.target_layer_ids)}); the target {target.name or ''} here has width "
            f"{have[0]}, vocabulary {have[1]} and {have[2]} layers: use a drafter trained for this target")


def _checkpoint_name(module_name: str) -> str:
    """A module parameter's name in the checkpoint (inverse of :meth:`DFlashDraftModel.module_state`)."""
    if module_name == "draft_to_target":
        return "d2t"
    for proj in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm"):
        module_name = module_name.replace(f".{proj}.", f".self_attn.{proj}.")
    return module_name


def load_checkpoint(folder: str | os.PathLike, *, calibration: bool = True) -> DFlashDraftModel:
    """Read a DFlash drafter folder written by :func:`save_checkpoint` (or any checkpoint of that format
    whose embedding and LM head are the target's).

    The model's ``checkpoint_sha256`` is the SHA-256 of the config and weight bytes it was built from
    (what a resumed recording compares, not the folder's name). The folder's optional
    ``calibration.json`` (written by ``dcut-drafter calibrate``) becomes the model's
    ``calibration_prior`` (``None`` without one, or with ``calibration=False``: not read).

    Raises:
        DraftCheckpointError: a missing file, a malformed or incomplete config, missing or unexpected
            tensors, a tensor of the wrong shape, or a malformed calibration.json (each names the file
            and the field, tensors under their checkpoint names).
    """
    import hashlib

    from safetensors import SafetensorError
    from safetensors.torch import load as load_safetensors

    folder = Path(folder)
    cfg_path, w_path = folder / CONFIG_NAME, folder / WEIGHTS_NAME
    cfg = read_config(folder)
    try:
        blob = w_path.read_bytes()
        tensors = load_safetensors(blob)
    except (SafetensorError, OSError, ValueError) as e:
        raise DraftCheckpointError(f"{w_path}: not a readable safetensors file ({e})") from None
    digest = hashlib.sha256(cfg_path.read_bytes())
    digest.update(blob)
    del blob
    with torch.device("meta"):  # shapes from the config without allocating them
        own = DFlashDraftModel(cfg).state_dict()
    if "d2t" in tensors and tensors["d2t"].dim() != 1:
        raise DraftCheckpointError(f"{w_path}: tensor d2t has shape {tuple(tensors['d2t'].shape)}, expected "
                                   f"[{cfg.draft_vocab_size}]")
    sd = DFlashDraftModel.module_state(tensors)
    missing = sorted(_checkpoint_name(k) for k in set(own) - set(sd))
    extra = sorted(_checkpoint_name(k) for k in set(sd) - set(own))
    if missing or extra:
        raise DraftCheckpointError(f"{w_path}: tensors missing {missing[:4]} / unexpected {extra[:4]} for the "
                                   f"config in {cfg_path}")
    for k, v in sd.items():
        name = _checkpoint_name(k)
        if tuple(v.shape) != tuple(own[k].shape):
            raise DraftCheckpointError(f"{w_path}: tensor {name} has shape {tuple(v.shape)}, the config says "
                                       f"{tuple(own[k].shape)}")
        if v.is_floating_point() and not torch.isfinite(v.float()).all():
            raise DraftCheckpointError(f"{w_path}: tensor {name} holds non-finite values (in float32)")
    model = DFlashDraftModel(cfg)
    model.load_state_dict({k: v if k == "draft_to_target" else v.float() for k, v in sd.items()}, strict=True)
    model.calibration_prior = _calibration_prior(folder) if calibration else None
    prior = model.calibration_prior
    if prior is not None and len(prior.intercepts) > cfg.block_size - 1:
        raise DraftCheckpointError(f"{folder / 'calibration.json'}: intercepts has {len(prior.intercepts)} depths, this "
                                   f"B = {cfg.block_size} drafter drafts at most {cfg.block_size - 1}; refit it with "
                                   f"dcut-drafter calibrate --draft {folder}")
    if model.draft_to_target is not None:
        d2t = model.draft_to_target
        if not bool((d2t[1:] > d2t[:-1]).all()) or int(d2t[0]) < 0 or int(d2t[-1]) >= cfg.vocab_size:
            raise DraftCheckpointError(f"{w_path}: tensor d2t does not map the draft vocabulary to distinct, "
                                       "ascending target ids")
    model.checkpoint_sha256 = digest.hexdigest()
    return model.eval()


def _calibration_prior(folder: Path):
    """The folder's optional ``calibration.json`` (:class:`~dcut_sched.calibration.CalibrationPrior`), or None."""
    from ..calibration import CalibrationPrior, CalibrationPriorError

    try:
        return CalibrationPrior.from_folder(folder)
    except CalibrationPriorError as e:
        raise DraftCheckpointError(str(e)) from None


def describe(cfg: DFlashConfig) -> dict[str, Any]:
    """A flat summary of the config for logs and cards."""
    d = asdict(cfg)
    d.pop("extra", None)
    d["feature_size"] = cfg.feature_size
    d["params"] = sum(math.prod(s) for s in _param_shapes(cfg))  # the drafter's own weights
    return d


def _param_shapes(cfg: DFlashConfig) -> list[tuple[int, ...]]:
    with torch.device("meta"):
        m = DFlashDraftModel(cfg)
    return [tuple(p.shape) for p in m.parameters()]
