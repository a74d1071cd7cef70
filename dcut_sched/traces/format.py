"""The acceptance-trace format of docs/design.md §3 and its validation.

Column names and types, the file metadata keys, and :func:`check_trace_columns`, which lists every
fault of a table naming the file, row, request, position and field. Values are read by exact dtype
or lossless cast only. :mod:`.trace` holds the :class:`~.trace.Trace` arrays and the file I/O.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Annotated, Any, Mapping

import numpy as np
import pandas as pd
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from ..util.inputs import shown
from ..util.validation import field_message, invalid, problems

__all__ = [
    "INDEXINGS",
    "REQUIRED_METADATA",
    "SOURCES",
    "TRACE_VERSION",
    "TraceError",
    "TraceFault",
    "TraceMetadata",
    "accept_len_dtype",
    "check_trace_columns",
    "is_sampled",
    "trace_temperature",
    "target_prob_columns",
]

TRACE_VERSION = "1"
VERSION_KEY = "dcut.trace.version"
INDEXINGS = ("position", "step")
SOURCES = ("recorded", "synthetic")
REQUIRED_METADATA = (VERSION_KEY, "indexing", "block_size", "source")
OPTIONAL_METADATA = ("target_model", "draft_model", "dataset", "temperature", "generator", "generator_params")
MAX_FAULTS = 50


class TraceError(ValueError):
    """A trace file is unreadable or invalid; the message names file, row/request/position and field."""


@dataclass(frozen=True)
class TraceFault:
    """One validation fault: where it is and what is wrong."""

    path: str
    field: str
    problem: str
    row: int | None = None
    request_id: int | None = None
    pos: int | None = None
    fix: str = ""

    def __str__(self) -> str:
        where = [self.path]
        if self.row is not None:
            where.append(f"row {self.row}")
        if self.request_id is not None:
            where.append(f"request {self.request_id}")
        if self.pos is not None:
            where.append(f"pos {self.pos}")
        return field_message(", ".join(where), self.field, self.problem, self.fix, quote=True)


def accept_len_dtype(block_size: int) -> np.dtype:
    """The ``accept_len`` dtype for block size B: int8 (docs/design.md §3) while B-1 <= 127, else int16.

    Raises:
        TraceError: B > 32768 (no accept_len type is defined for it).
    """
    if block_size <= 128:
        return np.dtype(np.int8)
    if block_size <= 32768:
        return np.dtype(np.int16)
    raise TraceError(f"block_size={block_size} is too large for a trace (at most 32768)")


def conf_columns(block_size: int) -> list[str]:
    """The confidence column names ``c1..c{B-1}``."""
    return [f"c{t}" for t in range(1, block_size)]


def target_prob_columns(block_size: int) -> list[str]:
    """The sampled trace's target-probability column names ``p1..p{B-1}``."""
    return [f"p{t}" for t in range(1, block_size)]


def trace_temperature(metadata: Mapping[str, str]) -> float:
    """The metadata's ``temperature`` (0 when absent): a finite number >= 0.

    Raises:
        ValueError: ``temperature`` is not a number, not finite (``inf``, ``1e400``, ``nan``) or
            negative; the message says which and how to fix it.
    """
    raw = metadata.get("temperature", "0")
    fix = "write the temperature the trace was sampled at (0 for greedy)"
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise ValueError(f"{raw!r} is not a number; {fix}") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{raw!r} is not a finite number >= 0; {fix}")
    return value


def is_sampled(metadata: Mapping[str, str]) -> bool:
    """True when the metadata's ``temperature`` is > 0 (a sampled trace).

    Raises:
        ValueError: ``temperature`` is present but not a finite number >= 0 (:func:`trace_temperature`).
    """
    return trace_temperature(metadata) > 0


def _cell(df: pd.DataFrame, column: str, row: int) -> int | None:
    """``df[column][row]`` as an int when it is a whole number (for fault locations), else None."""
    try:
        value = df[column].iat[row]
        f = float(value)
    except (TypeError, ValueError):
        return None
    return int(f) if np.isfinite(f) and f == int(f) and abs(f) < 2**63 else None


