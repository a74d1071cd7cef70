"""A drafter's ``calibration.json`` that is there but is no file -- a folder, a link that leads
nowhere -- is refused naming it, like a malformed one: it was skipped silently, and the run went on
without the prior the drafter was given."""

from __future__ import annotations

import pytest

from dcut_sched.calibration import CalibrationPrior, CalibrationPriorError
from dcut_sched.drafters.checkpoint import DraftCheckpointError, load_checkpoint, save_checkpoint
from dcut_sched.drafters.dflash import DFlashConfig, DFlashDraftModel
from dcut_sched.model import LlamaConfig, LlamaModel


def _drafter(folder):
    cfg = DFlashConfig.for_target(LlamaConfig.preset("tiny"), num_layers=1, block_size=8, num_target_features=1)
    return save_checkpoint(DFlashDraftModel.random_init(cfg, seed=0), folder)


@pytest.mark.parametrize("make, needle", [
    (lambda p: p.mkdir(), "is a folder, not a calibration prior"),
    (lambda p: p.symlink_to(p.parent / "gone.json"), "is not a file (a link that leads nowhere"),
])
def test_a_prior_that_is_no_file_is_refused(tmp_path, make, needle):
    make(tmp_path / "calibration.json")
    with pytest.raises(CalibrationPriorError, match="remove it") as info:
        CalibrationPrior.from_folder(tmp_path)
    assert f"{tmp_path / 'calibration.json'}: {needle}" in str(info.value)


def test_no_prior_is_still_none(tmp_path):
    assert CalibrationPrior.from_folder(tmp_path) is None
    assert CalibrationPrior.from_folder(tmp_path / "missing") is None


def test_the_drafter_and_the_engine_refuse_a_prior_folder(tmp_path, capsys, monkeypatch):
    from dcut_sched.cli import engine

    folder = _drafter(tmp_path / "d")
    (folder / "calibration.json").mkdir()
    with pytest.raises(DraftCheckpointError, match="calibration.json: is a folder"):
        load_checkpoint(folder)
    assert load_checkpoint(folder, calibration=False).calibration_prior is None  # calibrate replaces it
    monkeypatch.setattr(LlamaModel, "from_smollm2", classmethod(lambda cls, **k: pytest.fail("loaded the target")))
    status = engine.main(["--draft", f"dflash:{folder}", "--block-size", "8"])
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1, err
    assert f"--draft dflash:{folder} ({folder}): {folder / 'calibration.json'}: is a folder" in err
