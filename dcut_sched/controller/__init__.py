"""The online controller: per-step verification plans, their token layouts, and the CUDA-graph bank.

See ``docs/controller.md``. Public names: :class:`RatioController` (plans over the policy registry),
:class:`ControllerPlan`, :class:`StepDriver` (the per-step sequence both the controller and the
simulator run), :class:`GraphCells`, :func:`restrict_to_graph_cells`, :func:`slot_layout` /
:class:`SlotLayout`, :class:`VerifyGraphBank`, :func:`cells_from_curve`, :class:`RequestBatch` (engine-neutral request
bookkeeping: plans by request id, dropped/unplanned accounting, metrics window, step records).

Names are imported on first use (PEP 562): the simulator imports :mod:`.step_driver` (numpy only) without
loading torch through :mod:`.controller`.
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
    "SlotLayout": ".layouts",
    "slot_layout": ".layouts",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)
