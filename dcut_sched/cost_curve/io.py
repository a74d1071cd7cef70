"""Cost-curve file I/O: the JSON document (schema ``dcut.cost-curve/2``, v1 still loads), atomic
writes, strict reads naming the file and field."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from ..util.atomic import atomic_write_text
from ..util.inputs import InputFileError, parse_json_strict
from .schema import SCHEMA, SCHEMA_V1, SCHEMAS, STEP_KINDS, CostCurveError, _json_scalar, _now_iso

if TYPE_CHECKING:
    from .curve import CostCurve

__all__ = ["CurveIO"]


class CurveIO:
    """The (de)serialisation half of :class:`~dcut_sched.cost_curve.CostCurve`."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON document of the curve (schema ``dcut.cost-curve/2``)."""

        def row_dict(row: Any) -> dict[str, Any]:
            return {k: v for k, v in row.__dict__.items() if v is not None}

        return {
            "schema": SCHEMA,
            "hardware": dict(self.hardware),
            "model": dict(self.model),
            "block_size": self.block_size,
            "context_len": self.context_len,
            "graph_mode": self.graph_mode,
            "verify": [row_dict(r) for r in sorted(self.verify, key=lambda r: (r.batch_size, r.num_tokens))],
            "ar": [row_dict(r) for r in sorted(self.ar, key=lambda r: r.batch_size)],
            "draft": [row_dict(r) for r in sorted(self.draft, key=lambda r: r.batch_size)],
            **({"draft_first": [row_dict(r) for r in sorted(self.draft_first, key=lambda r: (r.batch_size, r.num_tokens))]}
               if self.draft_first else {}),
            **({"step_overhead": [row_dict(r) for r in sorted(self.step_overhead,
                                                              key=lambda r: (STEP_KINDS.index(r.kind), r.batch_size))]}
               if self.step_overhead else {}),
            "created": self.created,
            "profile_seconds": self.profile_seconds,
            "source": self.source,
        }

    def save(self, path: str | os.PathLike) -> None:
        """Write the curve as JSON (schema ``dcut.cost-curve/2``), atomically (temp file in the same
        folder, then rename). A curve without ``ar`` rows is written with ``"ar": []`` and loads back
        with the plain step assumed, as before.

        Raises:
            CostCurveError: a ``hardware`` / ``model`` value JSON cannot hold (names the field).
        """
        doc = self.to_dict()
        try:
            text = json.dumps(doc, indent=1, allow_nan=False, default=_json_scalar)
        except RecursionError:
            raise self._fail("hardware/model", "nested too deeply to write") from None
        except (TypeError, ValueError) as exc:
            raise self._fail("hardware/model", f"not JSON-serialisable: {exc}",
                             "use str, int, float, bool, None, lists and dicts") from None
        atomic_write_text(path, text + "\n")

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any], path: str | None = None) -> "CostCurve":
        """Build and validate a curve from its JSON document (schema v2, or v1 with the plain step
        assumed and one :class:`AssumedArWarning`).

        Raises:
            CostCurveError: wrong schema version, missing or malformed fields (naming file, row, field).
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
                raise CostCurveError(f"{where}: field '{key}': missing")
        if schema == SCHEMA_V1:
            for key in ("ar", "draft_first", "step_overhead"):
                if key in doc:
                    raise CostCurveError(f"{where}: field '{key}': not part of {SCHEMA_V1}; set 'schema' to {SCHEMA!r}")
        known = {"schema", "hardware", "model", "block_size", "context_len", "graph_mode", "verify", "draft", "ar",
                 "draft_first", "step_overhead", "created", "profile_seconds", "source"}
        unknown = sorted(str(k) for k in doc if k not in known)
        if unknown:
            raise CostCurveError(f"{where}: unknown top-level fields {unknown} (allowed: {', '.join(sorted(known))})")
        curve = cls(
            hardware=doc["hardware"],
            model=doc["model"],
            block_size=doc["block_size"],
            context_len=doc["context_len"],
            verify=doc["verify"],
            draft=doc.get("draft"),
            ar=doc.get("ar"),
            draft_first=doc.get("draft_first"),
            step_overhead=doc.get("step_overhead"),
            graph_mode=doc.get("graph_mode"),
            created=doc.get("created") or _now_iso(),
            profile_seconds=doc.get("profile_seconds"),
            source=doc.get("source") or "",
            path=path,
            loaded_schema=schema,
        )
        if schema == SCHEMA_V1:
            curve._warn_ar_assumed(stacklevel=4)
        return curve

    @classmethod
    def load(cls, path: str | os.PathLike, *, check_hardware: bool = True) -> "CostCurve":
        """Read and validate a cost-curve JSON file.

        Args:
            path: the file.
            check_hardware: warn if it was measured on another GPU than the current CUDA device.

        Raises:
            CostCurveError: unreadable file, not UTF-8 JSON (a binary or Parquet file), JSON nested too
                deeply, wrong schema, or an invalid field; the message names the file, row and field.
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
            doc = parse_json_strict(text, f"cost curve {path_str}", allow_nonfinite=True)
        except InputFileError as exc:
            raise CostCurveError(str(exc)) from None
        except ValueError as exc:  # e.g. an integer literal longer than Python's int conversion limit
            raise CostCurveError(f"cost curve {path_str}: not a valid cost-curve JSON ({exc})") from None
        curve = cls.from_dict(doc, path=path_str)
        if check_hardware:
            curve.check_hardware()
        return curve
