"""Engine-neutral request bookkeeping around a :class:`~dcut_sched.controller.RatioController`.

An engine that verifies drafts by request id (vLLM's scheduler, the project's
:class:`~dcut_sched.engine.SpecEngine`, an SGLang or TensorRT-LLM scheduler) talks to the controller
through one :class:`RequestBatch`, three calls per step:

1. :meth:`RequestBatch.plan` (the requests that carry drafts, their drafts and ``[n, B-1]``
   confidences) or :meth:`RequestBatch.plan_without_draft`: the controller's plan, mapped to the
   request ids and **clipped to the drafts available** (request ``i`` keeps its first
   ``L[i] - 1 <= len(drafts[i])`` drafts: :attr:`StepPlan.kept`).
2. :meth:`RequestBatch.schedule`: what the engine really runs. Planned requests it runs are
   *verified* (with ``1 +`` the drafts it runs), planned ones it does not run (finished or
   preempted in between) are *dropped*, requests it runs drafts for without a plan are *unplanned*.
3. :meth:`RequestBatch.observe` (drafts accepted per request id): feeds the controller (once per
   plan, in plan order; a dropped request counts 0), adds the step to the metrics window, writes
   the step record (one JSON line, when a record path is set) and hands the window to the
   ``on_window`` callback every ``log_interval_s`` seconds.

The step record (the JSONL format ``record_path`` writes; docs/vllm.md):

=====================  =====================================================================
``step``               index from 0 (steps observed by this object)
``batch_size``         requests the step ran
(engine fields)        the keyword arguments of :meth:`~RequestBatch.schedule`, e.g. vLLM's
                       ``num_spec_tokens_to_schedule``
``planned``            ``{id: L}`` the plan, clipped (``{}`` for a plan without draft)
``verified``           ``{id: slots}`` planned requests the step ran, ``1 + drafts`` run
``dropped``            ``[id]`` planned requests the step did not run
``drafted``            whether the plan had drafts; ``draft_next``: the plan's
``ratio``              the controller's ``num_tokens / (bs * B)`` (``null`` without draft)
``num_tokens``         ``sum(planned)`` (0 without draft); ``expected_tokens``: the plan's (``null``)
``plan_ms``            wall time of planning (from ``started``)
``conf``               ``{id: [B-1 confidences, 6 decimals]}``, ``drafts`` ``{id: [all drafts]}``,
                       ``num_output`` ``{id: tokens before the step}``: only when recording
                       (``{}`` for a plan without draft)
``unplanned``          ``{id: slots}``; ``accepted``: ``{id: drafts accepted}`` as observed
=====================  =====================================================================

Plan fields are absent from a step that ran without a plan. No engine import; numpy only (the
controller object carries torch, this module does not need it).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Hashable, Iterable, Mapping, Sequence

import numpy as np

__all__ = ["METRIC_FIELDS", "Flight", "MetricsWindow", "RequestBatch", "StepPlan", "confidence_matrix",
           "summarize_metrics"]

#: Counters of the metrics window (:class:`MetricsWindow`).
METRIC_FIELDS = ("steps", "drafted_steps", "verified_slots", "drafted_slots", "accepted_drafts",
                 "verified_requests", "plan_ms")


def confidence_matrix(rows: Sequence[Sequence[float]], width: int) -> np.ndarray:
    """``[len(rows), width]`` float32: each row's first ``width`` values, zero-padded when shorter
    (a request with fewer drafts than ``B - 1`` scores its missing slots 0)."""
    out = np.zeros((len(rows), width), dtype=np.float32)
    for i, row in enumerate(rows):
        vals = row[:width]
        out[i, : len(vals)] = vals
    return out


def summarize_metrics(t: Mapping[str, float]) -> dict[str, float]:
    """Counters -> steps, drafted steps, keep ratio (verified / drafted slots), accepted drafts per
    verified request-step, tokens per request-step, mean plan ms per step."""
    vr = max(t["verified_requests"], 1)
    return {
        "steps": int(t["steps"]), "drafted_steps": int(t["drafted_steps"]),
        "keep_ratio": t["verified_slots"] / t["drafted_slots"] if t["drafted_slots"] else float("nan"),
        "accepted_per_request_step": t["accepted_drafts"] / vr,
        "tokens_per_request_step": (t["accepted_drafts"] + t["verified_requests"]) / vr,
        "plan_ms_per_step": t["plan_ms"] / max(t["steps"], 1),
    }


class MetricsWindow:
    """The counters since the last :meth:`roll` (the window) and before it (the totals)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.totals: dict[str, float] = {k: 0 if k != "plan_ms" else 0.0 for k in METRIC_FIELDS}
        self.window = dict(self.totals)
        self.started = clock()

    def add(self, **counts: float) -> None:
        for k, v in counts.items():
            self.window[k] += v

    def age(self) -> float:
        """Seconds since the window started."""
        return self.clock() - self.started

    def roll(self) -> dict[str, float] | None:
        """Move the window into the totals and start a new one; its summary, ``None`` when it has no step."""
        w = self.window
        summary = summarize_metrics(w) if w["steps"] else None
        for k in METRIC_FIELDS:
            self.totals[k] += w[k]
            w[k] = 0 if k != "plan_ms" else 0.0
        self.started = self.clock()
        return summary

    def summary(self) -> dict[str, float]:
        """Totals and window together (:func:`summarize_metrics`)."""
        return summarize_metrics({k: self.totals[k] + self.window[k] for k in METRIC_FIELDS})


