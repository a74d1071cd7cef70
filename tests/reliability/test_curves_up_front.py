"""A cost curve that cannot price a step a run will take is refused before the run's first step:
by ``StepCosts.check`` at ``dcut-sim``'s checks, at ``RatioController`` construction (so
``dcut-engine`` before it loads the model), never by a ``plan()`` in the middle of serving."""

from __future__ import annotations

import numpy as np
import pytest

from dcut_sched import CostCurve
from dcut_sched.cli import engine as engine_cli
from dcut_sched.cli import sim as sim_cli
from dcut_sched.controller import RatioController
from dcut_sched.cost_curve import CostCurveError, CostCurveRangeError
from dcut_sched.step_costs import StepCosts
from tests.conftest import linear_curve
from tests.sim.conftest import random_trace

B = 4


def _doc(**rows) -> dict:
    """The linear test curve at bs 1, 2, 4, 8 (B = 4: every token count measured), with ``rows``."""
    doc = linear_curve(batch_sizes=(1, 2, 4, 8), block_size=B).to_dict()
    doc.update(rows)
    return doc


def _k_keyed_low_bs() -> dict:
    """Drafted step_overhead keyed by K, measured at bs 1-2 only: bs 3..8 cannot price a drafted step."""
    return _doc(step_overhead=[{"kind": "drafted", "batch_size": bs, "num_tokens": k, "median_ms": 0.5}
                               for bs in (1, 2) for k in (bs, bs * B)])


def _undrafted_low_bs() -> dict:
    return _doc(step_overhead=[{"kind": "undrafted", "batch_size": bs, "median_ms": 0.5} for bs in (1, 2)])


def _missing_k_bucket() -> dict:
    """At bs 8 the verify cells stop at 24 tokens: dcut's ratio-1.0 bucket (K = 32) is not priced."""
    doc = _doc()
    doc["verify"] = [r for r in doc["verify"] if not (r["batch_size"] == 8 and r["num_tokens"] > 24)]
    return doc


def _negative_between_cells() -> dict:
    """One batch size (4). Drafted residuals -9 ms at K = 4 and -29 ms at K = 16 price those two cells at
    +4 ms, but the convex verify cells (10, 10.5, 30 ms at K = 4, 10, 16) make every budget between
    them cost less than nothing (K = 10: 3 + 10.5 - 19 = -5.5 ms)."""
    return {
        "schema": "dcut.cost-curve/2", "hardware": {"device_name": "test", "backend": "analytic"},
        "model": {"name": "convex-test", "config": {}}, "block_size": B, "context_len": 0,
        "verify": [{"batch_size": 4, "num_tokens": k, "median_ms": ms} for k, ms in ((4, 10.0), (10, 10.5), (16, 30.0))],
        "draft": [{"batch_size": 4, "median_ms": 3.0}],
        "ar": [{"batch_size": 4, "median_ms": 10.0}],
        "step_overhead": [{"kind": "drafted", "batch_size": 4, "num_tokens": 4, "median_ms": -9.0},
                          {"kind": "drafted", "batch_size": 4, "num_tokens": 16, "median_ms": -29.0}],
    }


def _conf(bs: int) -> np.ndarray:
    return np.full((bs, B - 1), 0.6, dtype=np.float32)


def test_a_residual_negative_between_its_cells_was_priced_only_at_them():
    """The cells themselves are positive, so building the step costs passes; the check prices every budget."""
    costs = StepCosts(CostCurve.from_dict(_negative_between_cells()), B)
    assert costs.drafted_ms(4, 4) == pytest.approx(4.0) and costs.drafted_ms(4, 16) == pytest.approx(4.0)
    with pytest.raises(CostCurveError, match=r"a drafted step at batch_size=4, num_tokens=\d+ is priced at -"):
        costs.check([4])
    costs.check([4], drafted=False, plain=True)  # the plain step alone is fine


@pytest.mark.parametrize("doc,policy,needle", [
    (_k_keyed_low_bs, "fine", "drafted step_overhead batch_size=3 is outside"),
    (_k_keyed_low_bs, "dspark", "drafted step_overhead batch_size=3 is outside"),
    (_undrafted_low_bs, "fine", "undrafted step overhead batch_size=3 is outside"),
    (_undrafted_low_bs, "smartspec", "undrafted step overhead batch_size=3 is outside"),
    (_missing_k_bucket, "dcut", "the policy verifies num_tokens=20 at batch_size=5"),
    (_negative_between_cells, "fine", "a drafted step at batch_size=4"),
    (_negative_between_cells, "dspark", "is priced at -"),
], ids=["k-keyed-bs1-2-fine", "k-keyed-bs1-2-dspark", "undrafted-bs1-2-fine", "undrafted-bs1-2-smartspec",
        "missing-k-bucket-dcut", "negative-between-cells-fine", "negative-between-cells-dspark"])
