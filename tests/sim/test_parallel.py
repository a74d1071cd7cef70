"""Parallel runs give the serial rows exactly (the main job runs with --jobs = the usable cores)."""

from __future__ import annotations

import pickle

import pandas as pd
import pytest

from dcut_sched.simulator import simulate
from dcut_sched.simulator.parallel import run_cells, usable_cores
from dcut_sched.simulator.protocol import simulate_benchmarks

from .conftest import random_trace


def _bytes(df: pd.DataFrame) -> bytes:
    return pickle.dumps((df.to_dict("split"), dict(df.attrs)))


@pytest.fixture
def traces():
    return [random_trace(num_requests=10, block_size=4, seed=s) for s in (1, 2, 3)]


def test_benchmarks_rows_are_identical_for_any_jobs(traces, make_curve):
    curve = make_curve(batch_sizes=(1, 2, 4, 8))
    opts = dict(policies=["full", "dcut", "fine", "uniform"], batch_sizes=[2, 4, 8], num_steps=60, warmup_steps=10)
    progress = []
    serial = simulate_benchmarks(traces, curve, jobs=1, **opts)
    parallel = simulate_benchmarks(traces, curve, jobs=2, on_run=lambda d, t, label: progress.append((d, t)), **opts)
    assert _bytes(serial) == _bytes(parallel)
    assert len(serial) == 3 * 5 * 3  # traces x (ar + 4 policies) x batch sizes
    assert [d for d, _ in progress] == list(range(1, 46)) and {t for _, t in progress} == {45}


def test_simulate_rows_are_identical_for_any_jobs(traces, make_curve):
    curve = make_curve(batch_sizes=(1, 2, 4, 8))
    opts = dict(policies=["full", "dcut"], batch_sizes=[1, 4, 8], num_steps=50, warmup_steps=5)
    assert _bytes(simulate(traces[0], curve, jobs=1, **opts)) == _bytes(simulate(traces[0], curve, jobs=3, **opts))


def test_run_cells_checks_jobs_and_usable_cores():
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="jobs must be an integer >= 1"):
            run_cells([], [], bad)
    assert run_cells([], [], 2) == []
    assert 1 <= usable_cores()
