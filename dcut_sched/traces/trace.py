"""The in-memory acceptance trace and its Parquet file (docs/design.md §3).

:class:`Trace` holds the flat arrays a replay reads, grouped by request; building one from a frame
or a file validates it (:func:`~.format.check_trace_columns`: the first fault raises
:class:`~.format.TraceError`), and :meth:`Trace.save` writes the file atomically.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from ..util.atomic import atomic_path
from ..util.inputs import is_symlink_loop
from .format import (
    TRACE_VERSION,
    VERSION_KEY,
    TraceError,
    accept_len_dtype,
    check_trace_columns,
    conf_columns,
    is_sampled,
    target_prob_columns,
)

__all__ = ["Trace", "read_trace_file"]


def _meta_to_str(metadata: Mapping[str, Any]) -> dict[str, str]:
    out = {}
    for key, value in metadata.items():
        if value is None:
            continue
        out[key] = value if isinstance(value, str) else json.dumps(value)
    return out



@dataclass
class Trace:
    """An acceptance trace held as flat numpy arrays, grouped by request and sorted by position.

    Attributes:
        request_id: ``[N]`` int32, rows grouped by request.
        pos: ``[N]`` int32, 0..n_i-1 within each request.
        accept_len: ``[N]`` int8 in ``[0, B-1]``: drafts the target accepts if all B slots are verified.
        conf: ``[N, B-1]`` float32 in [0, 1]: draft confidence of each draft slot.
        metadata: file-level metadata (strings; see module docstring).
        path: the file it came from, for messages.
        target_prob: ``[N, B-1]`` float32 in [0, 1] for sampled traces (``p1..p{B-1}``), else None.

    Derived: ``request_ids`` ``[R]`` (order of appearance), ``starts`` ``[R]`` int64 first row of each
    request, ``num_positions`` ``[R]`` int64 rows of each request.
    """

    request_id: np.ndarray
    pos: np.ndarray
    accept_len: np.ndarray
    conf: np.ndarray
    metadata: dict[str, str] = field(default_factory=dict)
    path: str | None = None
    target_prob: np.ndarray | None = None

    def __post_init__(self) -> None:
        dtype = accept_len_dtype(int(self.conf.shape[1]) + 1)
        al = np.asarray(self.accept_len)
        if al.dtype.kind not in "iu" or np.iinfo(al.dtype).max < self.conf.shape[1]:
            raise TraceError(f"accept_len of dtype {al.dtype} cannot hold B-1 = {self.conf.shape[1]}; build it as "
                             f"{dtype} (dcut_sched.traces.format.accept_len_dtype)")
        self.metadata = _meta_to_str(self.metadata)
        self.metadata.setdefault(VERSION_KEY, TRACE_VERSION)
        self.metadata.setdefault("block_size", str(self.conf.shape[1] + 1))
        change = np.flatnonzero(np.diff(self.request_id)) + 1
        self.starts = np.concatenate([[0], change]).astype(np.int64) if len(self.request_id) else np.zeros(0, np.int64)
        self.num_positions = np.diff(np.concatenate([self.starts, [len(self.request_id)]])).astype(np.int64)
        self.request_ids = self.request_id[self.starts].astype(np.int64)

    # -------------------------------------------------------------- properties
    @property
    def block_size(self) -> int:
        return int(self.conf.shape[1]) + 1

    @property
    def indexing(self) -> str:
        return self.metadata.get("indexing", "position")

    @property
    def exact_replay(self) -> bool:
        """True for position-indexed traces (exact replay); False for step-indexed (approximate)."""
        return self.indexing == "position"

    @property
    def sampled(self) -> bool:
        """True for a sampled trace (temperature > 0, ``target_prob`` present)."""
        return self.target_prob is not None

    @property
    def temperature(self) -> float:
        return float(self.metadata.get("temperature", "0"))

    @property
    def num_requests(self) -> int:
        return int(len(self.starts))

    @property
    def num_rows(self) -> int:
        return int(len(self.request_id))

    @property
    def name(self) -> str:
        return Path(self.path).stem if self.path else self.metadata.get("dataset", "trace")

    def describe(self) -> str:
        return (
            f"{self.name}: {self.num_requests} requests, {self.num_rows} {self.indexing}s, B={self.block_size}, "
            f"source={self.metadata.get('source', '?')}"
        )

    # -------------------------------------------------------------- conversion
    def to_frame(self) -> pd.DataFrame:
        """One row per (request, position): request_id, pos, accept_len, c1..c{B-1}."""
        df = pd.DataFrame(
            {"request_id": self.request_id.astype(np.int32), "pos": self.pos.astype(np.int32),
             "accept_len": self.accept_len.astype(accept_len_dtype(self.block_size))}
        )
        conf = pd.DataFrame(self.conf.astype(np.float32), columns=conf_columns(self.block_size))
        parts = [df, conf]
        if self.target_prob is not None:
            parts.append(pd.DataFrame(self.target_prob.astype(np.float32), columns=target_prob_columns(self.block_size)))
        return pd.concat(parts, axis=1)

    @classmethod
    def from_frame(cls, df: pd.DataFrame, metadata: Mapping[str, Any], path: str | None = None) -> "Trace":
        """Build a trace from a frame with the trace columns (rows sorted by request, position).

        Raises:
            TraceError: the first fault :func:`check_trace_columns` finds.
        """
        faults = check_trace_columns(df, _meta_to_str(metadata), path or "<frame>", max_faults=1)
        if faults:
            raise TraceError(str(faults[0]))
        block = int(_meta_to_str(metadata)["block_size"])
        df = df.sort_values(["request_id", "pos"], kind="stable")
        return cls(
            request_id=df["request_id"].to_numpy(np.int32),
            pos=df["pos"].to_numpy(np.int32),
            accept_len=df["accept_len"].to_numpy(accept_len_dtype(block)),
            conf=df[conf_columns(block)].to_numpy(np.float32),
            metadata=dict(metadata),
            path=path,
            target_prob=(df[target_prob_columns(block)].to_numpy(np.float32)
                         if is_sampled(_meta_to_str(metadata)) else None),
        )

    # -------------------------------------------------------------- I/O
    def save(self, path: str | os.PathLike) -> None:
        """Write the trace as Parquet with its metadata, atomically (temp file + rename)."""
        table = pa.Table.from_pandas(self.to_frame(), preserve_index=False)
        meta = {k.encode(): v.encode() for k, v in self.metadata.items()}
        table = table.replace_schema_metadata({**(table.schema.metadata or {}), **meta})
        with atomic_path(path, suffix=".parquet") as tmp:
            pq.write_table(table, tmp, compression="zstd")

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Trace":
        """Read and validate a trace file.

        Raises:
            TraceError: unreadable or non-Parquet file, or the first validation fault (file, row,
                request, position and field named).
        """
        df, metadata = read_trace_file(path)
        return cls.from_frame(df, metadata, path=str(path))



def read_trace_file(path: str | os.PathLike) -> tuple[pd.DataFrame, dict[str, str]]:
    """Read a trace Parquet file into (frame, metadata) without validating the values.

    Raises:
        TraceError: missing file, a symlink loop, truncated or non-Parquet file.
    """
    path_str = str(path)
    if is_symlink_loop(path):
        raise TraceError(f"{path_str}: is a symlink loop (the link leads back to itself); give a trace file")
    if not Path(path).is_file():
        if Path(path).exists():  # a folder, pipe or device: reading it could block or never end
            raise TraceError(f"{path_str}: is not a regular file (a folder, pipe or device); give a trace file")
        raise TraceError(f"{path_str}: no such trace file")
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError, ValueError, MemoryError) as exc:
        raise TraceError(f"{path_str}: not a readable Parquet trace file ({type(exc).__name__}: {exc}); give a "
                         f"trace written by dcut-trace record or synth (or re-record it if it was damaged)") from None
    try:
        names = table.schema.names
    except UnicodeDecodeError:
        raise TraceError(f"{path_str}: a column name is not UTF-8 text (the file is corrupt or was not written as "
                         f"a trace; rewrite it with dcut_sched.traces.Trace.save)") from None
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise TraceError(f"{path_str}: field {dupes[0]!r}: the column appears {names.count(dupes[0])} times; "
                         f"write each column once")
    metadata = {}
    for k, v in (table.schema.metadata or {}).items():
        if k == b"pandas":
            continue
        try:
            metadata[k.decode("utf-8")] = v.decode("utf-8")
        except UnicodeDecodeError:
            raise TraceError(f"{path_str}: file metadata key {k!r} is not UTF-8 text (key and value must be UTF-8 "
                             f"strings; rewrite the file with dcut_sched.traces.Trace.save)") from None
    try:
        df = table.to_pandas()
    except (pa.ArrowException, ValueError, TypeError) as exc:
        raise TraceError(f"{path_str}: columns cannot be read as a table ({type(exc).__name__}: {exc})") from None
    return df, metadata
