"""Reading small text inputs (JSON, JSON lines, configs) with one-line errors that name the file.

A binary file given where text is expected (a Parquet trace passed as a prompt file, a model
checkpoint as a config), a file that is not UTF-8, or JSON nested too deeply to parse all raise
:class:`InputFileError` (a ``ValueError``) naming the file and what it should be, never a traceback.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["InputFileError", "read_json", "read_text", "parse_json"]

#: Refuse text inputs larger than this (a wrong file given by mistake).
MAX_TEXT_BYTES = 256 << 20

_BINARY_MAGIC = {b"PAR1": "a Parquet file", b"\x89PNG": "a PNG image", b"%PDF": "a PDF file",
                 b"PK\x03\x04": "a zip archive", b"\x7fELF": "an executable", b"GGUF": "a GGUF model file",
                 b"\x1f\x8b": "a gzip file"}


class InputFileError(ValueError):
    """An input file is missing, binary, not UTF-8 or not parseable; the message names it."""


def read_text(path: str | os.PathLike, what: str = "a text file") -> str:
    """The UTF-8 text of ``path``.

    Args:
        path: the file.
        what: what it should be, for messages (``"a JSON-lines prompt file"``).

    Raises:
        InputFileError: missing, a folder, too large, binary (by magic bytes or a NUL byte) or not UTF-8.
    """
    p = Path(path)
    if not p.exists():
        raise InputFileError(f"{path}: no such file; give {what}")
    if p.is_dir():
        raise InputFileError(f"{path}: is a folder; give {what}")
    try:
        size = p.stat().st_size
        if size > MAX_TEXT_BYTES:
            raise InputFileError(f"{path}: {size} bytes is too large for {what}")
        data = p.read_bytes()
    except OSError as exc:
        raise InputFileError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    for magic, kind in _BINARY_MAGIC.items():
        if data.startswith(magic):
            raise InputFileError(f"{path}: is {kind}, not {what}")
    if b"\x00" in data[:65536]:
        raise InputFileError(f"{path}: is a binary file, not {what}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputFileError(f"{path}: is not UTF-8 text (invalid byte at offset {exc.start}); give {what}") from None


def parse_json(text: str, where: str) -> Any:
    """``json.loads(text)`` with a one-line :class:`InputFileError` naming ``where`` on failure
    (invalid JSON, nesting too deep for the parser, NaN-free numbers are not enforced)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputFileError(f"{where}: not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})") from None
    except RecursionError:
        raise InputFileError(f"{where}: JSON nested too deeply to read") from None


def read_json(path: str | os.PathLike, what: str = "a JSON file") -> Any:
    """:func:`read_text` then :func:`parse_json`."""
    return parse_json(read_text(path, what), str(path))