def test_controller_refuses_at_construction_what_plan_would_raise_on(doc, policy, needle):
    curve = CostCurve.from_dict(doc())
    with pytest.raises((CostCurveError, CostCurveRangeError)) as info:
        RatioController(curve, B, policy=policy)
    message = str(info.value)
    assert message.startswith(f"RatioController: policy {policy!r} cannot plan every batch size up to "), message
    assert needle in message, message


def test_what_the_policy_does_not_read_is_not_refused():
    """dspark never prices a step without a draft, dcut only C_verify at its buckets, full no curve."""
    RatioController(CostCurve.from_dict(_undrafted_low_bs()), B, policy="dspark")
    ctrl = RatioController(CostCurve.from_dict(_k_keyed_low_bs()), B, policy="dcut")
    assert ctrl.plan(_conf(8)).num_tokens in (8, 16, 24, 32)
    RatioController(CostCurve.from_dict(_missing_k_bucket()), B, policy="full")


def test_max_batch_size_bounds_the_check():
    """A controller that never plans above bs 2 serves on rows measured at bs 1-2; one that can
    plan bs 3 is refused, naming it."""
    curve = CostCurve.from_dict(_undrafted_low_bs())
    ctrl = RatioController(curve, B, policy="fine", max_batch_size=2)
    assert ctrl.plan(_conf(2)).batch_size == 2
    with pytest.raises(CostCurveRangeError, match="every batch size up to 3 .*batch_size=3"):
        RatioController(curve, B, policy="fine", max_batch_size=3)
    with pytest.raises(CostCurveRangeError, match="batch_size=9 is outside the measured batch sizes 1..8"):
        RatioController(CostCurve.from_dict(_doc()), B, policy="fine", max_batch_size=16)
    for bad in (0, 2.5, True):
        with pytest.raises(ValueError, match="max_batch_size="):
            RatioController(curve, B, policy="fine", max_batch_size=bad)


@pytest.mark.parametrize("block_size", [1, 0, -3])
def test_block_size_below_two_is_refused_at_construction(block_size):
    """B = 1 has no draft slot: refused with the reason, not by numpy in every plan()."""
    with pytest.raises(ValueError, match=rf"block_size={block_size} leaves no draft slot.*block size >= 2"):
        RatioController(None, block_size, policy="full")


@pytest.mark.parametrize("doc,batch_sizes,needle", [
    (_k_keyed_low_bs, "4", "drafted step_overhead batch_size=4 is outside"),
    (_undrafted_low_bs, "4", "undrafted step overhead batch_size=4 is outside"),
    (_missing_k_bucket, "8", "at batch_size=8 it covers num_tokens 8..24, not 8..32"),
    (_negative_between_cells, "4", "a drafted step at batch_size=4"),
], ids=["k-keyed-bs1-2", "undrafted-bs1-2", "missing-k-bucket", "negative-between-cells"])
def test_dcut_sim_refuses_before_its_first_step(tmp_path, capsys, doc, batch_sizes, needle):
    trace, cost = tmp_path / "t.parquet", tmp_path / "c.json"
    random_trace(num_requests=6, block_size=B, max_len=20, seed=2).save(trace)
    CostCurve.from_dict(doc()).save(cost)
    out = tmp_path / "r.csv"
    rc = sim_cli.main(["--trace", str(trace), "--cost", str(cost), "--batch-sizes", batch_sizes, "--steps", "30",
                       "--warmup", "5", "--policies", "ar,fine,dcut", "--out", str(out)])
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert rc == 2 and len(lines) == 1, captured.err
    assert lines[0].startswith(f"dcut-sim: error: batch size {batch_sizes} cannot be simulated: cost curve "), lines[0]
    assert needle in lines[0]
    assert "runs" not in captured.err and captured.out == ""  # no size line, no table: nothing ran
    assert not out.exists()


