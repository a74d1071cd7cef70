"""Engine-neutral request bookkeeping around a :class:`~dcut_sched.controller.RatioController`: an
engine that verifies drafts by request id talks to the controller through one :class:`RequestBatch`,
three calls per step (plan, schedule, observe). It clips plans to the drafts available, accounts for
dropped and unplanned requests, keeps the metrics window, checks predicted against actual
(docs/controller.md, "Observability") and writes the step record (its fields: docs/controller.md,
"The step record"). numpy only, no engine import.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Hashable, Iterable, Mapping, Sequence

import numpy as np

__all__ = ["DRIFT_THRESHOLD", "DRIFT_WINDOW", "METRIC_FIELDS", "DraftDepth", "DriftMonitor", "Flight", "MetricsWindow",
           "RequestBatch", "StepPlan", "confidence_matrix", "metrics_line", "summarize_metrics"]

#: Counters of the metrics window (:class:`MetricsWindow`). ``predicted_drafts``/``actual_drafts``
#: sum over the ``calibrated_steps`` (drafted, nothing dropped); ``predicted_ms``/``measured_ms``
#: over the ``timed_steps`` (timed by the engine, priced by the cost curve).
METRIC_FIELDS = ("steps", "drafted_steps", "verified_slots", "drafted_slots", "accepted_drafts",
                 "verified_requests", "plan_ms", "calibrated_steps", "predicted_drafts", "actual_drafts",
                 "timed_steps", "predicted_ms", "measured_ms")
#: Relative error (``predicted / actual - 1``) beyond which a prediction has drifted.
DRIFT_THRESHOLD = 0.25
#: Steps over which the drift is measured (a warning needs that many steps of evidence).
DRIFT_WINDOW = 64

_log = logging.getLogger("dcut_sched.controller")


def confidence_matrix(rows: Sequence[Sequence[float]], width: int) -> np.ndarray:
    """``[len(rows), width]`` float32: each row's first ``width`` values, zero-padded when shorter
    (a request with fewer drafts than ``B - 1``, e.g. a shallower pass, :class:`DraftDepth`, gets
    confidence 0 there; a calibrator may still score such a slot above 0, and :meth:`RequestBatch.plan`
    clips every plan to the drafts present)."""
    out = np.zeros((len(rows), width), dtype=np.float32)
    for i, row in enumerate(rows):
        vals = row[:width]
        out[i, : len(vals)] = vals
    return out


def _relative_error(predicted: float, actual: float, floor: float = 0.0) -> float:
    """``predicted / max(actual, floor) - 1`` (NaN when both are 0)."""
    den = max(actual, floor)
    return predicted / den - 1.0 if den > 0 else float("nan")


def summarize_metrics(t: Mapping[str, float]) -> dict[str, float]:
    """Counters -> per-window figures: steps, drafted steps, keep ratio, accepted drafts and tokens per
    request-step, plan ms per step, predicted against actual accepted drafts (``calibration_error``)
    and step ms (``cost_error``); NaN where the window has no such step.
    """
    vr = max(t["verified_requests"], 1)
    cs, ts = t["calibrated_steps"], t["timed_steps"]
    nan = float("nan")
    return {
        "steps": int(t["steps"]), "drafted_steps": int(t["drafted_steps"]),
        "keep_ratio": t["verified_slots"] / t["drafted_slots"] if t["drafted_slots"] else nan,
        "accepted_per_request_step": t["accepted_drafts"] / vr,
        "tokens_per_request_step": (t["accepted_drafts"] + t["verified_requests"]) / vr,
        "plan_ms_per_step": t["plan_ms"] / max(t["steps"], 1),
        "predicted_drafts_per_step": t["predicted_drafts"] / cs if cs else nan,
        "actual_drafts_per_step": t["actual_drafts"] / cs if cs else nan,
        "calibration_error": _relative_error(t["predicted_drafts"], t["actual_drafts"], cs) if cs else nan,
        "predicted_ms_per_step": t["predicted_ms"] / ts if ts else nan,
        "measured_ms_per_step": t["measured_ms"] / ts if ts else nan,
        "cost_error": _relative_error(t["predicted_ms"], t["measured_ms"]) if ts else nan,
    }


def metrics_line(policy: str, s: Mapping[str, float]) -> str:
    """The one-line summary of a metrics window (:func:`summarize_metrics`) the engines log."""
    def pct(v: float) -> str:
        return "n/a" if math.isnan(v) else f"{100 * v:+.0f}%"

    return (f"D-Cut metrics: policy {policy}, steps {s['steps']} (drafted {s['drafted_steps']}), keep ratio "
            f"{s['keep_ratio']:.3f}, accepted drafts per request-step {s['accepted_per_request_step']:.2f}, tokens per "
            f"request-step {s['tokens_per_request_step']:.2f}, plan time {s['plan_ms_per_step']:.3f} ms/step, accepted "
            f"drafts per step predicted {s['predicted_drafts_per_step']:.2f} / actual {s['actual_drafts_per_step']:.2f} "
            f"(calibration error {pct(s['calibration_error'])}), step time predicted {s['predicted_ms_per_step']:.1f} / "
            f"measured {s['measured_ms_per_step']:.1f} ms (cost-curve error {pct(s['cost_error'])})")


class DriftMonitor:
    """Relative error of a prediction over the last ``window`` observations: :meth:`add` returns it once
    when it drifts beyond ``threshold`` (window full), then nothing until it is back within.
    """

    def __init__(self, window: int = DRIFT_WINDOW, threshold: float = DRIFT_THRESHOLD, floor: float = 0.0) -> None:
        if window < 1 or not threshold > 0:
            raise ValueError(f"DriftMonitor: window={window} must be >= 1 and threshold={threshold} > 0")
        self.window, self.threshold, self.floor = int(window), float(threshold), float(floor)
        self._pairs: deque[tuple[float, float]] = deque(maxlen=self.window)
        self.drifting = False
        self.episodes = 0

    def add(self, predicted: float, actual: float) -> float | None:
        self._pairs.append((predicted, actual))
        if len(self._pairs) < self.window:
            return None
        pred = sum(p for p, _ in self._pairs)
        act = sum(a for _, a in self._pairs)
        err = _relative_error(pred, act, self.floor * self.window)
        if math.isnan(err):
            return None
        if abs(err) <= self.threshold:
            self.drifting = False
            return None
        if self.drifting:
            return None
        self.drifting = True
        self.episodes += 1
        return err


class DraftDepth:
    """How many draft slots the next drafter pass fills, for an engine whose pass grows with it (vLLM's
    DFlash: docs/vllm.md, "Draft depth"). The deepest draft kept by the last ``window`` drafted
    plans; the whole block (``B - 1``) until ``window`` drafted plans fill the window (at the start and
    after a plan without draft, before a probe) and on every ``refresh``-th plan, so that deeper slots
    are scored again (between those the depth can only fall or stay). :meth:`next` takes one plan.
    """

    def __init__(self, block_size: int, window: int = 4, refresh: int = 16) -> None:
        if block_size < 2 or window < 1 or refresh < 1:
            raise ValueError(f"DraftDepth: block_size={block_size} must be >= 2, window={window} and "
                             f"refresh={refresh} >= 1")
        self.full = int(block_size) - 1
        self.refresh = int(refresh)
        self._kept: deque[int] = deque(maxlen=int(window))
        self._since_full = 0

    def next(self, kept_depth: int | None) -> int:
        """The next pass's depth after a plan whose deepest kept draft is ``kept_depth`` (``None``: a plan
        without draft)."""
        if kept_depth is None:
            self._kept.clear()
        else:
            self._kept.append(min(max(int(kept_depth), 1), self.full))
        self._since_full += 1
        if len(self._kept) < self._kept.maxlen or self._since_full >= self.refresh:
            self._since_full = 0
            return self.full
        return max(self._kept)


_FLOAT_FIELDS = ("plan_ms", "predicted_drafts", "predicted_ms", "measured_ms")


class MetricsWindow:
    """The counters since the last :meth:`roll` (the window) and before it (the totals)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.totals: dict[str, float] = {k: 0 if k not in _FLOAT_FIELDS else 0.0 for k in METRIC_FIELDS}
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
            w[k] = 0 if k not in _FLOAT_FIELDS else 0.0
        self.started = self.clock()
        return summary

    def summary(self) -> dict[str, float]:
        """Totals and window together (:func:`summarize_metrics`)."""
        return summarize_metrics({k: self.totals[k] + self.window[k] for k in METRIC_FIELDS})


