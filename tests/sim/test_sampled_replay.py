"""Replay of sampled traces: acceptance drawn from p per seed; dcut-sim --seeds reports the spread."""

from __future__ import annotations

import numpy as np
import pandas as pd

from dcut_sched import policies
from dcut_sched.cli import sim as cli
from dcut_sched.simulator import run_closed_loop
from dcut_sched.simulator.replay import ReplayBatch
from dcut_sched.traces import Trace

from .conftest import random_trace


def sampled(trace: Trace, prob: np.ndarray, temperature: str = "0.7") -> Trace:
    return Trace(trace.request_id, trace.pos, trace.accept_len, trace.conf,
                 {**trace.metadata, "temperature": temperature}, target_prob=np.asarray(prob, np.float32))


def one_request(n: int, block: int, p: float) -> Trace:
    conf = np.full((n, block - 1), 0.5, np.float32)
    acc = np.zeros(n, np.int8)
    base = Trace(np.zeros(n, np.int32), np.arange(n, dtype=np.int32), acc, conf,
                 {"indexing": "position", "source": "synthetic", "block_size": str(block)})
    return sampled(base, np.full((n, block - 1), p))


def test_certain_and_impossible_acceptance():
    for p, want in [(1.0, [7, 7]), (0.0, [0, 0])]:
        batch = ReplayBatch(one_request(100, 8, p), seed=0)
        batch.add(np.array([0, 0]))
        _, acc = batch.gather()
        assert acc.tolist() == want
    # the cap keeps p + 1 + accept_len inside the output, as in a recorded trace
    batch = ReplayBatch(one_request(3, 8, 1.0), seed=0)
    batch.add(np.array([0]))
    assert batch.gather()[1].tolist() == [2]


def test_drawn_acceptance_is_a_run_of_bernoulli_successes():
    """P(accept_len >= t) = p**t: compare the drawn histogram with the exact truncated geometric law."""
    block, p, n = 6, 0.6, 20000
    batch = ReplayBatch(one_request(10, block, p), seed=3)
    batch.add(np.zeros(n, dtype=np.int64))
    _, acc = batch.gather()
    exact = np.array([p**t * (1 - p) for t in range(block - 1)] + [p ** (block - 1)])
    from scipy import stats

    counts = np.bincount(acc, minlength=block)
    assert stats.chisquare(counts, exact * n).pvalue > 1e-3
    batch2 = ReplayBatch(one_request(10, block, p), seed=4)
    batch2.add(np.zeros(n, dtype=np.int64))
    assert not np.array_equal(batch2.gather()[1], acc)


def test_greedy_trace_replays_as_recorded(make_curve):
    trace = random_trace(num_requests=8, block_size=4, seed=1)
    curve = make_curve(block_size=4)
    a = run_closed_loop(trace, curve, policies.get("dcut"), 4, num_steps=40, seed=0)
    b = run_closed_loop(trace, curve, policies.get("dcut"), 4, num_steps=40, seed=0)
    assert np.array_equal(a.steps.tokens, b.steps.tokens)
    # a sampled trace whose p makes the recorded draw certain replays exactly like the greedy trace
    acc = trace.accept_len.astype(int)
    prob = (np.arange(1, 4)[None, :] <= acc[:, None]).astype(np.float32)  # p_t = 1 up to accept_len, then 0
    s = run_closed_loop(sampled(trace, prob), curve, policies.get("dcut"), 4, num_steps=40, seed=0)
    assert np.array_equal(s.steps.tokens, a.steps.tokens)


def test_cli_seeds_reports_mean_and_spread(tmp_path, capsys, make_curve):
    base = random_trace(num_requests=6, block_size=4, max_len=20, seed=2)
    trace = sampled(base, base.conf)  # calibrated: p = c
    tp = tmp_path / "s.parquet"
    trace.save(tp)
    cp = tmp_path / "c.json"
    make_curve(block_size=4).save(cp)
    out = tmp_path / "seeds.csv"
    rc = cli.main(["--trace", str(tp), "--cost", str(cp), "--policies", "full,dcut", "--batch-sizes", "2,4",
                   "--steps", "40", "--warmup", "5", "--seeds", "3", "--out", str(out)])
    text = capsys.readouterr().out
    assert rc == 0 and "seeds (0..2)" in text and "acceptance redrawn" in text
    df = pd.read_csv(out)
    assert sorted(df["seed"].unique()) == [0, 1, 2] and set(df["policy"]) == {"ar", "full", "dcut"}
    full = df[(df["policy"] == "full") & (df["batch_size"] == 4)]["tokens_per_s"]
    assert full.nunique() > 1  # every seed redraws the acceptance
    assert cli.main(["--trace", str(tp), "--cost", str(cp), "--seeds", "0"]) == 2
