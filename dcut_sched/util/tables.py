"""The one table writer (and reader) of the project: CSV, Parquet or JSON chosen by the file suffix.

Used by ``dcut-sim --out``/``--selection-curve``, ``dcut-engine --out``/``--steps``, ``dcut-profile
--report`` and the scripts under ``analysis/``, so every table file of one suffix has one layout:

- ``.csv``: one header row, one line per row; list/array cells are written as JSON lists
  (``"[1, 2, 3]"``), so a CSV cell is always a scalar.
- ``.parquet``: the frame as is (pandas keeps ``DataFrame.attrs`` in the file metadata).
- ``.json``: ``{"attrs": {...}, "rows": [{column: value, ...}, ...]}`` -- the frame's ``attrs``
  (run settings such as ``mode``, ``approximate``) and one object per row; NaN is ``null``.

Writes are atomic (:mod:`dcut_sched.util.atomic`): the file is the old one or the complete new one, and
inside :func:`dcut_sched.util.atomic.all_or_none` a command's tables and plots appear together or not at all.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .atomic import atomic_path

__all__ = ["TABLE_SUFFIXES", "read_table", "show_table", "table_suffix", "write_table"]

TABLE_SUFFIXES = (".csv", ".parquet", ".json")


def table_suffix(path: str | os.PathLike) -> str:
    """The lower-case suffix of ``path``.

    Raises:
        ValueError: not one of :data:`TABLE_SUFFIXES` (the message names the path and the choices).
    """
    suffix = Path(path).suffix.lower()
    if suffix not in TABLE_SUFFIXES:
        raise ValueError(f"{path}: unknown table format {suffix or '(no suffix)'!r}; use one of "
                         f"{', '.join(TABLE_SUFFIXES)}")
    return suffix


def _json_cell(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return json.dumps(value.tolist())
    if isinstance(value, (list, tuple)):
        return json.dumps([v.item() if isinstance(v, np.generic) else v for v in value])
    return value


def _csv_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with list/array cells JSON-encoded (scalar CSV cells)."""
    out = frame
    for col in frame.columns:
        if frame[col].dtype == object and frame[col].map(lambda v: isinstance(v, (list, tuple, np.ndarray))).any():
            if out is frame:
                out = frame.copy()
            out[col] = frame[col].map(_json_cell)
    return out


def _default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return str(value)


def write_table(frame: pd.DataFrame, path: str | os.PathLike, *, float_format: str | None = None) -> None:
    """Write ``frame`` to ``path`` by suffix (module docstring), atomically.

    Args:
        frame: the table (its index is not written; ``frame.attrs`` goes to JSON and Parquet).
        path: ``.csv``, ``.parquet`` or ``.json``.
        float_format: CSV only, e.g. ``"%.6g"``.

    Raises:
        ValueError: unknown suffix.
        OSError: the file cannot be written (the message names it).
    """
    suffix = table_suffix(path)
    with atomic_path(path, suffix=suffix) as tmp:
        if suffix == ".csv":
            _csv_frame(frame).to_csv(tmp, index=False, float_format=float_format)
        elif suffix == ".parquet":
            frame.to_parquet(tmp, index=False)
        else:
            doc = {"attrs": dict(frame.attrs), "rows": json.loads(frame.to_json(orient="records", default_handler=str))}
            tmp.write_text(json.dumps(doc, indent=1, default=_default) + "\n", encoding="utf-8")


def show_table(frame: pd.DataFrame, out: str | os.PathLike | None = None) -> None:
    """Print ``frame`` as plain text (no index) and, given ``out``, write it there (:func:`write_table`)."""
    print(frame.to_string(index=False))
    if out:
        write_table(frame, out)


def read_table(path: str | os.PathLike) -> pd.DataFrame:
    """Read a table written by :func:`write_table` (``attrs`` restored for JSON and Parquet).

    Raises:
        ValueError: unknown suffix, or a ``.json`` file that is not ``{"attrs": ..., "rows": [...]}``.
    """
    suffix = table_suffix(path)
    if suffix == ".csv":
        return pd.read_csv(path)
    if suffix == ".parquet":
        return pd.read_parquet(path)
    doc = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(doc, dict) or not isinstance(doc.get("rows"), list):
        raise ValueError(f"{path}: not a table file (expected a JSON object with 'attrs' and 'rows')")
    frame = pd.DataFrame(doc["rows"])
    frame.attrs.update(doc.get("attrs") or {})
    return frame
