"""The DFlash drafter as the project's engine runs it: a context cache fed from verified tokens.

Protocol (docs/drafters.md, "In the engine"): a request whose committed sequence has ``n`` tokens
has had ``x_0 .. x_{n-2}`` processed by the target; ``x_{n-1}`` (its *current* token) has not.
The drafter's context cache of that row must hold the context keys/values of exactly those
``n - 1`` tokens, which the engine supplies from the target's own forwards:

- after a prefill, the features of the prompt's tokens (:meth:`DFlashDrafter.extend`);
- after each verification, the features of the slots whose tokens were committed: the current
  token and the accepted drafts (``1 + a`` slots). The bonus token becomes the next anchor.

:meth:`DFlashDrafter.draft` then runs one forward per step: block ``[x_{n-1}, mask x (B-1)]`` at
positions ``n-1 .. n+B-2`` over the row's context, and returns ``B-1`` tokens and confidences.
Slots of rejected drafts are never written to the context cache; a row's cache is valid up to its
recorded length and overwritten beyond it.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from ..model.drafter import confidence
from .dflash import DFlashDraftModel

__all__ = ["DFlashDrafter", "DraftContextError", "NoDrafter"]


class NoDrafter:
    """The drafter of a run whose policy never drafts (``ar``): nothing to keep in sync, no features."""

    target_feature_layers = None

    def reset(self, rows: Sequence[int] | None = None) -> None:
        """Nothing to forget."""

    def draft(self, sequences, num_draft, rows=None):
        raise RuntimeError("NoDrafter.draft: this run's policy never drafts")


class DraftContextError(RuntimeError):
    """The engine asked for a draft of a row whose context cache does not match its sequence."""


class DFlashDrafter:
    """Engine drafter over a :class:`DFlashDraftModel` (module docstring for the protocol).

    Args:
        model: the drafter weights; target: the target ``LlamaModel`` (its embedding and LM head).
        max_batch_size: cache rows; max_seq_len: longest sequence (committed + drafts) per row.

    Raises:
        ValueError: drafter and target disagree on width, vocabulary or layer count.
    """

    def __init__(self, model: DFlashDraftModel, target, *, max_batch_size: int = 1, max_seq_len: int = 2048):
        cfg, tc = model.config, target.config
        if (cfg.hidden_size, cfg.vocab_size, cfg.target_num_layers) != (tc.hidden_size, tc.vocab_size, tc.num_layers):
            raise ValueError(f"DFlashDrafter: the drafter was made for a target of width {cfg.hidden_size}, vocabulary "
                             f"{cfg.vocab_size} and {cfg.target_num_layers} layers, not {tc.hidden_size}, "
                             f"{tc.vocab_size}, {tc.num_layers}")
        dev, dtype = target.device, target.dtype
        self.model = model.to(device=dev, dtype=dtype).eval()
        if self.model.draft_to_target is not None:
            self.model.draft_to_target = self.model.draft_to_target.long()
        self.target = target
        self.max_seq_len = int(max_seq_len)
        kv = (max_batch_size, cfg.num_kv_heads, self.max_seq_len, cfg.head_dim)
        self.k_cache = [torch.zeros(kv, dtype=dtype, device=dev) for _ in range(cfg.num_layers)]
        self.v_cache = [torch.zeros(kv, dtype=dtype, device=dev) for _ in range(cfg.num_layers)]
        self.context_len = [0] * max_batch_size

    #: the target layers whose output hidden states the engine must hand over (see ``extend``)
    @property
    def target_feature_layers(self) -> tuple[int, ...]:
        return self.model.config.target_layer_ids

    def reset(self, rows: Sequence[int] | None = None) -> None:
        """Forget the context of these rows (all by default); call when a row gets a new request."""
        for r in (range(len(self.context_len)) if rows is None else rows):
            self.context_len[int(r)] = 0

    @torch.inference_mode()
    def extend(self, rows: Sequence[int], features: Sequence[torch.Tensor], starts: Sequence[int]) -> None:
        """Append context: row ``rows[i]`` gets the features ``[n_i, feature_size]`` of its tokens at
        positions ``starts[i] ..``, which must equal the row's context length (rows may repeat only
        if their pieces are consecutive, in order).

        Raises:
            DraftContextError: a start that is not the row's context length, or past max_seq_len.
        """
        pieces = [(int(r), f, int(s)) for r, f, s in zip(rows, features, starts) if f.shape[0] > 0]
        if not pieces:
            return
        for r, f, s in pieces:
            if s != self.context_len[r]:
                raise DraftContextError(f"DFlashDrafter.extend: row {r} holds {self.context_len[r]} context tokens, "
                                        f"got features starting at position {s}")
            if s + f.shape[0] > self.max_seq_len:
                raise DraftContextError(f"DFlashDrafter.extend: row {r} would exceed max_seq_len={self.max_seq_len}")
            self.context_len[r] = s + f.shape[0]
        dev = self.k_cache[0].device
        feats = torch.cat([f for _, f, _ in pieces]).to(dev)[None]
        pos = torch.cat([torch.arange(s, s + f.shape[0]) for _, f, s in pieces]).to(dev)
        row_of = torch.cat([torch.full((f.shape[0],), r, dtype=torch.long) for r, f, _ in pieces]).to(dev)
        kv = self.model.context_kv(feats, pos[None])
        for layer, (k, v) in enumerate(kv):  # k, v: [1, kv_heads, M, head_dim]
            self.k_cache[layer][row_of, :, pos] = k[0].transpose(0, 1).to(self.k_cache[layer].dtype)
            self.v_cache[layer][row_of, :, pos] = v[0].transpose(0, 1).to(self.v_cache[layer].dtype)

    @torch.inference_mode()
    def draft(self, sequences: Sequence[Sequence[int]], num_draft: int,
              rows: Sequence[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Draft ``num_draft`` tokens after each committed sequence in one block forward.

        Returns:
            (tokens ``[bs, k]`` int64 target ids, confidences ``[bs, k]`` float32 = max softmax).
        Raises:
            DraftContextError: a row's context is not its sequence minus the current token.
            ValueError: ``num_draft`` above the drafter's block size - 1, or past max_seq_len.
        """
        bs = len(sequences)
        rows = list(range(bs)) if rows is None else [int(r) for r in rows]
        B = num_draft + 1
        if num_draft < 1 or B > self.model.config.block_size:
            raise ValueError(f"DFlashDrafter.draft: {num_draft} drafts; this drafter drafts 1..{self.model.config.block_size - 1}")
        starts = []
        for seq, r in zip(sequences, rows):
            p = len(seq) - 1
            if self.context_len[r] != p:
                raise DraftContextError(f"DFlashDrafter.draft: row {r} holds {self.context_len[r]} context tokens, its "
                                        f"sequence needs {p} (the engine must extend the context after each step)")
            if p + B > self.max_seq_len:
                raise ValueError(f"DFlashDrafter.draft: length {len(seq)} + {num_draft} drafts exceeds max_seq_len")
            starts.append(p)
        dev = self.k_cache[0].device
        S = max(starts)
        start_t = torch.tensor(starts, device=dev)
        ids = torch.full((bs, B), self.model.config.mask_token_id, dtype=torch.long, device=dev)
        ids[:, 0] = torch.tensor([int(s[-1]) for s in sequences], device=dev)
        bpos = start_t[:, None] + torch.arange(B, device=dev)
        row_t = torch.tensor(rows, device=dev)
        ctx = [(k[row_t, :, :S], v[row_t, :, :S]) for k, v in zip(self.k_cache, self.v_cache)]
        ctx_vis = torch.arange(S, device=dev)[None, :] < start_t[:, None]  # [bs, S]
        mask = torch.cat([ctx_vis[:, None, :].expand(bs, B, S), torch.ones(bs, B, B, dtype=torch.bool, device=dev)], -1)
        emb = F.embedding(ids, self.target.embed_tokens.weight)
        h = self.model.block_hidden(emb, bpos, ctx, mask[:, None])[:, 1:]
        head = self.target.embed_tokens.weight if self.target.lm_head is None else self.target.lm_head.weight
        logits = self.model.draft_logits(h, head)
        return self.model.to_target_ids(logits.argmax(-1)), confidence(logits)
