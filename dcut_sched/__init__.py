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

__all__ = [
    "ControllerPlan",
    "CostCurve",
    "CostCurveError",
    "CostCurveRangeError",
    "OnlineCalibrator",
    "Policy",
    "RatioController",
    "ScoreRanking",
    "VerifyGraphBank",
    "VerifyPlan",
    "check_confidences",
    "expected_tokens",
    "global_topk",
    "policies",
    "slot_scores",
]
