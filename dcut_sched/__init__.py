"""dcut-sched: batch-aware verification budgets for block speculative decoding (D-Cut).

The pure core (scores, selection, policies) works on numpy arrays and torch tensors alike; the cost
curve, traces, simulator and online controller are thin layers over it. See ``shared/DESIGN.md`` for
terms and formulas and README.md for the tools.
"""

from . import policies
from .calibration import OnlineCalibrator
from .controller import ControllerPlan, RatioController, VerifyGraphBank
from .cost_curve import CostCurve, CostCurveError, CostCurveRangeError
from .policies import Policy, VerifyPlan
from .scores import ScoreRanking, check_confidences, expected_tokens, global_topk, slot_scores

__version__ = "0.1.0"

# The simulator (simpy, pandas, pyarrow) loads on first use: the controller, the cost curve, the
# policies and the model then import where only numpy, scipy and torch exist (a bare GPU image).
_SIMULATOR_EXPORTS = frozenset({"SimulationError", "selection_curve", "simulate", "sweep"})


def __getattr__(name: str):
    if name == "simulator" or name in _SIMULATOR_EXPORTS:
        import importlib

        simulator = importlib.import_module(f"{__name__}.simulator")
        return simulator if name == "simulator" else getattr(simulator, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "ControllerPlan",
    "CostCurve",
    "CostCurveError",
    "CostCurveRangeError",
    "OnlineCalibrator",
    "Policy",
    "RatioController",
    "ScoreRanking",
    "SimulationError",
    "VerifyGraphBank",
    "VerifyPlan",
    "check_confidences",
    "expected_tokens",
    "global_topk",
    "policies",
    "selection_curve",
    "simulate",
    "simulator",
    "slot_scores",
    "sweep",
]
