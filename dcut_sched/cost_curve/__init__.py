"""Verification, plain-decode and draft cost curves: the file format of docs/design.md §4 and lookups into it.

A cost curve holds measured (or published, fitted, analytic) times of

- ``C_verify(batch_size, num_tokens)`` ms: one target forward verifying ``num_tokens`` slots for
  ``batch_size`` requests at ``context_len``, replayed from a CUDA graph where the backend has them;
- ``C_ar(batch_size)`` ms: one plain autoregressive decode step (one token per request, no draft) on
  the path a serving engine runs without speculation (full CUDA graphs of the one-token step, decode
  attention kernels). It is **not** ``C_verify(bs, bs)``: verification runs another path
  (piecewise graphs, variable-length attention, hidden states exported for the drafter), and in the
  public D-Cut data the two differ several-fold (the figures: docs/design.md §1). Schema
  ``dcut.cost-curve/2`` keeps it as its own ``ar`` rows;
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

The format's schema versions and validation: :mod:`.schema`; the lookups (how every row kind is
interpolated, and that nothing is extrapolated): :mod:`.lookup`; the hardware fingerprint:
:mod:`.hardware`; reading and writing files: :mod:`.io`.
"""

from __future__ import annotations

from .curve import CostCurve
from .hardware import FINGERPRINT_FIELDS, cpu_model_name
from .schema import (
    AR_ASSUMED_NO_ROWS,
    AR_ASSUMED_V1,
    BACKENDS,
    GRAPH_MODES,
    PROVENANCES,
    SCHEMA,
    SCHEMA_V1,
    SCHEMAS,
    STEP_KINDS,
    ArRow,
    AssumedArWarning,
    CostCurveError,
    CostCurveRangeError,
    DraftFirstRow,
    DraftRow,
    StepOverheadRow,
    VerifyRow,
)

__all__ = [
    "AR_ASSUMED_NO_ROWS",
    "AR_ASSUMED_V1",
    "AssumedArWarning",
    "ArRow",
    "BACKENDS",
    "GRAPH_MODES",
    "PROVENANCES",
    "SCHEMA",
    "SCHEMAS",
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