def _integer_faults(col: pd.Series, dtype: np.dtype, limit: int = 5) -> list[tuple[int, str]]:
    """Rows of ``col`` that would not convert to ``dtype`` losslessly, with the reason (up to ``limit``)."""
    info = np.iinfo(dtype)
    kind = col.dtype.kind if isinstance(col.dtype, np.dtype) else ""
    want = f"store it as {dtype.name} (whole numbers in [{info.min}, {info.max}])"
    if col.dtype == bool or kind == "b" or str(col.dtype) == "boolean":
        return [(0, f"boolean column; {want}")]
    if kind and kind in "iu":
        values = col.to_numpy()
        bad = np.flatnonzero((values < info.min) | (values > info.max)) if values.dtype != dtype else []
        return [(int(r), f"{values[r]} does not fit {dtype.name} (it would wrap); {want}") for r in bad[:limit]]
    if pd.api.types.is_integer_dtype(col.dtype):  # pandas nullable Int64 etc.
        nulls = np.flatnonzero(col.isna().to_numpy())
        if len(nulls):
            return [(int(r), f"null value; {want}") for r in nulls[:limit]]
        return _integer_faults(col.astype(np.int64), dtype, limit)
    if kind == "f":
        values = col.to_numpy(np.float64)
        with np.errstate(invalid="ignore"):
            ok = np.isfinite(values) & (values == np.round(values)) & (values >= info.min) & (values <= info.max)
        out = []
        for r in np.flatnonzero(~ok)[:limit]:
            v = float(values[r])
            what = ("null/NaN value" if np.isnan(v) else f"{v!r} is not finite" if not np.isfinite(v)
                    else f"{v!r} is not a whole number (it would be truncated)" if v != np.round(v)
                    else f"{v!r} does not fit {dtype.name}")
            out.append((int(r), f"{what}; {want}"))
        return out
    return [(0, f"column of type {col.dtype} (e.g. {col.iat[0]!r}); {want}")]


def _float_column_fault(col: pd.Series) -> str | None:
    """Why a confidence column is not numeric, or None (NaN and range are checked with the values)."""
    if col.dtype == bool or str(col.dtype) == "boolean":
        return "boolean column; store confidences as float32 in [0, 1]"
    if pd.api.types.is_numeric_dtype(col.dtype):
        return None
    return f"column of type {col.dtype} (e.g. {col.iat[0]!r}); store confidences as float32 in [0, 1]"


def check_trace_columns(
    df: pd.DataFrame, metadata: Mapping[str, str], path: str, max_faults: int = MAX_FAULTS
) -> list[TraceFault]:
    """Every fault of docs/design.md §3 in a trace table, up to ``max_faults``.

    Types: exact dtypes or lossless casts only. An integer column of any integer type passes when
    every value fits the column's type, a float column only when every value is a finite whole
    number in range; nulls, NaN, fractions (an ``accept_len`` of 6.7), booleans and strings are
    faults, never truncated, wrapped or merged.

    Checks: required metadata and its values, columns present for the block size, no extra
    confidence columns, confidences finite in [0, 1], accept_len in ``[0, B-1]``, positions
    0..n-1 contiguous per request with no duplicates, and for position-indexed traces that
    ``pos + 1 + accept_len`` does not run past the request's output. The metadata is a
    :class:`TraceMetadata`; the columns are checked as arrays (a model per row of a 10^5-row table
    would be slow), each fault a :class:`TraceFault` printed by
    :func:`~dcut_sched.util.validation.field_message`.
    """
    faults = _Faults(path, max_faults)
    block = _metadata_faults(faults, metadata)
    if block is None or _column_faults(faults, df, block):
        return faults.items
    if _value_faults(faults, df, block):
        return faults.items
    layout = _RequestLayout.of(df)
    if _position_faults(faults, layout):
        return faults.items
    if not faults.items:
        faults.items.extend(check_target_prob_columns(df, metadata, path, block, max_faults))
        if len(faults.items) >= max_faults:
            return faults.items
    if metadata.get("indexing") == "position" and not faults.items:
        _run_past_faults(faults, layout)
    return faults.items