@dataclass
class StepPlan:
    """One plan, by request id (:meth:`RequestBatch.plan`).

    Attributes:
        req_ids: the planned requests, in the confidence rows' order (empty without draft).
        lengths: ``L[i]`` slots per planned request, clipped to ``1 + len(drafts[i])``.
        kept: each planned request's first ``L[i] - 1`` drafts.
        drafted: whether the plan had drafts.
        plan: the controller's :class:`~dcut_sched.controller.ControllerPlan` (unclipped).
        plan_ms: wall time of planning.
        conf, drafts, num_output: the record's per-request inputs (``None`` unless recording).
    """

    req_ids: list[Hashable]
    lengths: list[int]
    kept: list[list[int]]
    drafted: bool
    plan: Any
    plan_ms: float
    conf: list[list[float]] | None = None
    drafts: list[list[int]] | None = None
    num_output: list[int] | None = None

    @property
    def draft_next(self) -> bool:
        return bool(self.plan.draft_next)

    @property
    def plan_batch_size(self) -> int:
        return int(self.plan.batch_size)

    @property
    def num_tokens(self) -> int:
        return sum(self.lengths)


@dataclass
class Flight:
    """A plan and what the engine ran of it (:meth:`RequestBatch.schedule`)."""

    plan: StepPlan | None
    verified: dict[Hashable, int]
    unplanned: dict[Hashable, int]
    batch_size: int
    fields: dict[str, Any] = field(default_factory=dict)

    @property
    def dropped(self) -> list[Hashable]:
        return [r for r in self.plan.req_ids if r not in self.verified] if self.plan is not None else []


