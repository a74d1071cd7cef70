"""The online controller (docs/controller.md): per-step plans (:class:`RatioController` over the
:class:`StepDriver` the simulator runs too), their token layouts, request bookkeeping
(:class:`RequestBatch`) and the CUDA-graph bank. Names are imported on first use (PEP 562), so the
simulator imports :mod:`.step_driver` without loading torch.
"""

from __future__ import annotations

from ..util._lazy import lazy_exports

# public name -> submodule that defines it
_EXPORTS: dict[str, str] = {
    "ControllerPlan": ".controller",
    "RatioController": ".controller",
    "GraphCells": ".step_driver",
    "StepDriver": ".step_driver",
    "restrict_to_graph_cells": ".step_driver",
    "VerifyGraphBank": ".graph_bank",
    "cells_from_curve": ".graph_bank",
    "DraftDepth": ".request_batch",
    "SlotLayout": ".layouts",
    "slot_layout": ".layouts",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)
