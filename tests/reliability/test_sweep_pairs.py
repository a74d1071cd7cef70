"""A sweep pairs every ``--trace`` with every ``--cost``; a pair that cannot run (a B = 16 trace
beside B = 8 curves) is one line naming that trace and that curve: it named only the curve and "not 16",
leaving the user to find which trace it meant."""

from __future__ import annotations

from pathlib import Path

import pytest

from dcut_sched.cli import sim
from dcut_sched.simulator import sweep

ROOT = Path(__file__).resolve().parents[2]
TRACES = ROOT / "dcut_sched" / "data" / "traces"
B8, B16 = TRACES / "smollm2-135m-skip14-15-b8.parquet", TRACES / "smollm2-135m-skip14-15-b16.parquet"
COST = ROOT / "dcut_sched" / "profiler" / "profiles" / "cpu-smollm2-135m-b8.json"


def test_a_sweep_pair_that_cannot_run_names_the_trace_and_the_curve(tmp_path, capsys):
    out = tmp_path / "r.csv"
    status = sim.main(["--sweep", "--trace", str(B8), "--trace", str(B16), "--cost", str(COST), "--batch-sizes", "2",
                       "--steps", "20", "--warmup", "2", "--policies", "ar,full", "--quiet", "--jobs", "1",
                       "--out", str(out)])
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1, err
    assert f"--trace {B16} with --cost {COST} cannot run: " in err
    assert "measured for block size 8, not 16" in err
    assert not out.exists()


def test_the_library_sweep_names_the_pair_too():
    with pytest.raises(ValueError, match=rf"trace {B16} \(B = 16\) with cost curve {COST} cannot run: .*not 16"):
        sweep([str(B8), str(B16)], [str(COST)], [2], None, jobs=1, num_steps=20, warmup_steps=2, policies=["ar"])
