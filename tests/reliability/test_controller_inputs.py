"""``RatioController`` refuses at construction what would fail later: ``smartspec`` on a curve that
cannot price every budget it weighs (its ``plan()`` raised mid-serving, at the first batch size whose
top budgets the curve misses), and a cost curve or calibration prior given as something else (a
path: an ``AttributeError`` from deep inside)."""

from __future__ import annotations

import numpy as np
import pytest

from dcut_sched import CostCurve
from dcut_sched.calibration import CalibrationPrior
from dcut_sched.controller import RatioController
from dcut_sched.cost_curve import CostCurveRangeError
from dcut_sched.policies import get
from tests.conftest import linear_curve

B = 4


def _short_curve() -> CostCurve:
    """bs 1, 2, 4, 8 with every token count measured, except bs 8 stops at 24 of its 32 tokens."""
    doc = linear_curve(batch_sizes=(1, 2, 4, 8), block_size=B).to_dict()
    doc["verify"] = [r for r in doc["verify"] if not (r["batch_size"] == 8 and r["num_tokens"] > 24)]
    return CostCurve.from_dict(doc)


def test_smartspec_weighs_every_budget_bs_2_to_bs_b():
    assert get("smartspec").budgets(3, B).tolist() == [6, 9, 12]
    assert get("smartspec", max_draft_len=1).budgets(3, B).tolist() == [6]


def test_smartspec_is_refused_at_construction_on_a_curve_missing_its_top_budgets():
    with pytest.raises(CostCurveRangeError, match=r"policy 'smartspec' cannot plan every batch size up to 8 .*"
                                                   r"the policy verifies num_tokens=\d+ at batch_size=\d"):
        RatioController(_short_curve(), B, policy="smartspec", max_batch_size=8)


def test_smartspec_plans_every_batch_size_it_was_built_for():
    ctrl = RatioController(_short_curve(), B, policy="smartspec", max_batch_size=4)  # bs 1..4: covered
    for bs in range(1, 5):
        plan = ctrl.plan(np.full((bs, B - 1), 0.6, np.float32))
        ctrl.observe(np.ones(bs, np.int64))
        assert plan.num_tokens % bs == 0 and bs <= plan.num_tokens <= bs * B
    capped = RatioController(_short_curve(), B, policy="smartspec", max_batch_size=8, max_draft_len=2)
    assert capped.plan(np.full((8, B - 1), 0.6, np.float32)).num_tokens <= 24  # k <= 2: budgets 16, 24


@pytest.mark.parametrize("kwargs, needle", [
    ({"cost": "curve.json"}, "cost must be a CostCurve (CostCurve.load(path)) or None, not str"),
    ({"calibration_prior": {"intercepts": [0.0], "slope": 1.0}},
     "calibration_prior must be a CalibrationPrior (CalibrationPrior.load(path)) or None, not dict"),
])
def test_a_curve_or_prior_of_another_type_is_a_type_error(kwargs, needle):
    args = {"cost": linear_curve(batch_sizes=(1, 2, 4, 8), block_size=B), **kwargs}
    with pytest.raises(TypeError) as info:
        RatioController(args.pop("cost"), B, policy="fine", **args)
    assert needle in str(info.value)
    RatioController(None, B, policy="threshold", calibration_prior=CalibrationPrior.identity())  # the right types
