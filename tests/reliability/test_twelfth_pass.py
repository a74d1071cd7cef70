"""Cases of the twelfth hostile pass (docs/reliability.md): an empty value for the path flags the ninth
pass did not reach (each was read as a path of no name: "unknown output format '(no suffix)'", "is a
folder", "config.json: not found"), refused by name before any work; and the multi-output and
``--resume`` cases that held, kept as they are."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from dcut_sched.cli import profile as profile_cli
from dcut_sched.cli import sim as sim_cli

from .test_ninth_pass import assert_empty_path_refused

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "dcut_sched" / "data" / "traces" / "smollm2-135m-dflash-b16.parquet"
COST = ROOT / "dcut_sched" / "profiler" / "profiles" / "h20-qwen3-8b-published.json"
SIM = ["--trace", str(TRACE), "--policies", "full", "--batch-sizes", "4", "--steps", "50", "--warmup", "10",
       "--quiet"]


@pytest.mark.parametrize(("module", "argv", "flag"), [
    ("sim", [*SIM, "--out", ""], "--out"),  # "unknown output format '(no suffix)'"
    ("sim", [*SIM, "--plot", ""], "--plot"),
    ("sim", ["--trace", "", "--policies", "full"], "--trace"),  # ": is not a regular file"
    ("sim", ["--trace", str(TRACE), "--cost", ""], "--cost"),
    ("profile", ["--analytic", "--device", "h20", "--fit", "", "--out", "f.json"], "--fit"),  # "is a folder"
    ("profile", ["--analytic", "--device", "h20", "--model", "qwen3-8b", "--out", "f.json", "--report", ""],
     "--report"),
    ("engine", ["--out", "", "--max-new-tokens", "2"], "--out"),
    ("engine", ["--steps", "", "--max-new-tokens", "2"], "--steps"),
    ("engine", ["--trace", "", "--max-new-tokens", "2"], "--trace"),
    ("engine", ["--cost", "", "--max-new-tokens", "2"], "--cost"),
    ("trace", ["synth", "--params", "", "--out", "x.parquet"], "--params"),  # "--params: .: is a folder"
    ("trace", ["record", "--backend", "hf", "--target", "", "--draft", "d", "--out", "r.parquet"], "--target"),
    ("trace", ["record", "--draft", "", "--out", "r.parquet"], "--draft"),
    ("drafter", ["calibrate", "--draft", ""], "--draft"),  # "config.json: not found"
])
def test_an_empty_path_flag_is_refused_by_name(tmp_path, monkeypatch, capsys, module, argv, flag):
    assert_empty_path_refused(tmp_path, monkeypatch, capsys, module, argv, flag)


@pytest.mark.parametrize("plot", ["dir.png", "afile/p.png", "out.csv", "link.csv", "p.xyz"])
def test_sim_out_is_untouched_when_plot_cannot_be_written(tmp_path, monkeypatch, capsys, plot):
    """``--out`` with a ``--plot`` that is a folder, under a file, the same file (also through a
    symlink) or of an unknown format: exit 2 before any run, ``--out`` byte-identical."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "dir.png").mkdir()
    (tmp_path / "afile").write_text("f")
    (tmp_path / "out.csv").write_text("old\n")
    (tmp_path / "link.csv").symlink_to("out.csv")
    before = sorted(p.name for p in tmp_path.iterdir())
    assert sim_cli.main([*SIM, "--out", "out.csv", "--plot", plot]) == 2
    err = capsys.readouterr().err
    assert "--plot" in err and err.count("\n") == 1, err
    assert (tmp_path / "out.csv").read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_sim_trace_given_as_a_hard_link_and_an_empty_trace(tmp_path, monkeypatch, capsys):
    import pyarrow.parquet as pq

    monkeypatch.chdir(tmp_path)
    shutil.copy(TRACE, "t.parquet")
    (tmp_path / "hard.parquet").hardlink_to(tmp_path / "t.parquet")
    argv = ["--policies", "full", "--batch-sizes", "4", "--steps", "50", "--warmup", "10", "--quiet"]
    assert sim_cli.main(["--trace", "t.parquet", "--trace", "hard.parquet", *argv]) == 2
    assert "are the same file" in capsys.readouterr().err
    table = pq.read_table("t.parquet")
    pq.write_table(table.slice(0, 0), "empty.parquet")
    assert sim_cli.main(["--trace", "empty.parquet", "--trace", "t.parquet", "--sweep", "--out", "s.csv",
                         *argv]) == 2
    err = capsys.readouterr().err
    assert "empty.parquet" in err and "no rows" in err and err.count("\n") == 1, err
    assert not (tmp_path / "s.csv").exists()


