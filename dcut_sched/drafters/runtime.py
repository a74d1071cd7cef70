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
recorded length and overwritten beyond it. The engine defers the projection of each step's
committed tokens (``extend_flat(..., defer=True)``) to the next draft, so a step that drafts nothing
costs the drafter no forward work (docs/drafters.md, "In the engine").
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
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
        self.context_len = np.zeros(max_batch_size, dtype=np.int64)  # context tokens held per row
        #: deferred context pieces ``(row per token, position per token, features)`` (``extend_flat``)
        self._pending: list[tuple[np.ndarray, np.ndarray, torch.Tensor]] = []
        self._pending_tokens = 0
        self.max_pending_tokens = 64 * int(max_batch_size)

    #: the target layers whose output hidden states the engine must hand over (see ``extend``)
    @property
    def target_feature_layers(self) -> tuple[int, ...]:
        return self.model.config.target_layer_ids

    def reset(self, rows: Sequence[int] | None = None) -> None:
        """Forget the context of these rows (all by default); call when a row gets a new request."""
        if rows is None:
            self.context_len[:] = 0
        else:
            self.context_len[np.asarray(rows, dtype=np.int64)] = 0

    @torch.inference_mode()
    def extend(self, rows: Sequence[int], features: Sequence[torch.Tensor], starts: Sequence[int]) -> None:
        """Append context: row ``rows[i]`` gets the features ``[n_i, feature_size]`` of its tokens at
        positions ``starts[i] ..``, which must equal the row's context length (each row at most once).

        Raises:
            DraftContextError: a start that is not the row's context length, or past max_seq_len.
        """
        counts = [int(f.shape[0]) for f in features]
        if sum(counts) == 0:
            return
        self.extend_flat(rows, counts, starts, torch.cat([f for f in features if f.shape[0] > 0]))

    @torch.inference_mode()
    def extend_flat(self, rows: Sequence[int], counts: Sequence[int], starts: Sequence[int],
                    features: torch.Tensor, *, defer: bool = False) -> None:
        """:meth:`extend` with the features of every row in one ``[sum(counts), feature_size]`` tensor
        (row ``rows[i]``'s ``counts[i]`` tokens in order, rows in the order given): one projection,
        one cache write per drafter layer, no per-row Python work beyond the index arithmetic.

        ``defer``: only record the tokens (the row's context length moves at once) and project them
        with every other deferred piece at the next :meth:`draft` or :meth:`flush`, or once
        ``max_pending_tokens`` wait: an engine step that drafts nothing then pays no projection, and
        the next drafted step pays one batched projection for every token it missed. Pieces are
        written in the order they came, so a row reset in between ends with the same cache contents
        up to its context length as with immediate writes.

        Raises:
            DraftContextError: a start that is not the row's context length, or past max_seq_len.
        """
        rows_np = np.asarray(rows, dtype=np.int64)
        counts_np = np.asarray(counts, dtype=np.int64)
        starts_np = np.asarray(starts, dtype=np.int64)
        wrong = np.flatnonzero(self.context_len[rows_np] != starts_np)
        if wrong.size:
            r = int(rows_np[wrong[0]])
            raise DraftContextError(f"DFlashDrafter.extend: row {r} holds {int(self.context_len[r])} context tokens, "
                                    f"got features starting at position {int(starts_np[wrong[0]])}")
        over = np.flatnonzero(starts_np + counts_np > self.max_seq_len)
        if over.size:
            raise DraftContextError(f"DFlashDrafter.extend: row {int(rows_np[over[0]])} would exceed "
                                    f"max_seq_len={self.max_seq_len}")
        total = int(counts_np.sum())
        if total == 0:
            return
        self.context_len[rows_np] = starts_np + counts_np
        offset = np.repeat(np.cumsum(counts_np) - counts_np, counts_np)
        pos = np.repeat(starts_np, counts_np) + np.arange(total) - offset
        self._pending.append((np.repeat(rows_np, counts_np), pos, features))
        self._pending_tokens += total
        if not defer or self._pending_tokens >= self.max_pending_tokens:
            self.flush()

    @torch.inference_mode()
    def flush(self) -> None:
        """Project every deferred token to its context K/V and write the caches (one batched call)."""
        if not self._pending:
            return
        pieces, self._pending, self._pending_tokens = self._pending, [], 0
        dev = self.k_cache[0].device
        rows_np = np.concatenate([r for r, _, _ in pieces])
        pos_np = np.concatenate([p for _, p, _ in pieces])
        feats = pieces[0][2] if len(pieces) == 1 else torch.cat([f for _, _, f in pieces])
        if len(pieces) > 1:  # a row reset and refilled in between: its latest token at a position wins
            key = rows_np * self.max_seq_len + pos_np
            _, last = np.unique(key[::-1], return_index=True)
            if last.size < key.size:
                keep = np.sort(key.size - 1 - last)
                rows_np, pos_np, feats = rows_np[keep], pos_np[keep], feats[torch.from_numpy(keep)]
        row_of, pos = torch.from_numpy(rows_np).to(dev), torch.from_numpy(pos_np).to(dev)
        kv = self.model.context_kv(feats.to(dev)[None], pos[None])
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
        self.flush()
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
