"""The selection curve: accepted tokens vs verification budget at one batch size (D-Cut's figure).

For a budget K (slots verified per step, ``2*bs <= K <= bs*B``; at bs = 64, B = 16 that is the
published 128..1024), each policy plans lengths on sampled batches of trace rows, and the replay rule
``1 + min(accept_len, L - 1)`` says what they produce. ``uniform`` runs at ``rho = K / (bs*B)``
(every request verifies ``ceil(K / bs)`` slots) and ``topk`` at the same rho (a global top-K over
the batch). The policies come from the registry and the computation is the trace library's
(:func:`dcut_sched.traces.stats.selection_frame`); this module picks the budgets and the batches.

A sampled batch is ``bs`` distinct steps of a full-verification replay (step-weighted, as a running
engine meets them, :func:`dcut_sched.traces.stats.sample_replay_batches`); every policy and budget
sees the same batches.
"""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np
import pandas as pd

from ..traces import Trace
from ..traces.stats import sample_replay_batches, selection_frame

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
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} must be >= 1")
    budgets = default_budgets(batch_size, trace.block_size) if budgets is None else [int(k) for k in budgets]
    if batches is None:
        batches = sample_replay_batches(trace, batch_size, num_batches, seed)
    elif np.asarray(batches).ndim != 2 or np.asarray(batches).shape[1] != batch_size:
        raise ValueError(f"batches must be [num_batches, {batch_size}] row indices")
    return selection_frame(trace, batches, budgets, policies)
