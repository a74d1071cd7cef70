"""Each ``dcut-sim --out`` row says how it was produced: the settings that change results and that
the rows did not hold (``--calibrate`` was not in them, nor ``--overhead-ms``, ``--no-shuffle``,
``--graph-tokens``, and in the open loop ``--requests`` and ``--slo-tpot-ms``) are columns, so two
files of differently made runs cannot be taken for one (``--param`` values are in the policy label). The table on screen is
unchanged: the columns are added to the written rows only."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from dcut_sched.cli import sim as cli
from dcut_sched.cli.sim_output import SETTING_COLUMNS
from dcut_sched.util.tables import read_table
from tests.sim.conftest import random_trace

FAST = ["--steps", "30", "--warmup", "5", "--batch-sizes", "2,4", "--policies", "dcut,uniform"]


@pytest.fixture
def files(tmp_path, make_curve):
    trace, cost = tmp_path / "t.parquet", tmp_path / "c.json"
    random_trace(num_requests=6, block_size=4, max_len=20, seed=2).save(trace)
    make_curve(block_size=4).save(cost)
    return ["--trace", str(trace), "--cost", str(cost)]


def _run(capsys, *argv) -> str:
    assert cli.main([str(a) for a in argv]) == 0, capsys.readouterr().err
    return capsys.readouterr().out


@pytest.mark.parametrize("suffix", [".csv", ".parquet", ".json"])
def test_default_rows_record_the_default_settings(files, tmp_path, capsys, suffix):
    out = tmp_path / f"rows{suffix}"
    _run(capsys, *files, *FAST, "--quiet", "--out", out)
    df = read_table(out)
    assert list(df.columns[-len(SETTING_COLUMNS):]) == list(SETTING_COLUMNS)
    assert not df["calibrate"].any() and (df["overhead_ms"] == 0).all() and df["shuffle"].all()
    assert set(df["graph_tokens"]) == {"all"}


def test_calibrate_and_the_other_settings_are_columns(files, tmp_path, capsys):
    plain, made = tmp_path / "plain.csv", tmp_path / "made.csv"
    _run(capsys, *files, *FAST, "--quiet", "--out", plain)
    _run(capsys, *files, *FAST, "--quiet", "--out", made, "--calibrate", "--overhead-ms", "0.5", "--no-shuffle",
         "--graph-tokens", "4,8,16", "--param", "uniform.rho=0.25")
    a, b = pd.read_csv(plain), pd.read_csv(made)
    assert list(a.columns) == list(b.columns)
    assert b["calibrate"].all() and (b["overhead_ms"] == 0.5).all() and not b["shuffle"].any()
    assert set(b["graph_tokens"]) == {"4,8,16"}
    assert set(b["policy"]) == {"ar", "dcut", "uniform(rho=0.25)"}  # --param: in the label
    doc = json.loads(_run(capsys, *files, *FAST, "--quiet", "--calibrate", "--out", tmp_path / "r.json") or "{}")
    assert doc == {}  # --quiet: nothing on stdout
    attrs = json.loads((tmp_path / "r.json").read_text())["attrs"]
    assert attrs["calibrate"] is True and attrs["shuffle"] is True and attrs["graph_tokens"] == "all"


def test_open_loop_rows_record_requests_and_the_tpot_objective(files, tmp_path, capsys):
    out = tmp_path / "open.csv"
    _run(capsys, *files, "--mode", "open", "--requests", "12", "--batch-sizes", "2", "--policies", "dcut", "--quiet",
         "--slo-tpot-ms", "40", "--out", out)
    df = pd.read_csv(out)
    assert (df["requests"] == 12).all() and (df["slo_tpot_ms"] == 40).all() and not df["calibrate"].any()
    _run(capsys, *files, "--mode", "open", "--requests", "12", "--batch-sizes", "2", "--policies", "dcut", "--quiet",
         "--out", out)
    assert pd.read_csv(out)["slo_tpot_ms"].isna().all()


def test_seeds_and_sweep_rows_record_the_settings(files, tmp_path, capsys):
    seeds, sweep = tmp_path / "seeds.csv", tmp_path / "sweep.csv"
    _run(capsys, *files, *FAST, "--quiet", "--seeds", "2", "--calibrate", "--jobs", "1", "--out", seeds)
    df = pd.read_csv(seeds)
    assert set(df["seed"]) == {0, 1} and df["calibrate"].all()
    _run(capsys, *files, *FAST, "--quiet", "--sweep", "--overhead-ms", "0.25", "--jobs", "1", "--out", sweep)
    assert (pd.read_csv(sweep)["overhead_ms"] == 0.25).all()


def test_the_table_on_screen_is_unchanged_by_out(files, tmp_path, capsys, monkeypatch):
    """The screen table is drawn from the simulator's rows, without the setting columns: the same
    text with and without --out, and the rendered frame holds none of them."""
    from dcut_sched.cli import render

    seen = []
    real = render.render_runs
    monkeypatch.setattr(render, "render_runs", lambda df, *a, **k: (seen.append(list(df.columns)), real(df, *a, **k)))
    monkeypatch.setenv("COLUMNS", "200")
    without = _run(capsys, *files, *FAST, "--calibrate", "--overhead-ms", "0.5")
    with_out = _run(capsys, *files, *FAST, "--calibrate", "--overhead-ms", "0.5", "--out", tmp_path / "r.csv")
    assert without == with_out and "speedup over ar" in without
    assert len(seen) == 2 and not set(SETTING_COLUMNS) & set(seen[0])
    written = pd.read_csv(tmp_path / "r.csv")
    shown = written.drop(columns=list(SETTING_COLUMNS))
    assert np.allclose(shown["speedup_vs_ar"], written["speedup_vs_ar"])
