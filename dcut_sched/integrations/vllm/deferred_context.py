"""The DFlash drafter's context K/V that undrafted steps have not written yet (worker side, torch only).

A DFlash drafter reads the context K/V of the committed tokens only on a drafted pass. On a step after
which no request drafts, :class:`DeferredContext` keeps the step's decode tokens (the target's
captured hidden states, before the drafter's ``fc``, on the device; their positions on the host) per
request instead of writing them, and hands them back to be written:

- at the request's next drafted pass, before vLLM's own pass writes that step's tokens;
- before that, as soon as one of its tokens sits in the last slot of a fill unit (the KV-cache block,
  or vLLM's prefix-cache hash block where that is smaller): vLLM may share a full block, or a full
  hash block of a partial one, through prefix caching, so such a block never lacks its drafter context;
- a step's prompt tokens (a prefill chunk, or the prompt part of a resumed request's recomputation)
  at once, since vLLM may share a prompt's partial tail block;
- everything waiting in the batch once the kept hidden states exceed ``max_waiting_tokens`` rows (a
  step's waiting tokens are kept together, until the last of them is written).

A request not scheduled in a step keeps its tokens (it does not advance, so fills no block); a finished
or preempted request drops them (:meth:`DeferredContext.retain`; a resumed one recomputes its tokens
into new blocks, and a request id may be used again after its request finished). Tokens a drafted step rejected are kept in step order and the later
token at the same position wins, as with vLLM's own writes. All decisions are made on host metadata
(the batch's token counts and sequence lengths): none reads the device; the indices reach it as small
host-to-device copies. Only drafts depend
on the drafter's context, so none of this can change what the target verifies (docs/vllm.md, "The
undrafted step").
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["MAX_WAITING_TOKENS", "ContextWrite", "DeferredContext"]

#: kept hidden-state rows over the whole batch beyond which a step writes every scheduled request's
MAX_WAITING_TOKENS = 16384


@dataclass(frozen=True)
class ContextWrite:
    """Context tokens to write now: ``rows`` (each token's request row in this step's batch, the block
    table's row), ``positions`` and the raw ``hidden`` states ``[n, H]``, on the hidden states' device;
    one token per (row, position)."""

    rows: torch.Tensor
    positions: torch.Tensor
    hidden: torch.Tensor


class _Kept:
    """One step's waiting tokens' hidden states (the step numbered ``step``), shared by its requests;
    ``live`` of its rows still wait."""

    __slots__ = ("hidden", "step", "live")

    def __init__(self, hidden: torch.Tensor, step: int) -> None:
        self.hidden, self.step, self.live = hidden, step, int(hidden.shape[0])


@dataclass(frozen=True)
class _Waiting:
    """One request's tokens of one step: rows ``offset:offset+count`` of ``kept``, at positions
    ``first..first+count-1``."""

    kept: _Kept
    offset: int
    count: int
    first: int


def _on(like: torch.Tensor, values: np.ndarray) -> torch.Tensor:
    """An int64 index tensor on ``like``'s device (a host copy that does not wait on the device)."""
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.int64)).to(like.device, non_blocking=True)


def _spans(lo: np.ndarray, n: np.ndarray) -> np.ndarray:
    """``lo[j] .. lo[j] + n[j] - 1`` for every j, concatenated."""
    lo, n = np.asarray(lo, dtype=np.int64), np.asarray(n, dtype=np.int64)
    return np.repeat(lo - np.concatenate([[0], np.cumsum(n)[:-1]]), n) + np.arange(int(n.sum()))


def _last_per_position(rows: np.ndarray, positions: np.ndarray) -> np.ndarray | None:
    """Indices keeping the last entry at each (row, position); ``None`` when all are distinct."""
    key = rows * (int(positions.max()) + 1) + positions
    _, last_rev = np.unique(key[::-1], return_index=True)
    if last_rev.size == key.size:
        return None
    return np.sort(key.size - 1 - last_rev)


