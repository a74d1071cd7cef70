"""StepDriver, the per-step sequence RatioController and the simulator share: the torch path (the one
CUDA tensors take, run here on CPU tensors, which RatioController itself routes to numpy) gives the
numpy path's lengths and counters."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from dcut_sched import OnlineCalibrator, policies
from dcut_sched.controller import GraphCells, RatioController, StepDriver, restrict_to_graph_cells
from dcut_sched.step_costs import StepCosts


@pytest.mark.parametrize("policy", ["fine", "dcut", "smartspec"])
def test_torch_path_matches_numpy_path(make_curve, policy):
    curve = make_curve(batch_sizes=(1, 2, 4, 8), block_size=8, base_ms=5.0, per_token_ms=0.4, draft_base_ms=1.0)
    cal = OnlineCalibrator(8, refit_every=8)
    drivers = {kind: StepDriver(policies.get(policy), StepCosts(curve, 8), 8, calibrator=copy.deepcopy(cal)) for kind in ("np", "pt")}
    rng = np.random.default_rng(0)
    for step in range(40):
        conf = rng.beta(5, 1.5, size=(4, 7)).astype(np.float32)
        if step % 7 == 3:
            conf[1, 2] = np.nan  # sanitised: row 1 becomes zeros
        if step % 11 == 5:
            conf[2, 0] = 1.5
        accept = rng.integers(-1, 9, size=4)  # out of [0, L-1] on purpose: clipped and counted
        got = {}
        for kind, drv in drivers.items():
            c = conf if kind == "np" else torch.from_numpy(conf.copy())
            a = accept if kind == "np" else torch.from_numpy(accept.copy())
            plan = drv.plan(c)
            got[kind] = np.asarray(plan.lengths).tolist()
            drv.observe(a)
        assert got["np"] == got["pt"], step
    m_np, m_pt = drivers["np"].metrics, drivers["pt"].metrics
    assert m_np == pytest.approx(m_pt)
    assert m_np["bad_conf_requests"] == 6 + 4 and m_np["bad_accept_requests"] > 0


def test_graph_cells_padding_rule():
    cells = GraphCells([(4, 8), (4, 16), (8, 16), (8, 64), (4, 16)])
    assert cells.cells == [(4, 8), (4, 16), (8, 16), (8, 64)]
    assert cells.token_counts() == [8, 16, 64] and cells.token_counts(4) == [8, 16]
    assert cells.cell_for(4, 9) == (4, 16)
    assert cells.cell_for(4, 17) == (8, 64)  # no cell at bs 4 holds 17: the next batch size up
    assert cells.cell_for(3, 8) == (4, 8)
    with pytest.raises(ValueError, match="no captured cell holds batch_size=8, num_tokens=65"):
        cells.cell_for(8, 65)
    assert GraphCells.at_batch_sizes([2, 8, 4], [2, 4]).cells == [(2, 2), (2, 4), (2, 8), (4, 4), (4, 8)]


def test_restrict_to_graph_cells_only_touches_a_policy_without_its_own_budgets():
    fine = restrict_to_graph_cells(policies.get("fine"), [16, 32])
    assert fine.params()["allowed_num_tokens"] == (16, 32)
    own = policies.get("fine", allowed_num_tokens=[8])
    assert restrict_to_graph_cells(own, [16, 32]) is own
    dcut = policies.get("dcut")
    assert restrict_to_graph_cells(dcut, [16, 32]) is dcut


def test_controller_with_graph_cells_restricts_and_pads(make_curve):
    curve = make_curve(batch_sizes=(1, 2, 4, 8), block_size=8, base_ms=5.0, per_token_ms=0.4, draft_base_ms=1.0)
    cells = GraphCells.at_batch_sizes([4, 10, 20, 32], [4])
    ctrl = RatioController(curve, 8, policy="fine", graph_bank=cells)
    assert ctrl.policy.params()["allowed_num_tokens"] == (4, 10, 20, 32)
    plan = ctrl.plan(np.full((4, 7), 0.9, dtype=np.float32))
    assert plan.num_tokens in (4, 10, 20, 32) and plan.graph_cell == (4, plan.num_tokens)
    uni = RatioController(curve, 8, policy="uniform", graph_bank=cells, rho=0.25)  # K = 8 -> cell 10
    assert uni.plan(np.full((4, 7), 0.9, dtype=np.float32)).graph_cell == (4, 10)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, ">f4", np.longdouble])
def test_sanitize_fast_path_is_exact(dtype):
    drv = StepDriver(policies.get("ar"), None, 4)
    good = np.array([[0.0, 0.5, 1.0], [-0.0, 1e-3, 0.999]], dtype=dtype)
    assert np.array_equal(drv.sanitize(good), good.astype(good.dtype.newbyteorder("=")))
    assert drv.metrics["bad_conf_requests"] == 0  # -0.0 is in [0, 1]
    for bad in (np.nan, np.inf, -np.inf, -1e-3, 1.001):
        conf = np.array([[0.5, bad, 0.5], [0.2, 0.3, 0.4]], dtype=dtype)
        out = drv.sanitize(conf)
        assert out[0].tolist() == [0.0, 0.0, 0.0] and out[1].tolist() == conf[1].tolist(), bad
