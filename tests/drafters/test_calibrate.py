"""The drafter's calibration prior: the checkpoint loader reads calibration.json (optional, validated),
and `dcut-drafter calibrate`'s blocks and prompt split (tiny random target; the real-model command is
run by hand, docs/drafters.md)."""

from __future__ import annotations

import pytest
import torch

from dcut_sched.calibration import CalibrationPrior
from dcut_sched.cli.drafter import calibration_blocks
from dcut_sched.drafters.calibration_split import calibration_prompts, calibration_training_list
from dcut_sched.drafters.checkpoint import DraftCheckpointError, load_checkpoint, save_checkpoint
from dcut_sched.drafters.data import DraftSequence, sequence_features
from dcut_sched.drafters.dflash import DFlashConfig, DFlashDraftModel
from dcut_sched.model import LlamaConfig, LlamaModel, greedy_generate

TARGET = LlamaConfig(vocab_size=16, hidden_size=32, intermediate_size=64, num_layers=4, num_heads=2, num_kv_heads=1,
                     head_dim=16, tie_word_embeddings=True, max_position=256, name="vocab16")
CFG = DFlashConfig(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=16, intermediate_size=64,
                   vocab_size=16, target_num_layers=4, target_layer_ids=(0, 2), mask_token_id=15, block_size=8)

#: training settings of a drafter of the first data pipeline (no ``num_gsm8k``), as the first shipped one had
FIRST_PIPELINE = {"seed": 0, "num_generated_prompts": 360, "max_new_tokens": 128}


def test_loader_reads_the_optional_prior_and_names_a_malformed_one(tmp_path):
    folder = save_checkpoint(DFlashDraftModel.random_init(CFG, seed=0), tmp_path / "d")
    assert load_checkpoint(folder).calibration_prior is None
    prior = CalibrationPrior(intercepts=[-0.4, -0.2], slope=1.3)
    prior.save(folder / "calibration.json")
    assert load_checkpoint(folder).calibration_prior == prior
    (folder / "calibration.json").write_text('{"intercepts": [0.0], "slope": 0}')
    with pytest.raises(DraftCheckpointError, match=r"calibration.json: field slope: Input should be greater than 0"):
        load_checkpoint(folder)
    assert load_checkpoint(folder, calibration=False).calibration_prior is None  # what calibrate replaces


def test_calibration_blocks_cover_every_anchor_with_the_slots_left():
    target = LlamaModel.random_init(TARGET, seed=1, std=0.2)
    model = DFlashDraftModel.random_init(CFG, seed=0).eval()
    prompts = [[1, 2, 3], [4, 5, 6, 7]]
    outs = greedy_generate(target, prompts, 6, eos_id=None)
    seqs = [DraftSequence(f"p{i}", "t", "greedy", torch.tensor(p + o), len(p)) for i, (p, o) in enumerate(zip(prompts, outs))]
    sequence_features(target, seqs, CFG.target_layer_ids, dtype=torch.float32)
    conf, accept, slots = calibration_blocks(model, target, seqs)
    # anchors prompt_len .. length - 2: 5 per sequence
    assert conf.shape == (10, CFG.block_size - 1) and accept.shape == slots.shape == (10,)
    assert slots.tolist() == [5, 4, 3, 2, 1] * 2  # slots left before the sequence's end
    assert (accept <= slots).all() and ((conf >= 0) & (conf <= 1)).all()


def test_calibration_prompts_spread_over_the_training_list():
    train = list(range(100))
    assert calibration_prompts(train, 5) == [0, 25, 50, 74, 99]
    assert calibration_prompts(train, 200) == train


