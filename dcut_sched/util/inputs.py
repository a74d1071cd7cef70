"""Reading small text inputs (JSON, JSON lines, configs) with one-line errors that name the file.

A binary file given where text is expected (a Parquet trace passed as a prompt file, a model
checkpoint as a config), a file that is not UTF-8, a symlink loop, or JSON nested too deeply to
parse all raise :class:`InputFileError` (a ``ValueError``) naming the file and what it should be,
never a traceback. Configuration inputs use :func:`parse_json_strict` (:func:`read_json_strict`);
text that is not JSON at all raises its subclass :class:`JSONSyntaxError`, so a caller that falls
back to a plain string (``--param key=fast``) still refuses JSON that breaks a strict rule.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["InputFileError", "JSONSyntaxError", "check_value_bounds", "is_symlink_loop", "read_json",
           "read_json_strict", "read_text", "parse_json", "parse_json_strict", "shown"]

#: Limits of :func:`parse_json_strict`: nesting depth and digits of one number.
MAX_JSON_DEPTH = 64
MAX_NUMBER_DIGITS = 64

#: Refuse text inputs larger than this (a wrong file given by mistake).
MAX_TEXT_BYTES = 256 << 20

_BINARY_MAGIC = {b"PAR1": "a Parquet file", b"\x89PNG": "a PNG image", b"%PDF": "a PDF file",
                 b"PK\x03\x04": "a zip archive", b"\x7fELF": "an executable", b"GGUF": "a GGUF model file",
                 b"\x1f\x8b": "a gzip file"}


def shown(value: Any, limit: int = 40) -> str:
    """``repr(value)`` for an error message, cut to ``limit`` characters (a 5,000-digit number or a
    3,000-item list is not echoed back)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class InputFileError(ValueError):
    """An input file is missing, binary, not UTF-8 or not parseable; the message names it."""


class JSONSyntaxError(InputFileError):
    """The text is not JSON at all (a syntax error), as opposed to JSON that breaks a strict rule."""


def is_symlink_loop(path: str | os.PathLike) -> bool:
    """Whether opening ``path`` fails with ``ELOOP``: the path (or a folder on it) is a symbolic link
    that leads back to itself, directly or through other links."""
    try:
        os.stat(path)
    except OSError as exc:
        return exc.errno == errno.ELOOP
    except ValueError:  # a NUL byte in the path: not a loop (the caller reports it)
        return False
    return False


def read_text(path: str | os.PathLike, what: str = "a text file") -> str:
    """The UTF-8 text of ``path``.

    Args:
        path: the file.
        what: what it should be, for messages (``"a JSON-lines prompt file"``).

    Raises:
        InputFileError: missing, a symlink loop, a folder, not a regular file (a pipe or device: it
            could block or never end), too large, binary (by magic bytes or a NUL byte) or not UTF-8.
    """
    p = Path(path)
    if is_symlink_loop(p):
        raise InputFileError(f"{path}: is a symlink loop (the link leads back to itself); give {what}")
    if not p.exists():
        raise InputFileError(f"{path}: no such file; give {what}")
    if p.is_dir():
        raise InputFileError(f"{path}: is a folder; give {what}")
    if not p.is_file():  # a FIFO would block the read forever, /dev/zero would fill memory
        raise InputFileError(f"{path}: is not a regular file (a pipe, device or socket); give {what}")
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
    (invalid JSON, nesting too deep for the parser, an integer longer than Python converts;
    NaN-free numbers are not enforced)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise JSONSyntaxError(f"{where}: not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})") from None
    except RecursionError:
        raise InputFileError(f"{where}: JSON nested too deeply to read") from None
    except ValueError:  # an integer literal beyond Python's int conversion limit (4300 digits)
        raise InputFileError(f"{where}: a number too long to read; give a number of ordinary size") from None


def read_json(path: str | os.PathLike, what: str = "a JSON file") -> Any:
    """:func:`read_text` then :func:`parse_json`."""
    return parse_json(read_text(path, what), str(path))


def read_json_strict(path: str | os.PathLike, what: str = "a JSON file", **rules: Any) -> Any:
    """:func:`read_text` then :func:`parse_json_strict` (``rules``: its keyword arguments)."""
    return parse_json_strict(read_text(path, what), str(path), **rules)


