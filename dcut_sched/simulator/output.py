"""Result files: a DataFrame written as CSV, Parquet or JSON by the file's suffix, atomically."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd

from ..atomic import atomic_path

__all__ = ["OUTPUT_SUFFIXES", "check_output_path", "write_frame"]

OUTPUT_SUFFIXES = (".csv", ".parquet", ".json")


def check_output_path(path: str | os.PathLike, suffixes: tuple[str, ...] = OUTPUT_SUFFIXES) -> str:
    """The lower-case suffix of ``path`` if it is one of ``suffixes``.

    Raises:
        ValueError: unknown suffix, or the folder exists as a file (checked before any work is done).
    """
    suffix = Path(path).suffix.lower()
    if suffix not in suffixes:
        raise ValueError(f"{path}: unknown output format {suffix or '(no suffix)'!r}; use one of {', '.join(suffixes)}")
    parent = Path(path).parent
    if parent.exists() and not parent.is_dir():
        raise ValueError(f"{path}: {parent} is not a folder")
    return suffix


def write_frame(df: pd.DataFrame, path: str | os.PathLike) -> None:
    """Write ``df`` to ``path`` by suffix (``.csv``, ``.parquet``, ``.json``), atomically.

    JSON is ``{"attrs": df.attrs, "rows": [one object per row]}``; Parquet keeps ``df.attrs`` in the
    file metadata (pandas does this); CSV carries the same facts in its columns (e.g. ``approximate``).

    Raises:
        ValueError: unknown suffix.
    """
    suffix = check_output_path(path)
    with atomic_path(path, suffix=suffix) as tmp:
        if suffix == ".csv":
            df.to_csv(tmp, index=False)
        elif suffix == ".parquet":
            df.to_parquet(tmp, index=False)
        else:
            doc = {"attrs": df.attrs, "rows": json.loads(df.to_json(orient="records"))}
            tmp.write_text(json.dumps(doc, indent=1, default=str) + "\n", encoding="utf-8")
