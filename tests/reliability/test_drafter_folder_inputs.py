"""Every file a drafter folder is read from is an input: no output of ``dcut-engine`` or
``dcut-profile`` may overwrite the drafter's ``config.json``, weights or ``calibration.json`` --
also when ``dcut-profile`` is given the drafter by its bare name -- and a drafter whose weights or
calibration prior cannot be read is one line naming ``--draft`` and the folder."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from dcut_sched.calibration import CalibrationPrior
from dcut_sched.drafters.checkpoint import save_checkpoint
from dcut_sched.drafters.dflash import DFlashConfig, DFlashDraftModel
from dcut_sched.model import LlamaConfig

ROOT = Path(__file__).resolve().parents[2]
COST = ROOT / "dcut_sched" / "profiler" / "profiles" / "cpu-smollm2-135m-b8.json"
TINY = LlamaConfig.preset("tiny")


def _drafter(folder: Path) -> Path:
    """A B = 8 drafter for the profiler's tiny target, with a calibration prior."""
    cfg = DFlashConfig.for_target(TINY, num_layers=1, block_size=8, num_target_features=1)
    save_checkpoint(DFlashDraftModel.random_init(cfg, seed=0), folder)
    CalibrationPrior(intercepts=[0.5, 0.25], slope=1.1).save(folder / "calibration.json")
    return folder


def _digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def _one_line(status: int, err: str, *needles: str) -> None:
    assert status == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, (needle, err)


@pytest.mark.parametrize("flag", ["--out", "--steps"])
def test_engine_output_never_overwrites_the_drafters_calibration_prior(tmp_path, capsys, monkeypatch, flag):
    from dcut_sched.cli import engine

    folder = _drafter(tmp_path / "d")
    before = _digests(folder)
    monkeypatch.setattr("dcut_sched.drafters.load_dflash", lambda *a, **k: pytest.fail("loaded the drafter first"))
    status = engine.main(["--cost", str(COST), "--draft", f"dflash:{folder}", "--policy", "full", "--block-size", "8",
                          flag, str(folder / "calibration.json")])
    _one_line(status, capsys.readouterr().err, f"{flag} {folder / 'calibration.json'} is the --draft input file")
    assert _digests(folder) == before


@pytest.mark.parametrize("name, draft", [("calibration.json", "folder"), ("calibration.json", "name"),
                                         ("config.json", "name")])
def test_profile_output_never_overwrites_a_file_of_the_drafter(tmp_path, capsys, monkeypatch, name, draft):
    """A bare ``dflash:NAME`` is resolved (``$DCUT_DRAFTERS``) before the outputs are checked: its
    config.json was overwritten by ``--out`` when the name was no path in the working folder."""
    from dcut_sched.cli import profile as cli

    root = tmp_path / "drafters"
    folder = _drafter(root / "mini")
    monkeypatch.setenv("DCUT_DRAFTERS", str(root))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("dcut_sched.profiler.workload.ForwardWorkload", lambda *a, **k: pytest.fail("built the model"))
    before = _digests(folder)
    spec = f"dflash:{folder}" if draft == "folder" else "dflash:mini"
    status = cli.main(["--cpu", "--model", "tiny", "--draft", spec, "--block-size", "8", "--batch-sizes", "1",
                       "--out", str(folder / name)])
    _one_line(status, capsys.readouterr().err, f"--out {folder / name} is the --draft input file")
    assert _digests(folder) == before


@pytest.mark.parametrize("damage, needle", [
    (lambda f: (f / "calibration.json").write_text('{"format": "dcut.calibration-prior/1", "intercepts": [0.1'),
     "calibration.json: not valid JSON"),
    (lambda f: (f / "model.safetensors").write_bytes((f / "model.safetensors").read_bytes()[:200]),
     "model.safetensors: not a readable safetensors file"),
])
def test_profile_names_the_drafter_flag_when_its_files_cannot_be_read(tmp_path, capsys, damage, needle):
    from dcut_sched.cli import profile as cli

    folder = _drafter(tmp_path / "d")
    damage(folder)
    before = _digests(folder)
    out = tmp_path / "c.json"
    status = cli.main(["--cpu", "--model", "tiny", "--draft", f"dflash:{folder}", "--block-size", "8",
                       "--batch-sizes", "1", "--out", str(out), "--no-progress"])
    _one_line(status, capsys.readouterr().err, f"--draft dflash:{folder} ({folder}): ", needle)
    assert _digests(folder) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]  # no curve, no partial


