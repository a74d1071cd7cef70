"""Cost-curve schema: versions, row types, errors, and the validation every curve passes.

Schema versions
---------------
``dcut.cost-curve/2`` (written by :meth:`CostCurve.save`) has ``ar`` rows. ``dcut.cost-curve/1``
files (no ``ar`` rows) still load: the plain step then falls back to ``C_verify(bs, bs)``, one
:class:`AssumedArWarning` says so, and :attr:`CostCurve.ar_provenance` reads
``"assumed: C_verify(bs, bs) (v1 curve)"`` so that every table can print it.

Validation
----------
Every field is checked when a curve is built or loaded, accepting exact types or lossless casts only
(a JSON ``true`` is not a 1 ms cell; ``16.0`` is batch size 16, ``16.5`` is an error; NaN, infinities
and non-positive times are errors): the fields beside the rows are a strict pydantic
:class:`CurveHeader`, each row a dataclass whose field types are strict pydantic types; the relations
between fields and rows (quantile order, cells within ``bs..bs*B``, no duplicate cell) are checked by
:class:`CurveValidation`. Faults raise :class:`CostCurveError` naming the file, the row and the field
(``verify[3].median_ms``), through :func:`dcut_sched.util.validation.field_message`.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import math
import numbers
from dataclasses import dataclass
from typing import Annotated, Any, Mapping, Optional

import numpy as np
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    TypeAdapter,
    ValidationError,
    with_config,
)

from ..util.inputs import shown
from ..util.validation import field_message, invalid, validation_message

__all__ = [
    "AR_ASSUMED_NO_ROWS", "AR_ASSUMED_V1", "BACKENDS", "GRAPH_MODES", "MAX_MS", "PROVENANCES", "SCHEMA", "SCHEMAS", "SCHEMA_V1",
    "STEP_KINDS", "ArRow", "AssumedArWarning", "CostCurveError", "CostCurveRangeError", "CurveHeader", "CurveValidation",
    "DraftFirstRow", "DraftRow", "StepOverheadRow", "VerifyRow",
]

SCHEMA = "dcut.cost-curve/2"
SCHEMA_V1 = "dcut.cost-curve/1"
SCHEMAS = (SCHEMA_V1, SCHEMA)
BACKENDS = ("cuda-graph", "cuda-eager", "cpu-eager", "analytic")
PROVENANCES = ("measured", "published", "fitted", "analytic")
GRAPH_MODES = ("full", "piecewise")
#: Step kinds of ``step_overhead`` rows: ``plain`` (an engine without speculation), ``drafted`` (a
#: step that verifies drafts and drafts the next block), ``undrafted`` (a step of a speculative
#: engine that verifies anchors only, e.g. ``fine`` skipping its draft).
STEP_KINDS = ("plain", "drafted", "undrafted")
#: The largest time a cost-curve row may give (ms, about 2.8 hours per step): far above any real step,
#: and low enough that a run's sums (up to 1e6 steps, --draft-scale up to 1e6) stay finite.
MAX_MS = 1e7
#: :attr:`CostCurve.ar_provenance` of a curve whose plain step is assumed, not measured.
AR_ASSUMED_V1 = "assumed: C_verify(bs, bs) (v1 curve)"
AR_ASSUMED_NO_ROWS = "assumed: C_verify(bs, bs) (no ar rows)"


class CostCurveError(ValueError):
    """A cost-curve file or object is invalid. The message names the file, the row and the field."""


class CostCurveRangeError(ValueError):
    """A lookup fell outside the measured range of a cost curve (no silent extrapolation)."""


class AssumedArWarning(UserWarning):
    """A curve has no plain-decode (``ar``) rows: ``C_ar(bs)`` is assumed to be ``C_verify(bs, bs)``."""


# Row types: key fields (``batch_size``, ``num_tokens``, ...), then the timing fields every kind
# shares, in this positional order: ``median_ms``; ``p20_ms``/``p80_ms`` quantiles; ``repeats``
# samples; ``provenance`` (one of :data:`PROVENANCES`). Times in ms. Each is a plain frozen dataclass
# (built positionally by the profilers) whose field types are strict pydantic types: a curve
# validates every row, a mapping or a row built in code, through :data:`_ROW_ADAPTERS`.

#: The largest integer field a cost curve holds (rows are indexed by int64 arrays).
_MAX_INT = int(np.iinfo(np.int64).max)


def _exact_int(value: Any) -> int | None:
    """``value`` as an int if that is lossless (ints, numpy ints, integral finite floats), else None.
    Booleans are not numbers here."""
    if isinstance(value, (bool, np.bool_)):
        return None
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        f = float(value)
        if math.isfinite(f) and f.is_integer():
            return int(f)
    return None


def _exact_float(value: Any) -> float | None:
    """``value`` as a finite float (ints, floats, numpy numbers; no booleans, no strings), else None."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        return None
    try:
        f = float(value)
    except (OverflowError, ValueError):  # ints too large for a float
        return None
    return f if math.isfinite(f) else None


