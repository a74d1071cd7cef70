"""Cost-curve lookups: the interpolation of every row kind (no extrapolation).

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
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np

from .schema import AR_ASSUMED_NO_ROWS, AR_ASSUMED_V1, SCHEMA_V1, STEP_KINDS, AssumedArWarning, CostCurveRangeError

__all__ = ["CurveLookup"]


class _CellTable:
    """``(batch_size, num_tokens)`` cells and their lookup (module docstring, "Lookups"): isotonic
    PCHIP in num_tokens at a measured batch size, linear in bs at fixed tokens per request between.
    ``monotone=False`` (signed overhead residuals, which may fall with K) skips the isotonic step."""

    def __init__(self, rows: list[Any], where, label: str, monotone: bool = True) -> None:
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
            ms = isotonic_regression(ms, increasing=True).x if len(ms) > 1 and monotone else ms
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


class CurveLookup:
    """The lookup half of :class:`~dcut_sched.cost_curve.CostCurve`: tables built once per curve,
    one method per cost term (module docstring)."""

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
        drafted_cells = [r for r in self.step_overhead if r.kind == "drafted" and r.num_tokens is not None]
        self._overhead_cells = (_CellTable(drafted_cells, self._where, "drafted step_overhead ", monotone=False)
                                if drafted_cells else None)
        for kind in STEP_KINDS:
            rows = sorted((r for r in self.step_overhead if r.kind == kind and r.num_tokens is None),
                          key=lambda r: r.batch_size)
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
        return kind in self._overhead or (kind == "drafted" and self._overhead_cells is not None)

    def overhead_by_tokens(self) -> bool:
        """Whether the drafted-step overhead is keyed by the verified tokens K (rows with ``num_tokens``)."""
        return self._overhead_cells is not None

    def overhead_ms(self, kind: str, batch_size: int, num_tokens: Any = None) -> Any:
        """``O_kind(batch_size)`` in ms (a signed residual): the engine's time per step of ``kind``
        beside the curve's forward passes, linear in batch size between its ``step_overhead`` rows
        (``numpy.interp``); 0 when the curve has no rows of that kind. When the drafted rows are keyed
        by ``num_tokens`` (:meth:`overhead_by_tokens`), ``O_drafted(bs, K)`` is looked up in those
        cells like :meth:`verify_ms` but without the isotonic step (a residual may fall with K), and
        ``num_tokens`` (an int or an array) is required.

        Raises:
            ValueError: unknown ``kind``, or no ``num_tokens`` for K-keyed drafted rows.
            CostCurveRangeError: ``batch_size`` (or ``num_tokens``) outside the measured cells of that kind.
        """
        if not self.has_overhead(kind):
            return 0.0
        if kind == "drafted" and self._overhead_cells is not None:
            if num_tokens is None:
                raise ValueError("this curve's drafted step overhead is keyed by num_tokens (the K bucket); pass it")
            return self._overhead_cells.lookup(batch_size, num_tokens)
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