def _json_depth(text: str) -> int:
    """Deepest nesting of objects/arrays in JSON text (brackets inside strings ignored)."""
    depth = best = 0
    in_str = esc = False
    for ch in text:
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "[{":
            depth += 1
            best = max(best, depth)
        elif ch in "]}":
            depth -= 1
    return best


def parse_json_strict(text: str, where: str, *, max_depth: int = MAX_JSON_DEPTH,
                      max_digits: int = MAX_NUMBER_DIGITS, allow_nonfinite: bool = False) -> Any:
    """JSON for configuration inputs: like :func:`parse_json`, and also refuses a key repeated in one
    object (JSON keeps the last silently), ``NaN``/``Infinity`` (unless ``allow_nonfinite``: then
    they parse as floats for a validator that names the field), a number longer than ``max_digits``
    digits and nesting deeper than ``max_depth``, each with a one-line :class:`InputFileError`
    naming ``where`` (:class:`JSONSyntaxError` when the text is not JSON at all)."""
    depth = _json_depth(text)
    if depth > max_depth:
        raise InputFileError(f"{where}: JSON nested too deeply ({depth} levels; at most {max_depth} are read)")

    def pairs(items):
        out: dict[str, Any] = {}
        for k, v in items:
            if k in out:
                raise InputFileError(f"{where}: key {k!r} appears twice in one object; keep one of them")
            out[k] = v
        return out

    def number(kind):
        def parse(s: str):
            if len(s.lstrip("-").replace(".", "").split("e")[0].split("E")[0]) > max_digits:
                raise InputFileError(f"{where}: a number with {len(s)} characters; at most {max_digits} digits are read")
            return kind(s)
        return parse

    def constant(name: str):
        if allow_nonfinite:
            return float(name)
        raise InputFileError(f"{where}: {name} is not a JSON number; give a finite value")

    try:
        return json.loads(text, object_pairs_hook=pairs, parse_int=number(int), parse_float=number(float),
                          parse_constant=constant)
    except json.JSONDecodeError as exc:
        raise JSONSyntaxError(f"{where}: not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})") from None
    except RecursionError:
        raise InputFileError(f"{where}: JSON nested too deeply to read") from None


#: The longest string a configuration value may hold (a path is at most 4,096 bytes on Linux).
MAX_STRING_CHARS = 4096


def check_value_bounds(value: Any, where: str, *, max_depth: int = MAX_JSON_DEPTH,
                       max_digits: int = MAX_NUMBER_DIGITS, max_chars: int = MAX_STRING_CHARS) -> None:
    """The rules of :func:`parse_json_strict` for a configuration given as Python objects (vLLM's
    ``additional_config``, a dict built in code): nesting at most ``max_depth``, an integer of at
    most ``max_digits`` digits, a string of at most ``max_chars`` characters. Walks without
    recursion.

    Raises:
        InputFileError: one line naming ``where`` and the key path (``policy_params.ratios``).
    """
    todo: list[tuple[Any, str, int]] = [(value, "", 0)]
    limit = 10 ** max_digits
    while todo:
        item, path, depth = todo.pop()
        if isinstance(item, (np.generic, np.ndarray)):  # numpy values count as what they hold
            item = item.item() if isinstance(item, np.generic) else item.tolist()
        shown = path if len(path) <= 60 else path[:57] + "..."
        at = f"{where}{'' if not path else ' key ' + repr(shown)}"
        if depth > max_depth:
            raise InputFileError(f"{at}: nested too deeply (more than {max_depth} levels)")
        if isinstance(item, bool):
            continue
        if isinstance(item, int) and not -limit < item < limit:
            raise InputFileError(f"{at}: an integer longer than {max_digits} digits; give a real value")
        if isinstance(item, str) and len(item) > max_chars:
            raise InputFileError(f"{at}: a string of {len(item):,} characters (at most {max_chars:,})")
        if isinstance(item, str) and "\x00" in item:
            raise InputFileError(f"{at}: a string holding a NUL character")
        if isinstance(item, dict):
            todo += [(v, f"{path}.{k}" if path else str(k)[:60], depth + 1) for k, v in item.items()]
        elif isinstance(item, (list, tuple)):
            todo += [(v, f"{path}[{i}]", depth + 1) for i, v in enumerate(item)]
        elif not (item is None or isinstance(item, (str, int, float))):
            raise InputFileError(f"{at}: a {type(item).__name__}; give what JSON holds (an object, a list, a "
                                 f"string, a number, a boolean or null)")