def _count(minimum: int) -> Any:
    """An int >= ``minimum`` (lossless casts only, at most int64)."""
    def check(value: Any) -> int:
        got = _exact_int(value)
        if got is None or got < minimum:
            kind = "a positive" if minimum == 1 else "a non-negative"
            raise invalid(f"must be {kind} integer, got {value!r}")
        if got > _MAX_INT:  # 1e308 is an integral float; no batch size, token count or repeat count is
            raise invalid(f"{value!r} is larger than {_MAX_INT} (int64); give a real count")
        return got
    return BeforeValidator(check)


def _ms(value: Any) -> float:
    got = _exact_float(value)
    if got is None or got <= 0:
        raise invalid(f"must be a positive finite number of ms, got {shown(value)}")
    if got > MAX_MS:
        raise invalid(f"{got:g} ms is above the limit {MAX_MS:g} ms; a step time in ms, not an overflow")
    return got


def _signed_ms(value: Any) -> float:
    got = _exact_float(value)
    if got is None:
        raise invalid(f"must be a finite number of ms (a signed residual), got {shown(value)}")
    if abs(got) > MAX_MS:
        raise invalid(f"{got:g} ms is beyond the limit +-{MAX_MS:g} ms; a step time in ms, not an overflow")
    return got


def _one_of(choices: tuple[str, ...], what: str) -> Any:
    def check(value: Any) -> Any:
        if value is None:
            raise invalid(f"missing; use one of {', '.join(choices)}")
        if not isinstance(value, str) or value not in choices:
            raise invalid(f"unknown {what}{value!r}; use one of {', '.join(choices)}")
        return value
    return BeforeValidator(check)


def _optional(check: Any) -> Any:
    return BeforeValidator(lambda value: None if value is None else check(value))


_Count = Annotated[int, _count(1), Strict()]
_OptCount = Annotated[Optional[Annotated[int, Strict()]], _optional(_count(1).func)]
_Ms = Annotated[float, BeforeValidator(_ms), Strict()]
_OptMs = Annotated[Optional[Annotated[float, Strict()]], _optional(_ms)]
_SignedMs = Annotated[float, BeforeValidator(_signed_ms), Strict()]
_OptSignedMs = Annotated[Optional[Annotated[float, Strict()]], _optional(_signed_ms)]
_Provenance = Annotated[str, _one_of(PROVENANCES, ""), Strict()]
_ROW = ConfigDict(extra="forbid", revalidate_instances="always")


@with_config(_ROW)
@dataclass(frozen=True)
class _Timing:
    """A cell's median and spread in ms, and how it was made (the fields after the cell's keys)."""

    median_ms: _Ms
    p20_ms: _OptMs = None
    p80_ms: _OptMs = None
    repeats: _OptCount = None
    provenance: _Provenance = "measured"


@dataclass(frozen=True)
class _BatchKey:
    batch_size: _Count


@dataclass(frozen=True)
class _TokenKey:
    batch_size: _Count
    num_tokens: _Count


