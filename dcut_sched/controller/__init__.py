"""The online controller: per-step verification plans, their token layouts, and the CUDA-graph bank.

See ``docs/controller.md``. Public names: :class:`RatioController` (plans over the policy registry),
:class:`ControllerPlan`, :func:`slot_layout` / :class:`SlotLayout`, :class:`VerifyGraphBank`,
:func:`cells_from_curve`.
"""

from .controller import ControllerPlan, RatioController
from .graph_bank import VerifyGraphBank, cells_from_curve
from .layouts import SlotLayout, slot_layout

__all__ = ["ControllerPlan", "RatioController", "SlotLayout", "VerifyGraphBank", "cells_from_curve", "slot_layout"]
