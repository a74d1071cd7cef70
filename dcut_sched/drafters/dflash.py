"""The DFlash block drafter: its config, its layers and the model (docs/drafters.md, "Architecture").

One non-causal forward over the anchor and B-1 mask slots, attending to the target's context
features, proposes every draft slot of a block; the target supplies the token embedding and the LM
head (or a draft vocabulary's own head). The checkpoint format is :mod:`.checkpoint`'s.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..model.config import LlamaConfig
from ..model.llama import RMSNorm
from ..model.mlp import build_mlp
from ..model.rope import apply_rope, rope_cos_sin, rope_inv_freq

__all__ = ["DFlashConfig", "DFlashDraftModel", "block_loss_weights", "default_target_layer_ids", "describe"]

#: SmolLM2's ``<empty_output>`` special token: never produced by the chat template or the model,
#: so its (frozen, shared) embedding row can stand for a masked slot.
SMOLLM2_MASK_TOKEN_ID = 16


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

    Parameter names are the checkpoint's but for ``self_attn.`` before the attention projections and
    norms, and the draft vocabulary's ``draft_to_target`` (``d2t`` there;
    :func:`~dcut_sched.drafters.checkpoint.checkpoint_tensors`).
    """

    def __init__(self, cfg: DFlashConfig):
        super().__init__()
        self.config = cfg
        #: SHA-256 of the checkpoint files it was loaded from (:func:`~.checkpoint.load_checkpoint`), None otherwise
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
        #: the folder's calibration prior (:func:`~.checkpoint.load_checkpoint`), None without one
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
