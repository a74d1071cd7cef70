"""The simulated serving loop: simpy processes with one event per engine step.

A step is the online controller's own step code,
:class:`~dcut_sched.controller.step_driver.StepDriver`, run on numpy arrays: a drafted step gathers
the batch's ``conf [bs, B-1]`` and ``accept_len [bs]`` from the trace and plans, a step without a
draft verifies anchors only; every request then advances by ``verified_prefix_tokens(accept_len, L)``
(:class:`~.replay.ReplayBatch`) and the driver observes the drafts accepted. Step times come from the
run's one :class:`~dcut_sched.step_costs.StepCosts`, the object the policy plans with (``drafted_ms``
at the replayed cell, ``undrafted_ms``, or ``plain_ms`` for ``ar``; docs/design.md §1). What it
simulates and checks against the controller: docs/simulator.md, "What it simulates".

Two workloads, each taking a :class:`~.config.SimConfig` (or its fields as keywords):
:func:`run_closed_loop`, ``bs`` concurrent requests, a finished one replaced at once from the
:class:`~.replay.RequestFeed` (the published benchmark); :func:`run_open_loop`, Poisson arrivals
at ``rate_rps`` into a FIFO queue, continuous batching up to ``max_batch_size`` at each step
boundary, and an optional batched prefill (``C_verify(k, k * prompt_len)`` or ``prefill_ms`` per
request) that blocks that boundary.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, runtime_checkable

import numpy as np
import simpy

from ..controller.step_driver import GraphCells, StepDriver, restrict_to_graph_cells
from ..cost_curve import CostCurve
from ..policies import Policy
from ..scores import verified_prefix_tokens
from ..step_costs import StepCosts
from ..traces import Trace
from .config import SimConfig
from .replay import ReplayBatch, RequestFeed

_sum_reduce = np.add.reduce

__all__ = [
    "Calibrator",
    "ClosedLoopRun",
    "OpenLoopRun",
    "SimulatedSteps",
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
class SimulatedSteps:
    """Per-step arrays of one simulated run (all ``[steps]``); the engine's own per-step log is
    :class:`dcut_sched.engine.EngineStepRecord`.

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
    def from_lists(cls, lists: dict[str, list]) -> "SimulatedSteps":
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
        controller_metrics: the step driver's counters at the end of the run (the keys of
            ``RatioController.metrics``: ``bad_conf_requests``, ``accepted_drafts``, ...).
    """

    policy: str
    batch_size: int
    block_size: int
    steps: SimulatedSteps
    warmup_steps: int
    finished_requests: int
    finished_tokens: int
    inflight_tokens: int
    trace_cycles: int
    approximate: bool
    log: list[dict] = field(default_factory=list)
    controller_metrics: dict[str, Any] = field(default_factory=dict)


@dataclass
class OpenLoopRun:
    """Everything an open-loop run measured.

    Per-request arrays are ``[num_requests]`` in arrival order (ms since the start of the run).

    Attributes:
        arrival_ms / start_ms / first_token_ms / finish_ms: arrival, start of the first decode step
            (after queueing and prefill), end of the first decode step, end of the last one.
        output_tokens: tokens each request produced (its output length).
        prefill_ms_total: engine time spent in prefill.
        controller_metrics: the step driver's counters at the end of the run (as :class:`ClosedLoopRun`).
    """

    policy: str
    max_batch_size: int
    block_size: int
    rate_rps: float
    steps: SimulatedSteps
    arrival_ms: np.ndarray
    start_ms: np.ndarray
    first_token_ms: np.ndarray
    finish_ms: np.ndarray
    output_tokens: np.ndarray
    warmup_requests: int
    prefill_ms_total: float
    trace_cycles: int
    approximate: bool
    controller_metrics: dict[str, Any] = field(default_factory=dict)


class _Stepper:
    """One engine's decode loop state: the controller's step driver, the step costs and the per-step lists."""

    def __init__(self, batch: ReplayBatch, policy: Policy, costs: StepCosts, calibrator: Calibrator | None,
                 graph_cells: GraphCells | None, record: bool):
        self.batch = batch
        self.costs = costs
        # The trace was validated on load; a calibrator's output is checked by the policy (the
        # Calibrator protocol does not promise values in [0, 1]).
        self.driver = StepDriver(policy, costs, batch.block_size, calibrator=calibrator, graph_cells=graph_cells,
                                 validate_scored=calibrator is not None)
        self.drafting = bool(policy.drafts_first_step)
        self.speculative = bool(policy.speculative)  # ar: the engine without speculation (plain steps)
        self.record = record
        self.draining = False  # no request waits and none will arrive: plans read the remaining tokens
        self.log: list[dict] = []
        self.lists: dict[str, list] = {k: [] for k in
                                       ("step_ms", "batch_size", "tokens", "num_tokens", "drafted", "expected_tokens")}
        (self._step_ms, self._batch_size, self._tokens, self._num_tokens, self._drafted,
         self._expected) = self.lists.values()  # the same lists, bound once (appended every step)

    def step(self) -> tuple[float, np.ndarray, np.ndarray]:
        """Plan and apply one step; returns ``(step_ms, tokens [bs], finished [bs])``."""
        batch = self.batch
        driver = self.driver
        bs = batch.batch_size
        cursor = batch.cursor.copy() if self.record else None
        if self.drafting:
            conf, accept = batch.gather()
            plan = driver.plan(conf, accept, batch.target - batch.produced if self.draining else None)
            lengths = np.asarray(plan.lengths, dtype=np.int64)
            verified = verified_prefix_tokens(accept, lengths)
            tokens, finished = batch.advance_by(verified)
            # drafts accepted among the L - 1 verified ones (in range by construction)
            driver.observe(verified - 1, in_range=True)
            step_ms = self.costs.drafted_ms(*driver.graph_cell(bs, plan.num_tokens))
        else:
            plan = driver.plan_without_draft(bs)
            driver.observe(None)  # nothing to learn; closes the step as online
            lengths = None
            tokens, finished = batch.advance_plain()
            # a speculative engine's anchor-only step, or a step of the engine without speculation (ar)
            step_ms = self.costs.undrafted_ms(bs) if self.speculative else self.costs.plain_ms(bs)
        self._step_ms.append(step_ms)
        self._batch_size.append(bs)
        self._tokens.append(int(_sum_reduce(tokens)))
        self._num_tokens.append(plan.num_tokens)
        self._drafted.append(self.drafting)
        self._expected.append(plan.expected_tokens)
        if self.record:
            self.log.append({
                "uid": batch.uid.copy(), "request": batch.request.copy(), "cursor": cursor,
                "lengths": np.ones(bs, dtype=np.int64) if lengths is None else lengths.copy(),
                "tokens": tokens.copy(), "drafted": self.drafting, "step_ms": step_ms,
            })
        self.drafting = bool(plan.draft_next)
        return step_ms, tokens, finished


def _run_config(config: SimConfig | None, options: Mapping[str, Any], batch_size: int, mode: str,
                direct_defaults: Mapping[str, Any]) -> SimConfig:
    """The run's :class:`SimConfig`: ``config`` with ``options`` applied, or one built from
    ``options`` over ``direct_defaults`` (a direct call with keywords)."""
    if config is None:
        return SimConfig(**{"batch_sizes": (int(batch_size),), "mode": mode, **direct_defaults, **options})
    return config.replace(**options) if options else config


def _prepare_run(trace: Trace, cost: CostCurve, policy: Policy, config: SimConfig,
                 batch_sizes: range | list[int]) -> tuple[Policy, Any, StepCosts, GraphCells | None]:
    """A run's private policy (reset; restricted to the graph cells when given), calibrator copy,
    step costs (the run's one :class:`StepCosts`: built here, where the curve enters the run) and
    graph cells."""
    policy = _fresh_policy(policy)
    cells = None
    if config.graph_token_counts is not None:
        policy = restrict_to_graph_cells(policy, config.graph_token_counts)
        cells = GraphCells.at_batch_sizes(config.graph_token_counts, batch_sizes)
    costs = StepCosts(cost, trace.block_size, overhead_ms=config.overhead_ms, draft_scale=config.draft_scale)
    return policy, copy.deepcopy(config.calibrator), costs, cells


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
    config: SimConfig | None = None,
    *,
    label: str | None = None,
    record: bool = False,
    **options: Any,
) -> ClosedLoopRun:
    """Simulate ``config.num_steps`` engine steps with ``batch_size`` concurrent requests.

    Args:
        trace: a validated trace (``Trace.load`` validates).
        cost: the cost curve (its block size must match the trace's; the caller checks).
        policy: a policy instance; the run works on a deep copy, reset first.
        batch_size: bs, requests in the batch at every step.
        config: the options (:class:`~.config.SimConfig`; used here: ``num_steps``, ``warmup_steps``,
            ``seed`` (request order), ``shuffle``, ``overhead_ms``, ``draft_scale``, ``calibrator``
            (the run works on a deep copy, so every run starts from the same state),
            ``graph_token_counts``).
        label: the policy's name in the results (default ``policy.name``).
        record: keep a per-step log of every slot (for tests and debugging; slow).
        **options: SimConfig fields, applied over ``config``; without ``config`` they build one, with
            ``warmup_steps`` defaulting to 0 here (e.g. ``run_closed_loop(t, c, p, 4, num_steps=100)``).

    Raises:
        CostCurveRangeError: a step time outside the curve's measured range.
        SimulationError: a bad option (from :class:`~.config.SimConfig`).
        ValueError: bad plan input (e.g. a calibrator returning values outside [0, 1]); a budget no
            captured graph cell holds.
    """
    config = _run_config(config, options, batch_size, "closed", {"warmup_steps": 0})
    policy, calibrator, costs, cells = _prepare_run(trace, cost, policy, config, [int(batch_size)])
    feed = RequestFeed(trace.num_requests, seed=config.seed, shuffle=config.shuffle)
    batch = ReplayBatch(trace, seed=config.seed)
    batch.add(feed.take(batch_size))
    stepper = _Stepper(batch, policy, costs, calibrator, cells, record)
    env = simpy.Environment()
    counters = {"finished_requests": 0, "finished_tokens": 0}
    num_steps = config.num_steps

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
        steps=SimulatedSteps.from_lists(stepper.lists),
        warmup_steps=int(config.warmup_steps),
        finished_requests=counters["finished_requests"],
        finished_tokens=counters["finished_tokens"],
        inflight_tokens=int(batch.produced.sum()),
        trace_cycles=feed.cycles,
        approximate=not trace.exact_replay,
        log=stepper.log,
        controller_metrics=stepper.driver.metrics,
    )


def run_open_loop(
    trace: Trace,
    cost: CostCurve,
    policy: Policy,
    max_batch_size: int,
    config: SimConfig | None = None,
    *,
    rate_rps: float | None = None,
    arrival_ms: np.ndarray | None = None,
    label: str | None = None,
    **options: Any,
) -> OpenLoopRun:
    """Simulate Poisson arrivals served with continuous batching until every request has finished.

    Args:
        trace / cost / policy / label: as :func:`run_closed_loop`.
        max_batch_size: most requests decoded together.
        config: the options (:class:`~.config.SimConfig`; used here: ``num_requests``,
            ``warmup_requests`` (the first arrivals, left out of the latency figures), ``seed`` (also
            the arrival times: same seed, same arrivals), ``shuffle``, ``overhead_ms``,
            ``draft_scale``, ``calibrator``, ``graph_token_counts``, ``prompt_len`` (admitting k
            requests costs a prefill of ``C_verify(k, k * prompt_len)``), ``prefill_ms`` (if given and
            no ``prompt_len``, admitting k requests costs ``k * prefill_ms``; with neither, prefill is
            free, stated in the results) and ``rate_rps`` when not given here).
        rate_rps: mean arrival rate in requests per second (exponential inter-arrival times);
            default ``config.rate_rps``.
        arrival_ms: explicit non-decreasing arrival times in ms (``[num_requests]``; e.g. a recorded
            arrival log) instead of Poisson arrivals; ``rate_rps`` is then only reported.
        **options: SimConfig fields, applied over ``config``; without ``config`` they build one, with
            ``warmup_requests`` defaulting to 0 here.

    Raises:
        CostCurveRangeError: a batch size, budget or prefill outside the curve's measured range.
        SimulationError / ValueError: bad options (``rate_rps`` missing or <= 0, bad ``arrival_ms``).
    """
    config = _run_config(config, options, max_batch_size, "open", {"warmup_requests": 0})
    if rate_rps is None:
        rate_rps = config.rate_rps
    if rate_rps is None or not (rate_rps > 0):
        raise ValueError(f"rate_rps={rate_rps} must be > 0")
    policy, calibrator, costs, cells = _prepare_run(trace, cost, policy, config, range(1, int(max_batch_size) + 1))
    n = int(config.num_requests)
    arrival_ms = _arrival_times(arrival_ms, rate_rps, n, config.seed)
    feed = RequestFeed(trace.num_requests, seed=config.seed, shuffle=config.shuffle)
    requests = feed.take(n)
    stepper = _Stepper(ReplayBatch(trace, seed=config.seed), policy, costs, calibrator, cells, record=False)
    env = simpy.Environment()
    server = _OpenLoopServer(env, stepper, requests, arrival_ms, max_batch_size,
                             _prefill_cost(costs, config.prompt_len, config.prefill_ms))
    env.process(server.arrivals())
    env.process(server.engine())
    env.run()
    return OpenLoopRun(
        policy=label or policy.name,
        max_batch_size=int(max_batch_size),
        block_size=trace.block_size,
        rate_rps=float(rate_rps),
        steps=SimulatedSteps.from_lists(stepper.lists),
        arrival_ms=arrival_ms,
        start_ms=server.start_ms,
        first_token_ms=server.first_token_ms,
        finish_ms=server.finish_ms,
        output_tokens=server.output_tokens,
        warmup_requests=config.open_warmup_requests,
        prefill_ms_total=server.prefill_ms_total,
        trace_cycles=feed.cycles,
        approximate=not trace.exact_replay,
        controller_metrics=stepper.driver.metrics,
    )


def _arrival_times(arrival_ms: np.ndarray | None, rate_rps: float, n: int, seed: int) -> np.ndarray:
    """The ``n`` arrival times in ms: ``arrival_ms`` checked (non-decreasing, >= 0), or Poisson
    arrivals at ``rate_rps`` drawn from ``seed``."""
    if arrival_ms is None:
        arrival_rng = np.random.default_rng([int(seed), 1])
        return np.cumsum(arrival_rng.exponential(1000.0 / rate_rps, size=n))
    arrival_ms = np.asarray(arrival_ms, dtype=np.float64)
    if arrival_ms.shape != (n,) or np.any(np.diff(arrival_ms) < 0) or (n and arrival_ms[0] < 0):
        raise ValueError(f"arrival_ms must be {n} non-decreasing times >= 0")
    return arrival_ms


def _prefill_cost(costs: StepCosts, prompt_len: int | None, prefill_ms: float | None) -> Callable[[int], float]:
    """The prefill time in ms of admitting ``k`` requests (:func:`run_open_loop`'s config)."""

    def cost(k: int) -> float:
        if prompt_len is not None:
            return costs.prefill_ms(k, prompt_len)
        if prefill_ms is not None:
            return k * float(prefill_ms)
        return 0.0

    return cost


class _OpenLoopServer:
    """The open loop's simpy processes: arrivals into a FIFO queue, and the engine that admits
    waiting requests at each step boundary (``uid`` == arrival index) and records their times."""

    def __init__(self, env: simpy.Environment, stepper: _Stepper, requests: np.ndarray, arrival_ms: np.ndarray,
                 max_batch_size: int, prefill_cost: Callable[[int], float]):
        n = len(arrival_ms)
        self.env, self.stepper, self.batch = env, stepper, stepper.batch
        self.queue = simpy.Store(env)
        self.requests, self.arrival_ms = requests, arrival_ms
        self.max_batch_size, self.prefill_cost = max_batch_size, prefill_cost
        self.start_ms = np.full(n, np.nan)
        self.first_token_ms = np.full(n, np.nan)
        self.finish_ms = np.full(n, np.nan)
        self.output_tokens = np.zeros(n, dtype=np.int64)
        self.prefill_ms_total = 0.0
        self.arrived = 0

    def arrivals(self):
        env, arrival_ms = self.env, self.arrival_ms
        for j in range(len(arrival_ms)):
            if arrival_ms[j] > env.now:  # simultaneous arrivals are queued together, so the engine
                yield env.timeout(arrival_ms[j] - env.now)  # admits them all at the same boundary
            self.queue.put(j)
            self.arrived = j + 1

    def _admit(self):
        """Move waiting requests into the batch (FIFO, up to ``max_batch_size``) and run their prefill."""
        env, queue, batch = self.env, self.queue, self.batch
        if batch.batch_size == 0 and not queue.items:
            first = yield queue.get()
            queue.items.insert(0, first)
        k = min(self.max_batch_size - batch.batch_size, len(queue.items))
        if k > 0:
            admitted = np.asarray(queue.items[:k], dtype=np.int64)
            del queue.items[:k]
            batch.add(self.requests[admitted])
            pre = self.prefill_cost(k)
            if pre > 0:
                self.prefill_ms_total += pre
                yield env.timeout(pre)
            self.start_ms[admitted] = env.now

    def engine(self):
        env, batch = self.env, self.batch
        done, n = 0, len(self.arrival_ms)
        while done < n:
            yield from self._admit()
            # the last arrival is in and none waits: the batch drains (docs/design.md §2.1)
            self.stepper.draining = self.arrived == n and not self.queue.items
            step_ms, _tokens, finished = self.stepper.step()
            yield env.timeout(step_ms)
            uid = batch.uid
            first = np.isnan(self.first_token_ms[uid])
            if first.any():
                self.first_token_ms[uid[first]] = env.now
            if finished.any():
                ended = uid[finished]
                self.finish_ms[ended] = env.now
                self.output_tokens[ended] = batch.produced[finished]
                batch.remove(finished)
                done += len(ended)
