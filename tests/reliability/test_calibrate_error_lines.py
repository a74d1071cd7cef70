"""``dcut-drafter calibrate``'s error lines, each reached (analysis/cli_error_coverage.py): a
first-pipeline drafter whose ``num_generated_prompts`` is negative, a bad ``--eval-prompts``, no
anchor to draft from, and a prior that cannot be fitted are each one line, exit 2, no
``calibration.json`` written. The model-bound steps are replaced by stand-ins: only the checks run."""

from __future__ import annotations

import json

import pytest

from dcut_sched.cli import drafter
from dcut_sched.drafters.checkpoint import save_checkpoint
from dcut_sched.drafters.dflash import DFlashConfig, DFlashDraftModel
from dcut_sched.model import LlamaConfig, LlamaModel


def _folder(tmp_path, settings: dict):
    cfg = DFlashConfig.for_target(LlamaConfig.preset("tiny"), num_layers=1, block_size=8, num_target_features=1)
    folder = save_checkpoint(DFlashDraftModel.random_init(cfg, seed=0), tmp_path / "d")
    (folder / "heldout.json").write_text(json.dumps({"settings": settings, "command": "dcut-drafter train"}))
    return folder


def _one_line(capsys, status, *needles):
    err = "".join(line for line in capsys.readouterr().err.splitlines(keepends=True)
                  if not line.startswith("[dcut-drafter calibrate"))  # the progress log's stage lines
    assert status == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, (needle, err)


@pytest.fixture
def no_model(monkeypatch):
    monkeypatch.setattr(LlamaModel, "from_smollm2", classmethod(lambda cls, **k: pytest.fail("loaded the target")))


def test_a_negative_prompt_count_of_a_first_pipeline_drafter(tmp_path, capsys, no_model):
    folder = _folder(tmp_path, {"seed": 0, "num_generated_prompts": -1})
    _one_line(capsys, drafter.main(["calibrate", "--draft", str(folder)]),
              "its settings are not a drafter's training settings (num_generated_prompts must be >= 0, not -1)")
    assert not (folder / "calibration.json").exists()


def test_a_bad_eval_prompts_file(tmp_path, capsys, no_model):
    folder = _folder(tmp_path, {"seed": 0, "num_generated_prompts": 8})
    bad = tmp_path / "prompts.jsonl"
    bad.write_text("not json\n")
    _one_line(capsys, drafter.main(["calibrate", "--draft", str(folder), "--eval-prompts", str(bad)]),
              "--eval-prompts: ")
    assert not (folder / "calibration.json").exists()


def test_no_anchor_to_draft_from(monkeypatch):
    def none(*a, **k):
        raise ValueError("no anchor")

    monkeypatch.setattr("dcut_sched.drafters.heldout.calibration_blocks", none)
    target = LlamaModel.random_init(LlamaConfig.preset("tiny"), seed=0)
    cfg = DFlashConfig.for_target(target.config, num_layers=1, block_size=8, num_target_features=1)
    with pytest.raises(drafter.UsageError, match="no anchor to draft from: the continuations are empty"):
        drafter.calibration_blocks(DFlashDraftModel.random_init(cfg, seed=0), target, [])


def test_a_prior_that_cannot_be_fitted(tmp_path, capsys, monkeypatch):
    folder = _folder(tmp_path, {"seed": 0, "num_generated_prompts": 8})
    target = LlamaModel.random_init(LlamaConfig.preset("tiny"), seed=0)
    monkeypatch.setattr(LlamaModel, "from_smollm2", classmethod(lambda cls, **k: target))
    monkeypatch.setattr("dcut_sched.model.tokenizer.load_smollm2_tokenizer", lambda: object())
    monkeypatch.setattr("dcut_sched.drafters.data.continue_prompts", lambda *a, **k: [])
    monkeypatch.setattr("dcut_sched.drafters.data.sequence_features", lambda *a, **k: None)
    monkeypatch.setattr(drafter, "calibration_blocks", lambda *a: (None, None, None))

    def unfit(*a):
        raise ValueError("too few reached slots to fit a prior")

    monkeypatch.setattr("dcut_sched.calibration.fit_prior", unfit)
    status = drafter.main(["calibrate", "--draft", str(folder), "--prompts", "4", "--max-new-tokens", "8"])
    _one_line(capsys, status, "too few reached slots to fit a prior (--prompts 4, --max-new-tokens 8)")
    assert not (folder / "calibration.json").exists()
