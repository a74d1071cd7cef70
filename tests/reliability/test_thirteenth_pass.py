"""Thirteenth pass (docs/reliability.md): the work dir of ``dcut-drafter train`` under a stop or a
``--fresh`` start, and the ``remaining`` input of a draining batch (``RatioController.plan``,
``StepDriver.plan``/``fine`` called directly, ``RequestBatch`` step records)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import dcut_sched as d
from dcut_sched.controller.request_batch import RequestBatch
from dcut_sched.controller.step_driver import StepDriver
from dcut_sched.drafters import train as train_mod
from dcut_sched.drafters.train import DATA_NAME, STATE_NAME, run_training
from dcut_sched.policies.fine import Fine
from dcut_sched.step_costs import StepCosts

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "drafters"))
from test_workdir import (  # noqa: E402 - the tiny target and made-up prompts of the work-dir tests
    TINY_SETTINGS,
    FakeTokenizer,
    tiny_training,
)

CONF = np.full((2, 3), 0.9)
SIDECAR = str(Path(DATA_NAME).with_suffix(".json"))


# --------------------------------------------------------------------------- remaining


def _fine(make_curve) -> d.RatioController:
    return d.RatioController(make_curve(batch_sizes=(1, 2, 4), base_ms=2.0, per_token_ms=1.0), 4, policy="fine",
                             calibrate=False, granularity=1)


def test_remaining_beyond_int64_counts_as_far_from_the_end(make_curve):
    far = _fine(make_curve).plan(CONF, remaining=np.array([2**62, 2**62]))
    assert far.lengths.tolist() == [4, 4]
    # an unsigned value beyond int64 (numpy uint64, or a Python int numpy stores as one) wrapped
    # below 1 when cast: both requests "ended this step", lengths [1, 1]
    for remaining in (np.array([2**63, 2**64 - 1], dtype=np.uint64), [2**63, 2**63]):
        plan = _fine(make_curve).plan(CONF, remaining=remaining)
        assert plan.lengths.tolist() == [4, 4] and plan.num_tokens == far.num_tokens
    ctrl = _fine(make_curve)
    ctrl.plan(CONF, remaining=np.array([2**63, 5], dtype=np.uint64))
    assert ctrl.policy.state.booked.remaining.tolist() == [2**63 - 1, 5]


@pytest.mark.parametrize("remaining, error", [
    (np.array([3]), ValueError),  # broadcast over the batch: every request planned as 3 from its end
    (np.array([3, 3, 3, 3, 3]), ValueError),
    (np.array([[3, 3, 3, 3]]), ValueError),
    (np.array([2.9, 3.5, 10.2, 1.1]), TypeError),  # truncated to integers without a word
])
def test_fine_checks_remaining_when_called_without_the_controller(curve4, remaining, error):
    costs, conf = StepCosts(curve4, 4), np.full((4, 3), 0.9)
    with pytest.raises(error, match="remaining must"):
        StepDriver(Fine(), costs, 4).plan(conf, None, remaining)
    with pytest.raises(error, match=r"^fine: remaining must"):
        Fine().plan(conf, costs, remaining=remaining)
    good = StepDriver(Fine(), costs, 4).plan(conf, None, [9, 3, 12, 1])  # a list of integers is taken
    same = Fine().plan(conf, costs, remaining=torch.tensor([9, 3, 12, 1]))
    assert good.lengths.tolist() == same.lengths.tolist()


@pytest.mark.parametrize("policy, draining", [("fine", True), ("uniform", False), ("full", False)])
def test_a_step_record_says_draining_only_when_the_plan_read_remaining(make_curve, tmp_path, policy, draining):
    curve = make_curve(batch_sizes=(1, 2, 4), base_ms=2.0, per_token_ms=1.0)
    ctrl = d.RatioController(curve if policy == "fine" else None, 4, policy=policy, calibrate=False)
    batch = RequestBatch(ctrl, record_path=tmp_path / "steps.jsonl")
    plan = batch.plan(["a", "b"], [[1, 2, 3], [4, 5, 6]], CONF, remaining=[10, 3], num_output=[0, 0])
    flight = batch.schedule(plan, ["a", "b"], {r: n - 1 for r, n in zip(plan.req_ids, plan.lengths)})
    record = batch.observe(flight, {"a": 0, "b": 0})
    batch.close()
    # before: True for every policy given remaining; docs/controller.md: "whether the plan read" them
    assert plan.draining is draining and record["draining"] is draining
    with pytest.raises(TypeError, match="remaining must be integers"):  # still checked for every policy
        batch.plan(["a", "b"], [[1, 2, 3], [4, 5, 6]], CONF, remaining=[1.5, 3.0])


# --------------------------------------------------------------------------- the drafter's work dir


@pytest.fixture
def train(monkeypatch, tmp_path):
    """``train(work, stop=None, fresh=False, **settings)``: ``run_training`` on the tiny target with
    made-up prompts (5 steps, a checkpoint every 2); ``stop(kind, n)`` raises ``KeyboardInterrupt``
    in the n-th training step (``"step"``) or right after the n-th ``torch.save`` wrote its file,
    before it is renamed into place (``"save"``)."""
    from dcut_sched.paths import prompts_path

    target, weights = tiny_training(monkeypatch, tmp_path)
    base = TINY_SETTINGS
    real_step, real_save = train_mod.train_step, torch.save

    def go(work: Path, stop: tuple[str, int] | None = None, fresh: bool = False, **changes):
        calls = {"step": 0, "save": 0}

        def step(*a, **k):
            calls["step"] += 1
            if stop == ("step", calls["step"]):
                raise KeyboardInterrupt
            return real_step(*a, **k)

        def save(obj, f, *a, **k):
            real_save(obj, f, *a, **k)
            calls["save"] += 1
            if stop == ("save", calls["save"]):
                raise KeyboardInterrupt

        monkeypatch.setattr(train_mod, "train_step", step)
        monkeypatch.setattr(torch, "save", save)
        log: list[str] = []
        try:
            return run_training(dataclasses.replace(base, **changes), target=target, tokenizer=FakeTokenizer(),
                                work_dir=work, eval_prompts=prompts_path(), log=log.append, model_file=weights,
                                fresh=fresh, evaluate=False), log
        finally:
            monkeypatch.setattr(torch, "save", real_save)

    return go


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def _same_weights(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize("save, left", [
    (1, []),  # the data: before, data.pt.tmp was left (the size of the data: hundreds of MB at defaults)
    (2, sorted([DATA_NAME, SIDECAR])),  # the first checkpoint: before, state.pt.tmp was left beside them
])
def test_a_stop_while_a_work_dir_file_is_written_leaves_no_temp_file(train, tmp_path, save, left):
    (whole, _, _), _ = train(tmp_path / "a")
    work = tmp_path / "b"
    with pytest.raises(KeyboardInterrupt):
        train(work, stop=("save", save))
    assert _names(work) == left
    (resumed, state, _), _ = train(work)
    assert state.step == 5 and _same_weights(whole, resumed)
    assert _names(work) == sorted([DATA_NAME, SIDECAR, STATE_NAME])


def test_a_fresh_run_stopped_before_its_first_checkpoint_leaves_no_stale_one(train, tmp_path):
    work = tmp_path / "w"
    train(work)  # seed 0: a 5-step checkpoint
    with pytest.raises(KeyboardInterrupt):
        train(work, stop=("step", 2), fresh=True, seed=1)  # the new data written, no checkpoint yet
    # before: the seed-0 checkpoint stayed beside the seed-1 data, so the rerun of seed 1 was refused
    # ("checkpoint trained with seed=0, not 1; pass --fresh") and --fresh generated the data again
    assert _names(work) == sorted([DATA_NAME, SIDECAR])
    (resumed, state, _), log = train(work, seed=1)
    assert state.step == 5 and any("reusing it" in line for line in log)
    (whole, _, _), _ = train(tmp_path / "other", seed=1)
    assert _same_weights(whole, resumed)
