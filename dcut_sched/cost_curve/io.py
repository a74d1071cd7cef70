"""Cost-curve file I/O as plain functions on the JSON document (schema ``dcut.cost-curve/2``; v1
still loads): :func:`load` reads a file strictly, :func:`fields` checks the document's top level and
gives :class:`~dcut_sched.cost_curve.CostCurve`'s fields, :func:`save` writes a document atomically.
Faults raise :class:`CostCurveError` naming the file and field."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping

from ..util.atomic import atomic_write_text
from ..util.inputs import InputFileError, parse_json_strict
from ..util.validation import field_message
from .schema import SCHEMA, SCHEMA_V1, SCHEMAS, CostCurveError, _json_scalar, _now_iso

__all__ = ["fields", "load", "save"]

_TOP_LEVEL = {"schema", "hardware", "model", "block_size", "context_len", "graph_mode", "verify", "draft", "ar",
              "draft_first", "step_overhead", "created", "profile_seconds", "source"}


def load(path: str | os.PathLike) -> Any:
    """The parsed JSON document of a cost-curve file (not yet checked: :func:`fields`).

    Raises:
        CostCurveError: unreadable file, not UTF-8 JSON (a binary or Parquet file), or JSON nested
            too deeply; the message names the file.
    """
    path_str = str(path)
    try:
        if Path(path).exists() and not Path(path).is_file():  # a FIFO blocks, /dev/zero never ends
            raise CostCurveError(f"cost curve {path_str}: is not a regular file (a folder, pipe or device); "
                                 "pass the file dcut-profile --out wrote")
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise CostCurveError(f"cost curve {path_str}: cannot read: {exc.strerror or exc}") from None
    if raw.startswith(b"PAR1"):
        raise CostCurveError(f"cost curve {path_str}: is a Parquet file, not a cost-curve JSON "
                             f"(pass the file dcut-profile --out wrote)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CostCurveError(f"cost curve {path_str}: not a UTF-8 JSON text file (byte {exc.start}: binary "
                             f"data?); pass the file dcut-profile --out wrote") from None
    try:  # strict: a key given twice in one row (JSON keeps the last silently), NaN, huge numbers
        return parse_json_strict(text, f"cost curve {path_str}", allow_nonfinite=True)
    except InputFileError as exc:
        raise CostCurveError(str(exc)) from None
    except ValueError as exc:  # e.g. an integer literal longer than Python's int conversion limit
        raise CostCurveError(f"cost curve {path_str}: not a valid cost-curve JSON ({exc})") from None


def fields(doc: Any, path: str | None = None) -> dict[str, Any]:
    """The :class:`~dcut_sched.cost_curve.CostCurve` keyword arguments of a document (schema v2, or
    v1 without ``ar`` rows); the rows themselves are validated when the curve is built.

    Raises:
        CostCurveError: not an object, wrong schema version, missing or unknown top-level fields.
    """
    where = f"cost curve {path}" if path else "cost curve"
    if not isinstance(doc, Mapping):
        raise CostCurveError(f"{where}: top level must be a JSON object, got {type(doc).__name__}")
    schema = doc.get("schema")
    if schema not in SCHEMAS:
        raise CostCurveError(
            f"{where}: field 'schema': expected {SCHEMA!r} (or {SCHEMA_V1!r}), got {schema!r} "
            f"(re-create the file with this version of dcut-profile)"
        )
    required = ("hardware", "model", "block_size", "context_len", "verify")
    if schema == SCHEMA:
        required += ("ar",)
    for key in required:
        if key not in doc:
            raise CostCurveError(field_message(where, key, "missing", quote=True))
    if schema == SCHEMA_V1:
        for key in ("ar", "draft_first", "step_overhead"):
            if key in doc:
                raise CostCurveError(field_message(where, key, f"not part of {SCHEMA_V1}", f"set 'schema' to {SCHEMA!r}",
                                                  quote=True))
    unknown = sorted(str(k) for k in doc if k not in _TOP_LEVEL)
    if unknown:
        raise CostCurveError(f"{where}: unknown top-level fields {unknown} (allowed: {', '.join(sorted(_TOP_LEVEL))})")
    return {
        "hardware": doc["hardware"],
        "model": doc["model"],
        "block_size": doc["block_size"],
        "context_len": doc["context_len"],
        "verify": doc["verify"],
        "draft": doc.get("draft"),
        "ar": doc.get("ar"),
        "draft_first": doc.get("draft_first"),
        "step_overhead": doc.get("step_overhead"),
        "graph_mode": doc.get("graph_mode"),
        "created": doc.get("created") or _now_iso(),
        "profile_seconds": doc.get("profile_seconds"),
        "source": doc.get("source") or "",
        "path": path,
        "loaded_schema": schema,
    }


def save(doc: Mapping[str, Any], path: str | os.PathLike, where: str = "cost curve") -> None:
    """Write a curve's document as JSON, atomically (temp file in the same folder, then rename).

    Raises:
        CostCurveError: a ``hardware`` / ``model`` value JSON cannot hold (``where`` names the curve).
    """
    try:
        text = json.dumps(doc, indent=1, allow_nan=False, default=_json_scalar)
    except RecursionError:
        raise CostCurveError(f"{where}: field 'hardware/model': nested too deeply to write") from None
    except (TypeError, ValueError) as exc:
        raise CostCurveError(f"{where}: field 'hardware/model': not JSON-serialisable: {exc} "
                             f"(use str, int, float, bool, None, lists and dicts)") from None
    atomic_write_text(path, text + "\n")