def test_dcut_sim_open_loop_checks_every_batch_size_down_to_one(tmp_path, capsys):
    trace, cost = tmp_path / "t.parquet", tmp_path / "c.json"
    random_trace(num_requests=6, block_size=B, max_len=20, seed=2).save(trace)
    doc = _doc(step_overhead=[{"kind": "undrafted", "batch_size": bs, "median_ms": 0.5} for bs in (2, 8)])
    CostCurve.from_dict(doc).save(cost)
    rc = sim_cli.main(["--trace", str(trace), "--cost", str(cost), "--mode", "open", "--batch-sizes", "8",
                       "--requests", "20", "--policies", "ar,fine", "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and "batch size 1 cannot be simulated (open loop: the batch size varies over 1..8" in err, err
    assert "undrafted step overhead batch_size=1 is outside" in err


def test_dcut_engine_refuses_the_curve_before_loading_the_model(tmp_path, capsys, monkeypatch):
    from dcut_sched.model import LlamaModel

    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded before the cost curve was checked")

    monkeypatch.setattr(LlamaModel, "from_smollm2", no_load)
    cost = tmp_path / "c.json"
    CostCurve.from_dict(_undrafted_low_bs()).save(cost)
    rc = engine_cli.main(["--policy", "fine", "--cost", str(cost), "--block-size", str(B), "--batch-size", "4"])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1, err
    assert lines[0].startswith("dcut-engine: error: --cost: RatioController: policy 'fine' cannot plan every batch "
                               "size up to 4 on this curve: cost curve "), lines[0]
    assert "undrafted step overhead batch_size=3 is outside" in lines[0]


def test_shipped_curves_pass_every_check():
    """The shipped profiles serve every policy at every batch size they measured."""
    from pathlib import Path

    from dcut_sched import policies

    folder = Path(__file__).resolve().parents[2] / "dcut_sched" / "profiler" / "profiles"
    for path in sorted(folder.glob("*.json")):
        curve = CostCurve.load(path, check_hardware=False)
        for name in policies.names():
            if name != "oracle":
                RatioController(curve, curve.block_size, policy=name)
        StepCosts(curve, curve.block_size).check(range(1, curve.batch_sizes[-1] + 1), plain=True, every_budget=True)


def test_vllm_plugin_checks_the_curve_up_to_max_num_seqs(tmp_path):
    """The plugin's controller is checked for 1..max_num_seqs (no vLLM needed to build it)."""
    from types import SimpleNamespace

    from dcut_sched.integrations.vllm.config import DCutConfigError, DCutVllmConfig
    from dcut_sched.integrations.vllm.startup import build_controller

    path = tmp_path / "c.json"
    CostCurve.from_dict(_undrafted_low_bs()).save(path)
    cfg = DCutVllmConfig.from_mapping({"policy": "fine", "cost_curve": str(path)}, "additional_config['dcut']")

    def vllm_config(max_num_seqs: int):
        return SimpleNamespace(scheduler_config=SimpleNamespace(max_num_seqs=max_num_seqs))

    assert build_controller(cfg, vllm_config(2), B).policy.name == "fine"
    with pytest.raises(DCutConfigError) as info:
        build_controller(cfg, vllm_config(4), B)
    message = str(info.value)
    assert message.startswith(f"additional_config['dcut']: cost curve {path} cannot serve batch sizes up to "
                              f"max_num_seqs 4 (RatioController: policy 'fine' cannot plan every batch size up to 4")
    assert "undrafted step overhead batch_size=3 is outside" in message
    assert message.endswith("; profile up to max_num_seqs or lower max_num_seqs")


def test_vllm_plugin_names_allowed_num_tokens_that_leave_no_budget():
    """``policy_params.allowed_num_tokens`` (e.g. vLLM's capture sizes) that leave some batch size no budget
    is a start-up config error naming the params, not a raw ValueError at the first step; the controller
    itself refuses them when it is built."""
    from pathlib import Path
    from types import SimpleNamespace

    from dcut_sched.integrations.vllm.config import DCutConfigError, DCutVllmConfig
    from dcut_sched.integrations.vllm.startup import build_controller

    h20 = Path(__file__).resolve().parents[2] / "dcut_sched" / "profiler" / "profiles" / "h20-qwen3-8b-published.json"
    cfg = DCutVllmConfig.from_mapping({"policy": "fine", "cost_curve": str(h20), "calibrate": False,
                                       "policy_params": {"allowed_num_tokens": [8]}}, "additional_config['dcut']")
    vllm_config = SimpleNamespace(scheduler_config=SimpleNamespace(max_num_seqs=16))
    with pytest.raises(DCutConfigError) as info:
        build_controller(cfg, vllm_config, 16)
    message = str(info.value)
    assert message.startswith("additional_config['dcut']: 'policy_params' {'allowed_num_tokens': [8]} cannot plan "
                              "every batch size up to max_num_seqs 16 (RatioController: policy 'fine' cannot plan "
                              "batch size 9 <= 16: fine: no candidate budget for batch_size=9"), message
    assert message.endswith("give token counts that cover [bs, bs*16] at every batch size, or lower max_num_seqs")


def test_controller_refuses_allowed_num_tokens_that_leave_a_batch_size_no_budget():
    curve = linear_curve()  # bs 1..8, B = 4
    with pytest.raises(ValueError, match=r"policy 'fine' cannot plan batch size 3 <= 8: fine: no candidate budget "
                                         r"for batch_size=3"):
        RatioController(curve, 4, "fine", calibrate=False, max_batch_size=8, allowed_num_tokens=[1, 2, 16, 32])
    # counts that meet every batch size's range [bs, 4 bs] are kept
    ctrl = RatioController(curve, 4, "fine", calibrate=False, max_batch_size=8, allowed_num_tokens=[2, 4, 8, 16, 32])
    assert ctrl.policy.candidates(3, 4, ctrl.costs).tolist() == [4, 8]
