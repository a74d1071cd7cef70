"""analysis/report_peers.py on hand-made frames and tiny inputs (seconds)."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import pytest

ANALYSIS = Path(__file__).resolve().parents[2] / "analysis"
sys.path.insert(0, str(ANALYSIS))

from report_peers import PeerFamily, peer_wins, peers_commentary, peers_markdown, peers_table, plot_peers, run_peers  # noqa: E402

from dcut_sched.policies import PEERS  # noqa: E402
from tests.sim.conftest import random_trace  # noqa: E402


def _frame(speedups: dict, family="h20", traces=("a", "b")) -> pd.DataFrame:
    """Rows of run_peers' shape from {policy: {bs: [speedup per trace]}} (other figures fixed)."""
    rows = []
    for policy, by_bs in speedups.items():
        for bs, values in by_bs.items():
            for t, v in zip(traces, values):
                rows.append({"family": family, "trace_name": t, "policy": policy, "batch_size": bs,
                             "speedup_vs_ar": v, "verified_tokens_per_step": 4.0, "mean_tokens_per_step": 3.0,
                             "draft_frac": 1.0})
    return pd.DataFrame(rows)


HAND = {"ar": {4: [1, 1], 8: [1, 1]}, "dcut": {4: [2, 3], 8: [1, 2]}, "fine": {4: [3, 3], 8: [1.5, 1.5]},
        **{p: {4: [2, 2], 8: [1, 1]} for p in PEERS}}
HAND["dspark"] = {4: [2, 4], 8: [2, 1.6]}  # mean 3.0 and 1.8


def test_peers_table_means_and_ratio():
    table = peers_table(_frame(HAND))
    assert list(table.columns) == [4, 8]
    assert table.loc["dcut", 4] == pytest.approx(2.5) and table.loc["dspark", 8] == pytest.approx(1.8)
    assert table.loc["best peer", 4] == "dspark" and table.loc["best peer", 8] == "dspark"
    assert table.loc["fine / best peer", 4] == pytest.approx(1.0)
    assert table.loc["fine / best peer", 8] == pytest.approx(1.5 / 1.8)
    assert list(table.index[:3]) == ["ar", "dcut", "fine"]


def test_peer_wins_lists_only_strict_wins():
    wins = peer_wins(_frame(HAND))
    assert wins[["batch_size", "peer"]].values.tolist() == [[8, "dspark"]]  # a tie at bs 4 is not a win
    assert wins["gain"].iat[0] == pytest.approx(1.8 / 1.5 - 1)
    assert peer_wins(_frame(HAND), margin=0.5).empty


def test_run_plot_and_markdown_on_tiny_inputs(tmp_path, make_curve):
    trace = tmp_path / "t.parquet"
    random_trace(num_requests=8, block_size=4, max_len=25, seed=4).save(trace)
    cost = tmp_path / "c.json"
    make_curve(batch_sizes=(1, 2, 4), block_size=4).save(cost)
    fam = PeerFamily("tiny", "tiny trace on a linear curve", (str(trace),), str(cost), (1, 2, 4))
    df = run_peers([fam], num_steps=40, warmup_steps=5, seed=0)
    assert set(df["policy"]) == {"ar", "dcut", "fine", *PEERS, "vllm_adaptive(lag_steps=0)", "fine(ema_decay=0.95)"}
    assert set(df["batch_size"]) == {1, 2, 4}
    assert (df[df["policy"] == "ar"]["speedup_vs_ar"] == 1.0).all()
    plot_peers(df, tmp_path / "peers.png", families=[fam])
    assert (tmp_path / "peers.png").stat().st_size > 0
    text = peers_markdown(df, [fam], commentary=peers_commentary(df, [fam]))
    assert "### tiny trace on a linear curve" in text and "| **fine / best peer** |" in text
    assert "#### Where a peer beats `fine`" in text and "one-step lag here" in text
