"""A bank of CUDA graphs of the verification forward, one per ``(batch_size, num_tokens)`` cell, all
captured largest first in one memory pool. A call pads the request up to a captured cell whose
static buffers hold its inputs and replays it; without CUDA the same buffers run ``fn`` eagerly
(same interface, same values). Outputs are static buffers, valid until the next call. Why cells and
the padding rule: docs/controller.md, "VerifyGraphBank".
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Sequence

import torch

from ..graph_capture import capture_graph
from .step_driver import GraphCells

__all__ = ["VerifyGraphBank", "cells_from_curve"]

Cell = tuple[int, int]


def cells_from_curve(curve: Any, batch_sizes: Iterable[int] | None = None) -> list[Cell]:
    """The measured ``(batch_size, num_tokens)`` cells of a :class:`~dcut_sched.CostCurve`
    (optionally only those at ``batch_sizes``), ascending."""
    wanted = None if batch_sizes is None else {int(b) for b in batch_sizes}
    cells = [(int(r.batch_size), int(r.num_tokens)) for r in curve.verify]
    return sorted(c for c in cells if wanted is None or c[0] in wanted)


class VerifyGraphBank:
    """One CUDA graph (or eager call) per verification cell (module docstring).

    ``fn(*inputs)``: the capturable verification (no host syncs, shapes fixed by the cell).
    ``make_inputs(batch_size, num_tokens)``: a cell's static input buffers (valid inputs: warm-up and
    capture run on them; their device decides where ``fn`` runs). ``enabled``: capture graphs
    (``None``: when the largest cell's buffers are on CUDA). ``pad_values``: one scalar or one per input
    (``None``: leave the buffer as it is). ``warmup_iters``: eager calls before each capture.
    ``ValueError`` for no cells, a cell with num_tokens < batch_size, or ``enabled=True`` without CUDA.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        cells: Iterable[Sequence[int]],
        *,
        make_inputs: Callable[[int, int], Sequence[torch.Tensor]],
        enabled: bool | None = None,
        pad_values: Any = 0,
        warmup_iters: int = 2,
    ):
        try:
            self.grid = GraphCells(cells)  # the cells and the padding rule (torch-free, shared with the simulator)
        except ValueError as exc:
            raise ValueError(f"VerifyGraphBank: {exc}") from None
        cell_set = self.grid.cells
        self.fn = fn
        self.make_inputs = make_inputs
        self.cells: list[Cell] = cell_set
        self.pad_values = pad_values
        self.warmup_iters = int(warmup_iters)
        self._inputs: dict[Cell, tuple[torch.Tensor, ...]] = {}
        self._outputs: dict[Cell, Any] = {}
        self._graphs: dict[Cell, Any] = {}
        self.pool = None
        largest = cell_set[-1]
        if enabled is None or enabled:
            self._inputs[largest] = tuple(make_inputs(*largest))
        on_cuda = bool(self._inputs) and all(t.is_cuda for t in self._inputs[largest])
        if enabled is None:
            enabled = torch.cuda.is_available() and on_cuda
        elif enabled and not (torch.cuda.is_available() and on_cuda):
            raise ValueError(
                "VerifyGraphBank: enabled=True needs CUDA and make_inputs returning CUDA tensors; "
                "use enabled=False (eager) on CPU"
            )
        self.enabled = bool(enabled)
        if self.enabled:
            self._capture_all()

    # ------------------------------------------------------------------ cells
    def token_counts(self, batch_size: int | None = None) -> list[int]:
        """Captured token counts (ascending) at ``batch_size``, or of every cell when ``None``."""
        return self.grid.token_counts(batch_size)

    def _candidates(self, batch_size: int, num_tokens: int):
        """Captured cells of batch size >= ``batch_size`` and token count >= ``num_tokens``, in the order of
        :meth:`GraphCells.cell_for`.
        """
        for bs in self.grid.batch_sizes:
            if bs >= int(batch_size):
                for k in self.grid.token_counts(bs):
                    if k >= int(num_tokens):
                        yield bs, k

    def _holds(self, cell: Cell, input_shapes: Sequence[Sequence[int]]) -> bool:
        """Whether ``cell``'s static buffers hold inputs of ``input_shapes`` (each no larger along any dimension)."""
        static = self._static(cell)
        return len(input_shapes) == len(static) and all(
            len(shape) == buf.dim() and all(a <= b for a, b in zip(shape, buf.shape))
            for shape, buf in zip(input_shapes, static))

    def cell_for(self, batch_size: int, num_tokens: int,
                 input_shapes: Sequence[Sequence[int]] | None = None) -> Cell:
        """The captured cell a request of ``(batch_size, num_tokens)`` replays: the padding rule's
        (:meth:`GraphCells.cell_for <dcut_sched.controller.step_driver.GraphCells.cell_for>`, what a plan
        is charged), or with ``input_shapes`` the first cell in that order whose buffers hold them.
        ``ValueError`` when no cell is that large or holds the inputs.
        """
        try:
            first = self.grid.cell_for(batch_size, num_tokens)
        except ValueError as exc:
            raise ValueError(f"VerifyGraphBank: {exc}") from None
        if input_shapes is None or self._holds(first, input_shapes):
            return first
        for cell in self._candidates(batch_size, num_tokens):
            if self._holds(cell, input_shapes):
                return cell
        shapes = [tuple(int(d) for d in s) for s in input_shapes]
        raise ValueError(
            f"VerifyGraphBank: a request with inputs of shapes {shapes} does not fit the static buffers of any "
            f"cell from {first} up (e.g. {[tuple(b.shape) for b in self._static(first)]} at {first}); "
            f"capture cells with longer rows"
        )

    # ------------------------------------------------------------------ capture
    def _capture_all(self) -> None:
        self.pool = torch.cuda.graph_pool_handle()
        for cell in reversed(self.cells):  # largest first: the pool grows once
            inputs = self._static(cell)
            self._graphs[cell], self._outputs[cell] = capture_graph(
                lambda inputs=inputs: self.fn(*inputs), pool=self.pool, warmup_iters=self.warmup_iters)
        torch.cuda.synchronize()

    # ------------------------------------------------------------------ calls
    def _pad_value(self, n: int) -> Any:
        if isinstance(self.pad_values, (list, tuple)):
            return self.pad_values[n]
        return self.pad_values

    def _static(self, cell: Cell) -> tuple[torch.Tensor, ...]:
        """The cell's static input buffers (made by ``make_inputs`` on first use)."""
        static = self._inputs.get(cell)
        if static is None:
            static = self._inputs[cell] = tuple(self.make_inputs(*cell))
        return static

    def _load(self, cell: Cell, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        static = self._static(cell)
        if len(inputs) != len(static):
            raise ValueError(f"VerifyGraphBank: got {len(inputs)} inputs, the cell's buffers take {len(static)}")
        for n, (buf, x) in enumerate(zip(static, inputs)):
            if x.dim() != buf.dim() or any(a > b for a, b in zip(x.shape, buf.shape)):
                raise ValueError(
                    f"VerifyGraphBank: input {n} of shape {tuple(x.shape)} does not fit the static buffer "
                    f"{tuple(buf.shape)} of cell {cell}"
                )
            if tuple(x.shape) != tuple(buf.shape):
                pad = self._pad_value(n)
                if pad is not None:
                    buf.fill_(pad)
            buf[tuple(slice(0, s) for s in x.shape)].copy_(x)
        return static

    def __call__(self, batch_size: int, num_tokens: int, *inputs: torch.Tensor) -> Any:
        """The outputs of ``fn`` for ``(batch_size, num_tokens)`` at the cell :meth:`cell_for` picks for the
        inputs' shapes (each input padded into its buffer); ``ValueError`` if no cell holds them or the
        number of inputs is wrong.
        """
        if len(inputs) != len(self._static(self.cells[-1])):
            raise ValueError(f"VerifyGraphBank: got {len(inputs)} inputs, the cells' buffers take "
                             f"{len(self._static(self.cells[-1]))}")
        cell = self.cell_for(batch_size, num_tokens, [tuple(x.shape) for x in inputs])
        static = self._load(cell, inputs)
        if self.enabled:
            self._graphs[cell].replay()
            return self._outputs[cell]
        return self.fn(*static)

    def __repr__(self) -> str:
        mode = "cuda-graph" if self.enabled else "eager"
        return f"VerifyGraphBank({mode}, cells={len(self.cells)}, batch_sizes={self.grid.batch_sizes})"