def test_calibration_list_is_the_list_the_drafter_was_trained_on():
    from dataclasses import replace

    from dcut_sched.drafters import datagen
    from dcut_sched.drafters.data import generated_prompts, humaneval_prompts, load_prompt_records
    from dcut_sched.drafters.train import TrainSettings, in_calibration_split
    from dcut_sched.paths import prompts_path

    evals = str(prompts_path())
    # a drafter of the first pipeline (the first shipped one): 360 templated prompts of seed 0, then
    # the 131 training HumanEval ones
    train, source = calibration_training_list(FIRST_PIPELINE, 0, evals)(None, None)
    assert source == "training prompts of legacy_prompt_split(360, seed 0)" and len(train) == 360 + 131
    held_out = [p.text for p in load_prompt_records(evals)] + [p.text for i, p in enumerate(humaneval_prompts()) if i % 5 == 0]
    assert [p.text for p in train[:360]] == [p.text for p in generated_prompts(360, 0, exclude=held_out)]
    assert not {p.text for p in train} & set(held_out)
    assert [p.id for p in train[360:]] == [p.id for i, p in enumerate(humaneval_prompts()) if i % 5]
    # a drafter of the current pipeline: the first turns of datagen's list (no self-instruct: no target needed)
    settings = TrainSettings(num_self_instruct=0, seed=3)
    convs, _ = datagen.training_list(datagen.DataSettings.from_train(replace(settings, seed=4), evals, ()), None, None)
    # without a calibration split in its settings: every training conversation
    unsplit = {k: v for k, v in settings.to_json().items() if k != "calibration_every"}
    train, source = calibration_training_list(unsplit, 4, evals)(None, None)
    assert [(p.id, p.text) for p in train] == [(c.id, c.turns[0]) for c in convs] and "seed 4" in source
    assert {p.category for p in train} >= {"math", "gsm8k", "humaneval"}
    # with one (the current default): only that split, which training never saw
    train, source = calibration_training_list(settings.to_json(), 4, evals)(None, None)
    split = [(c.id, c.turns[0]) for c in convs if in_calibration_split(c.id, settings.calibration_every)]
    assert [(p.id, p.text) for p in train] == split and 0 < len(split) < len(convs) / 4
    assert "calibration-split" in source


def test_calibrate_refuses_a_missing_drafter_folder(tmp_path, capsys):
    from dcut_sched.cli import drafter

    assert drafter.main(["calibrate", "--draft", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(tmp_path / "nope") in err
    assert drafter.main(["calibrate", "--draft", str(tmp_path), "--prompts", "1"]) == 2
    assert "argument --prompts: 1 must be >= 2" in capsys.readouterr().err


def test_calibrate_replaces_a_prior_only_when_out_names_it(tmp_path, capsys):
    """The shipped drafter's prior (or any drafter's) is never replaced by the bare command: refused
    before the target loads, the file untouched."""
    import shutil
    from pathlib import Path

    from dcut_sched.cli import drafter

    shipped = Path(__file__).resolve().parents[2] / "drafters" / "smollm2-135m-dflash"
    folder = tmp_path / "d"
    shutil.copytree(shipped, folder)
    before = (folder / "calibration.json").read_bytes()
    assert drafter.main(["calibrate", "--draft", str(folder)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "already holds calibration.json" in err
    assert f"--out {folder / 'calibration.json'}" in err
    assert (folder / "calibration.json").read_bytes() == before
    # an --out that is one of the drafter's inputs is refused too
    assert drafter.main(["calibrate", "--draft", str(folder), "--out", str(folder / "config.json")]) == 2
    assert "--out" in capsys.readouterr().err and (folder / "config.json").exists()


@pytest.mark.slow
def test_calibrate_replaces_a_malformed_prior_at_tiny_scale(tmp_path, capsys):
    """The real command on a copy of the shipped drafter, 3 training prompts x 24 tokens (~10 s)."""
    import json
    import shutil
    from pathlib import Path

    from dcut_sched.cli import drafter

    shipped = Path(__file__).resolve().parents[2] / "drafters" / "smollm2-135m-dflash"
    folder = tmp_path / "d"
    folder.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(shipped / name, folder / name)
    # settings of the first data pipeline: its training list needs no self-instruct generation
    (folder / "heldout.json").write_text(json.dumps({"settings": FIRST_PIPELINE}))
    (folder / "calibration.json").write_text("{not json")
    assert drafter.main(["calibrate", "--draft", str(folder), "--prompts", "3", "--max-new-tokens", "24",
                         "--threads", "1", "--out", str(folder / "calibration.json")]) == 0
    prior = load_checkpoint(folder).calibration_prior
    prov = prior.provenance
    assert prov["prompts"] == 3 and prov["seed"] == 0 and prov["continuations"] == {"greedy": 3, "t0.7": 2,
                                                                                     "max_new_tokens": 24}
    assert prov["command"].startswith("dcut-drafter calibrate --draft") and "never the held-out prompts" in prov["prompt_split"]
    assert prov["log_loss_calibrated"] <= prov["log_loss_raw"]
    assert prov["by_depth"][0]["depth"] == 1 and {"ece_raw", "ece_calibrated"} <= set(prov["by_depth"][0])
    assert json.loads(capsys.readouterr().out)["slope"] == prior.slope
