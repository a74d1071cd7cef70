"""The simulated serving engine: simpy processes with one event per engine step.

A step (docs/design.md §1, issue 5):

1. if the policy wants a draft this step (``policy.drafts_first_step`` on the first step, then the
   previous plan's ``draft_next``): gather the batch's ``conf [bs, B-1]`` and ``accept_len [bs]`` from
   the trace, pass ``conf`` through the optional calibrator, and let the policy plan the verified
   lengths (``policy.plan``); the step takes ``StepCosts.drafted_ms(bs, num_tokens)``
   (``C_draft(bs) + C_verify(bs, num_tokens) + overhead_ms`` plus the curve's optional per-step rows);
2. otherwise ``policy.plan_without_draft``: every request verifies its anchor only and the step takes
   ``StepCosts.undrafted_ms(bs)`` (``C_ar(bs)`` where the engine truly skips the drafter), or
   ``StepCosts.plain_ms(bs)`` for ``ar``, the engine without speculation;

Step times come from one :class:`~dcut_sched.step_costs.StepCosts` per run, and the policy is given
that same object, so what a policy optimises and what the simulator charges are the same numbers.
3. every request advances by ``1 + min(accept_len, L - 1)`` tokens (:class:`~.replay.ReplayBatch`).

The engine holds no policy logic of its own: policies come from :mod:`dcut_sched.policies`.

Two workloads:

- :func:`run_closed_loop`: a fixed number ``bs`` of concurrent requests; a finished request is
  replaced at once by the next one of the :class:`~.replay.RequestFeed` (the published benchmark).
- :func:`run_open_loop`: Poisson arrivals at ``rate_rps`` requests/s into a FIFO queue; continuous
  batching admits waiting requests at each step boundary up to ``max_batch_size``; an optional
  prefill (batched, blocking the decode of that step boundary) costs ``C_verify(k, k * prompt_len)``
  for k admitted requests, or ``prefill_ms`` per admitted request, or nothing (the default).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np
import simpy

from ..cost_curve import CostCurve
from ..policies import Policy
from ..traces import Trace
from .replay import ReplayBatch, RequestFeed
from .step_cost import StepCosts

__all__ = [
    "Calibrator",
    "ClosedLoopRun",
    "OpenLoopRun",
    "StepRecord",
    "run_closed_loop",
    "run_open_loop",
]


@runtime_checkable
class Calibrator(Protocol):
    """What the simulator needs of a confidence calibrator (e.g. ``dcut_sched.calibration.OnlineCalibrator``).

    ``transform(conf)`` maps raw draft confidences ``[bs, B-1]`` to calibrated ones of the same shape
    and kind (values in [0, 1]) before the policy sees them; ``observe(conf, num_accepted, lengths)``
    is called after every drafted step with the *raw* ``conf [bs, B-1]``, ``num_accepted [bs]`` int64
    (``min(accept_len, lengths - 1)``: drafts the verification accepted) and ``lengths [bs]`` int64
    (slots verified; drafts beyond ``lengths - 1`` were not verified, so their outcome is unknown).
    An optional ``observe_plain(batch_size)`` is called after every step that ran no draft (the
    calibrator's clock for decaying unobserved confidence ranges, see ``OnlineCalibrator``).
    """

    def transform(self, conf: Any) -> Any: ...

    def observe(self, conf: Any, num_accepted: Any, lengths: Any) -> None: ...


@dataclass
class StepRecord:
    """Per-step arrays of one run (all ``[steps]``).

    Attributes:
        step_ms: duration of each step in ms.
        batch_size: requests in the batch.
        tokens: output tokens the batch produced.
        num_tokens: slots verified (the budget K; ``bs`` for a plain step).
        drafted: whether the step ran the draft model.
        expected_tokens: the plan's expected tokens (sum of verified slot scores; ``bs`` for a plain step).
    """

    step_ms: np.ndarray
    batch_size: np.ndarray
    tokens: np.ndarray
    num_tokens: np.ndarray
    drafted: np.ndarray
    expected_tokens: np.ndarray

    @classmethod
    def from_lists(cls, lists: dict[str, list]) -> "StepRecord":
        return cls(
            step_ms=np.asarray(lists["step_ms"], dtype=np.float64),
            batch_size=np.asarray(lists["batch_size"], dtype=np.int64),
            tokens=np.asarray(lists["tokens"], dtype=np.int64),
            num_tokens=np.asarray(lists["num_tokens"], dtype=np.int64),
            drafted=np.asarray(lists["drafted"], dtype=bool),
            expected_tokens=np.asarray(lists["expected_tokens"], dtype=np.float64),
        )

    def __len__(self) -> int:
        return int(self.step_ms.shape[0])


@dataclass
class ClosedLoopRun:
    """Everything a closed-loop run measured.

    Attributes:
        policy: the policy label.
        batch_size: bs.
        block_size: B.
        steps: per-step arrays (warm-up included).
        warmup_steps: leading steps the steady-state figures leave out.
        finished_requests: requests that reached their output length (whole run).
        finished_tokens: sum of their output lengths.
        inflight_tokens: tokens produced by the requests still in the batch at the end.
        trace_cycles: how often the request feed wrapped around the trace (0: no request replayed twice).
        approximate: True when the trace is step-indexed (approximate replay).
        log: per-step detail when the run was asked to ``record`` (tests): dicts with ``uid``,
            ``request``, ``cursor`` (before the step), ``lengths``, ``tokens``, ``drafted``, ``step_ms``.
    """

    policy: str
    batch_size: int
    block_size: int
    steps: StepRecord
    warmup_steps: int
    finished_requests: int
    finished_tokens: int
    inflight_tokens: int
    trace_cycles: int
    approximate: bool
    log: list[dict] = field(default_factory=list)


@dataclass
class OpenLoopRun:
    """Everything an open-loop run measured.

    Per-request arrays are ``[num_requests]`` in arrival order (ms since the start of the run).

    Attributes:
        arrival_ms / start_ms / first_token_ms / finish_ms: arrival, start of the first decode step
            (after queueing and prefill), end of the first decode step, end of the last one.
        output_tokens: tokens each request produced (its output length).
        prefill_ms_total: engine time spent in prefill.
    """

    policy: str
    max_batch_size: int
    block_size: int
    rate_rps: float
    steps: StepRecord
    arrival_ms: np.ndarray
    start_ms: np.ndarray
    first_token_ms: np.ndarray
    finish_ms: np.ndarray
    output_tokens: np.ndarray
    warmup_requests: int
    prefill_ms_total: float
    trace_cycles: int
    approximate: bool


class _Stepper:
    """One engine's decode loop state: the policy, the step costs and the per-step lists."""

    def __init__(self, batch: ReplayBatch, policy: Policy, cost: CostCurve, costs: StepCosts,
                 calibrator: Calibrator | None, record: bool):
        self.batch = batch
        self.policy = policy
        self.cost = cost
        self.costs = costs
        self.calibrator = calibrator
        self.block_size = batch.block_size
        self.drafting = bool(policy.drafts_first_step)
        self.needs_accept_len = bool(policy.needs_accept_len)
        # The trace was validated on load; a calibrator's output is checked by the policy.
        self.validate = calibrator is not None
        self.record = record
        self.log: list[dict] = []
        self.lists: dict[str, list] = {k: [] for k in
                                       ("step_ms", "batch_size", "tokens", "num_tokens", "drafted", "expected_tokens")}

    def step(self) -> tuple[float, np.ndarray, np.ndarray]:
        """Plan and apply one step; returns ``(step_ms, tokens [bs], finished [bs])``."""
        batch = self.batch
        bs = batch.batch_size
        cursor = batch.cursor.copy() if self.record else None
        if self.drafting:
            conf, accept = batch.gather()
            conf_in = conf if self.calibrator is None else self.calibrator.transform(conf)
            if self.needs_accept_len:
                plan = self.policy.plan(conf_in, self.costs, accept_len=accept, validate=self.validate)
            else:
                plan = self.policy.plan(conf_in, self.costs, validate=self.validate)
            lengths = np.asarray(plan.lengths, dtype=np.int64)
            tokens, finished = batch.advance(lengths)
            num_accepted = np.minimum(accept, lengths - 1)
            if self.calibrator is not None:
                self.calibrator.observe(conf, num_accepted, lengths)
            self.policy.observe(lengths, num_accepted)
            step_ms = self.costs.drafted_ms(bs, plan.num_tokens)
        else:
            plan = self.policy.plan_without_draft(bs, self.block_size, self.costs)
            if self.calibrator is not None and hasattr(self.calibrator, "observe_plain"):
                self.calibrator.observe_plain(bs)  # optional: the decay clock of unobserved ranges
            lengths = None
            tokens, finished = batch.advance_plain()
            # a speculative engine's anchor-only step, or a step of the engine without speculation (ar)
            step_ms = self.costs.undrafted_ms(bs) if self.policy.speculative else self.costs.plain_ms(bs)
        lists = self.lists
        lists["step_ms"].append(step_ms)
        lists["batch_size"].append(bs)
        lists["tokens"].append(int(tokens.sum()))
        lists["num_tokens"].append(plan.num_tokens)
        lists["drafted"].append(self.drafting)
        lists["expected_tokens"].append(plan.expected_tokens)
        if self.record:
            self.log.append({
                "uid": batch.uid.copy(), "request": batch.request.copy(), "cursor": cursor,
                "lengths": np.ones(bs, dtype=np.int64) if lengths is None else lengths.copy(),
                "tokens": tokens.copy(), "drafted": self.drafting, "step_ms": step_ms,
            })
        self.drafting = bool(plan.draft_next)
        return step_ms, tokens, finished


def _fresh_policy(policy: Policy) -> Policy:
    """A private copy of ``policy`` with its cross-step state reset (each run starts clean)."""
    policy = copy.deepcopy(policy)
    policy.reset()
    return policy


def run_closed_loop(
    trace: Trace,
    cost: CostCurve,
    policy: Policy,
    batch_size: int,
    *,
    num_steps: int,
    warmup_steps: int = 0,
    seed: int = 0,
    shuffle: bool = True,
    overhead_ms: float = 0.0,
    draft_scale: float = 1.0,
    calibrator: Calibrator | None = None,
    label: str | None = None,
    record: bool = False,
) -> ClosedLoopRun:
    """Simulate ``num_steps`` engine steps with ``batch_size`` concurrent requests.

    Args:
        trace: a validated trace (``Trace.load`` validates).
        cost: the cost curve (its block size must match the trace's; the caller checks).
        policy: a policy instance; the run works on a deep copy, reset first.
        batch_size: bs, requests in the batch at every step.
        num_steps: steps to simulate (warm-up included).
        warmup_steps: leading steps left out of steady-state figures (kept in ``steps``).
        seed: seed of the request order (:class:`RequestFeed`): same seed, same requests.
        shuffle: shuffle the request order (False: the trace's order).
        overhead_ms: fixed time added to each drafted step.
        draft_scale: multiplier on the curve's draft step ``C_draft`` (what-if analyses; 1 = as measured).
        calibrator: optional; the run works on a deep copy, so every run starts from the same state.
        label: the policy's name in the results (default ``policy.name``).
        record: keep a per-step log of every slot (for tests and debugging; slow).

    Raises:
        CostCurveRangeError: a step time outside the curve's measured range.
        ValueError: bad plan input (e.g. a calibrator returning values outside [0, 1]).
    """
    policy = _fresh_policy(policy)
    calibrator = copy.deepcopy(calibrator)
    feed = RequestFeed(trace.num_requests, seed=seed, shuffle=shuffle)
    batch = ReplayBatch(trace, seed=seed)
    batch.add(feed.take(batch_size))
    stepper = _Stepper(batch, policy, cost, StepCosts(cost, trace.block_size, overhead_ms, draft_scale),
                       calibrator, record)
    env = simpy.Environment()
    counters = {"finished_requests": 0, "finished_tokens": 0}

    def engine():
        for _ in range(num_steps):
            step_ms, _tokens, finished = stepper.step()
            yield env.timeout(step_ms)
            if finished.any():
                slots = np.flatnonzero(finished)
                counters["finished_requests"] += len(slots)
                counters["finished_tokens"] += int(batch.target[slots].sum())
                batch.replace(slots, feed.take(len(slots)))

    env.process(engine())
    env.run()
    return ClosedLoopRun(
        policy=label or policy.name,
        batch_size=int(batch_size),
        block_size=trace.block_size,
        steps=StepRecord.from_lists(stepper.lists),
        warmup_steps=int(warmup_steps),
        finished_requests=counters["finished_requests"],
        finished_tokens=counters["finished_tokens"],
        inflight_tokens=int(batch.produced.sum()),
        trace_cycles=feed.cycles,
        approximate=not trace.exact_replay,
        log=stepper.log,
    )


def run_open_loop(
    trace: Trace,
    cost: CostCurve,
    policy: Policy,
    max_batch_size: int,
    *,
    rate_rps: float,
    num_requests: int,
    warmup_requests: int = 0,
    seed: int = 0,
    shuffle: bool = True,
    overhead_ms: float = 0.0,
    draft_scale: float = 1.0,
    calibrator: Calibrator | None = None,
    prompt_len: int | None = None,
    prefill_ms: float | None = None,
    label: str | None = None,
    arrival_ms: np.ndarray | None = None,
) -> OpenLoopRun:
    """Simulate Poisson arrivals served with continuous batching until every request has finished.

    Args:
        trace / cost / policy / seed / shuffle / overhead_ms / draft_scale / calibrator / label: as
            :func:`run_closed_loop`; ``seed`` also seeds the arrival times (same seed, same arrivals).
        max_batch_size: most requests decoded together.
        rate_rps: mean arrival rate in requests per second (exponential inter-arrival times).
        num_requests: requests that arrive (the run ends when all have finished).
        warmup_requests: the first arrivals, left out of the latency figures.
        prompt_len: if given, admitting k requests costs a prefill of ``C_verify(k, k * prompt_len)``.
        prefill_ms: if given (and no ``prompt_len``), admitting k requests costs ``k * prefill_ms``.
            With neither, prefill is free (stated in the results).
        arrival_ms: explicit non-decreasing arrival times in ms (``[num_requests]``; e.g. a recorded
            arrival log) instead of Poisson arrivals; ``rate_rps`` is then only reported.

    Raises:
        CostCurveRangeError: a batch size, budget or prefill outside the curve's measured range.
    """
    if not (rate_rps > 0):
        raise ValueError(f"rate_rps={rate_rps} must be > 0")
    policy = _fresh_policy(policy)
    calibrator = copy.deepcopy(calibrator)
    n = int(num_requests)
    if arrival_ms is None:
        arrival_rng = np.random.default_rng([int(seed), 1])
        arrival_ms = np.cumsum(arrival_rng.exponential(1000.0 / rate_rps, size=n))
    else:
        arrival_ms = np.asarray(arrival_ms, dtype=np.float64)
        if arrival_ms.shape != (n,) or np.any(np.diff(arrival_ms) < 0) or (n and arrival_ms[0] < 0):
            raise ValueError(f"arrival_ms must be {n} non-decreasing times >= 0")
    feed = RequestFeed(trace.num_requests, seed=seed, shuffle=shuffle)
    requests = feed.take(n)
    batch = ReplayBatch(trace, seed=seed)
    costs = StepCosts(cost, trace.block_size, overhead_ms, draft_scale)
    stepper = _Stepper(batch, policy, cost, costs, calibrator, record=False)
    start_ms = np.full(n, np.nan)
    first_token_ms = np.full(n, np.nan)
    finish_ms = np.full(n, np.nan)
    output_tokens = np.zeros(n, dtype=np.int64)
    env = simpy.Environment()
    queue = simpy.Store(env)
    state = {"prefill_ms_total": 0.0}

    def arrivals():
        for j in range(n):
            if arrival_ms[j] > env.now:  # simultaneous arrivals are queued together, so the engine
                yield env.timeout(arrival_ms[j] - env.now)  # admits them all at the same boundary
            queue.put(j)

    def prefill_cost(k: int) -> float:
        if prompt_len is not None:
            return costs.cost.verify_ms(k, k * int(prompt_len))
        if prefill_ms is not None:
            return k * float(prefill_ms)
        return 0.0

    def engine():
        done = 0
        while done < n:
            if batch.batch_size == 0 and not queue.items:
                first = yield queue.get()
                queue.items.insert(0, first)
            k = min(max_batch_size - batch.batch_size, len(queue.items))
            if k > 0:
                admitted = np.asarray(queue.items[:k], dtype=np.int64)
                del queue.items[:k]
                batch.add(requests[admitted])  # FIFO admission: uid == arrival index
                pre = prefill_cost(k)
                if pre > 0:
                    state["prefill_ms_total"] += pre
                    yield env.timeout(pre)
                start_ms[admitted] = env.now
            step_ms, _tokens, finished = stepper.step()
            yield env.timeout(step_ms)
            uid = batch.uid
            first = np.isnan(first_token_ms[uid])
            if first.any():
                first_token_ms[uid[first]] = env.now
            if finished.any():
                ended = uid[finished]
                finish_ms[ended] = env.now
                output_tokens[ended] = batch.produced[finished]
                batch.remove(finished)
                done += len(ended)

    env.process(arrivals())
    env.process(engine())
    env.run()
    return OpenLoopRun(
        policy=label or policy.name,
        max_batch_size=int(max_batch_size),
        block_size=trace.block_size,
        rate_rps=float(rate_rps),
        steps=StepRecord.from_lists(stepper.lists),
        arrival_ms=arrival_ms,
        start_ms=start_ms,
        first_token_ms=first_token_ms,
        finish_ms=finish_ms,
        output_tokens=output_tokens,
        warmup_requests=int(warmup_requests),
        prefill_ms_total=state["prefill_ms_total"],
        trace_cycles=feed.cycles,
        approximate=not trace.exact_replay,
    )