def test_the_drafter_files_are_its_config_weights_and_prior(tmp_path):
    from dcut_sched.drafters import drafter_files

    assert [Path(p).name for p in drafter_files(tmp_path)] == ["config.json", "model.safetensors", "calibration.json"]


@pytest.mark.parametrize("name", ["config.json", "calibration.json", "heldout.json"])
def test_eval_json_never_overwrites_a_file_of_the_drafter(tmp_path, capsys, monkeypatch, name):
    """``dcut-drafter eval DIR --json DIR/config.json`` replaced the drafter's config with the tau table."""
    from dcut_sched.cli import drafter as cli

    folder = _drafter(tmp_path / "d")
    (folder / "heldout.json").write_text('{"settings": {"seed": 0}}\n')
    before = _digests(folder)
    monkeypatch.setattr("dcut_sched.drafters.checkpoint.load_checkpoint", lambda *a, **k: pytest.fail("loaded"))
    status = cli.main(["eval", str(folder), "--json", str(folder / name)])
    _one_line(status, capsys.readouterr().err, f"--json {folder / name} is the folder input file")
    assert _digests(folder) == before


def _tensors(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(folder / "model.safetensors")


@pytest.mark.parametrize("damage, needle", [
    ("block_size", "field block_size is 4, field dflash_config.block_size is 8: the two copies must agree"),
    ("d2t", "tensor d2t is float32, not integer token-id offsets"),
    ("int_weights", "is int8, not a floating type"),
])
def test_a_drafter_whose_files_disagree_is_refused_not_loaded_silently(tmp_path, damage, needle):
    """Each used to load: the top-level block size ignored, d2t's fractions cut, int8 weights taken as
    whole-number weights."""
    import json

    import torch
    from safetensors.torch import save_file

    from dcut_sched.drafters.checkpoint import DraftCheckpointError, load_checkpoint

    cfg = DFlashConfig.for_target(TINY, num_layers=1, block_size=8, num_target_features=1, draft_vocab_size=16)
    folder = tmp_path / "d"
    save_checkpoint(DFlashDraftModel.random_init(cfg, seed=0), folder)
    tensors = _tensors(folder)
    if damage == "block_size":
        raw = json.loads((folder / "config.json").read_text())
        raw["block_size"] = 4
        (folder / "config.json").write_text(json.dumps(raw))
    elif damage == "d2t":
        tensors["d2t"] = tensors["d2t"].float() + 0.5
        save_file(tensors, folder / "model.safetensors")
    else:
        tensors = {k: v.to(torch.int8) if v.is_floating_point() else v for k, v in tensors.items()}
        save_file(tensors, folder / "model.safetensors")
    with pytest.raises(DraftCheckpointError, match=needle):
        load_checkpoint(folder)


def test_a_config_with_only_the_top_level_block_size_uses_it(tmp_path):
    import json

    from dcut_sched.drafters.checkpoint import load_checkpoint

    folder = _drafter(tmp_path / "d")
    raw = json.loads((folder / "config.json").read_text())
    del raw["dflash_config"]["block_size"]
    raw["block_size"] = 4
    (folder / "config.json").write_text(json.dumps(raw))
    assert load_checkpoint(folder).config.block_size == 4


def test_eval_resolves_a_bare_drafter_name_as_draft_does(tmp_path, monkeypatch, capsys):
    """``dcut-drafter eval NAME`` finds the drafter under $DCUT_DRAFTERS (as ``--draft dflash:NAME``);
    this one is for the tiny target, so the width check names the resolved folder."""
    from dcut_sched.cli import drafter

    _drafter(tmp_path / "store" / "tiny-dflash")
    monkeypatch.setenv("DCUT_DRAFTERS", str(tmp_path / "store"))
    monkeypatch.chdir(tmp_path)
    _one_line(drafter.main(["eval", "tiny-dflash"]), capsys.readouterr().err,
              f"{tmp_path / 'store' / 'tiny-dflash'}: ", "dcut-drafter eval measures drafters of SmolLM2-135M-Instruct")
    _one_line(drafter.main(["eval", "no-such-drafter"]), capsys.readouterr().err, "no-such-drafter")