@dataclass
class _Faults:
    """The faults found so far in one file, at most ``max_faults``."""

    path: str
    max_faults: int
    items: list[TraceFault] = field(default_factory=list)

    def add(self, field_name: str, problem: str, row=None, request_id=None, pos=None, fix: str = "") -> bool:
        """Record one fault; True when the list is full (the caller stops)."""
        self.items.append(TraceFault(self.path, field_name, problem, row, request_id, pos, fix))
        return len(self.items) >= self.max_faults


def _block_size(raw: Any) -> Any:
    """The ``block_size`` metadata string as an int in [2, 32768] (checked before any column list is
    built: a block size of 10^22 would never finish)."""
    try:
        block = int(raw) if isinstance(raw, str) else None
    except ValueError:
        block = None
    if block is None or block < 2:
        raise invalid(f"{shown(raw)} is not an integer block size >= 2")
    if block > 32768:
        raise invalid(f"{str(block)[:30]} is too large for a trace (at most 32768)")
    return block


def _one_of(choices: tuple[str, ...]) -> Any:
    def check(raw: Any) -> Any:
        if raw not in choices:
            raise invalid(f"{raw!r} is not one of {choices}")
        return raw
    return BeforeValidator(check)


def _version(raw: Any) -> Any:
    if raw != TRACE_VERSION:
        raise invalid(f"unsupported trace version {raw!r}; this reader reads version {TRACE_VERSION!r}")
    return raw


def _temperature(raw: Any) -> Any:
    try:
        return trace_temperature({"temperature": raw})
    except ValueError as exc:
        raise invalid(str(exc)) from None


def _json_of(kind: type, what: str) -> Any:
    """A metadata string that must hold JSON of ``kind`` (the recorder's ``requests`` and settings)."""
    def check(raw: Any) -> Any:
        try:
            value = json.loads(raw) if isinstance(raw, str) else None
        except ValueError:
            value = None
        if not isinstance(value, kind):
            raise invalid(f"{shown(raw)} is not {what}")
        return value
    return BeforeValidator(check)


def _seconds(raw: Any) -> Any:
    try:
        value = float(raw) if isinstance(raw, str) else math.nan
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise invalid(f"{shown(raw)} is not a finite number of seconds >= 0")
    return value


#: What to do about each metadata fault (the message's fix).
METADATA_FIXES = {
    "block_size": "write the block size B the trace was recorded with, an integer in [2, 32768]",
    "indexing": "write 'position' (one row per output position) or 'step' (one row per decode step)",
    "source": "write 'recorded' (dcut-trace record) or 'synthetic' (dcut-trace synth)",
    "requests": "write the JSON list of finished requests dcut-trace record writes, or drop the key",
    "recorder": "write the JSON object of recorder settings dcut-trace record writes, or drop the key",
    "record_seconds": "write the recording time in seconds, or drop the key",
}


class TraceMetadata(BaseModel):
    """The file metadata of a trace (module docstring), each value a Parquet metadata string; other
    keys are not checked."""

    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)
    version: Annotated[str, BeforeValidator(_version)] = Field(alias=VERSION_KEY)
    indexing: Annotated[str, _one_of(INDEXINGS)]
    block_size: Annotated[int, BeforeValidator(_block_size)]
    source: Annotated[str, _one_of(SOURCES)]
    temperature: Annotated[float, BeforeValidator(_temperature)] = 0.0
    requests: Annotated[Any, _json_of(list, "a JSON list of finished requests")] = None
    recorder: Annotated[Any, _json_of(dict, "a JSON object of recorder settings")] = None
    record_seconds: Annotated[float, BeforeValidator(_seconds)] = 0.0


