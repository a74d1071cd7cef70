"""CUDA-graph capture and replay timing for ``dcut-profile --gpu``.

One graph per cell (verification forward, plain decode step, draft step), captured with
:func:`dcut_sched.graph_capture.capture_graph` (the routine the engine's ``VerifyGraphBank`` uses), each a *full* graph of the
whole step (the plain decode cell is thus a captured full CUDA graph of the one-token step, the path
serving engines run without speculation), captured largest first into one shared memory pool (later, smaller graphs reuse
the pool's blocks, as serving engines do), each after two eager warm-up calls on a side stream
(lazy cuBLAS/attention initialisation must not happen inside a capture). A replay is timed with a
pair of CUDA events around ``graph.replay()`` on the current stream; all events of a cell are read
after one ``synchronize``. Outputs of different graphs may share pool memory: fine here, nothing
reads them.

The module imports without CUDA; :func:`require_cuda` raises :class:`NoCudaError` with a clear
message when ``--gpu`` is asked for on a machine without it. The ``cuda`` argument of
:class:`GraphTimer` defaults to ``torch.cuda``; tests pass a stand-in to exercise the capture logic on
CPU-only machines.
"""

from __future__ import annotations

import subprocess
from typing import Any, Callable, Sequence

import numpy as np
import torch

from dcut_sched.graph_capture import capture_graph

from .grid import Cell
from .harness import NoCudaError, is_oom

__all__ = ["GraphTimer", "NoCudaError", "cuda_hardware", "require_cuda"]


def require_cuda() -> None:
    """Raise :class:`NoCudaError` unless ``torch.cuda.is_available()``."""
    if not torch.cuda.is_available():
        build = torch.version.cuda or "none (CPU-only build)"
        raise NoCudaError(
            f"--gpu needs a CUDA device, but torch {torch.__version__} sees none (torch CUDA version: {build}); "
            f"use --cpu for this machine's CPU or --analytic --device NAME for a roofline curve")


def _driver_version() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10, check=True)
        return out.stdout.strip().splitlines()[0] or None
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def cuda_hardware(backend: str) -> dict[str, Any]:
    """GPU name, driver, CUDA and torch versions of the current device (``require_cuda`` first)."""
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return {
        "device_name": torch.cuda.get_device_name(),
        "backend": backend,
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "driver_version": _driver_version(),
        "memory_gb": round(props.total_memory / 1e9, 1),
        "compute_capability": f"{props.major}.{props.minor}",
    }


class GraphTimer:
    """Capture one CUDA graph per cell, then time replays with CUDA events.

    Args:
        workload: object with ``fn_for(cell) -> callable`` (the callables are captured).
        cuda: the ``torch.cuda`` module, or a stand-in with the same names (tests).
        capture_warmups: eager calls on a side stream before each capture.
    """

    def __init__(self, workload: Any, cuda: Any = None, capture_warmups: int = 2):
        self.workload = workload
        self.cuda = cuda if cuda is not None else torch.cuda
        self.capture_warmups = capture_warmups
        self.graphs: dict[Cell, Any] = {}
        # The captured callables own the static input tensors the graphs read; keep them alive.
        self.fns: dict[Cell, Callable[[], Any]] = {}
        self.pool: Any = None
        self.capture_order: list[Cell] = []

    def prepare(self, cells: Sequence[Cell], progress: Callable[[Cell], None] | None = None) -> dict[Cell, str]:
        """Capture every cell's graph, largest first, into one pool.

        Returns:
            ``{cell: reason}`` for cells whose capture ran out of memory (they are then skipped).
        """
        cuda = self.cuda
        if self.pool is None:
            self.pool = cuda.graph_pool_handle()
        failed: dict[Cell, str] = {}
        for cell in sorted(cells, key=lambda c: (c.size(), c.kind, c.batch_size), reverse=True):
            try:
                fn = self.workload.fn_for(cell)
                graph, _ = capture_graph(fn, pool=self.pool, warmup_iters=self.capture_warmups, cuda=cuda)
            except Exception as exc:  # noqa: BLE001 - only OOM is tolerated
                if not is_oom(exc):
                    raise
                failed[cell] = f"out of memory during capture: {str(exc).splitlines()[0][:120]}"
                self.release_memory()
            else:
                self.graphs[cell] = graph
                self.fns[cell] = fn
                self.capture_order.append(cell)
            if progress is not None:
                progress(cell)
        cuda.synchronize()
        return failed

    def release_memory(self) -> None:
        """Return cached blocks to the driver after an out-of-memory error."""
        self.cuda.synchronize()
        self.cuda.empty_cache()

    def time(self, cell: Cell, warmups: int, repeats: int) -> np.ndarray:
        """Replay ``cell``'s graph ``warmups`` times, then time ``repeats`` replays (ms each)."""
        cuda = self.cuda
        graph = self.graphs[cell]
        for _ in range(warmups):
            graph.replay()
        starts = [cuda.Event(enable_timing=True) for _ in range(repeats)]
        ends = [cuda.Event(enable_timing=True) for _ in range(repeats)]
        for s, e in zip(starts, ends):
            s.record()
            graph.replay()
            e.record()
        cuda.synchronize()
        return np.array([s.elapsed_time(e) for s, e in zip(starts, ends)], dtype=np.float64)
