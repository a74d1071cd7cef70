"""The :class:`CostCurve` object: its fields and JSON document, with validation (:mod:`.schema`),
lookups (:mod:`.lookup`), the hardware check (:mod:`.hardware`) and file I/O (:mod:`.io`) each in
its own module."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from . import io as curve_io
from .hardware import CurveHardware
from .lookup import CurveLookup
from .schema import (
    SCHEMA,
    SCHEMA_V1,
    STEP_KINDS,
    ArRow,
    CurveValidation,
    DraftFirstRow,
    DraftRow,
    StepOverheadRow,
    VerifyRow,
    _now_iso,
)

__all__ = ["CostCurve"]


@dataclass
class CostCurve(CurveValidation, CurveLookup, CurveHardware):
    """A verification / plain-decode / draft cost curve (schema ``dcut.cost-curve/2``, docs/design.md §4).

    Build one in code (the profiler does), or :meth:`load` it from JSON. Rows are validated (and
    numpy scalars turned into Python numbers) when the object is created; lookups are cached per
    batch size.

    Attributes:
        hardware: ``{"device_name", "backend", "torch_version", "cuda_version", "driver_version", ...}``;
            ``backend`` is one of :data:`BACKENDS`.
        model: ``{"name": str, "config": {...}}``: the shapes that fix the cost.
        block_size: B, slots per request the curve was measured for.
        context_len: tokens of KV cache each request had during the measurement.
        verify: verification cells; at least one.
        draft: draft-step cells (may be empty; then :meth:`draft_ms` raises).
        ar: plain-decode cells (may be empty; then :meth:`ar_ms` assumes ``C_verify(bs, bs)`` and
            warns once).
        draft_first: the drafter's first forward over a step's verified tokens (may be empty: then
            :meth:`draft_first_ms` is 0 and a drafted step's draft is ``C_draft(bs)`` at any budget).
        step_overhead: per-step engine time beside the forwards, by step kind (may be empty: 0).
        graph_mode: ``"full"``, ``"piecewise"`` or ``None`` where it does not apply.
        created: ISO-8601 time stamp.
        profile_seconds: wall time the profile took to measure.
        source: free text: how the curve was made, citations for published rows.
        path: file it was loaded from (not serialised; used in error messages).
        loaded_schema: schema of the file it was loaded from (not serialised; ``None`` if built in code).

    Raises:
        CostCurveError: on creation, any invalid field (naming file, row and field).
    """

    hardware: dict[str, Any]
    model: dict[str, Any]
    block_size: int
    context_len: int
    verify: list[VerifyRow]
    draft: list[DraftRow] = field(default_factory=list)
    ar: list[ArRow] = field(default_factory=list)
    draft_first: list[DraftFirstRow] = field(default_factory=list)
    step_overhead: list[StepOverheadRow] = field(default_factory=list)
    graph_mode: str | None = None
    created: str = field(default_factory=_now_iso)
    profile_seconds: float | None = None
    source: str = ""
    path: str | None = None
    loaded_schema: str | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._validate()
        self._build_tables()
        self._ar_warned = False

    def __repr__(self) -> str:
        return (
            f"CostCurve(model={self.model.get('name')!r}, device={self.hardware.get('device_name')!r}, "
            f"backend={self.hardware.get('backend')!r}, B={self.block_size}, batch_sizes={self.batch_sizes}, "
            f"cells={len(self.verify)}, ar={self.ar_provenance!r})"
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON document of the curve (schema ``dcut.cost-curve/2``), rows sorted by their cells."""

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
        """Write the curve as JSON (:func:`.io.save`). A curve without ``ar`` rows is written with
        ``"ar": []`` and loads back with the plain step assumed."""
        curve_io.save(self.to_dict(), path, self._where())

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any], path: str | None = None) -> "CostCurve":
        """Build and validate a curve from its JSON document (:func:`.io.fields`); a v1 document
        emits one :class:`AssumedArWarning`.

        Raises:
            CostCurveError: wrong schema version, missing or malformed fields (naming file, row, field).
        """
        curve = cls(**curve_io.fields(doc, path))
        if curve.loaded_schema == SCHEMA_V1:
            curve._warn_ar_assumed(stacklevel=4)
        return curve

    @classmethod
    def load(cls, path: str | os.PathLike, *, check_hardware: bool = True) -> "CostCurve":
        """Read and validate a cost-curve JSON file (:func:`.io.load`, then :meth:`from_dict`);
        ``check_hardware`` warns if it was measured on another device (:meth:`check_hardware`).

        Raises:
            CostCurveError: an unreadable or invalid file; the message names the file, row and field.
        """
        curve = cls.from_dict(curve_io.load(path), path=str(path))
        if check_hardware:
            curve.check_hardware()
        return curve