def _metadata_faults(faults: _Faults, metadata: Mapping[str, str]) -> int | None:
    """Faults of the file metadata (:class:`TraceMetadata`); the block size, or None when the columns
    cannot be checked."""
    try:
        return TraceMetadata.model_validate(dict(metadata)).block_size
    except ValidationError as exc:
        for name, problem in problems(exc):
            if problem == "missing":
                problem = "missing file metadata key (write the trace with dcut_sched.traces.Trace.save)"
            if faults.add(name, problem, fix=METADATA_FIXES.get(name, "")):
                break
        return None


def _column_faults(faults: _Faults, df: pd.DataFrame, block: int) -> bool:
    """Faults of the column set and types (exact dtypes or lossless casts, module docstring, so the
    value checks truncate, wrap or merge nothing); True when the value checks cannot follow."""
    needed = ["request_id", "pos", "accept_len", *conf_columns(block)]
    missing = [c for c in needed if c not in df.columns]
    if missing:
        faults.add(missing[0], f"column missing (block_size={block} needs {needed[0]}, ..., c{block - 1}); "
                   f"missing: {', '.join(missing[:5])}{'...' if len(missing) > 5 else ''}")
        return True
    extra = sorted(c for c in df.columns if c.startswith("c") and c[1:].isdigit() and int(c[1:]) >= block)
    if extra:
        faults.add(extra[0], f"confidence column beyond block_size={block} (B inconsistent with metadata)")
        return True
    if len(df) == 0:
        faults.add("request_id", "the trace has no rows (a trace with no positions cannot be replayed)",
                   fix="record (dcut-trace record) or synthesize (dcut-trace synth) a trace of at least one request")
        return True
    for name, dtype in (("request_id", np.int32), ("pos", np.int32), ("accept_len", accept_len_dtype(block))):
        for r, problem in _integer_faults(df[name], np.dtype(dtype)):
            if faults.add(name, problem, r, _cell(df, "request_id", r), _cell(df, "pos", r)):
                return True
    for name in conf_columns(block):
        problem = _float_column_fault(df[name])
        if problem is not None and faults.add(name, problem):
            return True
    return bool(faults.items)


def _value_faults(faults: _Faults, df: pd.DataFrame, block: int) -> bool:
    """Confidences outside [0, 1] and accept_len outside [0, B-1]; True when the list is full."""
    conf = df[conf_columns(block)].to_numpy(np.float64)
    bad = ~(np.isfinite(conf) & (conf >= 0) & (conf <= 1))
    for r, t in np.argwhere(bad)[:faults.max_faults]:
        if faults.add(f"c{t + 1}", f"confidence {float(conf[r, t])!r} is not a finite value in [0, 1]", int(r),
                      int(df["request_id"].iat[r]), int(df["pos"].iat[r])):
            return True
    accept = df["accept_len"].to_numpy()
    for r in np.flatnonzero((accept < 0) | (accept > block - 1))[:faults.max_faults]:
        if faults.add("accept_len", f"{accept[r]} is outside [0, {block - 1}]", int(r),
                      int(df["request_id"].iat[r]), int(df["pos"].iat[r]),
                      fix=f"accept_len counts the drafts the target accepts of a block of {block}; fix the row "
                          "or re-record the trace"):
            return True
    return False


@dataclass(frozen=True)
class _RequestLayout:
    """The rows sorted by (request_id, pos): ``order`` (file rows), their ``req``, ``pos`` and ``acc``,
    and each request's ``starts``/``ends`` in that order."""

    order: np.ndarray
    req: np.ndarray
    pos: np.ndarray
    acc: np.ndarray
    starts: np.ndarray
    ends: np.ndarray

    @classmethod
    def of(cls, df: pd.DataFrame) -> _RequestLayout:
        order = np.lexsort((df["pos"].to_numpy(), df["request_id"].to_numpy()))
        req = df["request_id"].to_numpy()[order]
        starts = np.concatenate([[0], np.flatnonzero(np.diff(req)) + 1])
        ends = np.concatenate([starts[1:], [len(req)]])
        return cls(order, req, df["pos"].to_numpy()[order], df["accept_len"].to_numpy()[order], starts, ends)


