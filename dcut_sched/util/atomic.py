"""Atomic file writes: a result file is either the old one or the complete new one, never half.

Two levels:

- :func:`atomic_path` (and the ``atomic_write_*`` wrappers): one file, written to a temp file beside
  it and renamed over it.
- :func:`all_or_none`: a command's outputs as one unit. Inside the ``with`` block every
  :func:`atomic_path` of this thread stages its temp file instead of renaming it; the renames happen
  together when the block ends without an exception (with SIGINT/SIGTERM held back for those few
  ``os.replace`` calls), and every staged temp file is removed when it raises. A rename that fails
  (a destination that cannot be replaced) puts the files already renamed back
  (:meth:`OutputSet.commit`). So a late failure (a bad plot after the table was written, Ctrl-C,
  an immutable destination) leaves the old files, never half of the new set.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import shutil
import signal
import tempfile
import threading
from pathlib import Path
from typing import Callable, Iterator

__all__ = ["OutputSet", "all_or_none", "atomic_path", "atomic_write_text", "atomic_write_with", "check_writable",
           "existing_folder", "missing_folders", "remove_empty_folders"]


class OutputSet:
    """Temp files staged by :func:`atomic_path` inside :func:`all_or_none`, renamed together."""

    def __init__(self) -> None:
        self.staged: list[tuple[Path, Path]] = []  # (temp file, destination)
        self.created: list[Path] = []  # folders made for the outputs, removed again on discard

    def commit(self) -> None:
        """Rename every staged file over its destination (signals held back meanwhile), all or none.

        Each existing destination is first kept under a hard link beside it; if a rename fails (a
        destination that became a folder, an immutable file, a read-only mount), the destinations
        already renamed get their previous file back (or are removed where there was none) and the
        error names the one that failed. The kept links are removed at the end either way.

        Raises:
            OSError: a destination could not be replaced (``cannot write PATH: ...; no output was
                changed``); the staged temp files are left for :meth:`discard`.
        """
        with _signals_held():
            kept: list[tuple[Path, Path | None]] = []  # (destination, its previous file or None), renamed ones
            try:
                for tmp, dest in self.staged:
                    old = _keep(dest)
                    try:
                        os.replace(tmp, dest)
                    except OSError:
                        if old is not None:
                            old.unlink(missing_ok=True)
                        raise
                    kept.append((dest, old))
            except OSError as exc:
                for dest, old in reversed(kept):
                    with contextlib.suppress(OSError):
                        if old is None:
                            dest.unlink()
                        else:
                            os.replace(old, dest)
                failed = self.staged[len(kept)][1]
                raise OSError(f"cannot write {failed}: {exc.strerror or exc}; no output was changed "
                              f"(outputs are written all or none)") from None
            for _, old in kept:
                if old is not None:
                    old.unlink(missing_ok=True)
            self.staged.clear()

    def discard(self) -> None:
        """Remove every staged temp file (destinations untouched)."""
        for tmp, _ in self.staged:
            tmp.unlink(missing_ok=True)
        self.staged.clear()
        remove_empty_folders(self.created)
        self.created.clear()


def _keep(dest: Path) -> Path | None:
    """A hard link to the file at ``dest`` beside it (None when there is none; a symlink is kept as a
    symlink), so that a commit that fails later can put it back; a file system without hard links
    keeps a copy instead."""
    if not (dest.is_symlink() or dest.is_file()):
        return None
    fd, name = tempfile.mkstemp(prefix=f".{dest.name[:80]}.", suffix=".old.tmp", dir=dest.parent)
    os.close(fd)
    old = Path(name)
    if dest.is_symlink():  # the link itself is what a rename replaces
        old.unlink()
        os.symlink(os.readlink(dest), old)
        return old
    try:
        old.unlink()
        os.link(dest, old)
    except OSError:
        shutil.copy2(dest, old)
    return old


_CURRENT: contextvars.ContextVar[OutputSet | None] = contextvars.ContextVar("dcut_output_set", default=None)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Block SIGINT/SIGTERM in the main thread for the body; a signal that arrives meanwhile is
    delivered (and its handler runs) right after."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    held = {signal.SIGINT, signal.SIGTERM}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


@contextlib.contextmanager
def all_or_none() -> Iterator[OutputSet]:
    """Write a command's outputs all or none (module docstring). Nested uses join the outer set."""
    outer = _CURRENT.get()
    if outer is not None:
        yield outer
        return
    outputs = OutputSet()
    token = _CURRENT.set(outputs)
    try:
        yield outputs
        _CURRENT.reset(token)
        token = None
        outputs.commit()
    except BaseException:
        if token is not None:
            _CURRENT.reset(token)
        outputs.discard()
        raise


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, suffix: str = "") -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success rename it over ``path``.

    The temp file lives in the destination folder (same filesystem, so ``os.replace`` is atomic),
    is fsynced before the rename, and is removed if the body raises (any exception, also
    ``KeyboardInterrupt``). ``suffix`` keeps the file ending for writers that choose a format by it
    (e.g. ``.parquet``). Inside :func:`all_or_none` the rename waits for the end of that block.

    Raises:
        OSError: the folder cannot be created or written (the message names ``path``).
    """
    path = Path(path)
    outputs = _CURRENT.get()
    tmp_path: Path | None = None
    created: list[Path] = []
    try:
        # Signals are held from the temp file's creation until its name is known, so an interrupt
        # can never leave a nameless temp file behind; one that arrives meanwhile is raised right
        # after, inside this try, and the file is removed.
        with _signals_held():
            try:
                created = _make_folders(path.parent)
                if outputs is not None:
                    outputs.created += created
                fd, tmp = tempfile.mkstemp(prefix=f".{path.name[:80]}.", suffix=suffix + ".tmp", dir=path.parent)
            except OSError as exc:
                raise OSError(f"cannot write {path}: {exc.strerror or exc}") from None
            tmp_path = Path(tmp)
            os.close(fd)
        # mkstemp creates the file 0600; give the result the permissions a plain open() would.
        os.chmod(tmp_path, 0o666 & ~_umask())
        yield tmp_path
        with open(tmp_path, "rb") as fh:
            os.fsync(fh.fileno())
        if outputs is None:
            os.replace(tmp_path, path)
        else:
            outputs.staged.append((tmp_path, path))
    except BaseException:
        if tmp_path is not None and (outputs is None or (tmp_path, path) not in outputs.staged):
            tmp_path.unlink(missing_ok=True)
        if outputs is None:
            remove_empty_folders(created)
        raise


def missing_folders(folder: str | os.PathLike) -> list[Path]:
    """The folders on the way to ``folder`` (itself included) that do not exist yet, deepest first."""
    folder, missing = Path(folder), []
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    return missing


def existing_folder(folder: str | os.PathLike) -> Path:
    """``folder`` if it exists, else its nearest existing ancestor."""
    missing = missing_folders(folder)
    return missing[-1].parent if missing else Path(folder)


def _make_folders(folder: Path) -> list[Path]:
    """``folder.mkdir(parents=True, exist_ok=True)``; returns the folders it made, deepest first."""
    made = missing_folders(folder)
    for f in reversed(made):
        f.mkdir(exist_ok=True)
    return made


def remove_empty_folders(folders: list[Path]) -> None:
    """Remove folders a write or a run made and did not fill (its result did not complete), deepest
    first; a folder that is not empty (another writer's file, resumable state) is kept."""
    for f in sorted(set(folders), key=lambda p: len(p.parts), reverse=True):
        try:
            f.rmdir()
        except OSError:  # not empty or already gone
            pass


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

    Changes nothing on disk that outlives the call: an existing folder is probed with a temp file
    that is removed again (an existing file at ``path`` is left untouched: it is replaced only when
    the new result is complete); missing parent folders are not made here (the writer makes them
    when the result is written, and removes them again if that fails), so the nearest existing
    folder above must be a writable folder. A ``path`` that is a folder is refused.
    """
    path = Path(path)
    if path.is_dir():
        raise OSError(f"cannot write {path}: it is a folder, give a file name")
    folder = existing_folder(path.parent)
    if not folder.is_dir():
        raise OSError(f"cannot write {path}: {folder} is a file, not a folder")
    if folder != path.parent:
        if not os.access(folder, os.W_OK | os.X_OK) or _read_only(folder):
            raise OSError(f"cannot write {path}: cannot make folders in {folder} (permission denied or read-only)")
        return
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name[:80]}.", suffix=".probe.tmp", dir=folder)
    except OSError as exc:
        raise OSError(f"cannot write {path}: {exc.strerror or exc}") from None
    os.close(fd)
    os.unlink(tmp)


def _read_only(folder: Path) -> bool:
    try:
        return bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):
        return False
