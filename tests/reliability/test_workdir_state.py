"""A ``state.pt`` whose curves do not match its step is refused naming the field, before anything is
written: ``history = None`` shipped a ``KeyError`` traceback from the curve plot, and a history
longer or shorter than ``step`` resumed silently (the run retrained steps it had taken, or shipped a
curve and card of other steps)."""

from __future__ import annotations

import hashlib

import pytest
import torch

from dcut_sched.drafters.train import DATA_NAME, STATE_NAME, TrainSettings, TrainState
from dcut_sched.drafters.workdir import WorkDirError, read_work_dir

SETTINGS = TrainSettings(steps=3).to_json()


def _row(n: int, loss: float = 2.5) -> dict:
    return {"step": n, "block_size": 16, "loss": loss, "lr": 1e-3, "elapsed_s": 0.1 * n}


def _save(work, state: TrainState) -> None:
    work.mkdir(exist_ok=True)
    torch.save({"settings": SETTINGS, "model": {"w": torch.zeros(2)}, "optimizer": {}, "state": state},
               work / STATE_NAME)


def _read(work):
    return read_work_dir(work, DATA_NAME, STATE_NAME, settings=SETTINGS, data_key={}, fresh=False)


def test_a_consistent_state_is_read(tmp_path):
    _save(tmp_path, TrainState(step=2, history=[_row(1), _row(2)], evals=[{"step": 2, "tau_b16": 1.5}], elapsed_s=3.0))
    assert _read(tmp_path).state["state"].step == 2


@pytest.mark.parametrize("state, needle", [
    (TrainState(step=2, history=None), "field state.history is NoneType, not one row per step taken (2)"),
    (TrainState(step=1, history=[_row(1), _row(2)]), "field state.history is 2 rows, not one row per step taken (1)"),
    (TrainState(step=2, history=[_row(1)]), "field state.history is 1 rows, not one row per step taken (2)"),
    (TrainState(step=2, history=[_row(1), _row(3)]), "field state.history[1] is not step 2's row"),
    (TrainState(step=1, history=[_row(1, float("nan"))]), "field state.history[0] is not step 1's row with a finite loss"),
    (TrainState(step=1, history=["row"]), "field state.history[0]"),
    (TrainState(step=1, history=[_row(1)], evals=None), "field state.evals is not a list of rows"),
    (TrainState(step=1, history=[_row(1)], elapsed_s=float("inf")), "field state.elapsed_s is inf"),
    (TrainState(step=1, history=[_row(1)], elapsed_s=-1.0), "field state.elapsed_s is -1.0"),
])
def test_a_state_whose_curves_do_not_match_its_step_is_refused(tmp_path, state, needle):
    _save(tmp_path, state)
    before = hashlib.sha256((tmp_path / STATE_NAME).read_bytes()).hexdigest()
    with pytest.raises(WorkDirError, match="pass --fresh") as info:
        _read(tmp_path)
    assert needle in str(info.value) and str(tmp_path / STATE_NAME) in str(info.value)
    assert hashlib.sha256((tmp_path / STATE_NAME).read_bytes()).hexdigest() == before
