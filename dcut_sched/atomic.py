"""Atomic file writes: a result file is either the old one or the complete new one, never half."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Callable, Iterator

__all__ = ["atomic_path", "atomic_write_text", "atomic_write_with", "check_writable"]


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, suffix: str = "") -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success rename it over ``path``.

    The temp file lives in the destination folder (same filesystem, so ``os.replace`` is atomic),
    is fsynced before the rename, and is removed if the body raises. ``suffix`` keeps the file ending
    for writers that choose a format by it (e.g. ``.parquet``).
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix + ".tmp", dir=path.parent)
    except OSError as exc:
        raise OSError(f"cannot write {path}: {exc.strerror or exc}") from None
    os.close(fd)
    tmp_path = Path(tmp)
    # mkstemp creates the file 0600; give the result the permissions a plain open() would.
    os.chmod(tmp_path, 0o666 & ~_umask())
    try:
        yield tmp_path
        with open(tmp_path, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp_path, path)
    except BaseException:
        tmp_path.unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def atomic_write_with(path: str | os.PathLike, writer: Callable[[Path], None], suffix: str = "") -> None:
    """Call ``writer(tmp_path)`` and move the result to ``path`` atomically."""
    with atomic_path(path, suffix=suffix) as tmp:
        writer(tmp)


def check_writable(path: str | os.PathLike) -> None:
    """Raise ``OSError`` naming ``path`` unless a file can be written there (before long work).

    Creates missing parent folders, as the atomic writers do, and leaves no file behind.
    """
    with atomic_path(path):
        pass
    Path(path).unlink()
