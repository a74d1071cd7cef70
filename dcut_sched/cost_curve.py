"""Verification, plain-decode and draft cost curves: the file format of docs/design.md §4 and lookups into it.

A cost curve holds measured (or published, fitted, analytic) times of

- ``C_verify(batch_size, num_tokens)`` ms: one target forward verifying ``num_tokens`` slots for
  ``batch_size`` requests at ``context_len``, replayed from a CUDA graph where the backend has them;
- ``C_ar(batch_size)`` ms: one plain autoregressive decode step (one token per request, no draft) on
  the path a serving engine runs without speculation (full CUDA graphs of the one-token step, decode
  attention kernels). It is **not** ``C_verify(bs, bs)``: verification runs another path
  (piecewise graphs, variable-length attention, hidden states exported for the drafter); in the
  public D-Cut data the AR engine steps in 17.8 ms at bs 64 on H20 where verifying 256 slots costs
  55.2 ms. Schema ``dcut.cost-curve/2`` keeps it as its own ``ar`` rows;
- ``C_draft(batch_size)`` ms: one draft step for the batch;
- optionally ``C_draft_first(batch_size, num_tokens)`` ms (``draft_first`` rows): the drafter's
  first forward of a step, over the step's ``num_tokens`` verified tokens (how a draft that keeps
  its own KV cache, e.g. vLLM's ``draft_model``, catches up and proposes its first token). Its cost
  grows with the verified tokens, so a drafted step's draft is not one number per batch size;
- optionally ``O_kind(batch_size)`` ms (``step_overhead`` rows, kind ``plain``, ``drafted`` or
  ``undrafted``): what an engine spends per step beside the curve's forward passes (scheduling,
  input preparation, sampling, output processing), measured on real engine steps.

How :class:`~dcut_sched.step_costs.StepCosts` sums them is in docs/design.md §1; absent rows add
nothing, so a curve without them prices steps exactly as before.

Schema versions
---------------
``dcut.cost-curve/2`` (written by :meth:`CostCurve.save`) has ``ar`` rows. ``dcut.cost-curve/1``
files (no ``ar`` rows) still load: the plain step then falls back to ``C_verify(bs, bs)``, one
:class:`AssumedArWarning` says so, and :attr:`CostCurve.ar_provenance` reads
``"assumed: C_verify(bs, bs) (v1 curve)"`` so that every table can print it.

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
- ``draft_first_ms`` interpolates like ``verify_ms`` (same code, its own cells).
- ``ar_ms``, ``draft_ms`` and ``overhead_ms`` are linear in batch size between measured batch sizes
  (``numpy.interp``).
- Anything outside the measured range raises :class:`CostCurveRangeError` naming the range: a cost
  curve is never extrapolated silently.

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
import os
import platform
import warnings
from dataclasses import dataclass, field, make_dataclass
from pathlib import Path
from typing import Any, Mapping, Optional

import numpy as np

from .atomic import atomic_write_text

__all__ = [
    "AR_ASSUMED_NO_ROWS",
    "AR_ASSUMED_V1",
    "AssumedArWarning",
    "ArRow",
    "BACKENDS",
    "PROVENANCES",
    "SCHEMA",
    "SCHEMA_V1",
    "CostCurve",
    "CostCurveError",
    "CostCurveRangeError",
    "DraftFirstRow",
    "DraftRow",
    "STEP_KINDS",
    "StepOverheadRow",
    "FINGERPRINT_FIELDS",
    "cpu_model_name",
    "VerifyRow",
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
#: :attr:`CostCurve.ar_provenance` of a curve whose plain step is assumed, not measured.
AR_ASSUMED_V1 = "assumed: C_verify(bs, bs) (v1 curve)"
AR_ASSUMED_NO_ROWS = "assumed: C_verify(bs, bs) (no ar rows)"


class CostCurveError(ValueError):
    """A cost-curve file or object is invalid. The message names the file, the row and the field."""


class CostCurveRangeError(ValueError):
    """A lookup fell outside the measured range of a cost curve (no silent extrapolation)."""


class AssumedArWarning(UserWarning):
    """A curve has no plain-decode (``ar``) rows: ``C_ar(bs)`` is assumed to be ``C_verify(bs, bs)``."""


#: The timing fields every row kind ends with, after its key fields (positional order: keys, then these).
_TIMING_FIELDS = (
    ("median_ms", float),
    ("p20_ms", Optional[float], field(default=None)),
    ("p80_ms", Optional[float], field(default=None)),
    ("repeats", Optional[int], field(default=None)),
    ("provenance", str, field(default="measured")),
)


def _row_class(name: str, doc: str, keys: list[tuple[str, type]]) -> type:
    """A frozen row dataclass: ``keys`` (e.g. ``batch_size``, ``num_tokens``) then :data:`_TIMING_FIELDS`
    (ms; ``p20_ms``/``p80_ms`` quantiles, ``repeats`` samples, ``provenance`` measured/fitted/...)."""
    cls = make_dataclass(name, [*keys, *_TIMING_FIELDS], frozen=True)
    cls.__module__, cls.__doc__ = __name__, doc  # importable and picklable as dcut_sched.cost_curve.<name>
    return cls


VerifyRow = _row_class("VerifyRow", "One verification cell: ``batch_size`` requests, ``num_tokens`` slots, times in ms.",
                       [("batch_size", int), ("num_tokens", int)])
ArRow = _row_class("ArRow", "One plain-decode cell: ``batch_size`` requests, one token each, no draft; times in ms.",
                   [("batch_size", int)])
DraftRow = _row_class("DraftRow", "One draft-step cell: ``batch_size`` requests drafting a block, times in ms.",
                      [("batch_size", int)])
DraftFirstRow = _row_class(
    "DraftFirstRow", "One cell of the drafter's first forward of a step: ``batch_size`` requests, over the step's "
    "``num_tokens`` verified tokens (attention over the context), times in ms.",
    [("batch_size", int), ("num_tokens", int)])
StepOverheadRow = _row_class(
    "StepOverheadRow", "What an engine spends per step of ``kind`` (one of :data:`STEP_KINDS`) beside the curve's "
    "forward passes, at ``batch_size`` requests; ms, ``median_ms >= 0``. ``p20_ms`` / ``p80_ms`` are quantiles of "
    "the per-step residuals and may be negative (a step faster than the curve's forwards).",
    [("kind", str), ("batch_size", int)])


_ROW_REQUIRED = {VerifyRow: ("batch_size", "num_tokens", "median_ms"), ArRow: ("batch_size", "median_ms"),
                 DraftRow: ("batch_size", "median_ms"), DraftFirstRow: ("batch_size", "num_tokens", "median_ms"),
                 StepOverheadRow: ("kind", "batch_size", "median_ms")}


#: The fields of :attr:`CostCurve.fingerprint` that :meth:`CostCurve.check_hardware` compares.
FINGERPRINT_FIELDS = ("device_name", "backend", "torch_version", "threads", "dtype", "context_len")


def cpu_model_name() -> str:
    """This machine's CPU model (``model name`` of /proc/cpuinfo, else ``platform.processor()``)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


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


