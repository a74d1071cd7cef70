"""``dcut-drafter calibrate`` reads the drafter's training seed from its ``heldout.json``: a seed
outside 0..2^63-1 there is one line naming the file, before the target loads (a negative one failed
after the target loaded, as "seed=-3 must be in [0, 2**64)", naming neither file nor field)."""

from __future__ import annotations

import json

import pytest

from dcut_sched.drafters.checkpoint import save_checkpoint
from dcut_sched.drafters.dflash import DFlashConfig, DFlashDraftModel
from dcut_sched.model import LlamaConfig, LlamaModel


@pytest.mark.parametrize("seed", [-5, 2**63, True, "abc", 1.5e30])
def test_a_bad_training_seed_in_heldout_json_is_one_line(tmp_path, capsys, monkeypatch, seed):
    from dcut_sched.cli import drafter

    cfg = DFlashConfig.for_target(LlamaConfig.preset("tiny"), num_layers=1, block_size=8, num_target_features=1)
    folder = save_checkpoint(DFlashDraftModel.random_init(cfg, seed=0), tmp_path / "d")
    report = folder / "heldout.json"
    report.write_text(json.dumps({"settings": {"seed": seed, "num_generated_prompts": 8},
                                  "command": "dcut-drafter train"}))
    monkeypatch.setattr(LlamaModel, "from_smollm2", classmethod(lambda cls, **k: pytest.fail("loaded the target")))
    status = drafter.main(["calibrate", "--draft", str(folder)])
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1, err
    assert f"--draft {report}: no settings.seed (" in err and "re-save the drafter" in err
    assert not (folder / "calibration.json").exists()
