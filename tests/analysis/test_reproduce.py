"""analysis/report_reproduce.py: the published comparison, the targets, the generated blocks, the gap traces."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

ANALYSIS = Path(__file__).resolve().parents[2] / "analysis"
sys.path.insert(0, str(ANALYSIS))

import report_reproduce as rr  # noqa: E402

from dcut_sched.simulator import benchmark_table, defaults  # noqa: E402
from dcut_sched.traces import Trace  # noqa: E402


def _table(full, dcut, fine):
    sizes = [4, 8, 16, 32, 64]
    t = pd.DataFrame([full, dcut, fine], index=["full", "dcut", "fine"], columns=sizes)
    t["geomean"] = 1.0
    return t


def test_published_comparison_and_targets_hand_computed():
    pub = rr.PUBLISHED
    # exactly the published numbers: every error 0, every target met (fine = dcut + 0.05 >= max(1, dcut) - .01
    # except where dcut < 1: there fine must be >= .99)
    t = _table(pub.loc["full"].tolist(), pub.loc["dcut"].tolist(), [3.6, 2.6, 1.7, 1.25, 1.0])
    cmp = rr.published_comparison(t)
    assert len(cmp) == 10 and np.allclose(cmp["rel_error"], 0.0)
    assert all(ok for _, ok, _ in rr.done_when(t))
    # full 10 % high at bs 64 and above 1.0 at bs 32; fine below ar at bs 64
    t = _table([3.16, 1.87, 1.16, 1.05, 0.715], pub.loc["dcut"].tolist(), [3.6, 2.6, 1.7, 1.25, 0.97])
    cmp = rr.published_comparison(t).set_index(["policy", "batch_size"])["rel_error"]
    assert cmp["full", 64] == pytest.approx(0.10) and cmp["full", 32] == pytest.approx(1.05 / 0.80 - 1)
    met = {what: ok for what, ok, _ in rr.done_when(t)}
    assert met == {"`full` < 1.0x at bs 32 and 64": False, "`dcut` above `full` at every bs": True,
                   "`fine` >= max(1.0, `dcut`) - 0.01 at every bs": False,
                   "every cell within 15% of the published one": False}


def test_benchmark_table_is_the_mean_over_benchmarks_and_geomean_over_settings():
    df = pd.DataFrame({
        "benchmark": ["a", "a", "b", "b"] * 2,
        "policy": ["ar"] * 4 + ["dcut"] * 4,
        "batch_size": [4, 8, 4, 8] * 2,
        "speedup_vs_ar": [1, 1, 1, 1, 2.0, 1.0, 4.0, 0.5],
    })
    t = benchmark_table(df)
    assert t.at["dcut", 4] == pytest.approx(3.0) and t.at["dcut", 8] == pytest.approx(0.75)
    assert t.at["dcut", "geomean"] == pytest.approx((2.0 * 1.0 * 4.0 * 0.5) ** 0.25)
    assert t.at["ar", "geomean"] == pytest.approx(1.0)


def test_generated_block_replaced_only_between_markers(tmp_path):
    doc = tmp_path / "README.md"
    doc.write_text("intro\n<!-- generated:headline -->\nold\n<!-- /generated:headline -->\nrest\n")
    assert rr.update_generated_block(doc, "headline", "| new |\n")
    assert doc.read_text() == "intro\n<!-- generated:headline -->\n| new |\n<!-- /generated:headline -->\nrest\n"
    other = tmp_path / "other.md"
    other.write_text("no markers\n")
    assert not rr.update_generated_block(other, "headline", "x") and other.read_text() == "no markers\n"


def test_gap_zero_traces_are_the_shipped_ones():
    # the sensitivity's traces at gap 0 are exactly the shipped presets' (48 requests, seed 0)
    shipped = Trace.load(defaults.default_trace_path(defaults.DEFAULT_TRACES[4]))
    made = rr.gap_traces(0.0)[4]
    np.testing.assert_array_equal(made.accept_len, shipped.accept_len)
    np.testing.assert_array_equal(made.conf, shipped.conf)
