"""Self-speculative drafter: the target model with some layers skipped (LayerSkip / Draft&Verify /
SWIFT style). Weights are shared with the target; no training.

The drafter owns its own `KVCache` (holding only the layers it runs): after the first skipped
layer its hidden states, hence its K/V, differ from the target's.

Cache-sync protocol (what `draft()` automates; `propose()` is the stateless core):
  Let a request's committed sequence have n tokens x_0..x_{n-1}; x_{n-1} is the "current" token
  (the target has not consumed it yet either). Drafting k tokens feeds the drafter
  x_{n-1} (and any earlier tokens it has not seen) and then its own drafts d_1..d_{k-1}, at
  positions n-1, n, .., n+k-2; d_k is produced but never fed. After the target verifies and
  commits d_1..d_a plus a bonus token c, the drafter's cache is valid for positions
  < n + min(a, k-1), so the next call must feed the tokens from there on: just c when a < k,
  or d_k and c when all k drafts were accepted. Stale slots beyond are never seen (queries only
  see slots <= their position) and get overwritten; no explicit rollback is needed.
  `draft()` works this out itself by comparing the new committed sequence with what it drafted.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import torch

from dcut_sched.model.llama import LlamaModel

#: Layer sets to skip on SmolLM2-135M (30 layers): two drafter variants. Their measured acceptance
#: (which of the two skips more easily): docs/model.md, "Drafter acceptance".
DRAFTER_PRESETS: dict[str, tuple[int, ...]] = {
    "skip14-15": (14, 15),
    "skip21-22": (21, 22),
}


def drafter_layers(num_layers: int, skip_layers: Iterable[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(sorted skipped layers, layers the drafter runs) of a self-speculative drafter.

    Raises:
        ValueError: a skipped layer index outside ``[0, num_layers)``, or every layer skipped.
    """
    skipped = tuple(sorted(set(int(i) for i in skip_layers)))
    bad = [i for i in skipped if not 0 <= i < num_layers]
    if bad:
        raise ValueError(f"self-speculative drafter: skip_layers {bad} out of range [0, {num_layers})")
    layers = tuple(i for i in range(num_layers) if i not in skipped)
    if not layers:
        raise ValueError("self-speculative drafter: cannot skip every layer")
    return skipped, layers


def confidence(logits: torch.Tensor) -> torch.Tensor:
    """Max softmax probability exp(max_logit - logsumexp(logits)) over the last axis, float32."""
    logits = logits.float()
    return torch.exp(logits.max(-1).values - torch.logsumexp(logits, -1))


