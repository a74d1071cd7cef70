"""``dcut-drafter train``'s files are inputs with owners: settings checked before anything is written,
corrupt files one line, the default ``--out`` never replaces a drafter, the folder swapped in whole,
one live run per work dir, a diverged run ships nothing.

The CLI runs on a tiny random target (8 layers, width 32) with six made-up prompts (in place of the
training sources and the held-out sets): the whole run
(data generation, training, held-out tau, the folder) takes a fraction of a second.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import pytest
import torch

from dcut_sched.cli import drafter as cli
from dcut_sched.drafters import train as train_mod
from dcut_sched.drafters.sources import TrainPrompt
from dcut_sched.drafters.train import DATA_NAME, STATE_NAME, TrainSettings
from dcut_sched.drafters.workdir import first_difference, lock_work_dir
from dcut_sched.model import LlamaConfig, LlamaModel
from dcut_sched.traces.prompts import Prompt

TARGET = LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_layers=8, num_heads=2, num_kv_heads=1,
                     head_dim=16, tie_word_embeddings=True, max_position=256, name="tiny-8")
SMALL = ["--draft-vocab", "0", "--layers", "1", "--seqs-per-step", "2", "--blocks-per-seq", "2", "--eval-every", "2",
         "--max-new-tokens", "8"]


@pytest.fixture(scope="module")
def target():
    return LlamaModel.random_init(TARGET, seed=1, std=0.2)


class FakeTokenizer:
    """Each character to a token id of the tiny vocabulary."""

    eos_id = None

    def chat_ids(self, messages, add_generation_prompt=True):
        return [1, 2] + [ord(ch) % 28 + 3 for ch in messages[-1]["content"][:6]]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(97 + i % 26) for i in ids)


def _prompts(seed):
    rng = random.Random(seed)
    return [Prompt(f"p{i}", "test", "".join(rng.choice("abcdefgh") for _ in range(6))) for i in range(6)]


def _training_prompts(s, heldout, instruct):
    """Four made-up training prompts of ``s.seed`` (in place of the sources)."""
    train = [TrainPrompt(p.id, p.category, (p.text,)) for p in _prompts(s.seed)[:4]]
    return train, {"by_source": {"test": len(train)}, "two_turn": 0, "dropped": {}}


def _eval_prompts(s):
    """Two made-up held-out prompts, no ``unlike`` ones."""
    return _prompts(s.seed)[4:], []


#: A tiny ``run_training`` (5 steps, a checkpoint every 2) for the tests that call it without the CLI.
TINY_SETTINGS = TrainSettings(steps=5, checkpoint_every=2, eval_every=100, num_layers=1, draft_vocab_size=None,
                              seqs_per_step=2, blocks_per_seq=2, max_new_tokens=8, warmup_steps=2)


def tiny_training(monkeypatch, tmp_path: Path) -> tuple[LlamaModel, Path]:
    """Patch in the made-up prompts; return the tiny target and a weights file under ``tmp_path`` for
    ``run_training`` (with :data:`TINY_SETTINGS` and :class:`FakeTokenizer`)."""
    monkeypatch.setattr("dcut_sched.drafters.datagen.training_prompts", _training_prompts)
    monkeypatch.setattr("dcut_sched.drafters.datagen.eval_prompts", _eval_prompts)
    weights = tmp_path / "tiny.gguf"
    weights.write_bytes(b"tiny target")
    return LlamaModel.random_init(TARGET, seed=1, std=0.2), weights


@pytest.fixture(scope="module")
def weights_file(tmp_path_factory):
    """The target's weights file, whose hash is part of the data's key (outside each test's tmp_path)."""
    path = tmp_path_factory.mktemp("target") / "tiny.gguf"
    path.write_bytes(b"tiny target")
    return path


@pytest.fixture
def run(tmp_path, monkeypatch, target, capsys, weights_file):
    """``run(*flags, seed=0, work="wd", out="d")`` -> (status, stderr): ``dcut-drafter train`` on the
    tiny target with six made-up prompts (data generation included)."""
    monkeypatch.setattr(LlamaModel, "from_smollm2", classmethod(lambda cls, **k: target))
    monkeypatch.setattr("dcut_sched.model.tokenizer.load_smollm2_tokenizer", lambda: FakeTokenizer())
    monkeypatch.setattr("dcut_sched.drafters.datagen.training_prompts", _training_prompts)
    monkeypatch.setattr("dcut_sched.drafters.datagen.eval_prompts", _eval_prompts)
    monkeypatch.setattr("dcut_sched.model.gguf_weights.smollm2_gguf_path", lambda: weights_file)

    def go(*flags, seed=0, work="wd", out="d"):
        argv = ["train", *(["--out", str(tmp_path / out)] if out else []), "--work-dir", str(tmp_path / work), *SMALL,
                "--seed", str(seed), *flags]
        capsys.readouterr()
        status = cli.main(argv)
        return status, capsys.readouterr().err

    return go


def _digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def _one_line(status: int, err: str, *needles: str) -> None:
    assert status == 2, err
    lines = [line for line in err.splitlines() if not line.startswith("[dcut-drafter")]  # progress log lines
    assert len(lines) == 1 and "Traceback" not in err and ": error: " in lines[0], err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def test_a_rerun_with_the_same_settings_resumes_and_rewrites_the_same_folder(run, tmp_path):
    assert run("--steps", "3")[0] == 0
    card = json.loads((tmp_path / "d" / "heldout.json").read_text())
    assert card["settings"]["steps"] == 3 and len(card["evals"]) == 2
    state = torch.load(tmp_path / "wd" / STATE_NAME, weights_only=False)
    assert state["state"].step == 3
    status, err = run("--steps", "3")
    assert status == 0 and "resumed from" in err and "at step 3" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d", "wd"]  # no staging folder left


def test_fewer_steps_than_the_checkpoint_are_refused_before_anything_is_written(run, tmp_path):
    assert run("--steps", "5")[0] == 0
    before, wd_before = _digest(tmp_path / "d"), _digest(tmp_path / "wd")
    # the shipped folder holds 5-step weights: never relabelled as 3
    _one_line(*run("--steps", "3"), f"--out {tmp_path / 'd'} holds a drafter trained with steps=5, not 3", "--fresh")
    # another --out, same work dir: the checkpoint refuses
    _one_line(*run("--steps", "3", out="e"), f"{tmp_path / 'wd' / STATE_NAME}: checkpoint trained with steps=5, not 3",
              "another learning-rate schedule", "--fresh")
    assert _digest(tmp_path / "d") == before and _digest(tmp_path / "wd") == wd_before
    assert not (tmp_path / "e").exists()


def test_a_longer_schedule_is_refused_and_fresh_equals_a_run_from_scratch(run, tmp_path):
    from safetensors.torch import load_file

    assert run("--steps", "3", out="a")[0] == 0
    _one_line(*run("--steps", "5", out="b"), "checkpoint trained with steps=3, not 5")
    assert run("--steps", "5", "--fresh", out="b")[0] == 0
    assert run("--steps", "5", work="wd2", out="c")[0] == 0  # from scratch in a new work dir
    b, c = load_file(str(tmp_path / "b" / "model.safetensors")), load_file(str(tmp_path / "c" / "model.safetensors"))
    assert b.keys() == c.keys() and all(torch.equal(b[k], c[k]) for k in b)


def test_another_seed_is_refused_before_the_cached_data_is_replaced(run, tmp_path):
    assert run("--steps", "2")[0] == 0
    wd_before = _digest(tmp_path / "wd")
    _one_line(*run("--steps", "2", seed=1, out="e"), "checkpoint trained with seed=0, not 1")
    assert _digest(tmp_path / "wd") == wd_before
    (tmp_path / "wd" / STATE_NAME).unlink()  # data alone: refused too, not regenerated
    _one_line(*run("--steps", "2", seed=1, out="e"), f"{tmp_path / 'wd' / DATA_NAME}: data generated with settings.seed=0, not 1",
              "--fresh")
    assert (tmp_path / "wd" / DATA_NAME).read_bytes() and _digest(tmp_path / "wd")[DATA_NAME] == wd_before[DATA_NAME]
    assert not (tmp_path / "e").exists()


def test_the_default_out_never_replaces_a_drafter(run, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shipped = tmp_path / "drafters" / "smollm2-135m-dflash"
    shipped.mkdir(parents=True)
    (shipped / "config.json").write_text(json.dumps({"architectures": ["DFlashDraftModel"]}))
    (shipped / "model.safetensors").write_bytes(b"shipped weights")
    before = _digest(shipped)
    _one_line(*run("--steps", "2", out=None), "--out is not given", "drafters/smollm2-135m-dflash already holds")
    assert _digest(shipped) == before


@pytest.mark.parametrize("heldout", [None, "{not json", json.dumps({"settings": {}, "command": "some-other-tool"})])
def test_a_drafter_another_command_wrote_is_replaced_only_with_fresh(run, tmp_path, heldout):
    out = tmp_path / "d"
    out.mkdir()
    (out / "config.json").write_text(json.dumps({"architectures": ["DFlashDraftModel"]}))
    (out / "model.safetensors").write_bytes(b"someone's weights")
    if heldout is not None:
        (out / "heldout.json").write_text(heldout)
    before = _digest(out)
    _one_line(*run("--steps", "2"), f"--out {out}: ", "was not written by dcut-drafter train", "--fresh")
    assert _digest(out) == before
    assert run("--steps", "2", "--fresh")[0] == 0
    assert json.loads((out / "heldout.json").read_text())["settings"]["steps"] == 2


def test_a_folder_holding_other_files_is_never_replaced(run, tmp_path):
    assert run("--steps", "2")[0] == 0
    (tmp_path / "d" / "notes.txt").write_text("mine\n")
    before = _digest(tmp_path / "d")
    _one_line(*run("--steps", "2", "--fresh"), "holds files dcut-drafter train does not write (notes.txt)")
    assert _digest(tmp_path / "d") == before


def test_the_drafter_folder_is_written_all_or_none(run, tmp_path, monkeypatch):
    assert run("--steps", "2")[0] == 0
    before = _digest(tmp_path / "d")

    def broken_plot(path, *a):
        raise OSError(f"cannot write {path}: disk full")

    monkeypatch.setattr(cli, "plot_curve", broken_plot)
    _one_line(*run("--steps", "2"), "disk full")
    assert _digest(tmp_path / "d") == before  # old config, weights and card together
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d", "wd"]  # the staged folder is gone
    monkeypatch.undo()


def test_the_swap_puts_the_old_folder_back_when_the_new_one_cannot_go_in(tmp_path, monkeypatch):
    import os

    from dcut_sched.drafters import workdir

    out = tmp_path / "d"
    out.mkdir()
    (out / "config.json").write_text("old")
    real = os.rename
    calls = []

    def rename(src, dst):
        calls.append(dst)
        if len(calls) == 2:  # the staged folder into place
            raise OSError(28, "No space left on device")
        return real(src, dst)

    monkeypatch.setattr(workdir.os, "rename", rename)
    with pytest.raises(OSError, match=f"cannot write {out}: No space left"):
        workdir.replace_folder(out, lambda stage: (stage / "config.json").write_text("new"))
    assert (out / "config.json").read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["d"]
    monkeypatch.undo()
    workdir.replace_folder(out, lambda stage: (stage / "config.json").write_text("new"))
    assert (out / "config.json").read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["d"]


def test_a_second_run_on_a_live_work_dir_is_refused(run, tmp_path):
    wd = tmp_path / "wd"
    wd.mkdir()
    with lock_work_dir(wd):  # another run holds it
        _one_line(*run("--steps", "2"), f"--work-dir {wd}: another dcut-drafter train is running on it")
    assert not (tmp_path / "d").exists() and not any(wd.iterdir())
    assert run("--steps", "2")[0] == 0  # released


def test_a_diverging_run_stops_and_ships_nothing(run, tmp_path, monkeypatch):
    # --lr is capped at 1, so divergence is forced: the real loss, times NaN, as an exploding run gives
    real_loss = train_mod.step_loss
    monkeypatch.setattr(train_mod, "step_loss", lambda *a, **k: real_loss(*a, **k) * float("nan"))
    _one_line(*run("--steps", "4"), "training diverged at step 1", "the loss is nan", "lower --lr")
    assert not (tmp_path / "d").exists() and not (tmp_path / "wd" / STATE_NAME).exists()


def _corrupt(path: Path, kind: str) -> None:
    if kind == "random":
        path.write_bytes(bytes(range(256)) * 4)
    elif kind == "truncated":
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "no-settings":
        torch.save({"model": {}}, path)
    elif kind == "tensor":
        torch.save(torch.zeros(3), path)


@pytest.mark.parametrize("name", [STATE_NAME, DATA_NAME])
@pytest.mark.parametrize("kind", ["random", "truncated", "empty", "no-settings", "tensor"])
def test_corrupt_work_dir_files_are_one_line(run, tmp_path, name, kind):
    assert run("--steps", "2")[0] == 0
    path = tmp_path / "wd" / name
    _corrupt(path, kind)
    before = _digest(tmp_path / "wd")
    _one_line(*run("--steps", "2", out="e"), f"{path}: ", "--fresh")
    assert _digest(tmp_path / "wd") == before and not (tmp_path / "e").exists()


def test_a_checkpoint_with_non_finite_weights_is_one_line(run, tmp_path):
    assert run("--steps", "2")[0] == 0
    path = tmp_path / "wd" / STATE_NAME
    saved = torch.load(path, weights_only=False)
    saved["model"]["fc.weight"][0, 0] = float("nan")
    torch.save(saved, path)
    _one_line(*run("--steps", "2"), f"{path}: model weight fc.weight holds non-finite values")


def test_first_difference_names_the_field():
    assert first_difference({"a": 1, "b": [16, 8]}, {"a": 1, "b": (16, 8)}) is None
    assert first_difference({"a": 1, "b": 2}, {"a": 1, "b": 3}) == "b"
    assert first_difference({"a": 1}, {"a": 1, "c": 0}) == "c"
    assert first_difference({"a": 1, "z": 0}, {"a": 1}) == "z"


def test_a_work_dir_inside_out_is_refused(run, tmp_path):
    _one_line(*run("--steps", "2", work="d/wd"), "--work-dir", "is inside --out", "outside --out")
    _one_line(*run("--steps", "2", work="d"), "is inside --out")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_cached_data_of_another_target_is_refused(run, tmp_path):
    assert run("--steps", "2")[0] == 0
    path = tmp_path / "wd" / DATA_NAME
    data = torch.load(path, weights_only=False)
    for s in data["train"]:
        s.features = s.features[:, :16]
    torch.save(data, path)
    (tmp_path / "wd" / STATE_NAME).unlink()
    _one_line(*run("--steps", "2"), f"{path}: features [16, 128] wide", "reads 128", "--fresh")


def test_a_relative_out_is_swapped_in_place(run, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert run("--steps", "2")[0] == 0
    assert cli.main(["train", "--out", "d", "--work-dir", "wd", *SMALL, "--seed", "0", "--steps", "2"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d", "wd"]
    assert json.loads((tmp_path / "d" / "heldout.json").read_text())["command"].startswith("dcut-drafter train --out d")


def test_a_live_run_in_another_process_holds_the_work_dir(run, tmp_path):
    import subprocess
    import sys

    wd = tmp_path / "wd"
    wd.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from pathlib import Path; from dcut_sched.drafters.workdir import "
         "lock_work_dir\nwith lock_work_dir(Path(sys.argv[1])):\n    print('locked', flush=True); sys.stdin.read()",
         str(wd)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "locked\n"
        _one_line(*run("--steps", "2"), f"--work-dir {wd}: another dcut-drafter train is running on it")
    finally:
        holder.communicate("", timeout=60)  # the holder ends: its lock goes with it
    assert run("--steps", "2")[0] == 0


@pytest.mark.parametrize("damage", ["shape", "nan"])
def test_a_checkpoint_whose_optimizer_moments_do_not_fit_is_one_line(run, tmp_path, damage):
    """torch's ``load_state_dict`` does not compare AdamW's moments with the weights: a moment of
    another shape was a RuntimeError traceback at the first resumed step."""
    assert run("--steps", "3")[0] == 0
    path = tmp_path / "wd" / STATE_NAME
    saved = torch.load(path, weights_only=False)
    saved["state"].step, saved["state"].history = 1, saved["state"].history[:1]
    moments = saved["optimizer"]["state"][0]
    if damage == "shape":
        moments["exp_avg"] = torch.zeros(3)
    else:
        moments["exp_avg_sq"][0] = float("nan")
    torch.save(saved, path)
    before = _digest(tmp_path / "wd")
    needle = "has shape (3,), the weight" if damage == "shape" else "holds non-finite values"
    _one_line(*run("--steps", "3", out="e"), f"{path}: optimizer state", needle, "--fresh")
    assert _digest(tmp_path / "wd") == before and not (tmp_path / "e").exists()


def test_a_damaged_data_sidecar_is_rewritten_not_decoded(run, tmp_path):
    """``data.json`` is the data's sidecar (an output): bytes that are not UTF-8 were decoded to
    compare them, and the run ended on "'utf-8' codec can't decode byte 0xff"."""
    assert run("--steps", "2")[0] == 0
    side = tmp_path / "wd" / "data.json"
    good = side.read_bytes()
    side.write_bytes(b"\xff\xfe\x00garbage")
    assert run("--steps", "2", out="e")[0] == 0
    assert side.read_bytes() == good


@pytest.mark.parametrize("name", ["config.json", "heldout.json"])
def test_a_pipe_in_out_is_refused_not_read(run, tmp_path, name):
    """``--out``'s config.json and heldout.json were read with ``Path.read_text``: a named pipe there
    blocked the run for ever before it started."""
    import os

    assert run("--steps", "2")[0] == 0
    out = tmp_path / "d"
    (out / name).unlink()
    os.mkfifo(out / name)
    needle = ("holds other files and no DFlash drafter" if name == "config.json"
              else f"{out / name} is missing or unreadable")
    _one_line(*run("--steps", "2"), f"--out {out}", needle)
    assert (out / "model.safetensors").is_file()


def test_no_calibration_split_is_not_called_empty_continuations():
    """A smoke run with no calibration split logged "no anchor to draft from (every continuation is
    empty)", though no continuation was empty: there was none."""
    from dcut_sched.drafters.heldout import calibration_blocks

    with pytest.raises(ValueError, match=r"no anchor to draft from \(no sequence given\)"):
        calibration_blocks(None, [], 16, None, None)
