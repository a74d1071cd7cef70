"""The results report's pieces (analysis/report_*.py) on tiny traces and a linear cost curve, in seconds."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy.stats import gmean

ANALYSIS = Path(__file__).resolve().parents[2] / "analysis"
sys.path.insert(0, str(ANALYSIS))

from report_budgets import VARIANTS, budget_steps, budget_summary, plot_budgets  # noqa: E402
from report_calibration import calibrated_throughput, plot_reliability, reliability  # noqa: E402
from report_markdown import render_report, speedup_markdown  # noqa: E402
from report_selection import plot_selection, selection_table  # noqa: E402
from report_speedup import Family, family_speedups, family_table, plot_family, run_family  # noqa: E402

from dcut_sched import policies  # noqa: E402
from tests.sim.conftest import build_trace, random_trace  # noqa: E402

STEPS, WARMUP = 60, 10


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """Two tiny B=4 traces and a linear cost curve covering bs 1..8, saved as files."""
    from tests.conftest import linear_curve

    d = tmp_path_factory.mktemp("report")
    traces = []
    for seed in (0, 1):
        path = d / f"smollm2-tiny-{seed}.parquet"
        random_trace(num_requests=10, block_size=4, seed=seed).save(path)
        traces.append(str(path))
    cost = d / "curve.json"
    linear_curve(batch_sizes=(1, 2, 4, 8), block_size=4).save(cost)
    return traces, str(cost), d


def test_family_speedups_is_gmean_over_traces():
    df = pd.DataFrame({"trace_name": ["a", "b", "a", "b"], "policy": ["dcut"] * 4, "batch_size": [4, 4, 8, 8],
                       "speedup_vs_ar": [2.0, 8.0, 1.0, 9.0]})
    out = family_speedups(df)
    assert out["speedup_vs_ar"].tolist() == pytest.approx([4.0, 3.0])
    assert out["num_traces"].tolist() == [2, 2]
    table = family_table(df)
    assert table.at["dcut", "geomean"] == pytest.approx(gmean([4.0, 3.0]))


def test_speedup_markdown_bolds_best_non_oracle():
    table = pd.DataFrame({4: [1.0, 2.0, 3.0], "geomean": [1.0, 2.5, 2.0]}, index=["ar", "dcut", "oracle"])
    text = speedup_markdown(table)
    assert "**2.00x**" in text and "**3.00x**" not in text and "**2.50x**" in text


def test_run_family_and_plot(inputs):
    traces, cost, d = inputs
    fam = Family("tiny", "tiny", traces, cost, (2, 4), note="n")
    done = []
    df = run_family(fam, num_steps=STEPS, warmup_steps=WARMUP, seed=0, on_run=lambda *a: done.append(a))
    assert len(done) == len(traces) * 2 * len(policies.names())
    assert set(df["policy"]) == set(policies.names())
    assert np.allclose(df.loc[df["policy"] == "ar", "speedup_vs_ar"], 1.0)
    plot_family(df, d / "speedup.png", title="t")
    assert (d / "speedup.png").stat().st_size > 1000


def test_selection_table_published_error_and_full_budget(inputs):
    traces, _, d = inputs
    bs, block = 4, 4
    budgets = (8, 16)
    published = {"uniform": (5.0, 8.0), "topk": (6.0, 8.0)}
    df = selection_table(traces[:1], batch_size=bs, budgets=budgets, num_batches=20, published=published,
                         published_trace=traces[0])
    assert set(df["weighting"]) == {"step-weighted"}
    assert np.allclose(df["rel_error"], df["accepted_tokens"] / df["published_tokens"] - 1)
    full = df[df["budget"] == bs * block].pivot_table(index="weighting", columns="policy", values="accepted_tokens")
    assert np.allclose(full["uniform"], full["topk"])  # verifying every slot: the selection does not matter
    plot_selection(df, d / "sel.png")
    assert (d / "sel.png").exists()


def test_budget_steps_and_summary(inputs):
    traces, cost, d = inputs
    steps = budget_steps(traces[0], cost, (2, 8), policies=list(VARIANTS), num_steps=STEPS)
    assert np.allclose(steps["ratio"], steps["num_tokens"] / (steps["batch_size"] * 4))
    dcut_budgets = set(policies.get("dcut").budgets(8, 4).tolist())
    fb = steps[(steps["policy"] == "fine(4 buckets)") & (steps["batch_size"] == 8) & steps["drafted"]]
    assert set(fb["num_tokens"]) <= dcut_budgets
    summ = budget_summary(steps, WARMUP)
    assert np.allclose(summ.loc[summ["policy"] == "dcut", "vs_dcut"], 1.0)
    one = steps[(steps["policy"] == "fine") & (steps["batch_size"] == 2) & (steps["step"] >= WARMUP)]
    row = summ[(summ["policy"] == "fine") & (summ["batch_size"] == 2)].iloc[0]
    assert row["tokens_per_s"] == pytest.approx(1000 * one["tokens"].sum() / one["step_ms"].sum())
    assert row["skipped_draft_frac"] == pytest.approx(1 - one["drafted"].mean())
    plot_budgets(steps, d / "budgets.png", first_step=WARMUP, num_shown=20)
    assert (d / "budgets.png").exists()


def test_reliability_all_accepted_at_half_confidence(tmp_path):
    """Every draft accepted, confidence always 0.525 (a bin centre of the calibrator's 20 bins): raw ECE is
    exactly 0.475; the learnt knot at that centre is (n + 8 * 0.525) / (n + 8) ~ 0.99 (the lookup table's
    1/1023 grid puts float32 0.525 just below the centre, a little toward the unfitted neighbour bin)."""
    reqs = [([3] * 20, np.full((20, 3), 0.525)) for _ in range(12)]
    path = tmp_path / "t.parquet"
    build_trace(reqs, indexing="step").save(path)
    bins, summary = reliability(str(path), seed=0)
    ece = summary.set_index("map")["ece"]
    assert ece["raw"] == pytest.approx(0.475, abs=1e-6)
    n = 6 * 20 * 3  # fit half: every slot observed and accepted
    knot = (n + 8 * 0.525) / (n + 8)
    assert 1 - knot <= ece["calibrated"] < 0.1
    assert bins.loc[bins["map"] == "raw", "count"].sum() == 6 * 20 * 3  # held-out half: all slots observed
    plot_reliability(bins, summary, tmp_path / "rel.png")
    assert (tmp_path / "rel.png").exists()


def test_calibrated_throughput_change(inputs):
    traces, cost, _ = inputs
    df = calibrated_throughput(traces[:1], cost, (4,), policies=("topk", "fine"), num_steps=STEPS,
                               warmup_steps=WARMUP, seed=0)
    assert set(df["policy"]) == {"topk", "fine"}
    assert np.allclose(df["change"], df["tokens_per_s_calibrated"] / df["tokens_per_s_raw"] - 1)


def test_render_report_fidelity_placeholder_and_include(inputs):
    traces, cost, _ = inputs
    fam = Family("tiny", "tiny family", traces, cost, (2, 4), note="note")
    from types import SimpleNamespace

    speed = run_family(fam, num_steps=STEPS, warmup_steps=WARMUP, seed=0)
    steps = budget_steps(traces[0], cost, (2, 8), policies=list(VARIANTS), num_steps=STEPS)
    summ = budget_summary(steps, WARMUP).assign(cost="h20")
    bins, rel = reliability(traces[0], seed=0)
    results = {
        "speedup": speed, "budget_summary": summ, "reliability_bins": bins, "reliability": rel,
        "selection": selection_table(traces[:1], batch_size=4, budgets=(8, 16), num_batches=5),
        "calibrate": calibrated_throughput(traces[:1], cost, (4,), num_steps=STEPS, warmup_steps=WARMUP, seed=0),
    }
    settings = SimpleNamespace(num_steps=STEPS, warmup_steps=WARMUP, seed=0, selection_batches=5)
    text = render_report(results, [fam], settings, fidelity=None)
    assert render_report(results, [fam], settings, fidelity=None) == text  # no run time or date in the file
    for heading in ("## 1. Speedup", "## 2. Selection curve", "## 3. Where `fine` beats `dcut`",
                    "## 4. Calibration", "## 5. Simulator fidelity", "## Caveats"):
        assert heading in text
    assert "python analysis/fidelity.py" in text
    with_fid = render_report(results, [fam], settings, fidelity="| policy | error |\n")
    assert "| policy | error |" in with_fid and "Not generated yet" not in with_fid
    assert "## 7. D-Cut inside real vLLM" in text and "No vLLM benchmark yet" in text
    with_vllm = render_report(results, [fam], settings, fidelity=None,
                              vllm="# own title\n\n| bs | tok/s |\n")
    assert "| bs | tok/s |" in with_vllm and "own title" not in with_vllm and "No vLLM benchmark yet" not in with_vllm
