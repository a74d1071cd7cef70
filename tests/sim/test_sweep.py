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


def test_sweep_with_its_own_worker_processes_and_no_jobs_given(paths):
    """``dcut-sim --sweep`` without ``--jobs``: the default pool (os.cpu_count workers, at most one per
    cell) gives the rows of the single-process run."""
    traces, costs = paths
    df = sweep(traces[:1], costs, [2], policies=["dcut"], num_steps=20, warmup_steps=2)
    one = simulate(traces[0], costs[0], policies=["dcut"], batch_sizes=[2], num_steps=20, warmup_steps=2)
    assert df["tokens_per_s"].tolist() == one["tokens_per_s"].tolist()


def test_sweep_checks_everything_first(paths):
    traces, costs = paths
    with pytest.raises(SimulationError, match="batch size 16"):
        sweep(traces, costs, [2, 16], jobs=1, num_steps=30, warmup_steps=5)


def test_sweep_on_a_dask_cluster_matches_local(paths, tmp_path):
    """`--sweep --scheduler dask` on a real (in-process) Dask cluster gives the local sweep's rows."""
    distributed = pytest.importorskip("distributed")
    import pandas as pd

    from dcut_sched.cli.sim import main

    traces, costs = paths
    common = ["--sweep", "--trace", traces[0], "--trace", traces[1], "--cost", costs[0], "--batch-sizes", "2,4",
              "--policies", "dcut,fine", "--steps", "30", "--warmup", "5", "--quiet"]
    local_out, dask_out = tmp_path / "local.csv", tmp_path / "dask.csv"
    assert main(common + ["--jobs", "1", "--out", str(local_out)]) == 0
    # a TCP scheduler (the CLI takes tcp:// addresses only), its worker in this process
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False, protocol="tcp://",
                                  dashboard_address=None) as cluster:
        assert main(common + ["--scheduler", "dask", "--scheduler-address", cluster.scheduler_address,
                              "--out", str(dask_out)]) == 0
    pd.testing.assert_frame_equal(pd.read_csv(local_out), pd.read_csv(dask_out))


def test_dask_scheduler_needs_sweep_and_address(paths, capsys):
    from dcut_sched.cli.sim import main

    traces, costs = paths
    assert main(["--trace", traces[0], "--cost", costs[0], "--scheduler", "dask", "--quiet"]) == 2
    assert "--scheduler-address" in capsys.readouterr().err


def test_dask_executor_names_an_unreachable_scheduler():
    pytest.importorskip("distributed")
    from dcut_sched.simulator import dask_executor

    with pytest.raises(ValueError, match="no Dask scheduler answered at 'tcp://127.0.0.1:9'"):
        with dask_executor("tcp://127.0.0.1:9", timeout_s=1):
            pass
