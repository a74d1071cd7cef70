"""Tiny traces built in code for the simulator tests."""

from __future__ import annotations

import numpy as np
import pytest

from dcut_sched.traces import Trace


def build_trace(requests, indexing: str = "position") -> Trace:
    """A trace from ``[(accept_lens, confs), ...]``, one entry per request, rows in position order.

    ``confs`` is ``[n, B-1]``; the block size is taken from it.
    """
    rid, pos, acc, conf = [], [], [], []
    for r, (a, c) in enumerate(requests):
        a = np.asarray(a, dtype=np.int8)
        c = np.asarray(c, dtype=np.float32).reshape(len(a), -1)
        rid.append(np.full(len(a), r, dtype=np.int32))
        pos.append(np.arange(len(a), dtype=np.int32))
        acc.append(a)
        conf.append(c)
    block = conf[0].shape[1] + 1
    trace = Trace(np.concatenate(rid), np.concatenate(pos), np.concatenate(acc), np.concatenate(conf),
                  metadata={"indexing": indexing, "source": "synthetic", "block_size": str(block)})
    return trace


def random_trace(num_requests=12, block_size=8, min_len=5, max_len=40, seed=0, indexing="position") -> Trace:
    """Calibrated synthetic trace: a draft is accepted with probability equal to its confidence."""
    rng = np.random.default_rng(seed)
    reqs = []
    for _ in range(num_requests):
        n = int(rng.integers(min_len, max_len + 1))
        conf = rng.beta(5, 1.5, size=(n, block_size - 1))
        ok = rng.random((n, block_size - 1)) < conf
        a = np.where(ok.all(1), block_size - 1, np.argmin(ok, 1))
        if indexing == "position":
            a = np.minimum(a, n - 1 - np.arange(n))
        reqs.append((a, conf))
    return build_trace(reqs, indexing)


@pytest.fixture(scope="module")
def trace() -> Trace:
    """12 random requests of B = 8 (seed 3): the replay invariants' trace."""
    return random_trace(num_requests=12, block_size=8, seed=3)


@pytest.fixture
def hand_trace() -> Trace:
    """Three requests, B = 4 (values chosen by hand; expected replays are worked out in the tests).

    A (6 positions), B (4 positions), C (3 positions).
    """
    a = ([2, 0, 1, 2, 1, 0],
         [[0.9, 0.5, 0.2], [0.3, 0.9, 0.9], [0.6, 0.6, 0.6], [0.9, 0.9, 0.5], [0.8, 0.5, 0.5], [0.5, 0.5, 0.5]])
    b = ([3, 1, 1, 0],
         [[0.95, 0.9, 0.9], [0.2, 0.2, 0.2], [0.7, 0.1, 0.1], [0.4, 0.4, 0.4]])
    c = ([1, 1, 0], [[0.5, 0.5, 0.5]] * 3)
    return build_trace([a, b, c])


@pytest.fixture
def hand_curve(make_curve):
    """C_verify(bs, K) = 2 + K ms, C_draft(bs) = 2 + 0.25 bs ms, bs in 1, 2, 4, 8; B = 4."""
    return make_curve(block_size=4, base_ms=2.0, per_token_ms=1.0, draft_base_ms=2.0, draft_per_request_ms=0.25)
