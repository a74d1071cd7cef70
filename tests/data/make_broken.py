"""Make the corpus of bad inputs used by tests/reliability/test_broken_corpus.py (issue "Reliability").

Each file is one hostile input of a class the CLIs must refuse with exit 2 and one line naming the
file, flag or field; ``good.parquet`` / ``good-cost.json`` / ``good-prompts.jsonl`` are valid inputs
the cases start from. Run from the repository root: ``PYTHONPATH=. python tests/data/make_broken.py``.
A symlink loop cannot be committed portably: the test makes it in its temp folder.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from dcut_sched import CostCurve
from dcut_sched.traces import Trace

OUT = Path(__file__).parent / "broken"
B = 4
META = {"dcut.trace.version": "1", "indexing": "position", "block_size": str(B), "source": "synthetic",
        "dataset": "broken-corpus"}


def good_trace() -> Trace:
    """Six requests of 12 positions, B = 4, confidences and acceptance from a fixed seed."""
    rng = np.random.default_rng(11)
    n_req, n = 6, 12
    pos = np.tile(np.arange(n), n_req)
    accept = np.minimum(rng.integers(0, B, n_req * n), n - 1 - pos)
    return Trace(np.repeat(np.arange(n_req), n).astype(np.int32), pos.astype(np.int32), accept.astype(np.int8),
                 rng.uniform(0.05, 0.95, size=(n_req * n, B - 1)).astype(np.float32),
                 {"indexing": "position", "source": "synthetic", "dataset": "broken-corpus"})


def good_cost() -> CostCurve:
    verify = [{"batch_size": bs, "num_tokens": k, "median_ms": 10.0 + 0.5 * k}
              for bs in (1, 2, 4) for k in range(bs, bs * B + 1)]
    return CostCurve(hardware={"device_name": "test", "backend": "analytic"}, model={"name": "linear-test", "config": {}},
                     block_size=B, context_len=0, verify=verify,
                     ar=[{"batch_size": bs, "median_ms": 9.0 + 0.5 * bs} for bs in (1, 2, 4)],
                     draft=[{"batch_size": bs, "median_ms": 2.0 + 0.25 * bs} for bs in (1, 2, 4)])


def write(name: str, table: pa.Table, meta: dict[bytes, bytes] | None = None) -> None:
    meta = {k.encode(): v.encode() for k, v in META.items()} if meta is None else meta
    pq.write_table(table.replace_schema_metadata(meta), OUT / name)


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for old in OUT.iterdir():
        old.unlink()
    trace = good_trace()
    trace.save(OUT / "good.parquet")
    good_cost().save(OUT / "good-cost.json")
    (OUT / "good-prompts.jsonl").write_text('{"id": "a", "category": "math", "prompt": "What is 2 + 2?"}\n')
    base = pa.Table.from_pandas(trace.to_frame(), preserve_index=False)

    def col(name: str, values) -> pa.Table:
        return base.set_column(base.schema.get_field_index(name), name, pa.array(values))

    acc = trace.accept_len.astype(object).tolist()
    # class 2: values that would be truncated, merged or wrapped
    write("accept_len_null.parquet", col("accept_len", [None if i == 5 else v for i, v in enumerate(acc)]))
    write("accept_len_float.parquet", col("accept_len", [2.7 if i == 3 else float(v) for i, v in enumerate(acc)]))
    ids = trace.request_id.astype(float)
    write("request_id_float.parquet", col("request_id", np.where(ids == 0, 1.25, np.where(ids == 1, 1.75, ids))))
    write("request_id_int64_wraps.parquet", col("request_id", trace.request_id.astype(np.int64) + 2**32))
    write("request_id_string.parquet", col("request_id", [f"r{v}" for v in trace.request_id]))
    # B = 200: accept_len 150 stored as int8 wraps to -106
    rng = np.random.default_rng(2)
    n = 160
    big = pd.DataFrame({"request_id": np.zeros(n, np.int32), "pos": np.arange(n, dtype=np.int32),
                        "accept_len": np.minimum(150, n - 1 - np.arange(n)).astype(np.int16).astype(np.int8)})
    big = pd.concat([big, pd.DataFrame(rng.uniform(0.5, 1.0, (n, 199)).astype(np.float32),
                                       columns=[f"c{t}" for t in range(1, 200)])], axis=1)
    write("accept_len_int8_wraps_b200.parquet", pa.Table.from_pandas(big, preserve_index=False),
          {k.encode(): v.encode() for k, v in {**META, "block_size": "200"}.items()})
    # class 6: malformed files
    write("metadata_not_utf8.parquet", base, {**{k.encode(): v.encode() for k, v in META.items()},
                                              b"dataset": b"\xff\xfebroken"})
    (OUT / "prompts-not-utf8.jsonl").write_bytes(b'{"id": "a", "category": "x", "prompt": "caf\xe9"}\n')
    (OUT / "prompts-nested.jsonl").write_text("[" * 5000 + "]" * 5000 + "\n")
    (OUT / "params-nested.json").write_text('{"params": ' + "[" * 5000 + "]" * 5000 + "}\n")
    (OUT / "params-string.json").write_text('{"params": "fast"}\n')
    (OUT / "params-nan.json").write_text('{"params": {"block_size": 8, "separation": NaN}}\n')
    (OUT / "model-config-bad.json").write_text('{"model_type": "llama", "text_config": "big"}\n')
    # sampled traces: p columns of the wrong type, a temperature that is not a finite number >= 0
    sampled = {k.encode(): v.encode() for k, v in {**META, "temperature": "0.7"}.items()}

    def with_p(values) -> pa.Table:
        table = base
        for t in range(1, B):
            table = table.append_column(f"p{t}", pa.array(values))
        return table

    n_rows = base.num_rows
    write("sampled_p_string.parquet", with_p(["0.5"] * n_rows), sampled)
    write("sampled_p_bool.parquet", with_p([True] * n_rows), sampled)
    good_p = with_p(np.full(n_rows, 0.5, np.float32))
    for name, temp in (("inf", "inf"), ("1e400", "1e400"), ("nan", "nan")):
        write(f"temperature_{name}.parquet", good_p, {**sampled, b"temperature": temp.encode()})
    # JSON: a key given twice in one object (JSON keeps the last), a 5,000-digit number
    cost_text = (OUT / "good-cost.json").read_text()
    first = '"median_ms": 10.5'
    assert first in cost_text
    (OUT / "cost-duplicate-key.json").write_text(cost_text.replace(first, f'"median_ms": -5, {first}', 1))
    (OUT / "cost-5000-digits.json").write_text(cost_text.replace('"context_len": 0', '"context_len": ' + "9" * 5000, 1))
    (OUT / "params-duplicate-key.json").write_text('{"params": {"block_size": 8, "block_size": 4}}\n')
    (OUT / "params-5000-digits.json").write_text('{"params": {"block_size": ' + "8" * 5000 + "}}\n")
    (OUT / "prompts-5000-digits.jsonl").write_text('{"id": ' + "7" * 5000 + ', "category": "x", "prompt": "hi"}\n')
    print(f"wrote {len(list(OUT.iterdir()))} files to {OUT}")


if __name__ == "__main__":
    main()
