"""SimConfig: one validated object of every simulation option."""

from __future__ import annotations

import json
import pickle
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from dcut_sched import OnlineCalibrator, policies
from dcut_sched.cli import sim as cli
from dcut_sched.simulator import SimConfig, SimulationError, simulate, sweep
from dcut_sched.simulator.sweep import sweep_job

from .conftest import random_trace


@pytest.mark.parametrize("field, value, message", [
    ("overhead_ms", float("nan"), r"overhead_ms=nan must be a finite number >= 0"),
    ("overhead_ms", -1.0, r"overhead_ms=-1.0 must be a finite number >= 0"),
    ("draft_scale", 0.0, r"draft_scale=0.0 must be a finite number > 0"),
    ("draft_scale", float("inf"), r"draft_scale=inf"),
    ("mode", "half-open", r"mode 'half-open' must be one of"),
    ("batch_sizes", [], r"no batch sizes given"),
    ("batch_sizes", [4, 4], r"batch sizes \[4, 4\] repeat a value"),
    ("batch_sizes", [0], r"batch size 0 must be a positive integer"),
    ("batch_sizes", [2.5], r"batch size 2.5 must be a positive integer"),
    ("num_steps", 0, r"num_steps=0 must be an integer >= 1"),
    ("warmup_steps", 1500, r"need 0 <= warmup_steps \(1500\) < num_steps \(1500\)"),
    ("seed", -1, r"seed=-1 must be an integer >= 0"),
    ("graph_token_counts", [], r"graph_token_counts=\[\] must be a non-empty list"),
    ("rate_rps", -2.0, r"rate_rps=-2.0 must be a finite number > 0"),
    ("load", 0.0, r"load=0.0 must be"),
    ("num_requests", 0, r"num_requests=0 must be an integer >= 1"),
    ("prompt_len", 0, r"prompt_len=0 must be an integer >= 1"),
    ("prefill_ms", -1.0, r"prefill_ms=-1.0"),
    ("slo_tpot_ms", 0.0, r"slo_tpot_ms=0.0"),
])
def test_bad_values_name_the_field(field, value, message):
    with pytest.raises(SimulationError, match=message):
        SimConfig(**{field: value})


def test_normalised_once():
    cfg = SimConfig(batch_sizes=[np.int64(4), 8], overhead_ms=1, graph_token_counts=[32, 8, 8, 16],
                    policies=["dcut", ("uniform", {"rho": 0.5})])
    assert cfg.batch_sizes == (4, 8) and type(cfg.batch_sizes[0]) is int
    assert cfg.overhead_ms == 1.0 and isinstance(cfg.overhead_ms, float)
    assert cfg.graph_token_counts == (8, 16, 32)
    assert cfg.open_warmup_requests == 40  # 10 % of the default 400 arrivals
    assert cfg.replace(warmup_requests=3).open_warmup_requests == 3
    with pytest.raises(SimulationError, match="overhead_ms"):
        cfg.replace(overhead_ms=-0.5)  # replace validates again


def test_dict_round_trip_through_json():
    cal = OnlineCalibrator(16, num_bins=10, depth_bands=(1, 4))
    cfg = SimConfig(policies=["fine", policies.get("uniform", rho=0.25)], policy_params={"fine": {"granularity": 2}},
                    batch_sizes=(4, 16), mode="open", seed=3, overhead_ms=0.2, calibrator=cal,
                    graph_token_counts=(16, 64), rate_rps=5.0, prompt_len=32)
    doc = json.loads(json.dumps(cfg.to_dict()))
    assert doc["policies"][1] == ["uniform", {"rho": 0.25}]
    assert doc["calibrator"]["num_bins"] == 10
    back = SimConfig.from_dict(doc)
    assert back.to_dict() == doc
    assert isinstance(back.calibrator, OnlineCalibrator) and back.calibrator.params() == cal.params()
    assert back.replace(calibrator=None) == cfg.replace(policies=back.policies, calibrator=None)
    assert SimConfig.from_dict({"calibrator": True}).calibrator.params()["num_bins"] == 20


def test_from_dict_rejects_unknown_keys():
    with pytest.raises(SimulationError, match=r"SimConfig has no field 'steps'; fields: policies, "):
        SimConfig.from_dict({"steps": 10})


def test_pickles_as_one_object():
    cfg = SimConfig(policies=[policies.get("dcut")], calibrator=OnlineCalibrator(4), batch_sizes=(2,))
    back = pickle.loads(pickle.dumps(cfg))
    assert back.to_dict() == cfg.to_dict()


@pytest.fixture
def inputs(tmp_path, make_curve):
    trace = random_trace(num_requests=6, block_size=4, max_len=20, seed=4)
    tp, cp = tmp_path / "t.parquet", tmp_path / "c.json"
    trace.save(tp)
    make_curve(block_size=4).save(cp)
    return str(tp), str(cp)


def test_simulate_takes_a_config_or_its_keywords(inputs):
    trace, cost = inputs
    kwargs = dict(policies=["dcut", "fine"], batch_sizes=[2, 4], num_steps=40, warmup_steps=5, seed=2)
    by_kwargs = simulate(trace, cost, **kwargs)
    by_config = simulate(trace, cost, SimConfig(**kwargs))
    over = simulate(trace, cost, SimConfig(**kwargs, overhead_ms=3.0), overhead_ms=0.0)  # keywords win
    for df in (by_config, over):
        assert df["tokens_per_s"].tolist() == by_kwargs["tokens_per_s"].tolist()
    with pytest.raises(SimulationError, match="overhead_ms=nan"):
        simulate(trace, cost, overhead_ms=float("nan"), batch_sizes=[2])


def test_sweep_ships_the_config(inputs):
    trace, cost = inputs
    cfg = SimConfig(policies=["dcut"], num_steps=30, warmup_steps=5)
    with ThreadPoolExecutor(2) as pool:
        df = sweep([trace], [cost], [2, 4], cfg, executor=pool)
    one = simulate(trace, cost, cfg.replace(batch_sizes=(4,)))
    assert df[df.batch_size == 4]["tokens_per_s"].tolist() == one["tokens_per_s"].tolist()
    # a job also accepts the dict form (e.g. from a job file)
    job = sweep_job(trace, cost, 4, cfg.to_dict())
    assert job["tokens_per_s"].tolist() == one["tokens_per_s"].tolist()


def test_cli_builds_one_config(inputs, capsys, tmp_path):
    trace, cost = inputs
    out = tmp_path / "seeds.csv"
    # --seeds with --policies all (rejected as an unknown policy 'all' before the CLI built one config)
    rc = cli.main(["--trace", trace, "--cost", cost, "--batch-sizes", "2", "--steps", "20", "--warmup", "2",
                   "--seeds", "2", "--policies", "all", "--quiet", "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    rc = cli.main(["--trace", trace, "--cost", cost, "--batch-sizes", "2", "--steps", "20", "--warmup", "2",
                   "--policies", "fine", "--graph-tokens", "2,4,6", "--quiet", "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    rc = cli.main(["--trace", trace, "--cost", cost, "--batch-sizes", "2", "--steps", "20", "--warmup", "2",
                   "--policies", "full", "--graph-tokens", "2,4,6", "--quiet"])
    err = capsys.readouterr().err  # refused before any run, naming the flag and the range
    assert rc == 2 and "--graph-tokens 2,4,6: at batch size 2 policy full can verify up to 8 tokens" in err, err