# A row is (timing, key): dataclass fields follow the reversed MRO, so the key's fields come first.
@dataclass(frozen=True)
class VerifyRow(_Timing, _TokenKey):
    """One verification cell: ``batch_size`` requests, ``num_tokens`` slots, times in ms."""


@dataclass(frozen=True)
class ArRow(_Timing, _BatchKey):
    """One plain-decode cell: ``batch_size`` requests, one token each, no draft; times in ms."""


@dataclass(frozen=True)
class DraftRow(_Timing, _BatchKey):
    """One draft-step cell: ``batch_size`` requests drafting a block, times in ms."""


@dataclass(frozen=True)
class DraftFirstRow(_Timing, _TokenKey):
    """One cell of the drafter's first forward of a step: ``batch_size`` requests, over the step's
    ``num_tokens`` verified tokens (attention over the context), times in ms."""


@with_config(_ROW)
@dataclass(frozen=True)
class StepOverheadRow:
    """What an engine spends per step of ``kind`` (one of :data:`STEP_KINDS`) beside the curve's
    forward passes, at ``batch_size`` requests (and, for ``drafted`` rows that give it, at
    ``num_tokens`` verified tokens: the K bucket); ms. A signed residual: ``median_ms`` (and
    ``p20_ms`` / ``p80_ms``) may be negative when the real step is faster than the curve's forward
    cells (docs/design.md §4); the whole step a curve prices must still be > 0."""

    kind: Annotated[str, _one_of(STEP_KINDS, "step kind "), Strict()]
    batch_size: _Count
    median_ms: _SignedMs
    p20_ms: _OptSignedMs = None
    p80_ms: _OptSignedMs = None
    repeats: _OptCount = None
    provenance: _Provenance = "measured"
    num_tokens: _OptCount = None


#: The strict validator of each row type (a mapping or a row built in code in, a checked row out).
_ROW_ADAPTERS = {cls: TypeAdapter(cls) for cls in (VerifyRow, ArRow, DraftRow, DraftFirstRow, StepOverheadRow)}


def _now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()


def _json_scalar(value: Any) -> Any:
    """``json.dumps`` hook: numpy integers, floats and booleans as Python numbers (lossless)."""
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    if isinstance(value, np.bool_):
        return bool(value)
    raise TypeError(f"{type(value).__name__} is not JSON-serialisable")


def _mapping(example: str) -> Any:
    """A JSON object (any mapping) as a dict."""
    def check(value: Any) -> Any:
        if not isinstance(value, Mapping):
            raise invalid(f"must be an object, got {type(value).__name__}" + (f"; e.g. {example}" if example else ""))
        return dict(value)
    return BeforeValidator(check)


def _plain_json(value: BaseModel) -> BaseModel:
    """What save() will write must be plain finite JSON."""
    try:
        json.dumps(value.model_dump(), allow_nan=False, default=_json_scalar)
    except RecursionError:
        raise invalid("nested too deeply") from None
    except (TypeError, ValueError) as exc:
        raise invalid(f"not plain finite JSON: {exc}; use str, int, float (finite), bool, None, lists and "
                      "objects") from None
    return value


def _string(problem: str, optional: bool = False, kind: bool = False) -> Any:
    """A string (or None when ``optional``), else :func:`invalid` with ``problem`` naming the value
    (its type name when ``kind``)."""
    def check(value: Any) -> Any:
        if isinstance(value, str) or (optional and value is None):
            return value
        raise invalid(problem.format(type(value).__name__ if kind else value))
    return check


class _Hardware(BaseModel):
    """The checked keys of ``hardware`` (others are kept as they are)."""

    model_config = ConfigDict(strict=True, extra="allow")
    backend: Annotated[str, _one_of(BACKENDS, "backend ")] = Field(None, validate_default=True)
    device_name: Annotated[Optional[str], BeforeValidator(_string("must be a string, got {!r}", optional=True))] = None


def _model_name(value: Any) -> Any:
    if not isinstance(value, str) or not value:
        raise invalid("missing or not a string; name the model whose forward was timed")
    return value


