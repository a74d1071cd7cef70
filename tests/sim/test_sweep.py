"""Sweeps run simulate per (trace, curve, batch size) on any concurrent.futures executor."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from dcut_sched.simulator import SimulationError, simulate, sweep

from .conftest import random_trace


@pytest.fixture
def paths(tmp_path, make_curve):
    t1, t2 = tmp_path / "a.parquet", tmp_path / "b.parquet"
    random_trace(num_requests=5, block_size=4, max_len=15, seed=1).save(t1)
    random_trace(num_requests=5, block_size=4, max_len=15, seed=2).save(t2)
    c = tmp_path / "c.json"
    make_curve(block_size=4).save(c)
    return [str(t1), str(t2)], [str(c)]


def test_sweep_matches_simulate(paths):
    traces, costs = paths
    with ThreadPoolExecutor(2) as pool:
        df = sweep(traces, costs, [2, 4], executor=pool, policies=["dcut"], num_steps=30, warmup_steps=5)
    assert len(df) == 2 * 1 * 2 * 2
    assert list(df.columns[:4]) == ["trace", "cost", "policy", "batch_size"]
    one = simulate(traces[1], costs[0], policies=["dcut"], batch_sizes=[4], num_steps=30, warmup_steps=5)
    got = df[(df.trace == traces[1]) & (df.batch_size == 4)].reset_index(drop=True)
    assert got["tokens_per_s"].tolist() == one["tokens_per_s"].tolist()
    assert got["speedup_vs_ar"].tolist() == one["speedup_vs_ar"].tolist()


def test_sweep_checks_everything_first(paths):
    traces, costs = paths
    with pytest.raises(SimulationError, match="batch size 16"):
        sweep(traces, costs, [2, 16], jobs=1, num_steps=30, warmup_steps=5)