class _CellTable:
    """``(batch_size, num_tokens)`` cells and their lookup (module docstring, "Lookups"): isotonic
    PCHIP in num_tokens at a measured batch size, linear in bs at fixed tokens per request between."""

    def __init__(self, rows: list[Any], where, label: str) -> None:
        # scipy loads with the first curve, not with the package (a controller import stays light)
        from scipy.interpolate import PchipInterpolator
        from scipy.optimize import isotonic_regression

        self._where, self._label = where, label
        by_bs: dict[int, list[Any]] = {}
        for row in rows:
            by_bs.setdefault(row.batch_size, []).append(row)
        self.interp: dict[int, tuple[np.ndarray, np.ndarray, Any]] = {}
        for bs, cells in sorted(by_bs.items()):
            cells.sort(key=lambda r: r.num_tokens)
            tokens = np.array([r.num_tokens for r in cells], dtype=np.float64)
            ms = np.array([r.median_ms for r in cells], dtype=np.float64)
            ms = isotonic_regression(ms, increasing=True).x if len(ms) > 1 else ms
            interp = PchipInterpolator(tokens, ms, extrapolate=False) if len(ms) > 1 else None
            self.interp[bs] = (tokens, ms, interp)
        self.sizes = np.array(sorted(by_bs), dtype=np.int64)

    def token_range(self, batch_size: int) -> tuple[int, int]:
        lo_bs, hi_bs, _ = self.bracket(batch_size)
        if lo_bs == hi_bs:
            tokens = self.interp[lo_bs][0]
            return int(tokens[0]), int(tokens[-1])
        t_lo, t_hi = self.interp[lo_bs][0], self.interp[hi_bs][0]
        per_lo = max(t_lo[0] / lo_bs, t_hi[0] / hi_bs)
        per_hi = min(t_lo[-1] / lo_bs, t_hi[-1] / hi_bs)
        return int(math.ceil(per_lo * batch_size - 1e-9)), int(math.floor(per_hi * batch_size + 1e-9))

    def bracket(self, batch_size: int) -> tuple[int, int, float]:
        sizes = self.sizes
        bs = int(batch_size) if np.isfinite(batch_size) else -1
        if bs != batch_size or bs < sizes[0] or bs > sizes[-1]:
            raise CostCurveRangeError(
                f"{self._where()}: {self._label}batch_size={batch_size} is outside the measured {self._label}batch sizes "
                f"{sizes[0]}..{sizes[-1]} ({', '.join(map(str, sizes))}); profile it or choose "
                f"a batch size in range"
            )
        if bs in self.interp:
            return bs, bs, 0.0
        j = int(np.searchsorted(sizes, bs))
        lo, hi = int(sizes[j - 1]), int(sizes[j])
        return lo, hi, (bs - lo) / (hi - lo)

    def at(self, bs: int, num_tokens: np.ndarray) -> np.ndarray:
        tokens, ms, interp = self.interp[bs]
        if interp is None:
            return np.full(num_tokens.shape, ms[0])
        return interp(num_tokens)

    def lookup(self, batch_size: int, num_tokens: Any) -> Any:
        scalar = np.isscalar(num_tokens)
        tokens = np.asarray(num_tokens, dtype=np.float64)
        if not np.isfinite(tokens).all():
            raise CostCurveRangeError(f"{self._where()}: num_tokens must be finite; got {num_tokens!r}")
        lo_tok, hi_tok = self.token_range(batch_size)
        if tokens.size and (tokens.min() < lo_tok or tokens.max() > hi_tok):
            bad = tokens[(tokens < lo_tok) | (tokens > hi_tok)].ravel()[0]
            raise CostCurveRangeError(
                f"{self._where()}: {self._label}num_tokens={bad:g} at batch_size={batch_size} is outside the "
                f"measured range {lo_tok}..{hi_tok}; profile more token counts or pick a budget in range"
            )
        lo, hi, w = self.bracket(batch_size)
        if lo == hi:
            out = self.at(lo, tokens)
        else:
            per_request = tokens / batch_size
            out = (1 - w) * self.at(lo, per_request * lo) + w * self.at(hi, per_request * hi)
        return float(out) if scalar else out