class _ModelInfo(BaseModel):
    """The checked key of ``model`` (others are kept as they are)."""

    model_config = ConfigDict(strict=True, extra="allow")
    name: Annotated[str, BeforeValidator(_model_name)] = Field(None, validate_default=True)


def _non_negative(value: Any) -> float:
    got = _exact_float(value)
    if got is None or got < 0:
        raise invalid(f"must be a non-negative number, got {value!r}")
    return got


def _graph_mode(value: Any) -> Any:
    if value is not None and value not in GRAPH_MODES:
        raise invalid(f"unknown {value!r}; use one of {GRAPH_MODES} or null")
    return value


_HARDWARE_EXAMPLE = f'{{"device_name": ..., "backend": one of {", ".join(BACKENDS)}}}'


class CurveHeader(BaseModel):
    """The fields of a cost curve beside its rows (docs/design.md §4), strictly typed."""

    model_config = ConfigDict(strict=True, extra="forbid")
    hardware: Annotated[_Hardware, _mapping(_HARDWARE_EXAMPLE), AfterValidator(_plain_json)]
    model: Annotated[_ModelInfo, _mapping(""), AfterValidator(_plain_json)]
    block_size: Annotated[int, _count(1), Strict()]
    context_len: Annotated[int, _count(0), Strict()]
    graph_mode: Annotated[Optional[str], BeforeValidator(_graph_mode)] = None
    profile_seconds: Annotated[Optional[Annotated[float, Strict()]], _optional(_non_negative)] = None
    created: Annotated[str, BeforeValidator(_string("must be an ISO-8601 string, got {!r}"))]
    source: Annotated[str, BeforeValidator(_string("must be a string, got {}", kind=True))]


