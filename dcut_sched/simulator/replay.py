"""Vectorised replay of an acceptance trace: which request is where, for a whole batch at once.

Two pieces:

- :class:`RequestFeed`: the order in which the trace's requests enter the engine. A seeded shuffle
  (or the trace's own order), walked from start to end; when it runs out, the next pass walks the same
  order again from a fresh random offset, and :attr:`RequestFeed.cycles` counts how often that
  happened (results report it, since a cycled request is replayed a second time).
- :class:`ReplayBatch`: the requests in the engine now, as flat numpy arrays (one entry per batch
  slot). :meth:`ReplayBatch.gather` picks the current ``conf [bs, B-1]`` and ``accept_len [bs]`` rows
  with one fancy index each; :meth:`ReplayBatch.advance` moves every request by the tokens its
  verified prefix produced.

Replay rule (docs/design.md §1, §3; the exact, approximate and sampled replays and what each
result says about them: docs/simulator.md, "Traces: exact and approximate replay"): a request that
verifies ``L`` slots produces ``verified_prefix_tokens(accept_len, L)`` tokens
(:func:`dcut_sched.scores.verified_prefix_tokens`, the one implementation of
``1 + min(accept_len, L - 1)``).

- **Position-indexed** trace (exact): the request's cursor is its output position ``p``; it moves to
  ``p + verified_prefix_tokens(accept_len[p], L)`` and is finished at ``p = n`` (its number of
  positions), which is also its output length (the trace loader guarantees
  ``p + 1 + accept_len[p] <= n``).
- **Step-indexed** trace (approximate): the cursor is the index of the recorded step; it moves on by
  one record per engine step, wrapping within the request. The request's output length is
  ``sum(1 + accept_len)`` over its records; the last step's tokens are clipped to it.
- **Sampled** trace (``p1..p{B-1}`` present, temperature > 0): :meth:`ReplayBatch.gather` draws each
  request's ``accept_len`` afresh from the seeded generator, the number of leading successes of
  independent Bernoulli(``p_t``) trials, capped like the recorded one (``p + 1 + accept_len <= n``);
  the cursor then moves along the recorded output's positions. Why that draw is what an engine
  verifying greedy drafts by rejection sampling would see: docs/design.md §3 and docs/sampling.md.
  Greedy traces replay exactly as before.
"""

from __future__ import annotations

import numpy as np

from ..scores import verified_prefix_tokens
from ..traces import Trace

__all__ = ["RequestFeed", "ReplayBatch", "output_lengths"]


def output_lengths(trace: Trace) -> np.ndarray:
    """``[R]`` int64 output tokens of each trace request (the replay's finishing point).

    Position-indexed: the number of positions. Step-indexed: ``sum(1 + accept_len)`` over the
    request's recorded steps.
    """
    if trace.exact_replay:
        return trace.num_positions.astype(np.int64)
    per_row = 1 + trace.accept_len.astype(np.int64)
    return np.add.reduceat(per_row, trace.starts).astype(np.int64)


class RequestFeed:
    """The sequence of trace requests (indices ``0..R-1`` into ``trace.starts``) an engine admits.

    The sequence depends only on ``(num_requests, seed, shuffle)``, so every policy run with the same
    seed sees the same requests in the same order: differences between policies are the policy's.

    Args:
        num_requests: R, requests in the trace (>= 1).
        seed: seed of the shuffle and of the offsets of later passes.
        shuffle: walk a seeded permutation (True) or the trace's order (False).

    Attributes:
        cycles: completed passes over the trace after the first (0 = no request was replayed twice).
        issued: requests handed out so far.
    """

    def __init__(self, num_requests: int, seed: int = 0, shuffle: bool = True):
        if num_requests < 1:
            raise ValueError("the trace has no requests")
        self._rng = np.random.default_rng(seed)
        n = int(num_requests)
        self._order = self._rng.permutation(n) if shuffle else np.arange(n, dtype=np.int64)
        self._n = n
        self._offset = 0
        self._next = 0
        self.cycles = 0
        self.issued = 0

    def take(self, count: int) -> np.ndarray:
        """The next ``count`` request indices (``[count]`` int64)."""
        out = np.empty(int(count), dtype=np.int64)
        filled = 0
        while filled < count:
            if self._next == self._n:  # trace exhausted: cycle with a fresh offset
                self.cycles += 1
                self._offset = int(self._rng.integers(self._n))
                self._next = 0
            m = min(count - filled, self._n - self._next)
            idx = (self._offset + np.arange(self._next, self._next + m)) % self._n
            out[filled : filled + m] = self._order[idx]
            self._next += m
            filled += m
        self.issued += int(count)
        return out


