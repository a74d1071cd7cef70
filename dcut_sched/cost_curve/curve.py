"""The :class:`CostCurve` object: its fields, with validation (:mod:`.schema`), lookups
(:mod:`.lookup`), the hardware check (:mod:`.hardware`) and file I/O (:mod:`.io`) each in its own
module."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .hardware import CurveHardware
from .io import CurveIO
from .lookup import CurveLookup
from .schema import ArRow, CurveValidation, DraftFirstRow, DraftRow, StepOverheadRow, VerifyRow, _now_iso

__all__ = ["CostCurve"]


@dataclass
class CostCurve(CurveValidation, CurveLookup, CurveHardware, CurveIO):
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
