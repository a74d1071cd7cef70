"""The selection curve: accepted tokens vs verification budget at one batch size (D-Cut's figure).

For a budget K (slots verified per step, ``2*bs <= K <= bs*B``; at bs = 64, B = 16 that is the
published 128..1024), each policy plans lengths on sampled batches of trace rows, and the replay rule
``1 + min(accept_len, L - 1)`` says what they produce. ``uniform`` runs at ``rho = K / (bs*B)``
(every request verifies ``ceil(K / bs)`` slots) and ``topk`` at the same rho (a global top-K over
the batch). The policies come from the registry; nothing here selects slots itself.

A sampled batch is ``bs`` rows drawn uniformly (seeded) from all trace rows, i.e. requests at random
output positions; every policy and budget sees the same batches.
"""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np
import pandas as pd

from .. import policies as policy_registry
from ..traces import Trace

__all__ = ["default_budgets", "selection_curve"]


def default_budgets(batch_size: int, block_size: int) -> list[int]:
    """Multiples of ``bs`` from ``2*bs`` (or ``bs`` when B = 2) to ``bs*B``."""
    start = 2 if block_size > 2 else 1
    return [k * batch_size for k in range(start, block_size + 1)]


def selection_curve(
    trace: Trace | str | os.PathLike,
    batch_size: int = 64,
    *,
    budgets: Sequence[int] | None = None,
    policies: Sequence[str] = ("uniform", "topk"),
    num_batches: int = 200,
    seed: int = 0,
    batches: np.ndarray | None = None,
) -> pd.DataFrame:
    """Mean accepted tokens per step vs verification budget, per policy.

    Args:
        trace: a :class:`Trace` or trace path.
        batch_size: bs of the sampled batches.
        budgets: verification budgets K in slots, each in ``[bs, bs*B]`` (None: :func:`default_budgets`).
        policies: registry names taking a ``rho`` parameter (default ``uniform`` and ``topk``).
        num_batches: sampled batches averaged per point.
        seed: seeds the sampling.
        batches: explicit ``[num_batches, bs]`` trace row indices instead of sampling.

    Returns:
        One row per (policy, budget): ``policy, batch_size, budget, ratio`` (K / (bs*B)),
        ``num_tokens`` (mean slots actually verified; ``uniform`` rounds up to whole slots per
        request), ``accepted_tokens`` (mean output tokens per step: accepted drafts plus one bonus
        token per request), ``accepted_drafts``, ``expected_tokens`` (the plan's estimate), and
        ``approximate`` (step-indexed trace).

    Raises:
        ValueError: a budget outside ``[bs, bs*B]``, a bad batch size or policy.
    """
    if not isinstance(trace, Trace):
        trace = Trace.load(trace)
    block = trace.block_size
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} must be >= 1")
    budgets = default_budgets(batch_size, block) if budgets is None else [int(k) for k in budgets]
    bad = [k for k in budgets if not batch_size <= k <= batch_size * block]
    if bad:
        raise ValueError(f"budget {bad[0]} is outside [{batch_size}, {batch_size * block}] (bs={batch_size}, B={block})")
    if batches is None:
        if num_batches < 1:
            raise ValueError(f"num_batches={num_batches} must be >= 1")
        rows_idx = np.random.default_rng(seed).integers(0, trace.num_rows, size=(num_batches, batch_size))
    else:
        rows_idx = np.asarray(batches, dtype=np.int64)
        if rows_idx.ndim != 2 or rows_idx.shape[1] != batch_size or rows_idx.min() < 0 or rows_idx.max() >= trace.num_rows:
            raise ValueError(f"batches must be [num_batches, {batch_size}] row indices in [0, {trace.num_rows})")
        num_batches = rows_idx.shape[0]
    accept = trace.accept_len.astype(np.int64)
    out = []
    for name in policies:
        for k in budgets:
            policy = policy_registry.get(name, rho=k / (batch_size * block))
            verified = produced = drafts = expected = 0.0
            for rows in rows_idx:
                acc = accept[rows]
                kwargs = {"accept_len": acc} if policy.needs_accept_len else {}
                plan = policy.plan(trace.conf[rows], None, validate=False, **kwargs)
                accepted = np.minimum(acc, np.asarray(plan.lengths) - 1)
                verified += plan.num_tokens
                drafts += accepted.sum()
                produced += batch_size + accepted.sum()
                expected += plan.expected_tokens
            out.append({
                "policy": name, "batch_size": batch_size, "budget": k, "ratio": k / (batch_size * block),
                "num_tokens": verified / num_batches, "accepted_tokens": produced / num_batches,
                "accepted_drafts": drafts / num_batches, "expected_tokens": expected / num_batches,
                "approximate": not trace.exact_replay,
            })
    return pd.DataFrame(out)
