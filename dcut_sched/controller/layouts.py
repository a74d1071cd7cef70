"""Token layouts of a verification plan, in the forms serving engines consume.

Given per-request lengths ``L [bs]`` (request i verifies its first ``L[i]`` of ``B`` slots; slot 1 is
the anchor) and ``K = sum(L)``:

- ``slot_mask`` ``[bs, B]`` bool: ``slot_mask[i, k] = k < L[i]`` (0-based k), a prefix of each row.
- ``gather_indices`` ``[K]`` int64: flat indices ``i * B + k`` of the kept slots into the
  row-major ``[bs, B]`` block, request-major (request 0's slots in order, then request 1's, ...).
  ``block.reshape(bs * B, ...)[gather_indices]`` is the ragged, packed verification input.
- ``num_draft_tokens`` ``[bs]`` int32 ``= L - 1``: drafts each request verifies (the anchor is not a
  draft), the per-request count vLLM's rejection sampler takes.
- ``cu_num_draft_tokens`` ``[bs]`` int32: inclusive cumulative sum of ``num_draft_tokens`` (vLLM's
  ``SpecDecodeMetadata.cu_num_draft_tokens``: request i's drafts are packed at
  ``[cu[i] - num_draft_tokens[i], cu[i])`` of the flat draft-token array).

Everything is computed on the lengths' device from ``K`` known on the host, with no host sync
(``torch.repeat_interleave(..., output_size=K)``). numpy lengths give numpy layouts.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..scores import Array

__all__ = ["SlotLayout", "slot_layout"]


@dataclass(frozen=True)
class SlotLayout:
    """The layouts of one plan (module docstring); same kind and device as the lengths."""

    slot_mask: Array
    gather_indices: Array
    num_draft_tokens: Array
    cu_num_draft_tokens: Array


def slot_layout(lengths: Array, block_size: int, num_tokens: int) -> SlotLayout:
    """Build the :class:`SlotLayout` of per-request lengths.

    Args:
        lengths: ``[bs]`` integer lengths in ``[1, B]`` (numpy array or torch tensor, any device).
        block_size: B.
        num_tokens: ``sum(lengths)`` as a host int (the plan already knows it; passing it avoids a
            device-to-host sync). A wrong value gives wrong ``gather_indices``; it is not re-checked.

    Returns:
        The :class:`SlotLayout`.
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
