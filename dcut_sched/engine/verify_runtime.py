"""The engine's verification runtime: the packed target forward, replayed through a VerifyGraphBank.

:func:`~dcut_sched.engine.decode_step.verify_block` packs a step's verified slots into dense
``input_ids / position_ids / cache_slots [rows, T]`` and ``batch_index [rows]``
(:mod:`dcut_sched.engine.packing`) and runs them through :class:`VerifyRuntime`, which holds a
:class:`~dcut_sched.controller.VerifyGraphBank` whose cell ``(rows, rows * T)`` has static buffers
of exactly ``[rows, T]``:

- **CUDA graphs** (default when ``torch.cuda.is_available()`` and the model is on a CUDA device):
  cells at row counts 1, 2, 4, .. up to the largest packing (and that largest count itself), every
  ``T`` in ``1..B``, captured once per :meth:`SpecEngine.generate` run (the cache is allocated per
  run). A packing is padded up to the first cell whose buffers hold it (padded tokens: id 0,
  position 0, cache slot = the engine's scratch slot, cache row 0; no query ever sees the scratch
  slot and padded rows' logits are dropped). Attention spans the whole cache (a captured graph has
  a fixed shape); the causal-by-position mask hides every slot after a query's position, so the
  values are those of the windowed forward up to floating-point summation order. Replays run no
  Python, so torch module hooks on the model do not fire for them.
- **Eager** (CPU, or ``cuda_graphs=False``): cells at every row count ``1..max_rows`` and every
  ``T``, so each packing lands on a cell of its own shape: no padding, and attention over slots
  ``[0, max position + 1)`` exactly as a direct forward. The output is therefore bit-for-bit the
  direct forward's; the bank's copies into its static buffers are the only extra work.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from ..controller.graph_bank import VerifyGraphBank

__all__ = ["VerifyRuntime", "graph_row_counts"]


def graph_row_counts(max_rows: int) -> list[int]:
    """Row counts captured in CUDA-graph mode: powers of two below ``max_rows``, and ``max_rows``.

    Raises:
        ValueError: ``max_rows < 1``.
    """
    if max_rows < 1:
        raise ValueError(f"graph_row_counts: max_rows={max_rows} must be >= 1")
    counts, r = [], 1
    while r < max_rows:
        counts.append(r)
        r *= 2
    return counts + [int(max_rows)]


class VerifyRuntime:
    """Runs the engine's packed verification forward through a :class:`VerifyGraphBank` (module docstring).

    Args:
        model: the target ``LlamaModel``; ``cache``: its KV cache for this run.
        max_rows: the most rows a packing can have (``batch_size * B``: every slot on its own row).
        block_size: B (the longest row).
        scratch_slot: the cache slot padded tokens write.
        cuda_graphs: capture CUDA graphs; ``None`` = when CUDA is available and the model is on it.
        row_counts: row counts of the cells (default: :func:`graph_row_counts` with CUDA graphs,
            every count ``1..max_rows`` eagerly); an eager runtime with the graph row counts pads
            exactly as the CUDA-graph one does (how the padding is tested on CPU).
        capture_layers: target layers whose output hidden states the forward also returns (a
            block drafter's context features; ``LlamaModel.forward``); ``None``: logits only.

    Raises:
        ValueError: ``cuda_graphs=True`` without CUDA (from the bank).
    """

    def __init__(self, model: Any, cache: Any, *, max_rows: int, block_size: int, scratch_slot: int,
                 cuda_graphs: bool | None = None, row_counts: Sequence[int] | None = None,
                 capture_layers: Sequence[int] | None = None):
        dev = model.device
        self.capture_layers = None if capture_layers is None else tuple(int(i) for i in capture_layers)
        if cuda_graphs is None:
            cuda_graphs = torch.cuda.is_available() and dev.type == "cuda"
        self.model, self.cache = model, cache
        self.cuda_graphs = bool(cuda_graphs)
        if row_counts is not None:
            rows = sorted({int(r) for r in row_counts})
        else:
            rows = graph_row_counts(max_rows) if self.cuda_graphs else range(1, int(max_rows) + 1)
        cells = [(r, r * t) for r in rows for t in range(1, int(block_size) + 1)]

        def make_inputs(num_rows: int, num_tokens: int) -> tuple[torch.Tensor, ...]:
            t = num_tokens // num_rows
            ids = torch.zeros(num_rows, t, dtype=torch.long, device=dev)
            return ids, torch.zeros_like(ids), torch.full_like(ids, scratch_slot), \
                torch.zeros(num_rows, dtype=torch.long, device=dev)

        self.bank = VerifyGraphBank(self._forward, cells, make_inputs=make_inputs, enabled=self.cuda_graphs,
                                    pad_values=[0, 0, int(scratch_slot), 0])

    def _forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, cache_slots: torch.Tensor,
                 batch_index: torch.Tensor) -> torch.Tensor:
        # eager: attend over [0, max position + 1), the live window; a graph: the whole cache
        kv_len = None if self.cuda_graphs else int(position_ids.max()) + 1
        return self.model(input_ids, position_ids, self.cache, cache_slots=cache_slots, batch_index=batch_index,
                          kv_len=kv_len, capture_layers=self.capture_layers)

    def __call__(self, input_ids: torch.Tensor, position_ids: torch.Tensor, cache_slots: torch.Tensor,
                 batch_index: torch.Tensor):
        """Logits ``[rows, T, vocab]`` float32 of the packed inputs (``[rows, T]`` int64 each,
        ``batch_index [rows]``); with ``capture_layers`` the pair (logits, features
        ``[rows, T, n * hidden]``). Views into the bank's static outputs in CUDA-graph mode: read
        them before the next call."""
        rows, t = input_ids.shape
        out = self.bank(rows, rows * t, input_ids, position_ids, cache_slots, batch_index)
        if self.capture_layers is None:
            return out[:rows, :t]
        return out[0][:rows, :t], out[1][:rows, :t]

    def __repr__(self) -> str:
        return f"VerifyRuntime({self.bank!r})"