class ReplayBatch:
    """The requests currently in the engine, one array entry per batch slot.

    Slot arrays (all ``[bs]`` int64): ``request`` (trace request index), ``uid`` (running admission
    number, unique per admitted request), ``cursor`` (position or record index within the request),
    ``produced`` (output tokens so far), ``target`` (output length).

    Args:
        trace: the (validated) trace to replay.
        seed: seeds the acceptance draws of a sampled trace (ignored for greedy traces).
    """

    def __init__(self, trace: Trace, seed: int = 0):
        self.trace = trace
        self._target_prob = None if trace.target_prob is None else np.ascontiguousarray(trace.target_prob)
        self._accept_rng = np.random.default_rng([int(seed), 2])
        self.exact = trace.exact_replay
        self.block_size = trace.block_size
        self._conf = np.ascontiguousarray(trace.conf)
        self._accept = trace.accept_len.astype(np.int64)
        self._starts = trace.starts.astype(np.int64)
        self._num_records = trace.num_positions.astype(np.int64)
        self._lengths = output_lengths(trace)
        empty = np.zeros(0, dtype=np.int64)
        self.request = empty
        self.uid = empty
        self.start = empty
        self.records = empty
        self.cursor = empty
        self.produced = empty
        self.target = empty
        self._rows: np.ndarray | None = None
        self._acc: np.ndarray | None = None
        self._next_uid = 0

    @property
    def batch_size(self) -> int:
        return int(self.request.shape[0])

    # ------------------------------------------------------------------ membership
    def _fresh(self, requests: np.ndarray) -> tuple[np.ndarray, ...]:
        requests = np.asarray(requests, dtype=np.int64)
        uid = np.arange(self._next_uid, self._next_uid + len(requests), dtype=np.int64)
        self._next_uid += len(requests)
        zeros = np.zeros(len(requests), dtype=np.int64)
        return (requests, uid, self._starts[requests], self._num_records[requests], zeros, zeros.copy(),
                self._lengths[requests])

    def add(self, requests: np.ndarray) -> np.ndarray:
        """Append new requests (trace indices) at position 0; returns their ``uid``s."""
        fields = self._fresh(requests)
        (self.request, self.uid, self.start, self.records, self.cursor, self.produced, self.target) = (
            np.concatenate([old, new])
            for old, new in zip(
                (self.request, self.uid, self.start, self.records, self.cursor, self.produced, self.target), fields
            )
        )
        self._rows = None
        return fields[1]

    def replace(self, slots: np.ndarray, requests: np.ndarray) -> np.ndarray:
        """Put new requests (at position 0) into the given slots (closed loop); returns their ``uid``s."""
        req, uid, start, records, cursor, produced, target = self._fresh(requests)
        self.request[slots] = req
        self.uid[slots] = uid
        self.start[slots] = start
        self.records[slots] = records
        self.cursor[slots] = cursor
        self.produced[slots] = produced
        self.target[slots] = target
        self._rows = None
        return uid

    def remove(self, mask: np.ndarray) -> None:
        """Drop the slots where ``mask`` is True (open loop); the others keep their order."""
        keep = ~mask
        self.request = self.request[keep]
        self.uid = self.uid[keep]
        self.start = self.start[keep]
        self.records = self.records[keep]
        self.cursor = self.cursor[keep]
        self.produced = self.produced[keep]
        self.target = self.target[keep]
        self._rows = None

    # ------------------------------------------------------------------ one step
    def gather(self) -> tuple[np.ndarray, np.ndarray]:
        """Current draft confidences and acceptance lengths of every slot.

        Returns:
            ``conf [bs, B-1]`` float32 (a copy; the policy may keep it) and ``accept_len [bs]`` int64.
        """
        rows = self.start + self.cursor
        self._rows = rows
        if self._target_prob is None:
            self._acc = self._accept[rows]
        else:
            self._acc = self._sample_accept(rows)
        return self._conf[rows], self._acc

    def _sample_accept(self, rows: np.ndarray) -> np.ndarray:
        """``[bs]`` int64 acceptance drawn from ``p`` (module docstring, "Sampled"), capped at the output's end."""
        prob = self._target_prob[rows]
        success = self._accept_rng.random(prob.shape) < prob
        drawn = np.cumprod(success, axis=1).sum(axis=1).astype(np.int64)
        return np.minimum(drawn, np.maximum(self.target - self.produced - 1, 0))

    def advance(self, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Advance every slot after verifying its first ``lengths[i]`` slots (after :meth:`gather`).

        Args:
            lengths: ``[bs]`` int verified slots per request, each in ``[1, B]``.

        Returns:
            ``(tokens [bs] int64, finished [bs] bool)``: output tokens produced this step and which
            requests reached their output length.
        """
        assert self._rows is not None, "ReplayBatch.advance needs gather() first in the same step"
        return self.advance_by(verified_prefix_tokens(self._acc, lengths))

    def advance_by(self, verified: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`advance` given the step's ``verified_prefix_tokens(accept_len, lengths)`` (``[bs]``
        int64, for a caller that needs them too), after :meth:`gather`. Same returns."""
        assert self._rows is not None, "ReplayBatch.advance needs gather() first in the same step"
        tokens = verified
        self._rows = None
        if self.exact:
            self.cursor += tokens
        else:
            tokens = np.minimum(tokens, self.target - self.produced)
            self.cursor += 1
            self.cursor %= self.records
        self.produced += tokens
        return tokens, self.produced >= self.target

    def advance_plain(self) -> tuple[np.ndarray, np.ndarray]:
        """Advance every slot by one token (a step without draft: anchor only)."""
        tokens = np.ones(self.batch_size, dtype=np.int64)
        self._rows = None
        if self.exact:
            self.cursor += 1
        else:
            self.cursor += 1
            self.cursor %= self.records
        self.produced += 1
        return tokens, self.produced >= self.target
