"""Inputs are sets where a set is meant (a repeated --trace/--cost is refused), and a command's
outputs are replaced all or none, also when a destination refuses its rename at the very end."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from dcut_sched.cli import sim
from dcut_sched.util import atomic
from dcut_sched.util.atomic import all_or_none, atomic_write_text

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "dcut_sched" / "data" / "traces" / "smollm2-135m-skip14-15-b8.parquet"
OTHER_TRACE = ROOT / "dcut_sched" / "data" / "traces" / "smollm2-135m-dflash-b8.parquet"
COST = ROOT / "dcut_sched" / "profiler" / "profiles" / "cpu-smollm2-135m-b8.json"
FAST = ["--batch-sizes", "2", "--steps", "20", "--warmup", "2", "--policies", "ar,full", "--quiet"]


def _digest(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


@pytest.fixture
def inputs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shutil.copy(TRACE, tmp_path / "t.parquet")
    shutil.copy(OTHER_TRACE, tmp_path / "u.parquet")
    shutil.copy(TRACE, tmp_path / "copy.parquet")
    shutil.copy(COST, tmp_path / "c.json")
    (tmp_path / "link.parquet").symlink_to(tmp_path / "t.parquet")
    return tmp_path


@pytest.mark.parametrize("argv,line", [
    (["--sweep", "--trace", "t.parquet", "--trace", "./t.parquet", "--cost", "c.json"],
     "--trace t.parquet and --trace ./t.parquet are the same file; give each trace once"),
    (["--trace", "t.parquet", "--trace", "u.parquet", "--trace", "t.parquet", "--cost", "c.json"],
     "--trace t.parquet is given twice; give each trace once"),
    (["--trace", "t.parquet", "--trace", "link.parquet", "--cost", "c.json"],
     "--trace t.parquet and --trace link.parquet are the same file; give each trace once"),
    (["--sweep", "--trace", "t.parquet", "--cost", "c.json", "--cost", "../" + "{dir}/c.json"],
     "--cost c.json and --cost ../{dir}/c.json are the same file; give each cost curve once"),
    (["--trace", "t.parquet", "--trace", "copy.parquet", "--cost", "c.json"],
     "--trace t.parquet and --trace copy.parquet hold the same bytes (a copy); it would be run and counted twice: "
     "give each trace once"),
], ids=["sweep-dot-slash", "benchmarks-a-b-a", "symlink", "sweep-cost", "copy"])
def test_a_repeated_input_is_refused_with_one_line(inputs, capsys, argv, line):
    argv = [a.replace("{dir}", inputs.name) for a in argv]
    out = inputs / "r.csv"
    status = sim.main([*argv, *FAST, "--jobs", "1", "--out", str(out)])
    err = capsys.readouterr().err
    assert status == 2, err
    assert err.strip().splitlines() == [f"dcut-sim: error: {line.replace('{dir}', inputs.name)}"]
    assert not out.exists()


def test_distinct_traces_still_run_as_a_set(inputs, capsys):
    out = inputs / "r.csv"
    assert sim.main(["--sweep", "--trace", "t.parquet", "--trace", "u.parquet", "--cost", "c.json", *FAST,
                     "--jobs", "1", "--out", str(out)]) == 0
    import pandas as pd

    rows = pd.read_csv(out)
    assert sorted(rows["trace"].unique()) == ["t.parquet", "u.parquet"]
    assert len(rows) == 2 * 2  # 2 traces x (ar, full) x 1 batch size: each once


def _refuse_replace_of(monkeypatch, victim: Path):
    """``os.replace`` in dcut_sched.util.atomic fails for ``victim`` as an immutable file would."""
    real = os.replace

    def replace(src, dst):
        if Path(dst) == victim:
            raise PermissionError(1, "Operation not permitted")
        return real(src, dst)

    monkeypatch.setattr(atomic.os, "replace", replace)


def test_commit_puts_back_what_it_renamed_when_a_later_rename_fails(tmp_path, monkeypatch):
    a, b, c = tmp_path / "a.txt", tmp_path / "b.txt", tmp_path / "sub" / "c.txt"
    a.write_text("old a")
    b.write_text("old b")
    _refuse_replace_of(monkeypatch, b)
    with pytest.raises(OSError, match=rf"cannot write {b}: Operation not permitted; no output was changed"):
        with all_or_none():
            atomic_write_text(a, "new a")
            atomic_write_text(c, "new c")  # a new file in a new folder: removed again
            atomic_write_text(b, "new b")
    assert a.read_text() == "old a" and b.read_text() == "old b"
    assert not c.exists() and not c.parent.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.txt"]  # no temp or kept file left


def test_commit_keeps_a_symlink_destination_as_it_was(tmp_path, monkeypatch):
    target, link, b = tmp_path / "target.txt", tmp_path / "link.txt", tmp_path / "b.txt"
    target.write_text("target")
    link.symlink_to(target)
    b.write_text("old b")
    _refuse_replace_of(monkeypatch, b)
    with pytest.raises(OSError, match="no output was changed"):
        with all_or_none():
            atomic_write_text(link, "new")
            atomic_write_text(b, "new b")
    assert link.is_symlink() and os.readlink(link) == str(target) and target.read_text() == "target"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.txt", "link.txt", "target.txt"]


def test_commit_that_succeeds_leaves_only_the_outputs(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("old a")
    with all_or_none():
        atomic_write_text(a, "new a")
        atomic_write_text(b, "new b")
    assert a.read_text() == "new a" and b.read_text() == "new b"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.txt"]


def test_sim_out_is_kept_when_the_plot_cannot_be_replaced(inputs, capsys, monkeypatch):
    out, plot = inputs / "r.csv", inputs / "p.png"
    out.write_text("the previous table\n")
    plot.write_bytes(b"the previous plot")
    _refuse_replace_of(monkeypatch, plot)
    status = sim.main(["--trace", "t.parquet", "--cost", "c.json", *FAST, "--jobs", "1", "--out", str(out),
                       "--plot", str(plot)])
    err = capsys.readouterr().err
    assert status == 2, err
    assert err.strip().splitlines() == [f"dcut-sim: error: cannot write {plot}: Operation not permitted; no output "
                                        f"was changed (outputs are written all or none)"]
    assert out.read_text() == "the previous table\n" and plot.read_bytes() == b"the previous plot"
    assert sorted(p.name for p in inputs.iterdir() if p.name.startswith(".")) == []


def _chattr_works(path: Path) -> bool:
    if shutil.which("chattr") is None or os.geteuid() != 0:
        return False
    return subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode == 0


def test_sim_out_is_kept_when_the_plot_is_immutable(inputs, capsys):
    """The case as a user meets it: an immutable --plot file (root ignores permissions, not this)."""
    out, plot = inputs / "r.csv", inputs / "p.png"
    out.write_text("the previous table\n")
    plot.write_bytes(b"the previous plot")
    if not _chattr_works(plot):
        pytest.skip("needs chattr +i (root, a file system with attributes)")
    try:
        before = _digest(out)
        status = sim.main(["--trace", "t.parquet", "--cost", "c.json", *FAST, "--jobs", "1", "--out", str(out),
                           "--plot", str(plot)])
        err = capsys.readouterr().err
        assert status == 2 and f"cannot write {plot}" in err and "no output was changed" in err, err
        assert _digest(out) == before
    finally:
        subprocess.run(["chattr", "-i", str(plot)], check=True)
