"""An output path never overwrites an input: the --seeds path, the benchmark path, dcut-drafter."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from dcut_sched.cli import sim

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "traces" / "smollm2-135m-skip14-15-b8.parquet"
COST = ROOT / "profiler" / "profiles" / "cpu-smollm2-135m-b8.json"


def _digest(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


@pytest.mark.parametrize("which", ["trace", "cost"])
def test_seeds_out_equal_to_an_input_is_refused(tmp_path, capsys, which):
    trace, cost = tmp_path / "t.parquet", tmp_path / "c.json"
    shutil.copy(TRACE, trace)
    shutil.copy(COST, cost)
    before = {p: _digest(p) for p in (trace, cost)}
    out = trace if which == "trace" else cost
    status = sim.main(["--trace", str(trace), "--cost", str(cost), "--seeds", "2", "--steps", "20", "--warmup", "2",
                       "--batch-sizes", "2", "--policies", "ar,full", "--out", str(out), "--quiet"])
    err = capsys.readouterr().err
    assert status == 2
    assert "--out" in err and "input" in err
    assert {p: _digest(p) for p in (trace, cost)} == before


def test_drafter_out_that_is_a_file_is_refused(tmp_path, capsys):
    from dcut_sched.cli import drafter

    f = tmp_path / "f.txt"
    f.write_text("keep me")
    assert drafter.main(["train", "--out", str(f)]) == 2
    assert "is a file" in capsys.readouterr().err
    assert f.read_text() == "keep me"


def test_drafter_eval_of_a_missing_folder_names_it(tmp_path, capsys):
    from dcut_sched.cli import drafter

    assert drafter.main(["eval", str(tmp_path / "nope")]) == 2
    assert "nope/config.json: not found" in capsys.readouterr().err


@pytest.mark.parametrize("flags", [["--temperature", "-1"], ["--top-p", "1.5", "--temperature", "0.7"],
                                   ["--temperature", "0.7", "--backend", "hf"]])
def test_trace_record_bad_sampling_flags_are_usage_errors(tmp_path, capsys, flags):
    from dcut_sched.cli import trace

    status = trace.main(["record", "--out", str(tmp_path / "t.parquet"), *flags])
    err = capsys.readouterr().err
    assert status == 2 and "Traceback" not in err and "--temperature" in err
    assert not (tmp_path / "t.parquet").exists()


@pytest.mark.parametrize("spec, match", [("dflash:/nowhere", "no DFlash drafter folder"),
                                         ("medusa", "expected greedy, sampled or dflash:PATH")])
def test_engine_bad_draft_spec_is_a_usage_error(capsys, spec, match):
    from dcut_sched.cli import engine

    assert engine.main(["--draft", spec, "--policy", "full"]) == 2
    err = capsys.readouterr().err
    assert match in err and "Traceback" not in err


@pytest.mark.parametrize("make, match", [
    (lambda d: "", "--out is empty"),
    (lambda d: str(d), "holds other files and no DFlash drafter"),
])
def test_drafter_out_never_overwrites_another_folder(tmp_path, capsys, make, match):
    from dcut_sched.cli import drafter

    (tmp_path / "README.md").write_text("the project's readme")
    assert drafter.main(["train", "--out", make(tmp_path)]) == 2
    assert match in capsys.readouterr().err
    assert (tmp_path / "README.md").read_text() == "the project's readme"


@pytest.mark.parametrize("flags, match", [
    (["--eval-prompts", "/nonexistent.jsonl"], "--eval-prompts"),
    (["--lr", "nan"], "--lr"),
    (["--lr", "-5"], "--lr"),
])
def test_drafter_train_checks_its_inputs_before_loading_anything(tmp_path, capsys, flags, match):
    from dcut_sched.cli import drafter

    assert drafter.main(["train", "--out", str(tmp_path / "new"), *flags]) == 2
    assert match in capsys.readouterr().err
    assert not (tmp_path / "new").exists()
