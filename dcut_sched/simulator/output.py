"""Result files of the simulator: :func:`dcut_sched.util.tables.write_table` (one table writer)."""

from __future__ import annotations

import os
from pathlib import Path

from ..util.tables import TABLE_SUFFIXES as OUTPUT_SUFFIXES
from ..util.tables import write_table as write_frame

__all__ = ["OUTPUT_SUFFIXES", "check_output_path", "write_frame"]


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
