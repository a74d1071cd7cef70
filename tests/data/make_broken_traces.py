"""Make the corpus of broken trace files used by tests/traces/test_cli.py.

Each file breaks one rule of docs/design.md §3; ``expected.json`` maps file name -> the field the first
fault must name (``file`` for files that are not readable Parquet at all).
Run from the repository root: ``PYTHONPATH=. python tests/data/make_broken_traces.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from dcut_sched.traces import Trace

OUT = Path(__file__).parent / "broken_traces"


def valid_trace() -> Trace:
    """Two requests (ids 4 and 9) of 5 and 3 positions, B = 4."""
    rng = np.random.default_rng(7)
    return Trace(
        request_id=np.array([4, 4, 4, 4, 4, 9, 9, 9], np.int32),
        pos=np.array([0, 1, 2, 3, 4, 0, 1, 2], np.int32),
        accept_len=np.array([3, 2, 1, 0, 0, 2, 1, 0], np.int8),
        conf=rng.uniform(0.05, 0.95, size=(8, 3)).astype(np.float32),
        metadata={"indexing": "position", "source": "synthetic", "dataset": "broken-corpus"},
    )


def write(name: str, df, meta: dict) -> None:
    table = pa.Table.from_pandas(df, preserve_index=False)
    table = table.replace_schema_metadata({k.encode(): str(v).encode() for k, v in meta.items()})
    pq.write_table(table, OUT / name)


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for old in OUT.glob("*.parquet"):
        old.unlink()
    t = valid_trace()
    good = OUT / "_valid.parquet.tmp"
    t.save(good)
    data = good.read_bytes()
    good.unlink()
    expected: dict[str, str] = {}

    def mutate(name: str, field: str, fn) -> None:
        df, meta = t.to_frame(), dict(t.metadata)
        out = fn(df, meta)
        write(name, out if isinstance(out, pd.DataFrame) else df, meta)
        expected[name] = field

    (OUT / "truncated.parquet").write_bytes(data[: len(data) // 2])
    expected["truncated.parquet"] = "file"
    (OUT / "not_parquet.parquet").write_text("request_id,pos,accept_len\n4,0,1\n")
    expected["not_parquet.parquet"] = "file"
    (OUT / "empty_file.parquet").write_bytes(b"")
    expected["empty_file.parquet"] = "file"
    mutate("nan_confidence.parquet", "c2", lambda df, m: df.__setitem__("c2", df["c2"].where(df.index != 3, np.nan)))
    mutate("confidence_above_one.parquet", "c1", lambda df, m: df.__setitem__("c1", df["c1"].where(df.index != 6, 1.5)))
    mutate("confidence_negative.parquet", "c3", lambda df, m: df.__setitem__("c3", df["c3"].where(df.index != 0, -0.25)))
    mutate("accept_len_too_large.parquet", "accept_len",
           lambda df, m: df.__setitem__("accept_len", df["accept_len"].where(df.index != 0, 4)))
    mutate("accept_len_negative.parquet", "accept_len",
           lambda df, m: df.__setitem__("accept_len", df["accept_len"].where(df.index != 7, -1)))
    mutate("accept_len_past_end.parquet", "accept_len",
           lambda df, m: df.__setitem__("accept_len", df["accept_len"].where(df.index != 6, 2)))
    mutate("position_gap.parquet", "pos", lambda df, m: df.__setitem__("pos", df["pos"].where(df.index != 4, 6)))
    mutate("position_duplicate.parquet", "pos", lambda df, m: df.__setitem__("pos", df["pos"].where(df.index != 2, 1)))
    mutate("position_not_from_zero.parquet", "pos", lambda df, m: df.__setitem__("pos", df["pos"] + 1))
    mutate("missing_conf_column.parquet", "c3", lambda df, m: df.pop("c3"))
    mutate("missing_request_id.parquet", "request_id", lambda df, m: df.pop("request_id"))
    mutate("extra_conf_column.parquet", "c4", lambda df, m: df.insert(len(df.columns), "c4", np.float32(0.5)))
    mutate("missing_block_size.parquet", "block_size", lambda df, m: m.pop("block_size"))
    mutate("bad_block_size.parquet", "block_size", lambda df, m: m.update(block_size="sixteen"))
    mutate("wrong_version.parquet", "dcut.trace.version", lambda df, m: m.update({"dcut.trace.version": "7"}))
    mutate("bad_indexing.parquet", "indexing", lambda df, m: m.update(indexing="token"))
    mutate("bad_source.parquet", "source", lambda df, m: m.update(source="imagined"))
    mutate("no_rows.parquet", "request_id", lambda df, m: df.iloc[0:0])

    def sampled(p_values, temperature: str):
        def fn(df, m):
            m.update(temperature=temperature)
            for t in range(1, 4):
                df[f"p{t}"] = p_values
        return fn

    mutate("sampled_p_string.parquet", "p1", sampled("0.5", "0.7"))
    mutate("sampled_p_bool.parquet", "p1", sampled(True, "0.7"))
    mutate("temperature_inf.parquet", "temperature", sampled(np.float32(0.5), "inf"))
    mutate("temperature_nan.parquet", "temperature", sampled(np.float32(0.5), "nan"))
    mutate("temperature_negative.parquet", "temperature", sampled(np.float32(0.5), "-0.7"))
    (OUT / "expected.json").write_text(json.dumps(dict(sorted(expected.items())), indent=2) + "\n")
    print(f"wrote {len(expected)} broken traces to {OUT}")


if __name__ == "__main__":
    main()
