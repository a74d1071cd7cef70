"""The prompts ``dcut-drafter calibrate`` fits a drafter's prior on: its own training list (never
the held-out prompts), rebuilt from the settings in its ``heldout.json``, and an even spread over it."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from ..traces.prompts import Prompt
from . import datagen
from .data import legacy_prompt_split
from .train import TrainSettings, in_calibration_split

__all__ = ["calibration_prompts", "calibration_training_list"]


def calibration_prompts(train, count: int) -> list:
    """``count`` prompts spread evenly over the training list ``train`` (every category, the
    HumanEval ones included), in list order."""
    if count >= len(train):
        return list(train)
    return [train[round(i * (len(train) - 1) / (count - 1))] for i in range(count)]


def calibration_training_list(trained: dict, seed: int, eval_prompts: str) -> Callable[[Any, Any], tuple[list, str]]:
    """``make(target, tokenizer) -> (prompts, provenance line)``: the training prompt list of the
    drafter whose ``heldout.json`` settings are ``trained``, with ``seed``. A drafter of the first
    data pipeline (settings without ``num_gsm8k``: templated prompts and HumanEval) gets
    :func:`~dcut_sched.drafters.data.legacy_prompt_split`'s list; any other the first turns of
    :func:`~dcut_sched.drafters.datagen.training_list` of its data settings (the target writes the
    self-instruct requests again, as in training).

    Raises:
        ValueError, TypeError, KeyError: ``trained`` is not a drafter's training settings (raised
            here, before any model is loaded).
    """
    if "num_gsm8k" not in trained:
        count = int(trained["num_generated_prompts"])
        if count < 0:
            raise ValueError(f"num_generated_prompts must be >= 0, not {count}")

        def legacy(target, tokenizer) -> tuple[list, str]:
            return (legacy_prompt_split(count, seed, eval_prompts)[0],
                    f"training prompts of legacy_prompt_split({count}, seed {seed})")

        return legacy
    names = {f.name for f in dataclasses.fields(TrainSettings)}
    fields = {k: tuple(v) if k == "block_sizes" else v for k, v in trained.items() if k in names}
    data = datagen.DataSettings.from_train(dataclasses.replace(TrainSettings(**fields), seed=seed), eval_prompts, ())

    every = int(trained.get("calibration_every", 0))

    def current(target, tokenizer) -> tuple[list, str]:
        convs, _ = datagen.training_list(data, target, tokenizer)
        if every:  # a drafter trained with a calibration split: that split, never trained on
            convs = [c for c in convs if in_calibration_split(c.id, every)]
        return ([Prompt(c.id, c.category, c.turns[0]) for c in convs],
                f"first turns of the {len(convs)} " + ("calibration-split" if every else "training")
                + f" conversations of datagen.training_list (the data settings of the drafter's heldout.json, seed {seed})")

    return current
