import numpy as np
import pytest

from dcut_sched.traces import Trace, TraceError, check_trace_columns


def small_trace() -> Trace:
    # request 7: 4 positions, request 3: 2 positions; B = 4
    return Trace(
        request_id=np.array([7, 7, 7, 7, 3, 3], np.int32),
        pos=np.array([0, 1, 2, 3, 0, 1], np.int32),
        accept_len=np.array([3, 1, 0, 0, 1, 0], np.int8),
        conf=np.linspace(0, 1, 18, dtype=np.float32).reshape(6, 3),
        metadata={"indexing": "position", "source": "synthetic", "dataset": "unit"},
    )


def test_roundtrip(tmp_path):
    trace = small_trace()
    path = tmp_path / "t.parquet"
    trace.save(path)
    back = Trace.load(path)
    assert back.block_size == 4 and back.num_rows == 6 and back.num_requests == 2
    # rows are grouped by request id on load
    assert back.request_ids.tolist() == [3, 7] and back.num_positions.tolist() == [2, 4]
    assert back.metadata["dcut.trace.version"] == "1" and back.metadata["dataset"] == "unit"
    np.testing.assert_array_equal(back.conf[back.starts[1]:], trace.conf[:4])
    assert back.exact_replay


@pytest.mark.parametrize(
    "mutate, field, where",
    [
        (lambda df, m: df.__setitem__("c2", df["c2"].where(df.index != 2, np.nan)), "c2", "row 2, request 7, pos 2"),
        (lambda df, m: df.__setitem__("c1", df["c1"].where(df.index != 1, 1.5)), "c1", "row 1"),
        (lambda df, m: df.__setitem__("accept_len", df["accept_len"].where(df.index != 4, 9)), "accept_len", "row 4"),
        (lambda df, m: df.__setitem__("pos", df["pos"].where(df.index != 3, 5)), "pos", "request 7"),
        (lambda df, m: df.__setitem__("accept_len", df["accept_len"].where(df.index != 2, 2)), "accept_len",
         "request 7, pos 2"),  # 2 accepted with 1 position left
        (lambda df, m: df.pop("c3"), "c3", ""),
        (lambda df, m: df.insert(len(df.columns), "c4", 0.5), "c4", ""),
        (lambda df, m: m.pop("block_size"), "block_size", ""),
        (lambda df, m: m.update({"dcut.trace.version": "9"}), "dcut.trace.version", ""),
        (lambda df, m: m.update(indexing="token"), "indexing", ""),
    ],
)
def test_faults_name_row_request_pos_and_field(mutate, field, where):
    trace = small_trace()
    df, meta = trace.to_frame(), dict(trace.metadata)
    mutate(df, meta)
    faults = check_trace_columns(df, meta, "x.parquet")
    assert faults, "fault not found"
    assert faults[0].field == field
    assert where in str(faults[0]) and "x.parquet" in str(faults[0])
    with pytest.raises(TraceError, match=field):
        Trace.from_frame(df, meta, path="x.parquet")


def test_unreadable_files(tmp_path):
    with pytest.raises(TraceError, match="no such trace file"):
        Trace.load(tmp_path / "none.parquet")
    (tmp_path / "junk.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(TraceError, match="not a readable Parquet"):
        Trace.load(tmp_path / "junk.parquet")
    small_trace().save(tmp_path / "ok.parquet")
    data = (tmp_path / "ok.parquet").read_bytes()
    (tmp_path / "trunc.parquet").write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceError, match="not a readable Parquet"):
        Trace.load(tmp_path / "trunc.parquet")
