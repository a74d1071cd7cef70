"""Selection curve: uniform vs topk at equal budgets, by hand on one batch."""

from __future__ import annotations

import numpy as np
import pytest

from dcut_sched.simulator import selection_curve
from dcut_sched.simulator.selection_curve import default_budgets


def test_hand_batch(hand_trace):
    # Batch = rows A p0 (accept 2, scores 1 .9 .45 .09) and B p0 (accept 3, scores 1 .95 .855 .7695).
    # K = 4: uniform L = (2, 2) -> tokens 2 + 2 = 4; topk: anchors, .95 B, .9 A -> (2, 2) -> 4.
    # K = 6: uniform ceil(6/2) = 3 -> (3, 3) -> 3 + 3 = 6; topk: + .855 B, .7695 B -> (2, 4) -> 2 + 4 = 6.
    # K = 8: both (4, 4) -> 3 + 4 = 7.
    a0, b0 = int(hand_trace.starts[0]), int(hand_trace.starts[1])
    df = selection_curve(hand_trace, 2, budgets=[4, 6, 8], batches=np.array([[a0, b0]]))
    got = df.set_index(["policy", "budget"])["accepted_tokens"]
    assert got.to_dict() == {("uniform", 4): 4, ("uniform", 6): 6, ("uniform", 8): 7,
                             ("topk", 4): 4, ("topk", 6): 6, ("topk", 8): 7}
    assert df.set_index(["policy", "budget"]).loc[("topk", 6), "expected_tokens"] == pytest.approx(5.4745, abs=1e-5)


def test_default_budgets_verify_exactly_the_budget(hand_trace):
    # Default budgets are multiples of bs, so uniform verifies exactly K slots too; at K = bs*B both verify all.
    df = selection_curve(hand_trace, 2, num_batches=300, seed=1)
    wide = df.pivot(index="budget", columns="policy", values="accepted_tokens")
    assert (df["num_tokens"] == df["budget"]).all()
    assert wide.index.tolist() == default_budgets(2, 4) == [4, 6, 8]
    assert wide.loc[8, "topk"] == wide.loc[8, "uniform"]


def test_published_budget_range():
    assert default_budgets(64, 16)[0] == 128 and default_budgets(64, 16)[-1] == 1024


def test_bad_budget(hand_trace):
    with pytest.raises(ValueError, match="outside"):
        selection_curve(hand_trace, 2, budgets=[1])
