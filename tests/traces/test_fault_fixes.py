"""The seventh hostile pass (docs/reliability.md): every ``dcut-trace validate`` fault names the file,
the field and the fix; a 0-row trace and malformed recorder metadata are refused by the one loader
(validate, ``dcut-sim --trace`` and ``dcut-trace record``'s resume alike), and a damaged partial
recording is refused before any model loads."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dcut_sched.cli.trace import main
from dcut_sched.traces.synth import SynthParams, generate


@pytest.fixture
def good(tmp_path):
    trace = generate(SynthParams(block_size=4), num_requests=2, seed=0)
    return trace.to_frame(), dict(trace.metadata)


def _write(path, df, metadata):
    table = pa.Table.from_pandas(df, preserve_index=False)
    pq.write_table(table.replace_schema_metadata({k.encode(): v.encode() for k, v in metadata.items()}), path)
    return path


def _bad_accept(df):
    df = df.copy()
    df.loc[1, "accept_len"] = 9
    return df


def _bad_pos(df):
    df = df.copy()
    df.loc[1, "pos"] = 7
    return df


# (id, frame change, metadata change, the line's field part, its fix part)
CASES = [
    ("block-size", None, {"block_size": "x"}, "field 'block_size': 'x' is not an integer block size >= 2",
     "write the block size B the trace was recorded with, an integer in [2, 32768]"),
    ("indexing", None, {"indexing": "rows"}, "field 'indexing': 'rows' is not one of ('position', 'step')",
     "write 'position' (one row per output position) or 'step'"),
    ("source", None, {"source": "mine"}, "field 'source': 'mine' is not one of ('recorded', 'synthetic')",
     "write 'recorded' (dcut-trace record) or 'synthetic' (dcut-trace synth)"),
    ("requests", None, {"requests": "{not json"}, "field 'requests': '{not json' is not a JSON list of finished",
     "write the JSON list of finished requests dcut-trace record writes, or drop the key"),
    ("recorder", None, {"recorder": "[1, 2]"}, "field 'recorder': '[1, 2]' is not a JSON object of recorder",
     "write the JSON object of recorder settings dcut-trace record writes, or drop the key"),
    ("record-seconds", None, {"record_seconds": "soon"},
     "field 'record_seconds': 'soon' is not a finite number of seconds >= 0", "write the recording time in seconds"),
    ("accept-len", _bad_accept, None, "row 1, request 0, pos 1: field 'accept_len': 9 is outside [0, 3]",
     "fix the row or re-record the trace"),
    ("pos", _bad_pos, None, "field 'pos': positions of request 0 are not contiguous from 0",
     "each request needs rows pos 0, 1, ..., n-1, once each; re-record the trace"),
    ("no-rows", lambda df: df.head(0), None, "field 'request_id': the trace has no rows (a trace with no positions "
     "cannot be replayed)", "record (dcut-trace record) or synthesize (dcut-trace synth) a trace"),
]


@pytest.mark.parametrize("change_df, change_meta, where, fix", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_validate_names_file_field_and_fix(tmp_path, good, capsys, change_df, change_meta, where, fix):
    df, metadata = good
    path = _write(tmp_path / "t.parquet", change_df(df) if change_df else df, {**metadata, **(change_meta or {})})
    assert main(["validate", str(path)]) == 2
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith(f"{path}") and where in first and f"; {fix}" in first, first


def test_unreadable_parquet_names_the_file_and_the_fix(tmp_path, capsys):
    path = tmp_path / "r.parquet"
    path.write_bytes(np.random.default_rng(0).bytes(1000))
    assert main(["validate", str(path)]) == 2
    out = capsys.readouterr().out
    assert f"{path}: not a readable Parquet trace file" in out
    assert "give a trace written by dcut-trace record or synth (or re-record it if it was damaged)" in out


def test_sim_refuses_a_zero_row_trace_up_front(tmp_path, good, capsys):
    from dcut_sched.cli.sim import main as sim_main

    df, metadata = good
    path = _write(tmp_path / "e.parquet", df.head(0), metadata)
    assert sim_main(["--trace", str(path), "--policies", "uniform"]) == 2
    err = capsys.readouterr().err
    assert f"{path}: field 'request_id': the trace has no rows" in err and "Traceback" not in err


@pytest.mark.parametrize("key, value", [("requests", "[[0, 'q0'"), ("recorder", "7"), ("record_seconds", "-1")])
def test_record_refuses_a_damaged_partial_before_the_model_loads(tmp_path, good, capsys, monkeypatch, key, value):
    from dcut_sched.engine import trace_backends

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the partial file was checked")

    for name in ("NativeBackend", "HFBackend", "DFlashBackend"):
        monkeypatch.setattr(trace_backends, name, no_model)
    df, metadata = good
    out = tmp_path / "t.parquet"
    part = _write(tmp_path / "t.partial.parquet", df, {**metadata, key: value})
    before = part.read_bytes()
    assert main(["record", "--out", str(out), "--block-size", "4", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert f"cannot resume from the partial recording: {part}: field {key!r}" in err[0]
    assert err[0].endswith(f"or delete {part} (or rerun with --fresh) to start over")
    assert part.read_bytes() == before and not out.exists()


@pytest.mark.parametrize("requests, needle", [
    ([[0, "q0", "c", 3], [1, "q1", "c", 3], [2, "q2", "c", 3]], "request 2 is listed as finished but has no rows"),
    ([[0, "q0", "c", 3]], "request 1 has rows but is not listed as finished"),
    ([[0, "q0", "c", 3], [0, "q0", "c", 3], [1, "q1", "c", 3]], "request 0 is listed twice"),
    ([[0, "q1", "c", 3], [1, "q0", "c", 3]], "request 0 is 'q1' (c), but prompt 0 of this run is 'q0' (c)"),
    ([[0, "q0", "c", 3], [1, "q1"]], "[1, 'q1'] is not a finished request"),
], ids=["listed-without-rows", "rows-not-listed", "listed-twice", "another-prompt", "short-entry"])
def test_record_refuses_a_partial_whose_requests_do_not_match_its_rows(tmp_path, good, capsys, monkeypatch,
                                                                       requests, needle):
    """Resumed, the first lost request 2 (its rows absent, never re-recorded: a 2-request trace listing
    3), the second and third wrote a trace with request rows twice (exit 0, then unreadable), the
    fourth kept another prompt's labels."""
    import json

    from dcut_sched.engine import trace_backends

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the partial file was checked")

    for name in ("NativeBackend", "HFBackend", "DFlashBackend"):
        monkeypatch.setattr(trace_backends, name, no_model)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"q{i}", "category": "c", "prompt": f"p {i}"}) + "\n"
                               for i in range(3)))
    df, metadata = good
    out = tmp_path / "t.parquet"
    part = _write(tmp_path / "t.partial.parquet", df, {**metadata, "requests": json.dumps(requests)})
    before = part.read_bytes()
    assert main(["record", "--prompts", str(prompts), "--out", str(out), "--block-size", "4", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert f"cannot resume from the partial recording: {part}: field requests: {needle}" in err[0], err[0]
    assert err[0].endswith(f"delete {part} (or rerun with --fresh) to start over")
    assert part.read_bytes() == before and not out.exists()
