"""Token layouts of a verification plan, in the forms serving engines consume: ``slot_mask``,
``gather_indices``, ``num_draft_tokens`` and ``cu_num_draft_tokens`` (:class:`SlotLayout`; the
definitions: docs/controller.md, "RatioController"). Built on the lengths' device from ``K`` known
on the host, without a host sync; numpy lengths give numpy layouts.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..scores import Array

__all__ = ["SlotLayout", "slot_layout"]


@dataclass(frozen=True)
class SlotLayout:
    """The layouts of lengths ``L [bs]``: ``slot_mask [bs, B]`` (``k < L[i]``), ``gather_indices [K]``
    (request-major ``i * B + k``), ``num_draft_tokens [bs]`` (``L - 1``) and its inclusive cumsum.
    """

    slot_mask: Array
    gather_indices: Array
    num_draft_tokens: Array
    cu_num_draft_tokens: Array


def slot_layout(lengths: Array, block_size: int, num_tokens: int) -> SlotLayout:
    """The :class:`SlotLayout` of ``lengths`` (``[bs]`` ints in ``[1, B]``, numpy or torch). ``num_tokens``
    is ``sum(lengths)`` as a host int, not re-checked (a wrong value gives wrong ``gather_indices``).
    """
    bs = int(lengths.shape[0])
    if isinstance(lengths, torch.Tensor):
        dev = lengths.device
        lengths = lengths.to(torch.int64)
        slots = torch.arange(block_size, device=dev)
        slot_mask = slots[None, :] < lengths[:, None]
        starts = torch.cumsum(lengths, 0) - lengths  # first packed position of each request
        request = torch.repeat_interleave(torch.arange(bs, device=dev), lengths, output_size=num_tokens)
        within = torch.arange(num_tokens, device=dev) - starts[request]
        gather = request * block_size + within
        num_draft = (lengths - 1).to(torch.int32)
        cu = torch.cumsum(num_draft, 0, dtype=torch.int32)
        return SlotLayout(slot_mask, gather, num_draft, cu)
    lengths = np.asarray(lengths, dtype=np.int64)
    slot_mask = _slot_range(block_size) < lengths[:, None]
    gather = np.flatnonzero(slot_mask)  # row-major nonzero = request-major order
    num_draft = (lengths - 1).astype(np.int32)
    cu = num_draft.cumsum(dtype=np.int32)
    return SlotLayout(slot_mask, gather, num_draft, cu)


_SLOT_RANGES: dict[int, np.ndarray] = {}


def _slot_range(block_size: int) -> np.ndarray:
    """``[1, B]`` int64 ``0..B-1`` (cached: one fewer allocation per step)."""
    r = _SLOT_RANGES.get(block_size)
    if r is None:
        r = _SLOT_RANGES[block_size] = np.arange(block_size)[None, :]
    return r