def _position_faults(faults: _Faults, layout: _RequestLayout) -> bool:
    """Positions not 0..n-1 contiguous per request (duplicates named); True when the list is full."""
    order, req, pos, starts, ends = layout.order, layout.req, layout.pos, layout.starts, layout.ends
    expected_pos = np.arange(len(req)) - np.repeat(starts, ends - starts)
    for r in np.flatnonzero(pos != expected_pos)[:faults.max_faults]:
        problem = (
            f"positions of request {req[r]} are not contiguous from 0: expected {expected_pos[r]}, found {pos[r]}"
            + (" (duplicate)" if r > 0 and req[r - 1] == req[r] and pos[r - 1] == pos[r] else "")
        )
        if faults.add("pos", problem, int(order[r]), int(req[r]), int(pos[r]),
                      fix="each request needs rows pos 0, 1, ..., n-1, once each; re-record the trace or drop the "
                          "request's rows"):
            return True
    return False


def _run_past_faults(faults: _Faults, layout: _RequestLayout) -> None:
    """Position-indexed traces: ``pos + 1 + accept_len`` past the request's last position."""
    order, req, pos, acc, starts, ends = (layout.order, layout.req, layout.pos, layout.acc, layout.starts,
                                          layout.ends)
    remaining = np.repeat(ends, ends - starts) - np.arange(len(req)) - 1
    for r in np.flatnonzero(acc > remaining)[:faults.max_faults]:
        if faults.add("accept_len", f"{acc[r]} accepted drafts run past the request's last position "
                      f"({remaining[r]} positions remain)", int(order[r]), int(req[r]), int(pos[r])):
            return


def check_target_prob_columns(df: pd.DataFrame, metadata: Mapping[str, str], path: str, block: int,
                              max_faults: int = MAX_FAULTS) -> list[TraceFault]:
    """Faults of the sampled-trace columns ``p1..p{B-1}``.

    A trace whose ``temperature`` is > 0 needs every ``p`` column, of a floating type, each value
    finite in [0, 1]; a greedy trace (temperature 0) must not carry them. ``metadata`` is already
    checked (:class:`TraceMetadata`).
    """
    faults: list[TraceFault] = []
    cols = target_prob_columns(block)
    present = [c for c in df.columns if c.startswith("p") and c[1:].isdigit()]
    if not is_sampled(metadata):  # the temperature was checked with the metadata (TraceMetadata)
        if present:
            faults.append(TraceFault(path, present[0], "target-probability column in a greedy trace "
                                     "(temperature 0); set the temperature it was sampled at or drop p1..p{B-1}"))
        return faults
    missing = [c for c in cols if c not in df.columns]
    if missing:
        return [TraceFault(path, missing[0], f"column missing: a sampled trace (temperature "
                           f"{metadata.get('temperature')}) needs p1..p{block - 1}, the target's probability of "
                           f"each draft token; missing: {', '.join(missing[:5])}{'...' if len(missing) > 5 else ''}")]
    extra = sorted(c for c in present if int(c[1:]) >= block)
    if extra:
        return [TraceFault(path, extra[0], f"target-probability column beyond block_size={block}")]
    for name in cols:
        col = df[name]
        if not pd.api.types.is_float_dtype(col.dtype):
            first = col.iat[0]
            first = first.item() if isinstance(first, np.generic) else first
            return [TraceFault(path, name, f"column of type {col.dtype} (e.g. {first!r}); store target "
                               "probabilities as float32 in [0, 1]")]
    prob = df[cols].to_numpy(np.float64, na_value=np.nan)
    bad = ~(np.isfinite(prob) & (prob >= 0) & (prob <= 1))
    for r, t in np.argwhere(bad)[:max_faults]:
        faults.append(TraceFault(path, f"p{t + 1}", f"target probability {float(prob[r, t])!r} is not a finite "
                                 "value in [0, 1]", int(r), int(df["request_id"].iat[r]), int(df["pos"].iat[r])))
    return faults
