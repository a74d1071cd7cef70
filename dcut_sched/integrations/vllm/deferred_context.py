"""The DFlash drafter's context K/V that undrafted steps have not written yet (worker side, torch only).

A DFlash drafter reads the context K/V of the committed tokens only on a drafted pass. On a step after
which no request drafts, :class:`DeferredContext` keeps the step's tokens (positions and the target's
captured hidden states, before the drafter's ``fc``) per request instead of writing them, and hands
them back to be written:

- at the request's next drafted pass, before vLLM's own pass writes that step's tokens;
- before that, as soon as one of its tokens sits in the last slot of a KV-cache block: vLLM may share
  a full block through prefix caching, so a full block never lacks its drafter context.

A request not scheduled in a step keeps its tokens (it does not advance, so fills no block); a finished
request, or one resumed after preemption (its blocks replaced, its tokens recomputed), drops them
(:meth:`DeferredContext.forget`). Tokens a drafted step rejected are kept in step order and the later token at the same
position wins, as with vLLM's own writes. Only drafts depend on the drafter's context, so none of
this can change what the target verifies (docs/vllm.md, "The undrafted step").
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

__all__ = ["ContextWrite", "DeferredContext"]


@dataclass(frozen=True)
class ContextWrite:
    """Context tokens to write now: ``rows`` (each token's request row in this step's batch, the block
    table's row), ``positions`` and the raw ``hidden`` states ``[n, H]``; one token per (row, position)."""

    rows: torch.Tensor
    positions: torch.Tensor
    hidden: torch.Tensor


class DeferredContext:
    """Per request, the committed tokens whose drafter context is not written yet (module docstring)."""

    def __init__(self, block_size: int) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self._pending: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {}

    @property
    def num_pending(self) -> int:
        """Tokens waiting, over all requests."""
        return sum(int(p.numel()) for chunks in self._pending.values() for p, _ in chunks)

    @property
    def requests(self) -> frozenset[str]:
        """The requests with tokens waiting."""
        return frozenset(self._pending)

    def forget(self, req_ids: Iterable[str]) -> None:
        """Drop the waiting tokens of ``req_ids`` (finished, or resumed after preemption)."""
        for r in req_ids:
            self._pending.pop(r, None)

    def step(self, req_ids: Sequence[str], positions: torch.Tensor, hidden: torch.Tensor,
             num_tokens: Sequence[int], *, drafted: bool) -> ContextWrite | None:
        """Take one step's context tokens and return those to write now (``None``: none).

        ``positions`` ``[n]`` and ``hidden`` ``[n, H]`` hold ``num_tokens[i]`` tokens of ``req_ids[i]``
        in batch order. On a ``drafted`` pass the step's own tokens are vLLM's to write and every earlier
        token of the batch is returned; otherwise the step's tokens wait, except for the requests one of
        whose tokens fills a block (those return all of theirs). Requests not in ``req_ids`` keep theirs.
        """
        n = positions.shape[0]
        if len(num_tokens) != len(req_ids) or sum(num_tokens) != n or hidden.shape[0] != n:
            raise ValueError(f"{len(req_ids)} requests with {sum(num_tokens)} tokens, got "
                             f"{len(num_tokens)} counts, {positions.shape[0]} positions, {hidden.shape[0]} rows")
        due: list[int] = []
        if drafted:
            due = [i for i, r in enumerate(req_ids) if r in self._pending]
        else:
            counts = [int(n) for n in num_tokens]
            fills = (positions % self.block_size == self.block_size - 1).to("cpu")
            pos_chunks = torch.split(positions.clone(), counts)
            hid_chunks = torch.split(hidden.clone(), counts)
            for i, (r, n) in enumerate(zip(req_ids, counts)):
                if n == 0:
                    continue
                self._pending.setdefault(r, []).append((pos_chunks[i], hid_chunks[i]))
            starts = [0]
            for n in counts:
                starts.append(starts[-1] + n)
            due = [i for i, n in enumerate(counts) if n and bool(fills[starts[i]:starts[i + 1]].any())]
        if not due:
            return None
        rows, pos, hid = [], [], []
        for i in due:
            for p, h in self._pending.pop(req_ids[i]):
                rows.append(torch.full_like(p, i))
                pos.append(p)
                hid.append(h)
        return _last_per_position(torch.cat(rows), torch.cat(pos), torch.cat(hid))


def _last_per_position(rows: torch.Tensor, positions: torch.Tensor, hidden: torch.Tensor) -> ContextWrite:
    """Keep the last token (in step order) at each (row, position)."""
    key = rows.to(torch.int64) * (int(positions.max()) + 1) + positions.to(torch.int64)
    uniq, inverse = torch.unique(key, return_inverse=True)
    if uniq.numel() == key.numel():
        return ContextWrite(rows, positions, hidden)
    order = torch.arange(key.numel(), device=key.device)
    last = torch.full((uniq.numel(),), -1, dtype=torch.int64, device=key.device)
    last = last.scatter_reduce(0, inverse, order, reduce="amax")
    return ContextWrite(rows[last], positions[last], hidden[last])
