"""Cases of the ninth hostile pass (docs/reliability.md): ``dcut-drafter calibrate --out`` onto the
drafter's training report, an empty ``--out``, a bare drafter name for ``--draft``; the open-loop
footer naming the rate that ran."""

from __future__ import annotations

import importlib
import shutil
from pathlib import Path

import pytest

from dcut_sched.cli import drafter as drafter_cli
from dcut_sched.cli import sim as sim_cli
from dcut_sched.model import llama

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "drafters" / "smollm2-135m-dflash"
TRACE = ROOT / "dcut_sched" / "data" / "traces" / "dflash-qwen3-8b-gsm8k-b16.parquet"


@pytest.fixture
def no_model(monkeypatch):
    """The target may not load: every refusal here comes before it."""
    def fail(*_a, **_k):
        raise AssertionError("the target model was loaded")
    monkeypatch.setattr(llama.LlamaModel, "from_smollm2", staticmethod(fail))


def _folder(tmp_path: Path) -> Path:
    folder = tmp_path / "d"
    folder.mkdir()
    for name in ("config.json", "heldout.json"):
        shutil.copy(SHIPPED / name, folder / name)
    (folder / "model.safetensors").write_bytes(b"weights")  # not read before the refusal
    return folder


def _refused(capsys, argv, *needles):
    assert drafter_cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, (needle, err)


def test_calibrate_out_onto_the_training_report_is_refused(tmp_path, capsys, no_model):
    folder = _folder(tmp_path)
    before = (folder / "heldout.json").read_bytes()
    _refused(capsys, ["calibrate", "--draft", str(folder), "--out", str(folder / "heldout.json")],
             "is the --draft input file", "heldout.json")
    link = tmp_path / "report.json"
    link.symlink_to(folder / "heldout.json")
    _refused(capsys, ["calibrate", "--draft", str(folder), "--out", str(link)], "is the --draft input file")
    assert (folder / "heldout.json").read_bytes() == before


@pytest.mark.parametrize("argv", [["calibrate", "--draft", "{folder}", "--out", ""],
                                  ["calibrate", "--draft", "{folder}", "--out", "  "],
                                  ["eval", "{folder}", "--json", ""]])
def test_an_empty_output_path_is_refused_not_read_as_absent(tmp_path, capsys, no_model, argv):
    """``eval --json ''`` ran the whole evaluation and wrote nothing (the empty path read as no flag)."""
    folder = _folder(tmp_path)
    flag = argv[-2]
    _refused(capsys, [a.format(folder=folder) for a in argv], f"argument {flag}: the path is empty")


def test_sim_empty_selection_curve_is_refused(capsys):
    """``--selection-curve ''`` ran the speedup simulation instead, exit 0."""
    assert sim_cli.main(["--trace", str(TRACE), "--selection-curve", ""]) == 2
    assert "argument --selection-curve: the path is empty" in capsys.readouterr().err


def test_profile_empty_out_names_the_flag(capsys):
    """``dcut-profile --out ''`` said "PosixPath('.') has an empty name"."""
    from dcut_sched.cli import profile as profile_cli

    assert profile_cli.main(["--analytic", "--model", "qwen3-8b", "--device", "h20", "--out", ""]) == 2
    assert "argument --out: the path is empty" in capsys.readouterr().err


def test_calibrate_resolves_a_bare_drafter_name_as_eval_does(capsys, no_model):
    _refused(capsys, ["calibrate", "--draft", SHIPPED.name],
             f"--draft {SHIPPED} already holds calibration.json")


@pytest.mark.parametrize(("flag", "expected"), [
    (["--rate", "5"], "(the rate is --rate 5 req/s at every max bs)"),
    (["--load", "0.3"], "(the rate is --load 0.3 x ar's capacity at each max bs)"),
])
def test_open_loop_footer_names_the_rate_that_ran(capsys, flag, expected):
    argv = ["--trace", str(TRACE), "--mode", "open", "--requests", "3", "--batch-sizes", "4", "--jobs", "1",
            "--policies", "ar,uniform", *flag]
    assert sim_cli.main(argv) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert expected in out


@pytest.mark.parametrize(("module", "argv", "flag"), [
    ("engine", ["--prompts", "", "--policy", "uniform"], "--prompts"),  # ran the default prompts
    ("trace", ["record", "--out", "", "--limit", "1"], "--out"),  # "PosixPath('.') has an empty name"
    ("trace", ["record", "--out", "r.parquet", "--prompts", " ", "--limit", "1"], "--prompts"),
    ("trace", ["stats", str(TRACE), "--out", ""], "--out"),
    ("trace", ["fit", str(TRACE), "--out", ""], "--out"),
    ("profile", ["--cpu", "--model", "tiny", "--out", "a.json", "--draft-config", ""], "--draft-config"),  # ignored
    ("drafter", ["train", "--out", "x", "--work-dir", ""], "--work-dir"),  # the default work dir used
])
def test_an_empty_path_flag_is_refused_by_name(tmp_path, monkeypatch, capsys, module, argv, flag):
    assert_empty_path_refused(tmp_path, monkeypatch, capsys, module, argv, flag)


def assert_empty_path_refused(tmp_path, monkeypatch, capsys, module: str, argv: list[str], flag: str) -> None:
    """``dcut_sched.cli.<module>`` run in an empty ``tmp_path`` exits 2 with the one line ``argument FLAG:
    the path is empty`` and writes nothing."""
    monkeypatch.chdir(tmp_path)
    cli = importlib.import_module(f"dcut_sched.cli.{module}")
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert f"argument {flag}: the path is empty" in err and err.count("\n") == 1, err
    assert list(tmp_path.iterdir()) == []


def test_a_damaged_local_drafter_folder_is_not_swapped_for_the_shipped_one(tmp_path, monkeypatch, capsys, no_model):
    """``./smollm2-135m-dflash`` without its config.json was read as the shipped drafter's name: eval and
    calibrate measured another drafter than the folder given."""
    from dcut_sched.drafters import parse_draft_spec

    monkeypatch.chdir(tmp_path)
    (tmp_path / SHIPPED.name).mkdir()
    (tmp_path / SHIPPED.name / "model.safetensors").write_bytes(b"weights")
    with pytest.raises(ValueError, match="no DFlash drafter folder there"):
        parse_draft_spec(f"dflash:{SHIPPED.name}")
    for argv in (["eval", SHIPPED.name], ["calibrate", "--draft", SHIPPED.name, "--out", "p.json"]):
        _refused(capsys, argv, f"{SHIPPED.name}/config.json: not found")
    (tmp_path / SHIPPED.name / "model.safetensors").unlink()
    (tmp_path / SHIPPED.name).rmdir()
    assert parse_draft_spec(f"dflash:{SHIPPED.name}").path == SHIPPED  # no folder here: the name
