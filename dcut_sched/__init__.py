"""dcut-sched: batch-aware verification budgets for block speculative decoding (D-Cut).

The pure core (scores, selection, policies) works on numpy arrays and torch tensors alike; the cost
curve, traces, simulator and online controller are thin layers over it. See ``docs/design.md`` for
terms and formulas and README.md for the tools.

Attributes are imported on first use (PEP 562), so ``from dcut_sched import RatioController`` loads
the controller and its pure core only: not the simulator (simpy, pandas, matplotlib) nor the trace
format (pyarrow).
"""

from __future__ import annotations

from .util._lazy import lazy_exports

__version__ = "0.1.0"

# public name -> submodule that defines it
_EXPORTS: dict[str, str] = {
    "ControllerPlan": ".controller",
    "RatioController": ".controller",
    "VerifyGraphBank": ".controller",
    "CalibrationPrior": ".calibration",
    "LogisticCalibrator": ".calibration",
    "OnlineCalibrator": ".calibration",
    "AssumedArWarning": ".cost_curve",
    "CostCurve": ".cost_curve",
    "CostCurveError": ".cost_curve",
    "CostCurveRangeError": ".cost_curve",
    "Policy": ".policies",
    "VerifyPlan": ".policies",
    "ScoreRanking": ".scores",
    "check_confidences": ".scores",
    "expected_tokens": ".scores",
    "global_topk": ".scores",
    "slot_scores": ".scores",
    "SimulationError": ".simulator",
    # the modules that define them: the simulator package also has submodules of these names
    "selection_curve": ".simulator.selection_curve",
    "simulate": ".simulator.simulate",
    "sweep": ".simulator.sweep",
}
_SUBMODULES = ("policies", "simulator")

__all__ = sorted([*_EXPORTS, *_SUBMODULES])


__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS, _SUBMODULES)