@pytest.mark.parametrize("report", ["dir.png", "afile/r.csv", "r.xyz", "c.json.partial"])
def test_profile_out_is_untouched_when_report_cannot_be_written(tmp_path, monkeypatch, capsys, report):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "dir.png").mkdir()
    (tmp_path / "afile").write_text("f")
    shutil.copy(COST, "c.json")
    old = (tmp_path / "c.json").read_bytes()
    argv = ["--analytic", "--device", "h20", "--model", "qwen3-8b", "--out", "c.json", "--report", report]
    assert profile_cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "--report" in err and err.count("\n") == 1, err
    assert (tmp_path / "c.json").read_bytes() == old
    assert not (tmp_path / "c.json.partial").exists()


def test_profile_resume_refuses_a_cost_curve_as_its_partial(tmp_path, monkeypatch, capsys):
    """A partial from another command (a finished cost curve copied to ``OUT.partial``) is refused by
    field and left as it is."""
    monkeypatch.chdir(tmp_path)
    shutil.copy(COST, "c.json.partial")
    old = (tmp_path / "c.json.partial").read_bytes()
    argv = ["--cpu", "--model", "tiny", "--batch-sizes", "1", "--block-size", "4", "--repeats", "1",
            "--out", "c.json", "--resume", "--quiet", "--no-progress"]
    assert profile_cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "c.json.partial" in err and "schema" in err and "--fresh" in err and err.count("\n") == 1, err
    assert (tmp_path / "c.json.partial").read_bytes() == old
    assert not (tmp_path / "c.json").exists()
    assert json.loads(old)["schema"].startswith("dcut.cost-curve")


SHIPPED = ROOT / "drafters" / "smollm2-135m-dflash"


@pytest.mark.parametrize(("key", "value", "expected"), [
    ("hidden_act", "gelu", "field hidden_act: Input should be 'silu' (got 'gelu')"),
    ("attention_bias", True, "field attention_bias: Input should be False (got True)"),
    ("rope_scaling", {"type": "linear", "factor": 4.0}, "field rope_scaling.type: Input should be 'default'"),
])
def test_a_drafter_config_the_forward_would_not_apply_is_refused(tmp_path, key, value, expected):
    """``hidden_act``, ``attention_bias`` and ``rope_scaling`` were ignored: a config saying GELU, biases
    or a linear RoPE scaling ran (``dcut-engine``, ``dcut-profile``) as SiLU, no bias, no scaling."""
    from dcut_sched.drafters.checkpoint import DraftCheckpointError, read_config

    folder = tmp_path / "d"
    folder.mkdir()
    (folder / "model.safetensors").symlink_to(SHIPPED / "model.safetensors")
    config = json.loads((SHIPPED / "config.json").read_text())
    config[key] = value
    (folder / "config.json").write_text(json.dumps(config))
    old = (folder / "config.json").read_bytes()
    with pytest.raises(DraftCheckpointError) as info:
        read_config(folder)
    assert str(folder / "config.json") in str(info.value) and expected in str(info.value), info.value
    assert (folder / "config.json").read_bytes() == old


def test_a_default_rope_scaling_and_the_shipped_config_still_load(tmp_path):
    from dcut_sched.drafters.checkpoint import read_config

    folder = tmp_path / "d"
    folder.mkdir()
    (folder / "model.safetensors").symlink_to(SHIPPED / "model.safetensors")
    config = json.loads((SHIPPED / "config.json").read_text())
    config["rope_scaling"] = {"rope_type": "default"}
    (folder / "config.json").write_text(json.dumps(config))
    assert read_config(folder) == read_config(SHIPPED)


def test_engine_refuses_a_gelu_drafter_before_decoding(tmp_path, monkeypatch, capsys):
    from dcut_sched.cli import engine as engine_cli

    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "d"
    folder.mkdir()
    (folder / "model.safetensors").symlink_to(SHIPPED / "model.safetensors")
    config = json.loads((SHIPPED / "config.json").read_text())
    config["hidden_act"] = "gelu"
    (folder / "config.json").write_text(json.dumps(config))
    argv = ["--draft", "dflash:d", "--policy", "dcut", "--num-prompts", "1", "--batch-size", "1",
            "--max-new-tokens", "4", "--quiet", "--out", "e.json"]
    assert engine_cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "--draft dflash:d" in err and "hidden_act" in err and err.count("\n") == 1, err
    assert not (tmp_path / "e.json").exists()
