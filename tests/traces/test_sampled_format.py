"""Validation of the sampled-trace columns p1..p{B-1}: missing, NaN, out of range, greedy with p."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dcut_sched.traces import Trace, TraceError
from dcut_sched.traces.format import check_trace_columns


def base_trace(temperature="0.7", with_p=True) -> Trace:
    n, k = 5, 3
    conf = np.full((n, k), 0.6, np.float32)
    prob = np.linspace(0.1, 0.9, n * k, dtype=np.float32).reshape(n, k)
    return Trace(np.zeros(n, np.int32), np.arange(n, dtype=np.int32), np.array([1, 2, 0, 1, 0], np.int8), conf,
                 {"indexing": "position", "source": "recorded", "block_size": "4", "temperature": temperature},
                 target_prob=prob if with_p else None)


def faults_of(frame, meta):
    return [str(f) for f in check_trace_columns(frame, meta, "t.parquet")]


def test_round_trip(tmp_path):
    t = base_trace()
    t.save(tmp_path / "t.parquet")
    back = Trace.load(tmp_path / "t.parquet")
    assert back.sampled and back.temperature == 0.7
    np.testing.assert_array_equal(back.target_prob, t.target_prob)
    assert list(back.to_frame().columns[-3:]) == ["p1", "p2", "p3"]
    greedy = base_trace("0", with_p=False)
    greedy.save(tmp_path / "g.parquet")
    assert not Trace.load(tmp_path / "g.parquet").sampled


@pytest.mark.parametrize("value, row, col", [(np.nan, 2, "p2"), (1.5, 0, "p1"), (-0.1, 4, "p3"), (np.inf, 1, "p3")])
def test_bad_probability_is_named(value, row, col):
    t = base_trace()
    frame = t.to_frame()
    frame.loc[row, col] = value
    faults = faults_of(frame, t.metadata)
    assert len(faults) == 1 and f"row {row}" in faults[0] and f"field '{col}'" in faults[0]
    assert "target probability" in faults[0]


def test_sampled_trace_without_p_is_a_fault(tmp_path):
    t = base_trace()
    frame = t.to_frame().drop(columns=["p2"])
    faults = faults_of(frame, t.metadata)
    assert len(faults) == 1 and "field 'p2'" in faults[0] and "sampled trace" in faults[0]
    path = tmp_path / "x.parquet"
    table = pa.Table.from_pandas(frame, preserve_index=False)
    pq.write_table(table.replace_schema_metadata({k.encode(): v.encode() for k, v in t.metadata.items()}), path)
    with pytest.raises(TraceError, match="p2"):
        Trace.load(path)


def test_greedy_trace_with_p_and_bad_temperature_are_faults():
    t = base_trace()
    meta = dict(t.metadata, temperature="0")
    assert "greedy trace" in faults_of(t.to_frame(), meta)[0]
    assert "not a number" in faults_of(t.to_frame(), dict(t.metadata, temperature="warm"))[0]
    frame = t.to_frame()
    frame["p4"] = 0.5
    assert "beyond block_size" in faults_of(frame, t.metadata)[0]


def test_stats_of_a_sampled_trace():
    from dcut_sched.traces.stats import trace_stats

    t = base_trace()
    t.target_prob[:] = 0.5
    s = trace_stats(t)
    assert s["temperature"] == 0.7 and s["mean_target_prob_by_depth"] == [0.5, 0.5, 0.5]
    assert s["expected_tau"] == 1 + 0.5 + 0.25 + 0.125
    assert "expected_tau" not in trace_stats(base_trace("0", with_p=False))
