"""Packing ragged verification prefixes into the dense ``[rows, T]`` input the model's forward takes.

Request i verifies ``L[i]`` slots (its anchor and ``L[i]-1`` drafts). Padding every request to
``max(L)`` costs ``bs * max(L)`` token-forwards, which throws away what a global top-K saves when
one request gets a long prefix and the rest short ones. Instead a request's slots may be split over
several consecutive rows that all point at the request's KV-cache row (``batch_index``): the forward
writes every token's K/V before attention, and a query sees every slot at or before its position, so
a later chunk attends to the earlier chunk's keys exactly as if they were one row. With rows of ``T``
tokens a request needs ``ceil(L[i] / T)`` rows; :func:`pack_rows` picks the ``T`` that minimises the
padded size ``rows * T`` (fewer rows on ties). ``T = max(L)`` is the plain padded layout, so packing
is never larger than padding; a balanced plan packs to ``[bs, ceil(K / bs)]``, the shape the profiler
times for the cell ``(bs, K)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

__all__ = ["RowPacking", "pack_rows"]


@dataclass(frozen=True)
class RowPacking:
    """Rows of one packed verification forward.

    Attributes:
        tokens_per_row: T.
        request: ``[rows]`` index (into the step's requests) each row belongs to.
        start: ``[rows]`` first slot (0-based, within the request's verified slots) of each row.
        length: ``[rows]`` real slots in each row (the rest of the row is padding).
    """

    tokens_per_row: int
    request: list[int]
    start: list[int]
    length: list[int]

    @property
    def num_rows(self) -> int:
        return len(self.request)

    @property
    def padded_tokens(self) -> int:
        """``rows * T``: token-forwards the packed input costs."""
        return self.num_rows * self.tokens_per_row


def pack_rows(lengths: Sequence[int]) -> RowPacking:
    """Split each request's ``lengths[i]`` slots into rows of T tokens, T minimising ``rows * T``.

    Args:
        lengths: per-request slot counts, each >= 1.

    Returns:
        The :class:`RowPacking`; rows are ordered by request, then by slot.

    Raises:
        ValueError: an empty batch or a length < 1.
    """
    lengths = [int(x) for x in lengths]
    if not lengths or min(lengths) < 1:
        raise ValueError(f"pack_rows: need a non-empty batch of lengths >= 1; got {lengths}")
    best = None
    for t in range(1, max(lengths) + 1):
        rows = sum(math.ceil(n / t) for n in lengths)
        key = (rows * t, rows)
        if best is None or key < best[0]:
            best = (key, t)
    t = best[1]
    request, start, length = [], [], []
    for i, n in enumerate(lengths):
        for s in range(0, n, t):
            request.append(i)
            start.append(s)
            length.append(min(t, n - s))
    return RowPacking(t, request, start, length)
