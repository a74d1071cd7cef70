"""Argument types and path guards shared by every command-line tool.

- Number types for ``argparse`` (``type=``): :func:`int_at_least`, :func:`finite_float`: a value
  that would make results meaningless (``--overhead-ms inf``, ``--jobs 0``, ``--seed -1``) is
  refused at parse time with a message naming the flag.
- :func:`check_paths`: before any work, every output path must be writable, of an accepted suffix,
  distinct from every other output and never one of the input files (compared as resolved paths,
  and with ``os.path.samefile`` where both exist, so links and ``./a/../a`` spellings are caught).
- :func:`read_text_input`: a text input (JSON, JSONL, config) read as UTF-8, with a one-line error
  naming the flag, the file and the fix when it is missing, binary (e.g. a Parquet file given by
  mistake) or not UTF-8 (:mod:`dcut_sched.inputs`).
"""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from ..atomic import check_writable
from .errors import UsageError

__all__ = ["check_paths", "finite_float", "int_at_least", "read_text_input", "same_file"]


def int_at_least(minimum: int, maximum: int | None = None) -> "callable":
    """An ``argparse`` type: an integer >= ``minimum`` (and <= ``maximum``, a documented limit, when given)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} must be >= {minimum}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"{value:,} is above the limit {maximum:,} (docs/reliability.md); "
                                             f"split the work into several runs")
        return value

    parse.__name__ = f"integer >= {minimum}" if maximum is None else f"integer in [{minimum}, {maximum}]"
    return parse


def finite_float(minimum: float | None = None, maximum: float | None = None, *, open_low: bool = False) -> "callable":
    """An ``argparse`` type: a finite float in ``[minimum, maximum]`` (``(minimum, ...`` with ``open_low``)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not finite; give a finite number")
        if minimum is not None and (value <= minimum if open_low else value < minimum):
            raise argparse.ArgumentTypeError(f"{value:g} must be {'>' if open_low else '>='} {minimum:g}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"{value:g} must be <= {maximum:g}")
        return value

    parse.__name__ = "finite number"
    return parse


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether two paths name one file: ``os.path.samefile`` when both exist, else equal resolved paths."""
    pa, pb = Path(a), Path(b)
    try:
        if pa.exists() and pb.exists():
            return os.path.samefile(pa, pb)
    except OSError:
        pass
    return pa.resolve() == pb.resolve()


def check_paths(
    inputs: Mapping[str, str | os.PathLike | Sequence[str | os.PathLike] | None],
    outputs: Mapping[str, tuple[str | os.PathLike | None, Iterable[str] | None]],
) -> None:
    """Refuse bad output paths before any work is done.

    Args:
        inputs: flag -> input path(s) (``None`` entries are skipped), e.g. ``{"--trace": [a, b]}``.
        outputs: flag -> ``(path or None, accepted suffixes or None for any)``.

    Raises:
        UsageError: an output that is an input or another output (both flags named), an unknown
            suffix, a folder, or a place that cannot be written.
    """
    ins: list[tuple[str, str]] = []
    for flag, value in inputs.items():
        if value is None:
            continue
        for p in ([value] if isinstance(value, (str, os.PathLike)) else value):
            if p is not None:
                ins.append((flag, str(p)))
    seen: list[tuple[str, str]] = []
    for flag, (path, suffixes) in outputs.items():
        if path is None:
            continue
        path = str(path)
        for in_flag, in_path in ins:
            if same_file(path, in_path):
                raise UsageError(f"{flag} {path} is the {in_flag} input file; writing it would destroy the input: "
                                 f"give {flag} another path")
        for out_flag, out_path in seen:
            if same_file(path, out_path):
                raise UsageError(f"{flag} and {out_flag} are the same file {path}; give each output its own path")
        seen.append((flag, path))
        if suffixes is not None:
            suffix = Path(path).suffix.lower()
            if suffix not in suffixes:
                raise UsageError(f"{flag} {path}: unknown output format {suffix or '(no suffix)'!r}; "
                                 f"use one of {', '.join(suffixes)}")
        try:
            check_writable(path)
        except OSError as exc:
            raise UsageError(f"{flag}: {exc}") from None


def read_text_input(path: str | os.PathLike, flag: str, what: str) -> str:
    """The UTF-8 text of an input file, or a :class:`UsageError` naming ``flag``, the file and the fix
    (:func:`dcut_sched.inputs.read_text`)."""
    from ..inputs import InputFileError, read_text

    try:
        return read_text(path, what)
    except InputFileError as exc:
        raise UsageError(f"{flag} {exc}") from None


def check_json_input(path: str | os.PathLike | None, flag: str, what: str) -> None:
    """Refuse before any work a JSON input that is missing, binary, not UTF-8, not JSON or nested
    too deeply to parse, with a :class:`UsageError` naming ``flag`` and the file (the loader then
    checks the fields)."""
    if path is None:
        return
    from ..inputs import InputFileError, parse_json

    text = read_text_input(path, flag, what)
    try:
        parse_json(text, str(path))
    except InputFileError as exc:
        raise UsageError(f"{flag} {exc}; give {what}") from None
