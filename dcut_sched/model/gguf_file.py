"""Open a GGUF file and read its metadata fields (the part of GGUF that configs and tokenizers share;
the tensors are read by :mod:`dcut_sched.model.gguf_weights`)."""

from __future__ import annotations

import os
from typing import Any

import gguf
import numpy as np

__all__ = ["gguf_field", "open_gguf"]

_MISSING = object()


def open_gguf(path: str | os.PathLike) -> Any:
    """`gguf.GGUFReader` of `path` (read-only memory map). Raises FileNotFoundError naming the path."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"GGUF file not found: {path}")
    return gguf.GGUFReader(path, "r")


def gguf_field(reader: Any, key: str, default: Any = _MISSING, path: str = "") -> Any:
    """Value of metadata field `key` (scalars as Python numbers, strings as str, arrays as lists).

    Raises:
        KeyError: the key is absent and no default was given (names file and key).
    """
    f = reader.fields.get(key)
    if f is None:
        if default is _MISSING:
            raise KeyError(f"{path or 'GGUF'}: metadata key {key!r} is missing")
        return default
    if hasattr(f, "contents"):  # gguf >= 0.11
        return f.contents()
    # Older gguf: decode by hand from the raw parts.
    vals = [f.parts[i] for i in f.data]
    if f.types and f.types[0] == gguf.GGUFValueType.STRING:
        vals = [bytes(v).decode("utf-8") for v in vals]
        return vals[0] if len(f.types) == 1 else vals
    vals = [v.tolist()[0] if isinstance(v, np.ndarray) else v for v in vals]
    return vals[0] if len(f.types) == 1 else vals
