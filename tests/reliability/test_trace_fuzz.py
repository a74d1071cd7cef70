"""Property-based fuzzing of the trace loader: a mutated good file loads to a valid trace that
round-trips, or raises TraceError -- never another exception (issue: validation lets wrong values
through)."""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from dcut_sched.traces import Trace, TraceError  # noqa: E402
from dcut_sched.traces.format import check_trace_columns  # noqa: E402

B = 4
COLUMNS = ["request_id", "pos", "accept_len", "c1", "c2", "c3"]
META = {"dcut.trace.version": "1", "indexing": "position", "block_size": str(B), "source": "synthetic",
        "dataset": "fuzz"}


def good_table() -> pa.Table:
    rng = np.random.default_rng(3)
    cols = {
        "request_id": np.array([4, 4, 4, 9, 9], np.int32),
        "pos": np.array([0, 1, 2, 0, 1], np.int32),
        "accept_len": np.array([2, 1, 0, 1, 0], np.int8),
        **{f"c{t}": rng.uniform(0.05, 0.95, 5).astype(np.float32) for t in range(1, B)},
    }
    return pa.table(cols).replace_schema_metadata({k.encode(): v.encode() for k, v in META.items()})


TYPES = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint64(), pa.float16(), pa.float32(),
         pa.float64(), pa.string(), pa.bool_(), pa.large_string(), pa.null()]
VALUES = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63 - 1), st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(), st.none(), st.text(max_size=5),
)


def _cast(table: pa.Table, name: str, typ: pa.DataType) -> pa.Table:
    col = table[name]
    try:
        new = col.cast(typ, safe=False)
    except (pa.ArrowException, ValueError):
        new = pa.array([str(v) for v in col.to_pylist()]) if typ != pa.null() else pa.nulls(len(col))
    return table.set_column(table.schema.get_field_index(name), name, new)


def _set_cell(table: pa.Table, name: str, row: int, value) -> pa.Table:
    values = table[name].to_pylist()
    if not values:
        return table
    values[row % len(values)] = value
    try:
        arr = pa.array(values, type=table[name].type)
    except (pa.ArrowException, ValueError, TypeError, OverflowError):
        try:
            arr = pa.array(values)
        except (pa.ArrowException, ValueError, TypeError, OverflowError):
            arr = pa.array([repr(v) for v in values])
    return table.set_column(table.schema.get_field_index(name), name, arr)


MUTATION = st.one_of(
    st.tuples(st.just("cast"), st.sampled_from(COLUMNS), st.sampled_from(TYPES)),
    st.tuples(st.just("cell"), st.sampled_from(COLUMNS), st.integers(0, 4), VALUES),
    st.tuples(st.just("drop"), st.sampled_from(COLUMNS)),
    st.tuples(st.just("extra"), st.sampled_from(["c4", "c9", "x", "c0", "pos"]), st.integers(-3, 3)),
    st.tuples(st.just("meta"), st.sampled_from([*META, "temperature", "junk"]), st.binary(max_size=6)),
    st.tuples(st.just("dropmeta"), st.sampled_from(list(META))),
    st.tuples(st.just("rows"), st.integers(0, 5)),
)


def mutate(table: pa.Table, m) -> pa.Table:
    kind = m[0]
    if kind in ("cast", "cell", "drop") and table.column_names.count(m[1]) != 1:
        return table
    if kind == "cast":
        return _cast(table, m[1], m[2])
    if kind == "cell":
        return _set_cell(table, m[1], m[2], m[3])
    if kind == "drop":
        return table.drop_columns([m[1]])
    if kind == "extra":  # an extra column ("pos": a duplicate column name)
        typ = pa.int32() if m[1] == "pos" else pa.int64()
        return pa.Table.from_arrays([*table.columns, pa.array([m[2]] * len(table), typ)],
                                    names=[*table.column_names, m[1]]).replace_schema_metadata(table.schema.metadata)
    if kind == "meta":
        meta = dict(table.schema.metadata or {})
        meta[m[1].encode()] = m[2]
        return table.replace_schema_metadata(meta)
    if kind == "dropmeta":
        meta = dict(table.schema.metadata or {})
        meta.pop(m[1].encode(), None)
        return table.replace_schema_metadata(meta)
    return table.slice(0, m[1])


def _roundtrip(trace: Trace, tmp) -> None:
    out = tmp / "again.parquet"
    trace.save(out)
    back = Trace.load(out)
    for name in ("request_id", "pos", "accept_len", "conf"):
        np.testing.assert_array_equal(getattr(back, name), getattr(trace, name))
    assert back.metadata == trace.metadata
    assert not check_trace_columns(back.to_frame(), back.metadata, str(out))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mutations=st.lists(MUTATION, min_size=1, max_size=3))
def test_mutated_tables_load_or_raise_trace_error(tmp_path, mutations):
    table = good_table()
    for m in mutations:
        table = mutate(table, m)
    path = tmp_path / "t.parquet"
    pq.write_table(table, path)
    try:
        trace = Trace.load(path)
    except TraceError as exc:
        assert str(path) in str(exc)
        return
    _roundtrip(trace, tmp_path)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(0, 10_000), flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=4))
def test_truncated_or_corrupted_bytes_load_or_raise_trace_error(tmp_path, cut, flips):
    buf = io.BytesIO()
    pq.write_table(good_table(), buf)
    data = bytearray(buf.getvalue())
    for at, byte in flips:
        data[at % len(data)] = byte
    data = data[: cut % (len(data) + 1)] if cut < len(data) else data
    path = tmp_path / "t.parquet"
    path.write_bytes(bytes(data))
    try:
        trace = Trace.load(path)
    except TraceError:
        return
    _roundtrip(trace, tmp_path)