class CurveValidation:
    """The validation half of :class:`~dcut_sched.cost_curve.CostCurve` (module docstring): the fields
    beside the rows are a :class:`CurveHeader`, each row its row type's strict pydantic model; the
    relations between fields and rows are checked here. Faults name the file, the row and the field."""

    def _where(self) -> str:
        return f"cost curve {self.path}" if self.path else "cost curve"

    def _fail(self, field_name: str, problem: str, fix: str = "") -> CostCurveError:
        return CostCurveError(field_message(self._where(), field_name, problem, fix, quote=True))

    def _row(self, cls_row: type, item: Any, where: str) -> Any:
        """Validate one row (a row or a mapping) and return it with plain Python values."""
        if not isinstance(item, (cls_row, Mapping)):
            required = [f.name for f in dataclasses.fields(cls_row) if f.default is dataclasses.MISSING]
            raise self._fail(where, f"must be an object with {', '.join(required)}, got {type(item).__name__}")
        try:
            row = _ROW_ADAPTERS[cls_row].validate_python(item)
        except ValidationError as exc:
            unknown = sorted(str(e["loc"][0]) for e in exc.errors() if e["type"] == "unexpected_keyword_argument")
            if unknown:
                raise self._fail(where, f"unknown keys {unknown}",
                                 f"allowed: {', '.join(cls_row.__dataclass_fields__)}") from None
            raise CostCurveError(validation_message(exc, self._where(), quote=True, prefix=(where,))) from None
        if cls_row is StepOverheadRow and row.num_tokens is not None and row.kind != "drafted":
            raise self._fail(f"{where}.num_tokens", f"a {row.kind} step verifies anchors only",
                             "only drafted rows are keyed by num_tokens (the K bucket); drop the key")
        tol = 1e-9 * abs(row.median_ms)
        if row.p20_ms is not None and row.p20_ms > row.median_ms + tol:
            raise self._fail(f"{where}.p20_ms", f"{row.p20_ms} > median_ms {row.median_ms}")
        if row.p80_ms is not None and row.p80_ms < row.median_ms - tol:
            raise self._fail(f"{where}.p80_ms", f"{row.p80_ms} < median_ms {row.median_ms}")
        return row

    def _rows(self, name: str, cls_row: type, rows: Any) -> list[Any]:
        if rows is None:
            return []
        if isinstance(rows, (str, bytes, Mapping)) or not hasattr(rows, "__iter__"):
            raise self._fail(name, f"must be a list of rows, got {type(rows).__name__}")
        return [self._row(cls_row, item, f"{name}[{n}]") for n, item in enumerate(rows)]

    def _validate(self) -> None:
        fields = ("hardware", "model", "block_size", "context_len", "graph_mode", "profile_seconds", "created",
                  "source")
        try:
            header = CurveHeader.model_validate({name: getattr(self, name) for name in fields})
        except ValidationError as exc:
            raise CostCurveError(validation_message(exc, self._where(), quote=True)) from None
        self.hardware, self.model = dict(self.hardware), dict(self.model)
        for name in fields[2:]:
            setattr(self, name, getattr(header, name))
        self.verify = self._rows("verify", VerifyRow, self.verify)
        self.draft = self._rows("draft", DraftRow, self.draft)
        self.ar = self._rows("ar", ArRow, self.ar)
        self.draft_first = self._rows("draft_first", DraftFirstRow, self.draft_first)
        self.step_overhead = self._rows("step_overhead", StepOverheadRow, self.step_overhead)
        if not self.verify:
            raise self._fail("verify", "no rows", "a curve needs at least one verification cell")
        self._check_cells("verify", self.verify)
        self._check_cells("draft_first", self.draft_first)
        for name, rows in (("draft", self.draft), ("ar", self.ar)):
            seen_bs: set[int] = set()
            for n, row in enumerate(rows):
                if row.batch_size in seen_bs:
                    raise self._fail(f"{name}[{n}]", f"duplicate {name} cell batch_size={row.batch_size}")
                seen_bs.add(row.batch_size)
        seen_kind: set[tuple[str, int]] = set()
        keyed = [row.num_tokens is not None for row in self.step_overhead if row.kind == "drafted"]
        if any(keyed) and not all(keyed):
            n = next(n for n, row in enumerate(self.step_overhead) if row.kind == "drafted" and row.num_tokens is None)
            raise self._fail(f"step_overhead[{n}].num_tokens", "missing, while other drafted rows give it",
                             "key every drafted row by num_tokens (the K bucket) or none")
        if any(keyed):
            self._check_cells("step_overhead", self.step_overhead, keep=lambda row: row.kind == "drafted")
        for n, row in enumerate(self.step_overhead):
            key = (row.kind, row.batch_size)
            if row.num_tokens is None and key in seen_kind:
                raise self._fail(f"step_overhead[{n}]", f"duplicate cell kind={row.kind}, batch_size={row.batch_size}")
            seen_kind.add(key)

    def _check_cells(self, name: str, rows: list[Any], keep=lambda row: True) -> None:
        """``(batch_size, num_tokens)`` cells of the rows ``keep`` selects: ``bs <= num_tokens <= bs * B``,
        no duplicates."""
        seen: set[tuple[int, int]] = set()
        for n, row in enumerate(rows):
            if not keep(row):
                continue
            where = f"{name}[{n}]"
            if row.num_tokens < row.batch_size:
                raise self._fail(
                    f"{where}.num_tokens",
                    f"{row.num_tokens} < batch_size {row.batch_size}",
                    "every request verifies at least its anchor slot",
                )
            if row.num_tokens > row.batch_size * self.block_size:
                raise self._fail(
                    f"{where}.num_tokens",
                    f"{row.num_tokens} > batch_size * block_size = {row.batch_size * self.block_size}",
                    "a request verifies at most B slots",
                )
            key = (row.batch_size, row.num_tokens)
            if key in seen:
                raise self._fail(where, f"duplicate cell batch_size={key[0]}, num_tokens={key[1]}")
            seen.add(key)

    def require_block_size(self, block_size: int) -> None:
        """Raise :class:`CostCurveError` unless the curve was measured for ``block_size``."""
        if int(block_size) != self.block_size:
            raise self._fail(
                "block_size",
                f"curve was measured for block size {self.block_size}, not {block_size}",
                "profile the target with the block size you serve (dcut-profile --block-size)",
            )

