"""Verification and draft cost curves: the file format of DESIGN.md §4 and lookups into it.

A cost curve holds measured (or published, fitted, analytic) times of

- ``C_verify(batch_size, num_tokens)`` ms: one target forward verifying ``num_tokens`` slots for
  ``batch_size`` requests at ``context_len``, replayed from a CUDA graph where the backend has them;
- ``C_draft(batch_size)`` ms: one draft step for the batch.

Lookups
-------
- At a measured batch size, ``verify_ms`` interpolates in num_tokens with a shape-preserving
  piecewise-cubic (``scipy.interpolate.PchipInterpolator``) through the per-cell medians after an
  isotonic (non-decreasing) regression (``scipy.optimize.isotonic_regression``). Measured
  medians that are already non-decreasing are passed through exactly; noisy dips are flattened so
  that verifying more tokens is never predicted to be cheaper.
- Between measured batch sizes it interpolates linearly in batch size at a fixed number of tokens per
  request (``num_tokens / batch_size``, i.e. at a fixed ratio rho), which keeps the valid range
  ``[1, B]`` tokens per request at every batch size (D-Cut's ``C_graph(bs, rho)``).
- Anything outside the measured range raises :class:`CostCurveRangeError` naming the range: a cost
  curve is never extrapolated silently.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from .atomic import atomic_write_text

__all__ = [
    "BACKENDS",
    "PROVENANCES",
    "SCHEMA",
    "CostCurve",
    "CostCurveError",
    "CostCurveRangeError",
    "DraftRow",
    "VerifyRow",
]

SCHEMA = "dcut.cost-curve/1"
BACKENDS = ("cuda-graph", "cuda-eager", "cpu-eager", "analytic")
PROVENANCES = ("measured", "published", "fitted", "analytic")


class CostCurveError(ValueError):
    """A cost-curve file or object is invalid. The message names the file and the field."""


class CostCurveRangeError(ValueError):
    """A lookup fell outside the measured range of a cost curve (no silent extrapolation)."""


@dataclass(frozen=True)
class VerifyRow:
    """One verification cell: ``batch_size`` requests, ``num_tokens`` slots, times in ms."""

    batch_size: int
    num_tokens: int
    median_ms: float
    p20_ms: float | None = None
    p80_ms: float | None = None
    repeats: int | None = None
    provenance: str = "measured"


@dataclass(frozen=True)
class DraftRow:
    """One draft-step cell: ``batch_size`` requests drafting a block, times in ms."""

    batch_size: int
    median_ms: float
    p20_ms: float | None = None
    p80_ms: float | None = None
    repeats: int | None = None
    provenance: str = "measured"


def _now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()


@dataclass
class CostCurve:
    """A verification/draft cost curve (schema ``dcut.cost-curve/1``, DESIGN.md §4).

    Build one in code (the profiler does), or :meth:`load` it from JSON. Rows are validated when the
    object is created; lookups are cached per batch size.

    Attributes:
        hardware: ``{"device_name", "backend", "torch_version", "cuda_version", "driver_version", ...}``;
            ``backend`` is one of :data:`BACKENDS`.
        model: ``{"name": str, "config": {...}}``: the shapes that fix the cost.
        block_size: B, slots per request the curve was measured for.
        context_len: tokens of KV cache each request had during the measurement.
        verify: verification cells; at least one.
        draft: draft-step cells (may be empty; then :meth:`draft_ms` raises).
        graph_mode: ``"full"``, ``"piecewise"`` or ``None`` where it does not apply.
        created: ISO-8601 time stamp.
        profile_seconds: wall time the profile took to measure.
        source: free text: how the curve was made, citations for published rows.
        path: file it was loaded from (not serialised; used in error messages).
    """

    hardware: dict[str, Any]
    model: dict[str, Any]
    block_size: int
    context_len: int
    verify: list[VerifyRow]
    draft: list[DraftRow] = field(default_factory=list)
    graph_mode: str | None = None
    created: str = field(default_factory=_now_iso)
    profile_seconds: float | None = None
    source: str = ""
    path: str | None = None

    def __post_init__(self) -> None:
        self.verify = [r if isinstance(r, VerifyRow) else VerifyRow(**r) for r in self.verify]
        self.draft = [r if isinstance(r, DraftRow) else DraftRow(**r) for r in self.draft]
        self._validate()
        self._build_tables()

    # ------------------------------------------------------------------ validation
    def _where(self) -> str:
        return f"cost curve {self.path}" if self.path else "cost curve"

    def _fail(self, field_name: str, problem: str, fix: str = "") -> CostCurveError:
        msg = f"{self._where()}: field '{field_name}': {problem}"
        if fix:
            msg += f" ({fix})"
        return CostCurveError(msg)

    def _validate(self) -> None:
        if not isinstance(self.hardware, Mapping) or "backend" not in self.hardware:
            raise self._fail("hardware.backend", "missing", f"one of {', '.join(BACKENDS)}")
        if self.hardware["backend"] not in BACKENDS:
            raise self._fail(
                "hardware.backend", f"unknown backend {self.hardware['backend']!r}", f"use one of {BACKENDS}"
            )
        if not isinstance(self.model, Mapping) or not self.model.get("name"):
            raise self._fail("model.name", "missing", "name the model whose forward was timed")
        if not isinstance(self.block_size, int) or self.block_size < 1:
            raise self._fail("block_size", f"must be a positive int, got {self.block_size!r}")
        if not isinstance(self.context_len, int) or self.context_len < 0:
            raise self._fail("context_len", f"must be a non-negative int, got {self.context_len!r}")
        if not self.verify:
            raise self._fail("verify", "no rows", "a curve needs at least one verification cell")
        seen: set[tuple[int, int]] = set()
        for n, row in enumerate(self.verify):
            where = f"verify[{n}]"
            self._check_row_common(row, where)
            if not isinstance(row.num_tokens, (int, np.integer)) or row.num_tokens < 1:
                raise self._fail(f"{where}.num_tokens", f"must be a positive int, got {row.num_tokens!r}")
            if row.num_tokens < row.batch_size:
                raise self._fail(
                    f"{where}.num_tokens",
                    f"{row.num_tokens} < batch_size {row.batch_size}",
                    "every request verifies at least its anchor slot",
                )
            key = (int(row.batch_size), int(row.num_tokens))
            if key in seen:
                raise self._fail(where, f"duplicate cell batch_size={key[0]}, num_tokens={key[1]}")
            seen.add(key)
        seen_bs: set[int] = set()
        for n, row in enumerate(self.draft):
            where = f"draft[{n}]"
            self._check_row_common(row, where)
            if row.batch_size in seen_bs:
                raise self._fail(where, f"duplicate draft cell batch_size={row.batch_size}")
            seen_bs.add(int(row.batch_size))

    def _check_row_common(self, row: VerifyRow | DraftRow, where: str) -> None:
        if not isinstance(row.batch_size, (int, np.integer)) or row.batch_size < 1:
            raise self._fail(f"{where}.batch_size", f"must be a positive int, got {row.batch_size!r}")
        for name in ("median_ms", "p20_ms", "p80_ms"):
            value = getattr(row, name)
            if value is None and name != "median_ms":
                continue
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise self._fail(f"{where}.{name}", f"must be a positive finite number of ms, got {value!r}")
        if row.provenance not in PROVENANCES:
            raise self._fail(f"{where}.provenance", f"unknown {row.provenance!r}", f"use one of {PROVENANCES}")

    # ------------------------------------------------------------------ lookup tables
    def _build_tables(self) -> None:
        # scipy loads with the first curve, not with the package (a controller import stays light)
        from scipy.interpolate import PchipInterpolator
        from scipy.optimize import isotonic_regression

        by_bs: dict[int, list[VerifyRow]] = {}
        for row in self.verify:
            by_bs.setdefault(int(row.batch_size), []).append(row)
        self._verify_interp: dict[int, tuple[np.ndarray, np.ndarray, Any]] = {}
        for bs, rows in sorted(by_bs.items()):
            rows.sort(key=lambda r: r.num_tokens)
            tokens = np.array([r.num_tokens for r in rows], dtype=np.float64)
            ms = np.array([r.median_ms for r in rows], dtype=np.float64)
            ms = isotonic_regression(ms, increasing=True).x if len(ms) > 1 else ms
            interp = PchipInterpolator(tokens, ms, extrapolate=False) if len(ms) > 1 else None
            self._verify_interp[bs] = (tokens, ms, interp)
        self._batch_sizes = np.array(sorted(by_bs), dtype=np.int64)
        draft_rows = sorted(self.draft, key=lambda r: r.batch_size)
        self._draft_bs = np.array([r.batch_size for r in draft_rows], dtype=np.float64)
        self._draft_ms = np.array([r.median_ms for r in draft_rows], dtype=np.float64)

    @property
    def batch_sizes(self) -> list[int]:
        """Batch sizes with verification cells, ascending."""
        return [int(b) for b in self._batch_sizes]

    def token_counts(self, batch_size: int) -> list[int]:
        """Measured num_tokens at ``batch_size`` (ascending); ``[]`` if that batch size is unmeasured."""
        entry = self._verify_interp.get(int(batch_size))
        return [] if entry is None else [int(t) for t in entry[0]]

    def token_range(self, batch_size: int) -> tuple[int, int]:
        """The ``(min, max)`` num_tokens :meth:`verify_ms` accepts at ``batch_size``.

        Raises:
            CostCurveRangeError: ``batch_size`` outside the measured batch sizes.
        """
        lo_bs, hi_bs, _ = self._bracket(batch_size)
        if lo_bs == hi_bs:
            tokens = self._verify_interp[lo_bs][0]
            return int(tokens[0]), int(tokens[-1])
        t_lo, t_hi = self._verify_interp[lo_bs][0], self._verify_interp[hi_bs][0]
        per_lo = max(t_lo[0] / lo_bs, t_hi[0] / hi_bs)
        per_hi = min(t_lo[-1] / lo_bs, t_hi[-1] / hi_bs)
        return int(math.ceil(per_lo * batch_size - 1e-9)), int(math.floor(per_hi * batch_size + 1e-9))

    def _bracket(self, batch_size: int) -> tuple[int, int, float]:
        sizes = self._batch_sizes
        bs = int(batch_size) if np.isfinite(batch_size) else -1
        if bs != batch_size or bs < sizes[0] or bs > sizes[-1]:
            raise CostCurveRangeError(
                f"{self._where()}: batch_size={batch_size} is outside the measured batch sizes "
                f"{sizes[0]}..{sizes[-1]} ({', '.join(map(str, sizes))}); profile it or choose "
                f"a batch size in range"
            )
        if bs in self._verify_interp:
            return bs, bs, 0.0
        j = int(np.searchsorted(sizes, bs))
        lo, hi = int(sizes[j - 1]), int(sizes[j])
        return lo, hi, (bs - lo) / (hi - lo)

    def _verify_at(self, bs: int, num_tokens: np.ndarray) -> np.ndarray:
        tokens, ms, interp = self._verify_interp[bs]
        if interp is None:
            return np.full(num_tokens.shape, ms[0])
        return interp(num_tokens)

    def verify_ms(self, batch_size: int, num_tokens: Any) -> Any:
        """``C_verify(batch_size, num_tokens)`` in ms.

        Args:
            batch_size: requests in the batch (an int within the measured batch sizes).
            num_tokens: slots verified, an int or an array of ints, within :meth:`token_range`.

        Returns:
            A float for a scalar ``num_tokens``, else a float64 array of the same shape.

        Raises:
            CostCurveRangeError: ``batch_size`` or any ``num_tokens`` outside the measured range.
        """
        scalar = np.isscalar(num_tokens)
        tokens = np.asarray(num_tokens, dtype=np.float64)
        if not np.isfinite(tokens).all():
            raise CostCurveRangeError(f"{self._where()}: num_tokens must be finite; got {num_tokens!r}")
        lo_tok, hi_tok = self.token_range(batch_size)
        if tokens.size and (tokens.min() < lo_tok or tokens.max() > hi_tok):
            bad = tokens[(tokens < lo_tok) | (tokens > hi_tok)].ravel()[0]
            raise CostCurveRangeError(
                f"{self._where()}: num_tokens={bad:g} at batch_size={batch_size} is outside the "
                f"measured range {lo_tok}..{hi_tok}; profile more token counts or pick a budget in range"
            )
        lo, hi, w = self._bracket(batch_size)
        if lo == hi:
            out = self._verify_at(lo, tokens)
        else:
            per_request = tokens / batch_size
            out = (1 - w) * self._verify_at(lo, per_request * lo) + w * self._verify_at(hi, per_request * hi)
        return float(out) if scalar else out

    def has_draft(self) -> bool:
        """Whether the curve has draft-step cells."""
        return bool(len(self._draft_bs))

    def draft_ms(self, batch_size: int) -> float:
        """``C_draft(batch_size)`` in ms, linear between measured batch sizes.

        Raises:
            CostCurveRangeError: no draft rows, or ``batch_size`` outside the measured ones.
        """
        if not self.has_draft():
            raise CostCurveRangeError(
                f"{self._where()}: has no draft rows; profile the draft step (dcut-profile --draft-config) "
                f"or add 'draft' rows"
            )
        lo, hi = self._draft_bs[0], self._draft_bs[-1]
        if not (lo <= batch_size <= hi):
            raise CostCurveRangeError(
                f"{self._where()}: draft batch_size={batch_size} is outside the measured range "
                f"{lo:g}..{hi:g}"
            )
        return float(np.interp(batch_size, self._draft_bs, self._draft_ms))

    def ar_ms(self, batch_size: int) -> float:
        """One plain autoregressive step: ``C_verify(batch_size, batch_size)``, no draft."""
        return self.verify_ms(batch_size, batch_size)

    # ------------------------------------------------------------------ checks against the user
    def require_block_size(self, block_size: int) -> None:
        """Raise :class:`CostCurveError` unless the curve was measured for ``block_size``."""
        if int(block_size) != self.block_size:
            raise self._fail(
                "block_size",
                f"curve was measured for block size {self.block_size}, not {block_size}",
                "profile the target with the block size you serve (dcut-profile --block-size)",
            )

    def check_hardware(self, device_name: str | None = None) -> bool:
        """Warn (``UserWarning``) if the curve was measured on another GPU than ``device_name``.

        With ``device_name=None`` the current CUDA device is used when there is one; curves from the
        ``analytic``/``published``/``cpu-eager`` backends are not compared. Returns True on a match
        or when nothing was compared.
        """
        if self.hardware.get("backend") not in ("cuda-graph", "cuda-eager"):
            return True
        if device_name is None:
            import torch

            if not torch.cuda.is_available():
                return True
            device_name = torch.cuda.get_device_name()
        measured = str(self.hardware.get("device_name", ""))
        if measured and measured != device_name:
            warnings.warn(
                f"{self._where()} was measured on {measured!r} but this device is {device_name!r}; "
                f"its times may not describe this GPU (re-profile with dcut-profile --gpu)",
                UserWarning,
                stacklevel=2,
            )
            return False
        return True

    # ------------------------------------------------------------------ (de)serialisation
    def to_dict(self) -> dict[str, Any]:
        """The JSON document of the curve (schema ``dcut.cost-curve/1``)."""

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
            "draft": [row_dict(r) for r in sorted(self.draft, key=lambda r: r.batch_size)],
            "created": self.created,
            "profile_seconds": self.profile_seconds,
            "source": self.source,
        }

    def save(self, path: str | os.PathLike) -> None:
        """Write the curve as JSON, atomically (temp file in the same folder, then rename)."""
        atomic_write_text(path, json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any], path: str | None = None) -> "CostCurve":
        """Build and validate a curve from its JSON document.

        Raises:
            CostCurveError: wrong schema version, missing or malformed fields (naming file and field).
        """
        where = f"cost curve {path}" if path else "cost curve"
        if not isinstance(doc, Mapping):
            raise CostCurveError(f"{where}: top level must be a JSON object")
        schema = doc.get("schema")
        if schema != SCHEMA:
            raise CostCurveError(
                f"{where}: field 'schema': expected {SCHEMA!r}, got {schema!r} "
                f"(re-create the file with this version of dcut-profile)"
            )
        for key in ("hardware", "model", "block_size", "context_len", "verify"):
            if key not in doc:
                raise CostCurveError(f"{where}: field '{key}': missing")

        def rows(key: str, cls_row: type, required: Sequence[str]) -> list[Any]:
            raw = doc.get(key) or []
            if not isinstance(raw, list):
                raise CostCurveError(f"{where}: field '{key}': must be a list of rows")
            known = set(cls_row.__dataclass_fields__)
            out = []
            for n, item in enumerate(raw):
                if not isinstance(item, Mapping):
                    raise CostCurveError(f"{where}: field '{key}[{n}]': must be an object")
                for req in required:
                    if req not in item:
                        raise CostCurveError(f"{where}: field '{key}[{n}].{req}': missing")
                unknown = set(item) - known
                if unknown:
                    raise CostCurveError(f"{where}: field '{key}[{n}]': unknown keys {sorted(unknown)}")
                out.append(cls_row(**item))
            return out

        verify = rows("verify", VerifyRow, ("batch_size", "num_tokens", "median_ms"))
        draft = rows("draft", DraftRow, ("batch_size", "median_ms"))
        return cls(
            hardware=dict(doc["hardware"]),
            model=dict(doc["model"]),
            block_size=doc["block_size"],
            context_len=doc["context_len"],
            verify=verify,
            draft=draft,
            graph_mode=doc.get("graph_mode"),
            created=doc.get("created") or _now_iso(),
            profile_seconds=doc.get("profile_seconds"),
            source=doc.get("source", ""),
            path=path,
        )

    @classmethod
    def load(cls, path: str | os.PathLike, *, check_hardware: bool = True) -> "CostCurve":
        """Read and validate a cost-curve JSON file.

        Args:
            path: the file.
            check_hardware: warn if it was measured on another GPU than the current CUDA device.

        Raises:
            CostCurveError: unreadable file, invalid JSON, wrong schema, or an invalid field; the
                message names the file and field.
        """
        path_str = str(path)
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise CostCurveError(f"cost curve {path_str}: cannot read: {exc.strerror or exc}") from None
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise CostCurveError(
                f"cost curve {path_str}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
            ) from None
        try:
            curve = cls.from_dict(doc, path=path_str)
        except TypeError as exc:  # wrong value types reaching the dataclasses
            raise CostCurveError(f"cost curve {path_str}: malformed field: {exc}") from None
        if check_hardware:
            curve.check_hardware()
        return curve

    def rows_frame(self):
        """The verification cells as a pandas DataFrame (one row per cell)."""
        import pandas as pd

        return pd.DataFrame([r.__dict__ for r in self.verify]).sort_values(["batch_size", "num_tokens"])

    def __repr__(self) -> str:
        return (
            f"CostCurve(model={self.model.get('name')!r}, device={self.hardware.get('device_name')!r}, "
            f"backend={self.hardware.get('backend')!r}, B={self.block_size}, batch_sizes={self.batch_sizes}, "
            f"cells={len(self.verify)})"
        )

