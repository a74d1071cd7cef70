"""Step times of the simulated engine: :class:`dcut_sched.step_costs.StepCosts` (the one owner).

Kept as an import path for the simulator; the class lives in :mod:`dcut_sched.step_costs` so that
policies and the online controller use the same step times without importing the simulator.
"""

from __future__ import annotations

from ..step_costs import StepCosts, step_costs

__all__ = ["StepCosts", "step_costs"]
