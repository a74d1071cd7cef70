"""dcut-drafter train --help: every training-size flag says what it sets and shows its default, the
default of :class:`~dcut_sched.drafters.train.TrainSettings`."""

from __future__ import annotations

import pytest

from dcut_sched.cli import drafter
from dcut_sched.drafters.train import TrainSettings


def test_train_help_shows_each_flag_and_its_default(capsys):
    with pytest.raises(SystemExit) as exc:
        drafter.main(["train", "--help"])
    assert exc.value.code == 0
    words = " ".join(capsys.readouterr().out.split())  # argparse wraps to the terminal width
    d = TrainSettings()
    for flag, meta, what, default in [("--seed", "SEED", "seeds the prompt generator", d.seed),
                                      ("--steps", "STEPS", "optimisation steps", d.steps),
                                      ("--layers", "LAYERS", "drafter decoder layers", d.num_layers),
                                      ("--seqs-per-step", "SEQS_PER_STEP", "training sequences per", d.seqs_per_step),
                                      ("--blocks-per-seq", "BLOCKS_PER_SEQ", "draft blocks", d.blocks_per_seq),
                                      ("--eval-every", "EVAL_EVERY", "steps between held-out", d.eval_every)]:
        entry = words.split(f" {flag} {meta} ")[-1]  # the option's own entry, after the usage lines
        assert entry.startswith(what), (flag, entry[:80])
        assert f"(default: {default})" in entry.split(" --")[0], (flag, entry[:200])
    assert (d.seed, d.steps, d.num_layers, d.seqs_per_step, d.blocks_per_seq, d.eval_every) == (0, 2400, 2, 4, 16, 250)
