"""dcut-sched: batch-aware verification budgets for block speculative decoding (D-Cut).

The pure core (scores, selection, policies) works on numpy arrays and torch tensors alike; the cost
curve, traces, simulator and online controller are thin layers over it. See ``docs/design.md`` for
terms and formulas and README.md for the tools.
"""

from . import policies, simulator
from .calibration import OnlineCalibrator
from .controller import ControllerPlan, RatioController, VerifyGraphBank
from .cost_curve import CostCurve, CostCurveError, CostCurveRangeError
from .policies import Policy, VerifyPlan
from .scores import ScoreRanking, check_confidences, expected_tokens, global_topk, slot_scores
from .simulator import SimulationError, selection_curve, simulate, sweep

__version__ = "0.1.0"

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