class SelfSpecDrafter:
    """Greedy drafter = `model` run without `skip_layers`.

    Args:
        model: the target `LlamaModel` (weights shared, not copied).
        skip_layers: absolute layer indices to skip, or a key of `DRAFTER_PRESETS`.
        max_batch_size: cache rows (requests drafted concurrently).
        max_seq_len: longest sequence (committed + drafts) per row. One extra scratch slot is
            allocated for padding writes.
    Raises:
        ValueError: a skipped layer index out of range, or nothing left to run.
    """

    def __init__(self, model: LlamaModel, skip_layers: Iterable[int] | str = (14, 15),
                 max_batch_size: int = 1, max_seq_len: int = 2048):
        if isinstance(skip_layers, str):
            skip_layers = DRAFTER_PRESETS[skip_layers]
        self.skip_layers, self.layers = drafter_layers(model.config.num_layers, skip_layers)
        self.model = model
        self.max_seq_len = int(max_seq_len)
        self.scratch_slot = self.max_seq_len  # padding writes go here; no query ever sees it
        self.cache = model.new_cache(max_batch_size, self.max_seq_len + 1, layers=self.layers)
        # row -> (n, drafted tokens fed to the cache at positions n, n+1, ..)
        self._state: dict[int, tuple[int, list[int]]] = {}

    # ------------------------------------------------------------------ stateless core
    @torch.inference_mode()
    def propose(self, input_ids: torch.Tensor, position_ids: torch.Tensor, num_draft: int,
                last_index: torch.Tensor | None = None, cache_slots: torch.Tensor | None = None,
                batch_index: torch.Tensor | None = None, kv_len: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed pending tokens, then greedily draft `num_draft` tokens per request.

        Args:
            input_ids: [bs, P] int64 tokens the drafter has not processed yet, ending with each
                request's current token (right-padded when P differs between requests).
            position_ids: [bs, P] int64 their positions (pads: any valid position, e.g. the last real one).
            num_draft: k >= 1 tokens to draft.
            last_index: [bs] int64 index in P of each request's current token (default P-1).
            cache_slots: [bs, P] int64 (default position_ids; pads should point at `scratch_slot`).
            batch_index: [bs] int64 drafter-cache rows (default 0..bs-1).
            kv_len: attention window, see `LlamaModel.forward`.
        Returns:
            (tokens [bs, k] int64, confidences [bs, k] float32 = max softmax probability).
        """
        bs, P = input_ids.shape
        dev = input_ids.device
        if last_index is None:
            last_index = torch.full((bs,), P - 1, dtype=torch.long, device=dev)
        m, c, layers = self.model, self.cache, self.layers
        logits = m(input_ids, position_ids, c, cache_slots=cache_slots, layers=layers,
                   batch_index=batch_index, logits_at=last_index[:, None], kv_len=kv_len)[:, 0]
        pos = position_ids.gather(1, last_index[:, None])  # [bs, 1]
        toks, confs = [], []
        for i in range(num_draft):
            tok = logits.argmax(-1)
            toks.append(tok)
            confs.append(confidence(logits))
            if i == num_draft - 1:
                break
            pos = pos + 1
            logits = m(tok[:, None], pos, c, layers=layers, batch_index=batch_index, kv_len=kv_len)[:, 0]
        return torch.stack(toks, 1), torch.stack(confs, 1)

    # ------------------------------------------------------------------ stateful convenience
    def reset(self, rows: Iterable[int] | None = None) -> None:
        """Forget what cache rows hold (all rows by default); call when a row gets a new request."""
        if rows is None:
            self._state.clear()
        else:
            for r in rows:
                self._state.pop(int(r), None)

    def synced_length(self, row: int, sequence: Sequence[int]) -> int:
        """Number of leading positions of `sequence` whose drafter K/V in `row` is valid (< len)."""
        st = self._state.get(row)
        if st is None:
            return 0
        n, drafted = st
        synced = min(n, len(sequence))
        for j, t in enumerate(drafted):
            if n + j >= len(sequence) or sequence[n + j] != t:
                break
            synced = n + j + 1
        return min(synced, len(sequence) - 1)

    def draft(self, sequences: Sequence[Sequence[int]], num_draft: int,
              rows: Sequence[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Draft `num_draft` tokens continuing each committed sequence (prompt + accepted tokens).

        Tracks per row what the cache holds and feeds only the missing tokens (the whole prompt
        on a row's first call). Rows are reused across requests only after `reset(rows)`.

        Args:
            sequences: committed token ids per request (each non-empty), in any order of growth.
            rows: drafter-cache row of each request (default 0..bs-1).
        Returns:
            (tokens [bs, k] int64, confidences [bs, k] float32) on the model's device.
        Raises:
            ValueError: a sequence plus drafts would exceed max_seq_len, or an empty sequence.
        """
        bs = len(sequences)
        rows = list(range(bs)) if rows is None else [int(r) for r in rows]
        dev = self.model.device
        pend, starts = [], []
        for seq, row in zip(sequences, rows):
            n = len(seq)
            if n == 0:
                raise ValueError("SelfSpecDrafter.draft: empty sequence")
            if n + num_draft - 1 > self.max_seq_len:
                raise ValueError(f"SelfSpecDrafter.draft: length {n} + {num_draft} drafts exceeds "
                                 f"max_seq_len={self.max_seq_len}; build the drafter with a larger max_seq_len")
            s = self.synced_length(row, seq)
            pend.append(list(seq[s:]))
            starts.append(s)
        P = max(len(p) for p in pend)
        ids = torch.zeros(bs, P, dtype=torch.long)
        pos = torch.zeros(bs, P, dtype=torch.long)
        slots = torch.full((bs, P), self.scratch_slot, dtype=torch.long)
        for b, (p, s) in enumerate(zip(pend, starts)):
            ids[b, :len(p)] = torch.tensor(p, dtype=torch.long)
            pos[b, :len(p)] = torch.arange(s, s + len(p))
            pos[b, len(p):] = s + len(p) - 1
            slots[b, :len(p)] = pos[b, :len(p)]
        last = torch.tensor([len(p) - 1 for p in pend], dtype=torch.long)
        batch_index = None if rows == list(range(bs)) else torch.tensor(rows, dtype=torch.long, device=dev)
        kv_len = min(self.max_seq_len, max(len(s) for s in sequences) + num_draft)
        toks, confs = self.propose(ids.to(dev), pos.to(dev), num_draft, last_index=last.to(dev),
                                   cache_slots=slots.to(dev), batch_index=batch_index, kv_len=kv_len)
        tl = toks.tolist()
        for seq, row, t in zip(sequences, rows, tl):
            self._state[row] = (len(seq), t[:num_draft - 1])
        return toks, confs