@dataclass
class StepPlan:
    """One plan by request id (:meth:`RequestBatch.plan`): ``req_ids`` in the confidence rows' order,
    ``lengths`` clipped to ``1 + len(drafts[i])``, ``kept`` the first ``L[i] - 1`` drafts of each, the
    controller's unclipped ``plan``, ``plan_ms``, ``draining`` (the plan read the requests' remaining
    tokens: no request waited and the policy reads them), ``draft_depth`` (the draft slots the next
    drafter pass fills, :class:`DraftDepth`; ``None``: the whole block); ``conf``/``drafts``/``num_output``
    only when recording.
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
    draining: bool = False
    draft_depth: int | None = None

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

    ``controller``: a :class:`~dcut_sched.controller.RatioController` or anything with its
    ``block_size``, ``plan``, ``plan_without_draft``, ``observe`` and ``costs``. ``record_path``: one
    JSON line per observed step. ``on_window(summary)`` every ``log_interval_s``; ``on_warning(line)``
    on a drift beyond ``drift_threshold`` over ``drift_window`` steps (default: the logger).
    ``clock`` / ``timer``: the window's and the plan's clocks (tests pass fake ones). ``draft_depth``:
    each plan's :attr:`StepPlan.draft_depth` from it (an engine that drafts fewer slots than the block).
    """

    def __init__(self, controller: Any, *, record_path: str | Path | None = None, log_interval_s: float = float("inf"),
                 on_window: Callable[[dict[str, float]], None] | None = None,
                 on_warning: Callable[[str], None] | None = None, drift_window: int = DRIFT_WINDOW,
                 drift_threshold: float = DRIFT_THRESHOLD, draft_depth: DraftDepth | None = None,
                 clock: Callable[[], float] = time.monotonic, timer: Callable[[], float] = time.perf_counter) -> None:
        self.controller = controller
        self.costs = getattr(controller, "costs", None)
        self.on_warning = on_warning if on_warning is not None else _log.warning
        # accepted drafts: the actual floored at one draft per step, so a run that accepts nothing
        # still has a finite error
        self.calibration_drift = DriftMonitor(drift_window, drift_threshold, floor=1.0)
        self.cost_drift = DriftMonitor(drift_window, drift_threshold)
        self.timer = timer
        self.block_size = int(controller.block_size)
        self.log_interval_s = float(log_interval_s)
        self.on_window = on_window
        self.window = MetricsWindow(clock)
        self.draft_depth = draft_depth
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
             accept_len: Any = None, remaining: Sequence[int] | None = None, num_output: Sequence[int] | None = None,
             started: float | None = None) -> StepPlan:
        """Plan ``req_ids`` (at least one) from their ``drafts`` and ``[n, B-1]`` ``conf`` (numpy or torch;
        :func:`confidence_matrix` builds it from ragged rows). ``accept_len``: ``oracle`` only;
        ``remaining``: each request's tokens still to generate at most, given while no request waits and
        none will arrive (:meth:`RatioController.plan <dcut_sched.controller.RatioController.plan>`);
        ``num_output``: tokens so far (recorded); ``started``: when the engine began the plan (``plan_ms``).
        """
        t0 = self.timer() if started is None else started
        extra: dict[str, Any] = {}
        if accept_len is not None:
            extra["accept_len"] = accept_len
        if remaining is not None:
            extra["remaining"] = np.asarray(remaining)
        plan = self.controller.plan(conf, **extra)
        lengths = [min(int(n), 1 + len(d)) for n, d in zip(plan.lengths.tolist(), drafts)]
        kept = [list(d[: n - 1]) for d, n in zip(drafts, lengths)]
        plan_ms = (self.timer() - t0) * 1e3
        # draining: the plan read the remaining tokens (a policy that does not, e.g. uniform, is given them
        # and plans as ever; a controller without a policy attribute is taken to read them)
        reads = getattr(getattr(self.controller, "policy", None), "reads_remaining", True)
        step = StepPlan(list(req_ids), lengths, kept, True, plan, plan_ms,
                        draining=remaining is not None and bool(reads),
                        draft_depth=None if self.draft_depth is None else self.draft_depth.next(max(lengths) - 1))
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
        step = StepPlan([], [], [], False, plan, (self.timer() - t0) * 1e3,
                        draft_depth=None if self.draft_depth is None else self.draft_depth.next(None))
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
    def observe(self, flight: Flight, accepted: Mapping[Hashable, int], *, step_ms: float | None = None) -> dict[str, Any]:
        """Close the step: feed the controller (a dropped request counts 0), count the step, check the
        predictions, write and return its record. ``step_ms``: the engine's measured wall time, if any.
        """
        plan = flight.plan
        record: dict[str, Any] = {"step": self.step, "batch_size": flight.batch_size, **flight.fields}
        if plan is not None:
            if plan.drafted:
                self.controller.observe(np.array([accepted.get(r, 0) for r in plan.req_ids], dtype=np.int64),
                                        step_ms=step_ms)
            else:  # a plain step: nothing drafted, so nothing accepted (observe once per plan)
                self.controller.observe(np.zeros(plan.plan_batch_size, dtype=np.int64), step_ms=step_ms)
            record.update({
                "planned": dict(zip(plan.req_ids, plan.lengths)), "verified": flight.verified,
                "dropped": flight.dropped, "drafted": plan.drafted, "draft_next": plan.draft_next,
                "draining": plan.draining,
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
            if plan.drafted and not flight.dropped and flight.verified:
                self._check_calibration(plan, flight, accepted)
        self.window.add(steps=1)
        record["unplanned"] = flight.unplanned
        record["accepted"] = accepted
        if step_ms is not None:
            record["step_ms"] = float(step_ms)
            record["predicted_ms"] = self._check_cost(plan, float(step_ms))
        self.step += 1
        if self._record is not None:
            self._record.write(json.dumps(record) + "\n")
            self._record.flush()
        if self.window.age() >= self.log_interval_s:
            self.flush_window()
        return record

    # ------------------------------------------------------------------ predictions
    def _check_calibration(self, plan: StepPlan, flight: Flight, accepted: Mapping[Hashable, int]) -> None:
        predicted = float(plan.plan.expected_tokens) - plan.plan_batch_size  # one token per request is sure
        actual = float(sum(accepted.get(r, 0) for r in flight.verified))
        self.window.add(calibrated_steps=1, predicted_drafts=predicted, actual_drafts=actual)
        err = self.calibration_drift.add(predicted, actual)
        if err is not None:
            fix = ("the online calibrator has not caught up: fit the drafter's prior with `dcut-drafter calibrate "
                   "--draft DIR`" if getattr(self.controller, "calibrate", False) else
                   "enable calibration (RatioController(calibrate=True), dcut-engine --calibrate, vLLM "
                   "'calibrate': true)")
            self.on_warning(f"D-Cut: predicted accepted drafts are {100 * err:+.0f}% off the actual over the last "
                            f"{self.calibration_drift.window} drafted steps (threshold "
                            f"{100 * self.calibration_drift.threshold:.0f}%); {fix}")

    def _check_cost(self, plan: StepPlan | None, step_ms: float) -> float | None:
        """The cost curve's price of the step (``None`` without a curve or plan, or outside its range)."""
        if self.costs is None or plan is None or not step_ms > 0:
            return None
        bs = plan.plan_batch_size
        try:
            predicted = (self.costs.drafted_ms(bs, int(plan.plan.num_tokens)) if plan.drafted
                         else self.costs.undrafted_ms(bs))
        except ValueError:  # CostCurveRangeError: a batch size or budget the curve does not cover
            return None
        self.window.add(timed_steps=1, predicted_ms=predicted, measured_ms=step_ms)
        err = self.cost_drift.add(predicted, step_ms)
        if err is not None:
            self.on_warning(f"D-Cut: the cost curve prices steps {100 * err:+.0f}% off the measured step time over the "
                            f"last {self.cost_drift.window} steps (threshold {100 * self.cost_drift.threshold:.0f}%); "
                            f"re-profile the cost curve with dcut-profile on this engine and machine (vLLM: "
                            f"dcut-profile --vllm MODEL --block-size {self.block_size}; docs/profiler.md)")
        return float(predicted)

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
