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
and non-positive times are errors). Faults raise :class:`CostCurveError` naming the file, the row
and the field (``verify[3].median_ms``).
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import numbers
from dataclasses import dataclass
from typing import Any, Mapping, Optional

import numpy as np

from ..util.inputs import shown

__all__ = [
    "AR_ASSUMED_NO_ROWS", "AR_ASSUMED_V1", "BACKENDS", "GRAPH_MODES", "MAX_MS", "PROVENANCES", "SCHEMA", "SCHEMAS", "SCHEMA_V1",
    "STEP_KINDS", "ArRow", "AssumedArWarning", "CostCurveError", "CostCurveRangeError", "CurveValidation",
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
# samples; ``provenance`` (one of :data:`PROVENANCES`). Times in ms.


@dataclass(frozen=True)
class VerifyRow:
    """One verification cell: ``batch_size`` requests, ``num_tokens`` slots, times in ms."""

    batch_size: int
    num_tokens: int
    median_ms: float
    p20_ms: Optional[float] = None
    p80_ms: Optional[float] = None
    repeats: Optional[int] = None
    provenance: str = "measured"


@dataclass(frozen=True)
class ArRow:
    """One plain-decode cell: ``batch_size`` requests, one token each, no draft; times in ms."""

    batch_size: int
    median_ms: float
    p20_ms: Optional[float] = None
    p80_ms: Optional[float] = None
    repeats: Optional[int] = None
    provenance: str = "measured"


@dataclass(frozen=True)
class DraftRow:
    """One draft-step cell: ``batch_size`` requests drafting a block, times in ms."""

    batch_size: int
    median_ms: float
    p20_ms: Optional[float] = None
    p80_ms: Optional[float] = None
    repeats: Optional[int] = None
    provenance: str = "measured"


@dataclass(frozen=True)
class DraftFirstRow:
    """One cell of the drafter's first forward of a step: ``batch_size`` requests, over the step's
    ``num_tokens`` verified tokens (attention over the context), times in ms."""

    batch_size: int
    num_tokens: int
    median_ms: float
    p20_ms: Optional[float] = None
    p80_ms: Optional[float] = None
    repeats: Optional[int] = None
    provenance: str = "measured"


@dataclass(frozen=True)
class StepOverheadRow:
    """What an engine spends per step of ``kind`` (one of :data:`STEP_KINDS`) beside the curve's
    forward passes, at ``batch_size`` requests (and, for ``drafted`` rows that give it, at
    ``num_tokens`` verified tokens: the K bucket); ms. A signed residual: ``median_ms`` (and
    ``p20_ms`` / ``p80_ms``) may be negative when the real step is faster than the curve's forward
    cells (docs/design.md §4); the whole step a curve prices must still be > 0."""

    kind: str
    batch_size: int
    median_ms: float
    p20_ms: Optional[float] = None
    p80_ms: Optional[float] = None
    repeats: Optional[int] = None
    provenance: str = "measured"
    num_tokens: Optional[int] = None


_ROW_REQUIRED = {VerifyRow: ("batch_size", "num_tokens", "median_ms"), ArRow: ("batch_size", "median_ms"),
                 DraftRow: ("batch_size", "median_ms"), DraftFirstRow: ("batch_size", "num_tokens", "median_ms"),
                 StepOverheadRow: ("kind", "batch_size", "median_ms")}



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


class CurveValidation:
    """The validation half of :class:`~dcut_sched.cost_curve.CostCurve` (module docstring): every field
    checked on creation, faults naming the file, the row and the field."""

    def _where(self) -> str:
        return f"cost curve {self.path}" if self.path else "cost curve"

    def _fail(self, field_name: str, problem: str, fix: str = "") -> CostCurveError:
        msg = f"{self._where()}: field '{field_name}': {problem}"
        if fix:
            msg += f" ({fix})"
        return CostCurveError(msg)

    def _int(self, value: Any, where: str, minimum: int) -> int:
        got = _exact_int(value)
        if got is None or got < minimum:
            kind = "a positive" if minimum == 1 else "a non-negative"
            raise self._fail(where, f"must be {kind} integer, got {value!r}")
        if got > _MAX_INT:  # 1e308 is an integral float; no batch size, token count or repeat count is
            raise self._fail(where, f"{value!r} is larger than {_MAX_INT} (int64); give a real count")
        return got

    def _ms(self, value: Any, where: str) -> float:
        got = _exact_float(value)
        if got is None or got <= 0:
            raise self._fail(where, f"must be a positive finite number of ms, got {shown(value)}")
        if got > MAX_MS:
            raise self._fail(where, f"{got:g} ms is above the limit {MAX_MS:g} ms", "a step time in ms, not an overflow")
        return got

    def _overhead_ms(self, value: Any, where: str) -> float:
        got = _exact_float(value)
        if got is None:
            raise self._fail(where, f"must be a finite number of ms (a signed residual), got {shown(value)}")
        if abs(got) > MAX_MS:
            raise self._fail(where, f"{got:g} ms is beyond the limit +-{MAX_MS:g} ms", "a step time in ms, not an overflow")
        return got

    def _row(self, cls_row: type, item: Any, where: str) -> Any:
        """Validate one row (a dataclass or a mapping) and return it with plain Python values."""
        if isinstance(item, cls_row):
            item = dict(item.__dict__)
        if not isinstance(item, Mapping):
            raise self._fail(where, f"must be an object with {', '.join(_ROW_REQUIRED[cls_row])}, got "
                                    f"{type(item).__name__}")
        known = cls_row.__dataclass_fields__
        unknown = [k for k in item if k not in known]
        if unknown:
            raise self._fail(where, f"unknown keys {sorted(map(str, unknown))}", f"allowed: {', '.join(known)}")
        for req in _ROW_REQUIRED[cls_row]:
            if item.get(req) is None:
                raise self._fail(f"{where}.{req}", "missing")
        out: dict[str, Any] = {}
        if cls_row is StepOverheadRow:
            kind = item["kind"]
            if not isinstance(kind, str) or kind not in STEP_KINDS:
                raise self._fail(f"{where}.kind", f"unknown step kind {kind!r}", f"use one of {', '.join(STEP_KINDS)}")
            out["kind"] = kind
        out["batch_size"] = self._int(item["batch_size"], f"{where}.batch_size", 1)
        if "num_tokens" in _ROW_REQUIRED[cls_row]:
            out["num_tokens"] = self._int(item["num_tokens"], f"{where}.num_tokens", 1)
        if cls_row is StepOverheadRow:  # a signed residual: any finite number of ms
            if item.get("num_tokens") is not None:
                if out["kind"] != "drafted":
                    raise self._fail(f"{where}.num_tokens", f"a {out['kind']} step verifies anchors only",
                                     "only drafted rows are keyed by num_tokens (the K bucket); drop the key")
                out["num_tokens"] = self._int(item["num_tokens"], f"{where}.num_tokens", 1)
            out["median_ms"] = self._overhead_ms(item["median_ms"], f"{where}.median_ms")
            for name in ("p20_ms", "p80_ms"):
                if item.get(name) is not None:
                    out[name] = self._overhead_ms(item[name], f"{where}.{name}")
        else:
            out["median_ms"] = self._ms(item["median_ms"], f"{where}.median_ms")
            for name in ("p20_ms", "p80_ms"):
                if item.get(name) is not None:
                    out[name] = self._ms(item[name], f"{where}.{name}")
        tol = 1e-9 * abs(out["median_ms"])
        if "p20_ms" in out and out["p20_ms"] > out["median_ms"] + tol:
            raise self._fail(f"{where}.p20_ms", f"{out['p20_ms']} > median_ms {out['median_ms']}")
        if "p80_ms" in out and out["p80_ms"] < out["median_ms"] - tol:
            raise self._fail(f"{where}.p80_ms", f"{out['p80_ms']} < median_ms {out['median_ms']}")
        if item.get("repeats") is not None:
            out["repeats"] = self._int(item["repeats"], f"{where}.repeats", 1)
        prov = item.get("provenance", "measured")
        if not isinstance(prov, str) or prov not in PROVENANCES:
            raise self._fail(f"{where}.provenance", f"unknown {prov!r}", f"use one of {', '.join(PROVENANCES)}")
        out["provenance"] = prov
        return cls_row(**out)

    def _rows(self, name: str, cls_row: type, rows: Any) -> list[Any]:
        if rows is None:
            return []
        if isinstance(rows, (str, bytes, Mapping)) or not hasattr(rows, "__iter__"):
            raise self._fail(name, f"must be a list of rows, got {type(rows).__name__}")
        return [self._row(cls_row, item, f"{name}[{n}]") for n, item in enumerate(rows)]

    def _validate(self) -> None:
        if not isinstance(self.hardware, Mapping):
            raise self._fail("hardware", f"must be an object, got {type(self.hardware).__name__}",
                             f"e.g. {{\"device_name\": ..., \"backend\": one of {', '.join(BACKENDS)}}}")
        self.hardware = dict(self.hardware)
        backend = self.hardware.get("backend")
        if backend is None:
            raise self._fail("hardware.backend", "missing", f"one of {', '.join(BACKENDS)}")
        if not isinstance(backend, str) or backend not in BACKENDS:
            raise self._fail("hardware.backend", f"unknown backend {backend!r}", f"use one of {BACKENDS}")
        if self.hardware.get("device_name") is not None and not isinstance(self.hardware["device_name"], str):
            raise self._fail("hardware.device_name", f"must be a string, got {self.hardware['device_name']!r}")
        if not isinstance(self.model, Mapping):
            raise self._fail("model", f"must be an object, got {type(self.model).__name__}")
        self.model = dict(self.model)
        if not isinstance(self.model.get("name"), str) or not self.model["name"]:
            raise self._fail("model.name", "missing or not a string", "name the model whose forward was timed")
        for name in ("hardware", "model"):  # what save() will write must be plain finite JSON
            try:
                json.dumps(getattr(self, name), allow_nan=False, default=_json_scalar)
            except RecursionError:
                raise self._fail(name, "nested too deeply") from None
            except (TypeError, ValueError) as exc:
                raise self._fail(name, f"not plain finite JSON: {exc}",
                                 "use str, int, float (finite), bool, None, lists and objects") from None
        bsz = _exact_int(self.block_size)
        if bsz is None or bsz < 1:
            raise self._fail("block_size", f"must be a positive int, got {self.block_size!r}")
        self.block_size = bsz
        ctx = _exact_int(self.context_len)
        if ctx is None or ctx < 0:
            raise self._fail("context_len", f"must be a non-negative int, got {self.context_len!r}")
        self.context_len = ctx
        if self.graph_mode is not None and self.graph_mode not in GRAPH_MODES:
            raise self._fail("graph_mode", f"unknown {self.graph_mode!r}", f"use one of {GRAPH_MODES} or null")
        if self.profile_seconds is not None:
            secs = _exact_float(self.profile_seconds)
            if secs is None or secs < 0:
                raise self._fail("profile_seconds", f"must be a non-negative number, got {self.profile_seconds!r}")
            self.profile_seconds = secs
        if not isinstance(self.created, str):
            raise self._fail("created", f"must be an ISO-8601 string, got {self.created!r}")
        if not isinstance(self.source, str):
            raise self._fail("source", f"must be a string, got {type(self.source).__name__}")
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