@dataclass
class CostCurve:
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

    # ------------------------------------------------------------------ validation
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
            raise self._fail(where, f"must be a positive finite number of ms, got {value!r}")
        return got

    def _overhead_ms(self, value: Any, where: str) -> float:
        got = _exact_float(value)
        if got is None or got < 0:
            raise self._fail(where, f"must be a finite number of ms >= 0, got {value!r}",
                             "a step's overhead beside the forwards cannot be negative; write 0 for none")
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
        if cls_row is StepOverheadRow:  # an overhead may be 0; its residual quantiles any finite number
            out["median_ms"] = self._overhead_ms(item["median_ms"], f"{where}.median_ms")
            for name in ("p20_ms", "p80_ms"):
                if item.get(name) is not None:
                    got = _exact_float(item[name])
                    if got is None:
                        raise self._fail(f"{where}.{name}", f"must be a finite number of ms, got {item[name]!r}")
                    out[name] = got
        else:
            out["median_ms"] = self._ms(item["median_ms"], f"{where}.median_ms")
            for name in ("p20_ms", "p80_ms"):
                if item.get(name) is not None:
                    out[name] = self._ms(item[name], f"{where}.{name}")
        if "p20_ms" in out and out["p20_ms"] > out["median_ms"] * (1 + 1e-9):
            raise self._fail(f"{where}.p20_ms", f"{out['p20_ms']} > median_ms {out['median_ms']}")
        if "p80_ms" in out and out["p80_ms"] < out["median_ms"] * (1 - 1e-9):
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
        for n, row in enumerate(self.step_overhead):
            key = (row.kind, row.batch_size)
            if key in seen_kind:
                raise self._fail(f"step_overhead[{n}]", f"duplicate cell kind={row.kind}, batch_size={row.batch_size}")
            seen_kind.add(key)

    def _check_cells(self, name: str, rows: list[Any]) -> None:
        """``(batch_size, num_tokens)`` cells: ``bs <= num_tokens <= bs * B``, no duplicates."""
        seen: set[tuple[int, int]] = set()
        for n, row in enumerate(rows):
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

    # ------------------------------------------------------------------ lookup tables
    def _build_tables(self) -> None:
        self._verify_cells = _CellTable(self.verify, self._where, "")
        self._verify_interp = self._verify_cells.interp
        self._batch_sizes = self._verify_cells.sizes
        self._draft_first_cells = _CellTable(self.draft_first, self._where, "draft_first ") if self.draft_first else None
        draft_rows = sorted(self.draft, key=lambda r: r.batch_size)
        self._draft_bs = np.array([r.batch_size for r in draft_rows], dtype=np.float64)
        self._draft_ms = np.array([r.median_ms for r in draft_rows], dtype=np.float64)
        ar_rows = sorted(self.ar, key=lambda r: r.batch_size)
        self._ar_bs = np.array([r.batch_size for r in ar_rows], dtype=np.float64)
        self._ar_ms = np.array([r.median_ms for r in ar_rows], dtype=np.float64)
        self._overhead: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for kind in STEP_KINDS:
            rows = sorted((r for r in self.step_overhead if r.kind == kind), key=lambda r: r.batch_size)
            if rows:
                self._overhead[kind] = (np.array([r.batch_size for r in rows], dtype=np.float64),
                                        np.array([r.median_ms for r in rows], dtype=np.float64))

    @property
    def batch_sizes(self) -> list[int]:
        """Batch sizes with verification cells, ascending."""
        return [int(b) for b in self._batch_sizes]

    @property
    def ar_batch_sizes(self) -> list[int]:
        """Batch sizes with plain-decode (``ar``) cells, ascending (``[]`` for an assumed plain step)."""
        return [int(b) for b in self._ar_bs]

    def token_counts(self, batch_size: int) -> list[int]:
        """Measured num_tokens at ``batch_size`` (ascending); ``[]`` if that batch size is unmeasured."""
        entry = self._verify_interp.get(int(batch_size))
        return [] if entry is None else [int(t) for t in entry[0]]

    def token_range(self, batch_size: int) -> tuple[int, int]:
        """The ``(min, max)`` num_tokens :meth:`verify_ms` accepts at ``batch_size``.

        Raises:
            CostCurveRangeError: ``batch_size`` outside the measured batch sizes.
        """
        return self._verify_cells.token_range(batch_size)

    def _bracket(self, batch_size: int) -> tuple[int, int, float]:
        return self._verify_cells.bracket(batch_size)

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
        return self._verify_cells.lookup(batch_size, num_tokens)

    def has_draft_first(self) -> bool:
        """Whether the curve prices the drafter's first forward by verified tokens (``draft_first`` rows)."""
        return self._draft_first_cells is not None

    def draft_first_ms(self, batch_size: int, num_tokens: Any) -> Any:
        """``C_draft_first(batch_size, num_tokens)`` in ms: the drafter's first forward of a step over
        its ``num_tokens`` verified tokens; interpolated exactly as :meth:`verify_ms` (isotonic PCHIP
        in num_tokens, linear in bs at fixed tokens per request), from the ``draft_first`` cells.

        Returns:
            A float for a scalar ``num_tokens``, else a float64 array; 0 (or zeros) without
            ``draft_first`` rows.

        Raises:
            CostCurveRangeError: ``batch_size`` or ``num_tokens`` outside the ``draft_first`` cells.
        """
        if self._draft_first_cells is None:
            return 0.0 if np.isscalar(num_tokens) else np.zeros(np.shape(num_tokens))
        return self._draft_first_cells.lookup(batch_size, num_tokens)

    def has_overhead(self, kind: str) -> bool:
        """Whether the curve has ``step_overhead`` rows of ``kind`` (one of :data:`STEP_KINDS`)."""
        if kind not in STEP_KINDS:
            raise ValueError(f"unknown step kind {kind!r}; use one of {', '.join(STEP_KINDS)}")
        return kind in self._overhead

    def overhead_ms(self, kind: str, batch_size: int) -> float:
        """``O_kind(batch_size)`` in ms: the engine's time per step of ``kind`` beside the curve's
        forward passes, linear in batch size between its ``step_overhead`` rows (``numpy.interp``);
        0 when the curve has no rows of that kind.

        Raises:
            ValueError: unknown ``kind``.
            CostCurveRangeError: ``batch_size`` outside the measured batch sizes of that kind.
        """
        if not self.has_overhead(kind):
            return 0.0
        xs, ys = self._overhead[kind]
        if not (np.isfinite(batch_size) and xs[0] <= batch_size <= xs[-1]):
            raise CostCurveRangeError(
                f"{self._where()}: {kind} step overhead batch_size={batch_size} is outside the measured "
                f"'step_overhead' batch sizes {xs[0]:g}..{xs[-1]:g}; profile it or choose a batch size in range"
            )
        return float(np.interp(batch_size, xs, ys))

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

    def has_ar(self) -> bool:
        """Whether the plain-decode step has its own cells (``False``: it is assumed, see :meth:`ar_ms`)."""
        return bool(len(self._ar_bs))

    @property
    def ar_assumed(self) -> bool:
        """True when ``C_ar`` falls back to ``C_verify(bs, bs)`` (no ``ar`` rows)."""
        return not self.has_ar()

    @property
    def ar_provenance(self) -> str:
        """Where ``C_ar`` comes from, for tables: a row provenance (``"measured"``, ``"published"``,
        ``"fitted"``, ``"analytic"``), several with their batch sizes (``"published (bs 4, 8);
        fitted (bs 1, 2)"``), or :data:`AR_ASSUMED_V1` / :data:`AR_ASSUMED_NO_ROWS`."""
        if not self.has_ar():
            return AR_ASSUMED_V1 if self.loaded_schema == SCHEMA_V1 else AR_ASSUMED_NO_ROWS
        by_prov: dict[str, list[int]] = {}
        for row in sorted(self.ar, key=lambda r: r.batch_size):
            by_prov.setdefault(row.provenance, []).append(row.batch_size)
        if len(by_prov) == 1:
            return next(iter(by_prov))
        return "; ".join(f"{p} (bs {', '.join(map(str, b))})" for p, b in by_prov.items())

    def _warn_ar_assumed(self, stacklevel: int = 3) -> None:
        if self._ar_warned:
            return
        self._ar_warned = True
        why = (f"schema {SCHEMA_V1} has no plain-decode ('ar') rows" if self.loaded_schema == SCHEMA_V1
               else "it has no plain-decode ('ar') rows")
        warnings.warn(
            f"{self._where()}: {why}; the plain AR step C_ar(bs) is ASSUMED to be C_verify(bs, bs), which can be "
            f"far from an engine's plain-decode path (H20 / Qwen3-8B: 17.8 ms vs 55.2+ ms at bs 64); re-profile "
            f"with dcut-profile (--gpu/--cpu measure it) to get measured 'ar' rows",
            AssumedArWarning,
            stacklevel=stacklevel,
        )

    def ar_ms(self, batch_size: int) -> float:
        """``C_ar(batch_size)`` in ms: one plain autoregressive decode step (one token per request, no
        draft), linear in batch size between the measured ``ar`` rows (``numpy.interp``).

        Without ``ar`` rows (a ``dcut.cost-curve/1`` file, or a curve built without them) it is
        *assumed* to be ``C_verify(batch_size, batch_size)``; the first such lookup (or the load of a
        v1 file) emits one :class:`AssumedArWarning`, and :attr:`ar_provenance` says so.

        Raises:
            CostCurveRangeError: ``batch_size`` outside the measured ``ar`` batch sizes (or, when
                assumed, outside the verification range).
        """
        if not self.has_ar():
            self._warn_ar_assumed()
            return self.verify_ms(batch_size, batch_size)
        lo, hi = self._ar_bs[0], self._ar_bs[-1]
        if not (np.isfinite(batch_size) and lo <= batch_size <= hi):
            raise CostCurveRangeError(
                f"{self._where()}: plain-decode batch_size={batch_size} is outside the measured 'ar' batch sizes "
                f"{lo:g}..{hi:g} ({', '.join(str(b) for b in self.ar_batch_sizes)}); profile it or choose a batch "
                f"size in range"
            )
        return float(np.interp(batch_size, self._ar_bs, self._ar_ms))

    # ------------------------------------------------------------------ checks against the user
    def require_block_size(self, block_size: int) -> None:
        """Raise :class:`CostCurveError` unless the curve was measured for ``block_size``."""
        if int(block_size) != self.block_size:
            raise self._fail(
                "block_size",
                f"curve was measured for block size {self.block_size}, not {block_size}",
                "profile the target with the block size you serve (dcut-profile --block-size)",
            )

    @property
    def fingerprint(self) -> dict[str, Any]:
        """What the times depend on besides the model: ``{device_name, backend, torch_version, threads,
        dtype, context_len}`` (``None`` where the file does not say; see :data:`FINGERPRINT_FIELDS`)."""
        hw = self.hardware
        return {"device_name": hw.get("device_name"), "backend": hw.get("backend"),
                "torch_version": hw.get("torch_version"), "threads": hw.get("threads"),
                "dtype": self.model.get("dtype"), "context_len": self.context_len}

    def check_hardware(self, device_name: str | None = None, *, torch_version: str | None = None,
                       threads: int | None = None, dtype: str | None = None, context_len: int | None = None) -> bool:
        """Warn (one ``UserWarning`` naming both sides) if this run differs from the curve's
        :attr:`fingerprint`.

        Compared, where both sides are known:
            - measured curves (``cuda-graph``, ``cuda-eager``, ``cpu-eager``): the device (the current CUDA
              device, or this machine's CPU model from :func:`cpu_model_name`, when ``device_name`` is
              None) and the torch version (``torch.__version__`` by default, once a device is known);
              CPU curves also the thread count (``torch.get_num_threads()`` by default);
            - every curve (``analytic`` too): ``dtype`` and ``context_len`` when given.

        Returns:
            True when nothing compared differs.
        """
        fp = self.fingerprint
        backend = fp["backend"]
        here: dict[str, Any] = {"dtype": dtype, "context_len": context_len, "device_name": None,
                                "torch_version": None, "threads": None}
        if backend in ("cuda-graph", "cuda-eager", "cpu-eager"):
            import torch

            if device_name is None:
                if backend == "cpu-eager":
                    device_name = cpu_model_name()
                elif torch.cuda.is_available():
                    device_name = torch.cuda.get_device_name()
            here["device_name"] = device_name
            if device_name is not None:
                here["torch_version"] = torch_version or torch.__version__
            if backend == "cpu-eager":
                here["threads"] = torch.get_num_threads() if threads is None else threads
        diffs = [(k, fp[k], here[k]) for k in FINGERPRINT_FIELDS
                 if here.get(k) is not None and fp.get(k) is not None and str(fp[k]) != str(here[k])]
        if not diffs:
            return True
        lead = (f"{self._where()} was measured on {fp['device_name']!r} but this device is {here['device_name']!r}"
                if diffs[0][0] == "device_name" else f"{self._where()} was measured under another setup")
        detail = "; ".join(f"{k}: curve {a!r}, this run {b!r}" for k, a, b in diffs)
        warnings.warn(
            f"{lead} ({detail}); its times may not describe this run (re-profile with dcut-profile --gpu/--cpu "
            f"on this machine, at this dtype, thread count and context length)",
            UserWarning,
            stacklevel=2,
        )
        return False

    # ------------------------------------------------------------------ (de)serialisation
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
        from .inputs import InputFileError, parse_json_strict

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

    def rows_frame(self):
        """The verification cells as a pandas DataFrame (one row per cell)."""
        import pandas as pd

        return pd.DataFrame([r.__dict__ for r in self.verify]).sort_values(["batch_size", "num_tokens"])

    def __repr__(self) -> str:
        return (
            f"CostCurve(model={self.model.get('name')!r}, device={self.hardware.get('device_name')!r}, "
            f"backend={self.hardware.get('backend')!r}, B={self.block_size}, batch_sizes={self.batch_sizes}, "
            f"cells={len(self.verify)}, ar={self.ar_provenance!r})"
        )