class RequestBatch:
    """Per-step bookkeeping between an engine and a ratio controller (module docstring).

    Args:
        controller: a :class:`~dcut_sched.controller.RatioController` (or anything with its
            ``block_size``, ``plan``, ``plan_without_draft`` and ``observe``).
        record_path: append one JSON line per observed step here (parent folders created).
        log_interval_s: hand the metrics window to ``on_window`` when it is this old at a step.
        on_window: ``callable(summary)`` of a window with steps (:func:`summarize_metrics`).
        clock: the window's clock, ``timer``: the plan's (seconds; tests pass fake ones).
    """

    def __init__(self, controller: Any, *, record_path: str | Path | None = None, log_interval_s: float = float("inf"),
                 on_window: Callable[[dict[str, float]], None] | None = None,
                 clock: Callable[[], float] = time.monotonic, timer: Callable[[], float] = time.perf_counter) -> None:
        self.controller = controller
        self.timer = timer
        self.block_size = int(controller.block_size)
        self.log_interval_s = float(log_interval_s)
        self.on_window = on_window
        self.window = MetricsWindow(clock)
        self.step = 0
        self._record = None
        if record_path:
            path = Path(record_path)
            path.parent.mkdir(parents=True, exist_ok=True)
            self._record = open(path, "a", encoding="utf-8")

    @property
    def recording(self) -> bool:
        """Whether steps are written (the engine then passes ``num_output`` to :meth:`plan`)."""
        return self._record is not None

    @property
    def metrics(self) -> dict[str, float]:
        """Summary of every step observed (:func:`summarize_metrics`)."""
        return self.window.summary()

    # ------------------------------------------------------------------ plan
    def plan(self, req_ids: Sequence[Hashable], drafts: Sequence[Sequence[int]], conf: Any, *,
             accept_len: Any = None, num_output: Sequence[int] | None = None,
             started: float | None = None) -> StepPlan:
        """Plan the requests ``req_ids`` (at least one) from their ``drafts`` and ``[n, B-1]`` ``conf``
        (numpy or torch; :func:`confidence_matrix` builds it from ragged rows).

        ``accept_len``: the true accepted drafts (the ``oracle`` policy only). ``num_output``:
        each request's tokens so far (kept in the record). ``started``: the ``timer`` reading when
        the engine began the plan (default: now), the start of ``plan_ms``.
        """
        t0 = self.timer() if started is None else started
        plan = self.controller.plan(conf) if accept_len is None else self.controller.plan(conf, accept_len=accept_len)
        lengths = [min(int(n), 1 + len(d)) for n, d in zip(plan.lengths.tolist(), drafts)]
        kept = [list(d[: n - 1]) for d, n in zip(drafts, lengths)]
        plan_ms = (self.timer() - t0) * 1e3
        step = StepPlan(list(req_ids), lengths, kept, True, plan, plan_ms)
        if self._record is not None:  # the traces a benchmark replays (step- or position-indexed)
            step.conf = [[round(float(x), 6) for x in c] for c in conf.tolist()]
            step.drafts = [[int(t) for t in d] for d in drafts]
            step.num_output = [int(n) for n in num_output] if num_output is not None else None
        return step

    def plan_without_draft(self, batch_size: int, *, device: Any = None, started: float | None = None) -> StepPlan:
        """A plain step's plan (no request carries drafts): every one of ``batch_size`` verifies its
        anchor, and the plan says whether the next step drafts. ``device``: the layouts' torch device."""
        t0 = self.timer() if started is None else started
        plan = (self.controller.plan_without_draft(batch_size) if device is None
                else self.controller.plan_without_draft(batch_size, device=device))
        step = StepPlan([], [], [], False, plan, (self.timer() - t0) * 1e3)
        if self._record is not None:  # recorded as empty maps, like a drafted step's
            step.conf, step.drafts, step.num_output = [], [], []
        return step

    # ------------------------------------------------------------------ schedule
    def schedule(self, plan: StepPlan | None, scheduled: Iterable[Hashable], drafts: Mapping[Hashable, int],
                 **fields: Any) -> Flight:
        """What the engine runs this step: ``scheduled``, every request it runs (``batch_size`` is
        their count), and ``drafts``, the draft tokens it verifies per request that has any.
        ``fields`` go into the step record after ``batch_size``."""
        scheduled = set(scheduled)
        planned = set(plan.req_ids) if plan is not None else set()
        verified = {r: 1 + int(drafts.get(r, 0)) for r in (plan.req_ids if plan is not None else ()) if r in scheduled}
        unplanned = {r: 1 + int(n) for r, n in drafts.items() if r not in planned}
        return Flight(plan, verified, unplanned, len(scheduled), dict(fields))

    # ------------------------------------------------------------------ observe
    def observe(self, flight: Flight, accepted: Mapping[Hashable, int]) -> dict[str, Any]:
        """Close the step: feed the controller, count the step, write and return its record."""
        plan = flight.plan
        record: dict[str, Any] = {"step": self.step, "batch_size": flight.batch_size, **flight.fields}
        if plan is not None:
            if plan.drafted:
                self.controller.observe(np.array([accepted.get(r, 0) for r in plan.req_ids], dtype=np.int64))
            else:  # a plain step: nothing drafted, so nothing accepted (observe once per plan)
                self.controller.observe(np.zeros(plan.plan_batch_size, dtype=np.int64))
            record.update({
                "planned": dict(zip(plan.req_ids, plan.lengths)), "verified": flight.verified,
                "dropped": flight.dropped, "drafted": plan.drafted, "draft_next": plan.draft_next,
                "ratio": float(plan.plan.ratio) if plan.drafted else None,
                "num_tokens": plan.num_tokens if plan.drafted else 0, "plan_ms": plan.plan_ms,
                "expected_tokens": float(plan.plan.expected_tokens) if plan.drafted else None,
            })
            if plan.conf is not None:
                record["conf"] = dict(zip(plan.req_ids, plan.conf))
                record["drafts"] = dict(zip(plan.req_ids, plan.drafts))
                record["num_output"] = dict(zip(plan.req_ids, plan.num_output or ()))
            self.window.add(plan_ms=plan.plan_ms)
            if plan.drafted:
                v = flight.verified
                self.window.add(drafted_steps=1, verified_slots=sum(v.values()), drafted_slots=self.block_size * len(v),
                                verified_requests=len(v), accepted_drafts=sum(accepted.get(r, 0) for r in v))
        self.window.add(steps=1)
        record["unplanned"] = flight.unplanned
        record["accepted"] = accepted
        self.step += 1
        if self._record is not None:
            self._record.write(json.dumps(record) + "\n")
            self._record.flush()
        if self.window.age() >= self.log_interval_s:
            self.flush_window()
        return record

    # ------------------------------------------------------------------ window, shutdown
    def flush_window(self) -> None:
        """Hand the window to ``on_window`` (when it has steps) and start a new one."""
        summary = self.window.roll()
        if summary is not None and self.on_window is not None:
            self.on_window(summary)

    def close(self) -> None:
        """Flush the window and close the record file (idempotent)."""
        self.flush_window()
        if self._record is not None:
            self._record.close()
            self._record = None
