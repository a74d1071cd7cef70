"""The work dir's ``state.pt`` and ``data.pt`` load with ``torch.load(weights_only=True)``: tensors,
plain containers and the few classes they hold (``workdir.safe_types``). A crafted pickle whose
``__reduce__`` would run code is refused in one line naming the file and the object, and nothing
runs (they were loaded with ``weights_only=False``, which runs it). A checkpoint still resumes to the
weights of an uninterrupted run, bit for bit."""

from __future__ import annotations

import hashlib
import pickle
import sys
import warnings
from pathlib import Path

import pytest
import torch

from dcut_sched.drafters.train import DATA_NAME, STATE_NAME, TrainSettings, TrainState, run_training
from dcut_sched.drafters.workdir import FRESH as FRESH_HINT
from dcut_sched.drafters.workdir import WorkDirError, read_work_dir

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "drafters"))
from test_workdir import (  # noqa: E402 - the tiny target and made-up prompts of the work-dir tests
    TARGET,
    TINY_SETTINGS,
    FakeTokenizer,
    tiny_training,
)

SETTINGS = TrainSettings(steps=3).to_json()


class Payload:
    """Unpickled, it writes ``marker`` (standing for any code a crafted file could run)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({str(self.marker)!r}, 'w').write('ran')",))


def _read(work: Path):
    return read_work_dir(work, DATA_NAME, STATE_NAME, settings=SETTINGS, data_key={"format": 1}, fresh=False)


def _crafted(path: Path, marker: Path, *, protocol: int | None, where: str) -> None:
    """``path``: a checkpoint-shaped dict with the payload under ``where``: torch's zip format
    (``protocol`` None), or a plain pickle of ``protocol``, which ``torch.load`` reads through its
    legacy path."""
    obj = {"settings": SETTINGS, "model": {}, "optimizer": {}, "state": TrainState(),
           "key": {"format": 1}}
    obj[where] = Payload(marker)
    if protocol is not None:
        path.write_bytes(pickle.dumps(obj, protocol=protocol))
    else:
        torch.save(obj, path)


def test_the_payload_runs_when_unpickled_unchecked(tmp_path):
    """The test's payload is live: an unchecked load runs it (what the work dir used to do)."""
    marker = tmp_path / "ran"
    _crafted(tmp_path / "x.pt", marker, protocol=None, where="state")
    torch.load(tmp_path / "x.pt", weights_only=False)
    assert marker.read_text() == "ran"


@pytest.mark.parametrize("name", [STATE_NAME, DATA_NAME])
@pytest.mark.parametrize("protocol", [None, 2, pickle.HIGHEST_PROTOCOL], ids=["zip", "pickle-2", "pickle-latest"])
@pytest.mark.parametrize("where", ["state", "settings"])
def test_a_crafted_pickle_is_refused_and_runs_nothing(tmp_path, name, protocol, where):
    work, marker = tmp_path / "wd", tmp_path / "ran"
    work.mkdir()
    path = work / name
    _crafted(path, marker, protocol=protocol, where=where)
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing but the error: torch's pickle-protocol warning is held back
        with pytest.raises(WorkDirError) as info:
            _read(work)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{path}: ") and message.endswith(FRESH_HINT), message
    if protocol != pickle.HIGHEST_PROTOCOL:  # read up to the payload: named (a newer protocol's framing stops earlier)
        assert "refers to exec, which no dcut-drafter train" in message and "refused without loading it" in message
    assert not marker.exists()
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before


def test_the_cli_refuses_a_crafted_state_in_one_line(tmp_path, monkeypatch, capsys):
    """Through ``dcut-drafter train``: exit 2, one error line, nothing run, nothing written."""
    from dcut_sched.cli import drafter as cli
    from dcut_sched.model import LlamaModel

    target = LlamaModel.random_init(TARGET, seed=1, std=0.2)
    monkeypatch.setattr(LlamaModel, "from_smollm2", classmethod(lambda cls, **k: target))
    monkeypatch.setattr("dcut_sched.model.tokenizer.load_smollm2_tokenizer", lambda: FakeTokenizer())
    monkeypatch.setattr("dcut_sched.model.gguf_weights.smollm2_gguf_path", lambda: tmp_path / "tiny.gguf")
    (tmp_path / "tiny.gguf").write_bytes(b"tiny target")
    work, marker = tmp_path / "wd", tmp_path / "ran"
    work.mkdir()
    _crafted(work / STATE_NAME, marker, protocol=None, where="state")
    status = cli.main(["train", "--out", str(tmp_path / "d"), "--work-dir", str(work), "--steps", "2"])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if not line.startswith("[dcut-drafter")]
    assert status == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert f"{work / STATE_NAME}: refers to exec" in lines[0]
    assert not marker.exists() and not (tmp_path / "d").exists()
    assert sorted(p.name for p in work.iterdir()) == [STATE_NAME]


@pytest.fixture
def tiny(monkeypatch, tmp_path):
    """``train(work, steps_done=None)``: ``run_training`` on the tiny target with made-up prompts
    (checkpoint every 2 steps); ``steps_done`` stops the run (KeyboardInterrupt) after that many steps."""
    from dcut_sched.drafters import train as train_mod
    from dcut_sched.paths import prompts_path

    target, weights = tiny_training(monkeypatch, tmp_path)
    settings = TINY_SETTINGS
    real_step = train_mod.train_step

    def train(work: Path, steps_done: int | None = None):
        calls = []

        def step(*a, **k):
            if steps_done is not None and len(calls) == steps_done:
                raise KeyboardInterrupt
            calls.append(1)
            return real_step(*a, **k)

        monkeypatch.setattr(train_mod, "train_step", step)
        return run_training(settings, target=target, tokenizer=FakeTokenizer(), work_dir=work,
                            eval_prompts=prompts_path(), log=lambda m: None, model_file=weights, evaluate=False)

    return train


def test_an_interrupted_run_resumes_to_the_same_weights_bit_for_bit(tiny, tmp_path):
    whole, _, _ = tiny(tmp_path / "a")
    with pytest.raises(KeyboardInterrupt):
        tiny(tmp_path / "b", steps_done=3)  # checkpointed at step 2, stopped in step 4
    saved = torch.load(tmp_path / "b" / STATE_NAME, weights_only=False)
    assert saved["state"].step == 2
    resumed, state, _ = tiny(tmp_path / "b")
    assert state.step == 5 and [h["step"] for h in state.history] == [1, 2, 3, 4, 5]
    a, b = whole.state_dict(), resumed.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