class DeferredContext:
    """Per request, the committed tokens whose drafter context is not written yet (module docstring)."""

    def __init__(self, fill_unit: int, max_waiting_tokens: int = MAX_WAITING_TOKENS) -> None:
        if fill_unit < 1 or max_waiting_tokens < 1:
            raise ValueError(f"fill_unit and max_waiting_tokens must be >= 1, got {fill_unit}, {max_waiting_tokens}")
        self.fill_unit = fill_unit
        self.max_waiting_tokens = max_waiting_tokens
        self._waiting: dict[str, list[_Waiting]] = {}
        self._num_waiting = 0
        self._num_held = 0  # rows of the kept tensors still alive (>= num_waiting)
        self._steps = 0

    @property
    def num_waiting(self) -> int:
        """Tokens waiting, over all requests."""
        return self._num_waiting

    @property
    def num_held(self) -> int:
        """Hidden-state rows kept alive: the waiting tokens and those sharing a step with one."""
        return self._num_held

    @property
    def requests(self) -> frozenset[str]:
        """The requests with tokens waiting."""
        return frozenset(self._waiting)

    def retain(self, live: Collection[str], drop: Iterable[str] = ()) -> None:
        """Drop the waiting tokens of every request not in ``live`` and of those in ``drop``."""
        for r in [r for r in self._waiting if r not in live] + list(drop):
            for w in self._waiting.pop(r, ()):
                self._release(w)

    def _release(self, w: _Waiting) -> None:
        self._num_waiting -= w.count
        w.kept.live -= w.count
        if w.kept.live == 0:
            self._num_held -= int(w.kept.hidden.shape[0])

    def step(self, req_ids: Sequence[str], num_tokens: Sequence[int], seq_lens: Sequence[int],
             hidden: torch.Tensor, *, drafted: bool, num_prompt_tokens: Sequence[int] | None = None
             ) -> ContextWrite | None:
        """Take one step's context tokens and return those to write now (``None``: none).

        ``hidden`` ``[n, H]`` holds, in batch order, ``num_tokens[i]`` tokens of ``req_ids[i]`` at
        positions ``seq_lens[i] - num_tokens[i] .. seq_lens[i] - 1``; ``num_prompt_tokens[i]`` is its
        prompt length (none: no prompt token in the step). On a ``drafted`` pass the step's own tokens
        are vLLM's to write and every earlier token of the batch is returned; otherwise a request's
        step tokens wait unless the module docstring's rules write them now, with its earlier ones.
        """
        count = np.asarray(num_tokens, dtype=np.int64)
        end = np.asarray(seq_lens, dtype=np.int64)
        if not (len(req_ids) == count.size == end.size) or int(count.sum()) != hidden.shape[0] \
                or (num_prompt_tokens is not None and len(num_prompt_tokens) != count.size):
            raise ValueError(f"{len(req_ids)} requests, {count.size} token counts, {end.size} sequence lengths "
                             f"and {hidden.shape[0]} hidden rows do not match")
        first = end - count
        start = np.concatenate([[0], np.cumsum(count)])
        waiting = np.array([r in self._waiting for r in req_ids], dtype=bool)
        if drafted:
            due, now = waiting, np.zeros_like(waiting)
        else:
            unit = self.fill_unit
            prompt = first < (np.asarray(num_prompt_tokens, dtype=np.int64) if num_prompt_tokens is not None else 0)
            now = (count > 0) & ((end // unit > first // unit) | prompt)
            if self._num_held + int(count[~now].sum()) > self.max_waiting_tokens:
                now = count > 0
                due = waiting | now
            else:
                due = now
            self._keep(req_ids, count, first, start, hidden, (count > 0) & ~now)
        if not due.any():
            return None
        return self._take(req_ids, count, first, start, hidden, due, now)

    def _keep(self, req_ids, count, first, start, hidden, wait) -> None:
        rows = np.flatnonzero(wait)
        self._steps += 1
        if rows.size == 0:
            return
        kept = _Kept(hidden.index_select(0, _on(hidden, _spans(start[rows], count[rows]))), self._steps)  # its own memory, waiting rows only
        offset = 0
        for i in rows:
            n = int(count[i])
            self._waiting.setdefault(req_ids[i], []).append(_Waiting(kept, offset, n, int(first[i])))
            offset += n
        self._num_waiting += offset
        self._num_held += offset

    def _take(self, req_ids, count, first, start, hidden, due, now) -> ContextWrite:
        """The waiting tokens of the ``due`` rows, then this step's of the ``now`` rows, in step order;
        the last token at each (row, position) kept."""
        by_step: dict[int, tuple[torch.Tensor, list[tuple[int, _Waiting]]]] = {}
        for i in np.flatnonzero(due):
            for w in self._waiting.pop(req_ids[i], ()):
                self._release(w)
                by_step.setdefault(w.kept.step, (w.kept.hidden, []))[1].append((int(i), w))
        parts, rows, positions = [], [], []
        for step in sorted(by_step):
            source, pieces = by_step[step]
            n = np.array([w.count for _, w in pieces])
            parts.append(source.index_select(0, _on(source, _spans([w.offset for _, w in pieces], n))))
            rows.append(np.repeat([i for i, _ in pieces], n))
            positions.append(_spans([w.first for _, w in pieces], n))
        now_rows = np.flatnonzero(now)
        if now_rows.size:
            parts.append(hidden.index_select(0, _on(hidden, _spans(start[now_rows], count[now_rows]))))
            rows.append(np.repeat(now_rows, count[now_rows]))
            positions.append(_spans(first[now_rows], count[now_rows]))
        out = torch.cat(parts) if len(parts) > 1 else parts[0]
        rows_np, pos_np = np.concatenate(rows), np.concatenate(positions)
        keep = _last_per_position(rows_np, pos_np)
        if keep is not None:
            out = out.index_select(0, _on(out, keep))
            rows_np, pos_np = rows_np[keep], pos_np[keep]
        return ContextWrite(_on(out, rows_np), _on(out, pos_np), out)
