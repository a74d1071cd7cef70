"""One CUDA-graph capture: warm the callable up on a side stream, then record one call into a graph.

The single capture routine of the project: :class:`dcut_sched.controller.VerifyGraphBank` (the
engine's verification runtime) and the profiler's ``GraphTimer`` (``dcut-profile --gpu``) both
capture through :func:`capture_graph`, so warm-up, stream handling and memory-pool sharing cannot
drift apart. The recipe is PyTorch's (``torch.cuda.graphs`` docs, "Whole-network capture"): eager
warm-up calls on a side stream (lazy cuBLAS / attention initialisation must not happen inside a
capture), the side stream joined back, then one call inside ``torch.cuda.graph(graph, pool=pool)``.
Capturing several graphs largest first into one pool (``torch.cuda.graph_pool_handle()``) lets the
smaller ones reuse the largest one's blocks, as vLLM and SGLang do for their decode graphs.

The module imports without CUDA; ``cuda`` defaults to ``torch.cuda`` and may be a stand-in with the
same names (``Stream``, ``current_stream``, ``stream``, ``CUDAGraph``, ``graph``) so that callers'
capture logic is testable on CPU.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

__all__ = ["capture_graph"]


def capture_graph(fn: Callable[[], Any], *, pool: Any = None, warmup_iters: int = 2, cuda: Any = None) -> tuple[Any, Any]:
    """Capture one call of ``fn`` into a CUDA graph.

    Args:
        fn: a capturable callable without arguments (fixed shapes, no host syncs); it reads and
            writes only tensors that outlive the graph (the caller keeps them alive).
        pool: memory pool handle shared with other graphs (``torch.cuda.graph_pool_handle()``), or
            ``None`` for a private pool.
        warmup_iters: eager calls on a side stream before the capture (>= 0).
        cuda: the ``torch.cuda`` module (default) or a stand-in with the same names.

    Returns:
        ``(graph, output)``: the captured ``CUDAGraph`` (``graph.replay()`` re-runs it) and what the
        captured call returned (static tensors, rewritten by every replay).

    Raises:
        whatever ``fn`` or the capture raises (e.g. ``torch.cuda.OutOfMemoryError``).
    """
    if cuda is None:
        cuda = torch.cuda
    side = cuda.Stream()
    side.wait_stream(cuda.current_stream())
    with cuda.stream(side):
        for _ in range(int(warmup_iters)):
            fn()
    cuda.current_stream().wait_stream(side)
    graph = cuda.CUDAGraph()
    with cuda.graph(graph, pool=pool):
        out = fn()
    return graph, out
