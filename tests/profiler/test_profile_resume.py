"""dcut-profile --resume: a profile interrupted after any number of visits resumes to the full grid;
a hand-made partial of valid cells is used as it is; a partial measured with other settings (another
--threads, --seed, ...) or holding a cell outside the grid is refused before the model is built,
naming the flag, and left byte-identical."""

from __future__ import annotations

import hashlib
import itertools
import json

import pytest

from dcut_sched import CostCurve
from dcut_sched.cli import profile as cli
from dcut_sched.profiler import harness
from dcut_sched.profiler.grid import build_cells

GRID = ["--cpu", "--model", "tiny", "--batch-sizes", "1,2", "--block-size", "4", "--context-len", "8",
        "--grid-step", "0", "--draft", "none", "--warmups", "0", "--repeats", "2", "--no-progress", "--quiet"]
KEYS = sorted(c.key for c in build_cells([1, 2], 4, grid_step=0, draft=False, ar=True))


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _interrupt_after(monkeypatch, visits: int) -> None:
    """The timer raises KeyboardInterrupt (Ctrl-C) on visit ``visits + 1``."""
    real, calls = harness.EagerTimer.time, itertools.count()

    def time(self, cell, warmups, repeats):
        if next(calls) >= visits:
            raise KeyboardInterrupt
        return real(self, cell, warmups, repeats)

    monkeypatch.setattr(harness.EagerTimer, "time", time)


def _interrupted(tmp_path, monkeypatch, visits: int, extra=()) -> tuple:
    out = tmp_path / "o.json"
    with monkeypatch.context() as m:
        _interrupt_after(m, visits)
        assert cli.main([*GRID, *extra, "--out", str(out)]) == 130
    return out, harness.partial_path_for(out)


@pytest.mark.parametrize("rounds", ["1", "2"])
def test_a_profile_interrupted_after_any_visit_resumes_to_the_full_grid(tmp_path, monkeypatch, capsys, rounds):
    visits = len(KEYS) * (1 if rounds == "1" else 2)  # the last one completes the run (nothing to resume)
    for n in sorted({1, 2, visits // 2, visits // 2 + 1, visits - 1}):
        folder = tmp_path / f"n{n}"
        folder.mkdir()
        out, partial = _interrupted(folder, monkeypatch, n, ["--rounds", rounds])
        doc = json.loads(partial.read_text())
        kept = sum(len(v) for v in doc["samples_ms"].values())
        assert kept == n * (2 if rounds == "1" else 1)  # every visit before the interrupt is kept
        before = {k: list(v) for k, v in doc["samples_ms"].items()}
        assert cli.main([*GRID, "--rounds", rounds, "--out", str(out), "--resume"]) == 0, capsys.readouterr().err
        curve = CostCurve.load(out)
        rows = {f"verify:{r.batch_size}:{r.num_tokens}": r for r in curve.verify}
        rows.update({f"ar:{r.batch_size}": r for r in curve.ar})
        assert sorted(rows) == KEYS and all(r.repeats == 2 for r in rows.values())
        complete = sum(1 for v in before.values() if len(v) == 2)
        assert curve.hardware["profile"]["resumed_cells"] == complete
        for key, vals in before.items():  # the kept samples are part of each cell's row
            if len(vals) == 2:
                assert rows[key].median_ms == pytest.approx(sum(vals) / 2)
        assert not partial.exists()
    capsys.readouterr()


def test_a_hand_made_partial_of_valid_cells_is_used(tmp_path, monkeypatch, capsys):
    """Settings as a real run writes them, samples for a few cells of the grid by hand: accepted, and
    those cells' rows are the hand-made samples (not measured again)."""
    out, partial = _interrupted(tmp_path, monkeypatch, 1)
    settings = json.loads(partial.read_text())["settings"]
    hand = {"verify:2:2": [1.0, 3.0], "ar:1": [0.5, 0.25], "verify:1:4": [7.0]}
    partial.write_text(json.dumps({"schema": harness.PARTIAL_SCHEMA, "settings": settings, "samples_ms": hand,
                                   "skipped": {}, "measure_seconds": 0.0}))
    assert cli.main([*GRID, "--out", str(out), "--resume"]) == 0, capsys.readouterr().err
    curve = CostCurve.load(out)
    verify = {(r.batch_size, r.num_tokens): r for r in curve.verify}
    assert verify[(2, 2)].median_ms == 2.0 and verify[(2, 2)].repeats == 2
    assert {r.batch_size: r.median_ms for r in curve.ar}[1] == 0.375
    assert verify[(1, 4)].repeats == 2  # one hand-made sample, one measured
    assert curve.hardware["profile"]["resumed_cells"] == 2


@pytest.mark.parametrize("then,now,line", [
    (["--threads", "1"], ["--threads", "2"], "--threads: 1 then, 2 now"),
    ([], ["--seed", "3"], "--seed: 0 then, 3 now"),
    ([], ["--repeats", "3"], "--repeats: 2 then, 3 now; --rounds: 2 then, 3 now"),  # --rounds follows
    ([], ["--context-len", "4"], "--context-len: 8 then, 4 now"),
    ([], ["--dtype", "bfloat16"], "--dtype: float32 then, bfloat16 now"),
], ids=["threads", "seed", "repeats", "context-len", "dtype"])
def test_a_partial_of_other_settings_is_refused_naming_the_flag(tmp_path, monkeypatch, capsys, then, now, line):
    out, partial = _interrupted(tmp_path, monkeypatch, 2, then)
    before = _digest(partial)

    def no_build(*args, **kwargs):
        raise AssertionError("the model was built before the partial was checked")

    monkeypatch.setattr("dcut_sched.profiler.workload.ForwardWorkload", no_build)
    capsys.readouterr()
    assert cli.main([*GRID, *now, "--out", str(out), "--resume"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"dcut-profile: error: partial file {partial}: measured with other "
                                               f"settings ({line}); resume with the settings it was measured with, "
                                               f"or rerun with --fresh"), err
    assert _digest(partial) == before and not out.exists()


def test_a_partial_of_an_older_version_without_threads_is_refused(tmp_path, monkeypatch, capsys):
    out, partial = _interrupted(tmp_path, monkeypatch, 2)
    doc = json.loads(partial.read_text())
    del doc["settings"]["threads"]
    partial.write_text(json.dumps(doc))
    capsys.readouterr()
    assert cli.main([*GRID, "--out", str(out), "--resume"]) == 2
    assert "(--threads: not recorded then, 1 now)" in capsys.readouterr().err


def test_a_cell_outside_the_grid_is_refused_naming_the_grid_flags(tmp_path, monkeypatch, capsys):
    out, partial = _interrupted(tmp_path, monkeypatch, 2)
    doc = json.loads(partial.read_text())
    doc["samples_ms"]["verify:4:16"] = [1.0]
    partial.write_text(json.dumps(doc))
    before = _digest(partial)
    capsys.readouterr()
    assert cli.main([*GRID, "--out", str(out), "--resume"]) == 2
    err = capsys.readouterr().err
    assert ("partial file" in err and "cell verify:4:16 is not a cell of this run's grid (--batch-sizes, --ratios, "
            "--grid-step, --block-size, --draft)") in err, err
    assert _digest(partial) == before
