"""``simulate``: replay a trace under policies x batch sizes and return the results DataFrame."""

from __future__ import annotations

import os
from typing import Any, Callable, Iterable, Mapping, Sequence, Union

import numpy as np
import pandas as pd

from .. import policies as policy_registry
from ..cost_curve import CostCurve, CostCurveRangeError
from ..policies import Policy
from ..traces import Trace, TraceError, check_trace_columns
from .defaults import DEFAULT_BATCH_SIZES, DEFAULT_NUM_STEPS, DEFAULT_WARMUP_STEPS
from .engine import Calibrator, run_closed_loop, run_open_loop
from .replay import output_lengths
from .results import CLOSED_COLUMNS, OPEN_COLUMNS, add_speedups, closed_loop_row, open_loop_row
from .step_cost import StepCosts, step_costs

__all__ = [
    "MODES", "PolicySpec", "SimulationError", "check_simulation", "default_rate_rps", "resolve_policies", "simulate",
]

MODES = ("closed", "open")
#: A policy given by name, as an instance, or as ``(name, params)``.
PolicySpec = Union[str, Policy, tuple]
#: Open loop without a rate: arrivals at this fraction of the ``ar`` capacity at the max batch size.
DEFAULT_LOAD = 0.7
DEFAULT_OPEN_REQUESTS = 400


class SimulationError(ValueError):
    """A simulation cannot run as asked (batch size outside the cost curve, bad option, ...)."""


def _label(name: str, params: Mapping[str, Any]) -> str:
    default = policy_registry.get(name).params()
    changed = {k: v for k, v in params.items() if default.get(k) != v}
    if not changed:
        return name
    return f"{name}(" + ",".join(f"{k}={v}" for k, v in changed.items()) + ")"


def resolve_policies(
    specs: Iterable[PolicySpec] | None = None, policy_params: Mapping[str, Mapping[str, Any]] | None = None
) -> list[tuple[str, Policy]]:
    """``[(label, policy)]`` from names, instances or ``(name, params)``; ``ar`` first if missing.

    Args:
        specs: policies (None: every registered policy, in registry order).
        policy_params: extra parameters per policy name for specs given by name,
            e.g. ``{"uniform": {"rho": 0.25}}``.

    Raises:
        SimulationError: unknown policy name, bad parameters, or a duplicate label.
    """
    policy_params = dict(policy_params or {})
    unknown = set(policy_params) - set(policy_registry.names())
    if unknown:
        raise SimulationError(f"parameters given for unknown policy {sorted(unknown)[0]!r}; "
                              f"known policies: {', '.join(policy_registry.names())}")
    specs = list(policy_registry.names() if specs is None else specs)
    by_name = {s if isinstance(s, str) else (s.name if isinstance(s, Policy) else s[0]) for s in specs}
    unused = sorted(set(policy_params) - by_name)
    if unused:
        raise SimulationError(f"parameters given for policy {unused[0]!r}, which is not run; add it to the "
                              f"policies or drop its parameters")
    out: list[tuple[str, Policy]] = []
    for spec in specs:
        if isinstance(spec, Policy):
            name, params, policy = spec.name, spec.params(), spec
        else:
            name, params = (spec, dict(policy_params.get(spec, {}))) if isinstance(spec, str) else (spec[0], dict(spec[1]))
            try:
                policy = policy_registry.get(name, **params)
            except KeyError as exc:
                raise SimulationError(str(exc.args[0])) from None
            except (TypeError, ValueError) as exc:
                raise SimulationError(f"policy {name!r} with parameters {params}: {exc}") from None
        out.append((_label(name, params), policy))
    labels = [label for label, _ in out]
    dupes = sorted({lab for lab in labels if labels.count(lab) > 1})
    if dupes:
        raise SimulationError(f"policy {dupes[0]!r} is listed twice")
    if not any(p.name == "ar" and label == "ar" for label, p in out):
        out.insert(0, ("ar", policy_registry.get("ar")))
    return out


def _load(trace: Trace | str | os.PathLike, cost: CostCurve | str | os.PathLike) -> tuple[Trace, CostCurve]:
    """Load (and validate) the inputs. A :class:`Trace` built in code is validated here too, since the
    engine plans with ``validate=False`` on the trace's confidences."""
    if isinstance(trace, Trace):
        faults = check_trace_columns(trace.to_frame(), trace.metadata, trace.path or "<trace in memory>", max_faults=1)
        if faults:
            raise TraceError(str(faults[0]))
    else:
        trace = Trace.load(trace)
    if not isinstance(cost, CostCurve):
        cost = CostCurve.load(cost, check_hardware=False)
    return trace, cost


def _check_batch_sizes(costs: StepCosts, batch_sizes: Sequence[int], drafting: bool, mode: str) -> None:
    """Raise :class:`SimulationError` unless every step the runs can take is inside the cost curve.

    Asks ``costs`` (the step costs the runs will use) for each batch size's verify table, draft step
    and plain step, so a curve that cannot answer one of them fails here, before anything runs.
    """
    cost, block_size = costs.cost, costs.block_size
    where = f"cost curve {cost.path}" if cost.path else "cost curve"
    measured = ", ".join(map(str, cost.batch_sizes))
    for bs in batch_sizes:
        if not isinstance(bs, (int, np.integer)) or bs < 1:
            raise SimulationError(f"batch size {bs!r} must be a positive integer")
        needed = range(1, bs + 1) if mode == "open" else (bs,)
        for b in needed:
            try:
                first, last = costs.token_range(b)
                if first > b or (drafting and last < b * block_size):
                    raise CostCurveRangeError(
                        f"{where}: at batch_size={b} it covers num_tokens {first}..{last}, not "
                        f"{b}..{b * block_size if drafting else b} (every request verifies 1..B={block_size} "
                        f"slots); profile those token counts"
                    )
                costs.plain_ms(b)
                if drafting:
                    costs.draft_ms(b)
            except CostCurveRangeError as exc:
                why = (f" (open loop: the batch size varies over 1..{bs}, so the curve must cover each of them; "
                       f"measured batch sizes: {measured})" if mode == "open" else "")
                raise SimulationError(f"batch size {b} cannot be simulated{why}: {exc}") from None


def default_rate_rps(trace: Trace, cost: CostCurve, max_batch_size: int, load: float = DEFAULT_LOAD) -> float:
    """Arrival rate (requests/s) at ``load`` times the ``ar`` capacity at ``max_batch_size``.

    ``ar`` capacity = ``1000 * bs / C_ar(bs)`` tokens/s divided by the trace's mean output length.
    """
    tokens_per_s = 1000.0 * step_costs(cost, trace.block_size).plain_tokens_per_ms(max_batch_size)
    return float(load * tokens_per_s / output_lengths(trace).mean())


def _prepare(
    trace, cost, *, policies=None, policy_params=None, batch_sizes=DEFAULT_BATCH_SIZES, mode="closed",
    num_steps=DEFAULT_NUM_STEPS, warmup_steps=DEFAULT_WARMUP_STEPS, overhead_ms=0.0, draft_scale=1.0, rate_rps=None,
    load=DEFAULT_LOAD, num_requests=DEFAULT_OPEN_REQUESTS, warmup_requests=None, prompt_len=None,
    prefill_ms=None, **_run_only: Any,
) -> tuple[Trace, CostCurve, list[tuple[str, Policy]], int]:
    """Load and check everything :func:`simulate` needs before it runs anything."""
    if mode not in MODES:
        raise SimulationError(f"mode {mode!r} must be one of {MODES}")
    trace, cost = _load(trace, cost)
    cost.require_block_size(trace.block_size)
    batch_sizes = list(batch_sizes)
    if not batch_sizes:
        raise SimulationError("no batch sizes given")
    if len(set(batch_sizes)) != len(batch_sizes):
        raise SimulationError(f"batch sizes {batch_sizes} repeat a value")
    if mode == "closed" and not (0 <= warmup_steps < num_steps):
        raise SimulationError(f"need 0 <= warmup_steps ({warmup_steps}) < num_steps ({num_steps})")
    if not 0 <= overhead_ms < float("inf"):
        raise SimulationError(f"overhead_ms={overhead_ms} must be a finite number >= 0")
    if not (draft_scale > 0 and np.isfinite(draft_scale)):
        raise SimulationError(f"draft_scale={draft_scale} must be a finite number > 0")
    if mode == "open":
        if num_requests < 1:
            raise SimulationError(f"num_requests={num_requests} must be >= 1")
        if rate_rps is not None and not rate_rps > 0:
            raise SimulationError(f"rate_rps={rate_rps} must be > 0")
        if rate_rps is None and not load > 0:
            raise SimulationError(f"load={load} must be > 0")
        if prompt_len is not None and prompt_len < 1:
            raise SimulationError(f"prompt_len={prompt_len} must be >= 1")
        if prefill_ms is not None and prefill_ms < 0:
            raise SimulationError(f"prefill_ms={prefill_ms} must be >= 0")
    runs = resolve_policies(policies, policy_params)
    drafting = any(p.name != "ar" for _, p in runs)
    _check_batch_sizes(StepCosts(cost, trace.block_size, overhead_ms, draft_scale), batch_sizes, drafting, mode)
    if mode == "open" and prompt_len is not None:
        for bs in batch_sizes:
            for k in range(1, bs + 1):
                try:
                    cost.verify_ms(k, k * int(prompt_len))
                except CostCurveRangeError as exc:
                    raise SimulationError(
                        f"prefill of prompt_len={prompt_len} is outside the cost curve: {exc}. Give a fixed "
                        f"per-request prefill time instead (prefill_ms / --prefill-ms)"
                    ) from None
    if warmup_requests is None:
        warmup_requests = num_requests // 10

    return trace, cost, runs, warmup_requests


def check_simulation(trace, cost, **simulate_kwargs: Any) -> None:
    """Raise what :func:`simulate` would raise for bad input, without simulating.

    Takes :func:`simulate`'s arguments. Raises TraceError, CostCurveError or SimulationError.
    """
    _prepare(trace, cost, **simulate_kwargs)


def simulate(
    trace: Trace | str | os.PathLike,
    cost: CostCurve | str | os.PathLike,
    *,
    policies: Iterable[PolicySpec] | None = None,
    policy_params: Mapping[str, Mapping[str, Any]] | None = None,
    batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
    mode: str = "closed",
    num_steps: int = DEFAULT_NUM_STEPS,
    warmup_steps: int = DEFAULT_WARMUP_STEPS,
    seed: int = 0,
    shuffle: bool = True,
    overhead_ms: float = 0.0,
    draft_scale: float = 1.0,
    calibrator: Calibrator | None = None,
    rate_rps: float | None = None,
    load: float = DEFAULT_LOAD,
    num_requests: int = DEFAULT_OPEN_REQUESTS,
    warmup_requests: int | None = None,
    prompt_len: int | None = None,
    prefill_ms: float | None = None,
    slo_tpot_ms: float | None = None,
    on_run: Callable[[int, int, str], None] | None = None,
) -> pd.DataFrame:
    """Replay ``trace`` with ``cost`` once per (policy, batch size); one result row each.

    Every run uses the same request sequence (``seed``), so differences between policies are the
    policy's. ``ar`` is always run (first) as the speedup baseline.

    Args:
        trace: a :class:`Trace` or a trace file path (validated on load).
        cost: a :class:`CostCurve` or a cost-curve JSON path; its block size must equal the trace's.
        policies: names, :class:`Policy` instances or ``(name, params)``; None = all registered policies.
        policy_params: parameters for policies given by name, e.g. ``{"topk": {"rho": 0.25}}``.
        batch_sizes: closed loop: concurrent requests; open loop: maximum batch sizes.
        mode: ``"closed"`` (fixed concurrency, steady state) or ``"open"`` (Poisson arrivals).
        num_steps / warmup_steps: closed loop: steps per run, and leading steps left out of the figures.
        seed: seeds the request order and the arrival times.
        shuffle: shuffle the request order (False: the trace's order).
        overhead_ms: fixed time added to every drafted step (controller overhead), ms.
        draft_scale: multiplier on the curve's draft step (what-if: a cheaper or dearer drafter).
        calibrator: optional confidence calibrator (:class:`~.engine.Calibrator`); each run gets a deep
            copy of it as given.
        rate_rps: open loop: arrival rate in requests/s (None: ``load`` x the ``ar`` capacity at each
            max batch size, see :func:`default_rate_rps`).
        load: open loop: the load used when ``rate_rps`` is None.
        num_requests: open loop: arrivals per run.
        warmup_requests: open loop: first arrivals left out of latency figures (None: 10%).
        prompt_len / prefill_ms: open loop prefill cost (see :func:`~.engine.run_open_loop`); neither = free.
        slo_tpot_ms: open loop: TPOT objective for goodput.
        on_run: called as ``on_run(done, total, label)`` after each run (progress bars).

    Returns:
        One row per (policy, batch_size) with the columns of :data:`~.results.CLOSED_COLUMNS` first
        (plus :data:`~.results.OPEN_COLUMNS` in open loop), then run details (steps, trace_cycles,
        ``approximate`` = step-indexed trace, ``trace``, ``cost``, ``mode``, ``seed``, ``draft_scale``,
        ``plain_step`` = provenance of ``C_ar``, ``prefill``).
        ``df.attrs`` holds the same run-level facts (``approximate``, ``mode``, ``warmup_steps``, ...).

    Raises:
        TraceError / CostCurveError: unreadable or invalid files, block-size mismatch.
        SimulationError: bad options, or batch sizes/budgets outside the cost curve.
    """
    trace, cost, runs, warmup_requests = _prepare(
        trace, cost, policies=policies, policy_params=policy_params, batch_sizes=batch_sizes, mode=mode,
        num_steps=num_steps, warmup_steps=warmup_steps, overhead_ms=overhead_ms, draft_scale=draft_scale,
        rate_rps=rate_rps, load=load,
        num_requests=num_requests, warmup_requests=warmup_requests, prompt_len=prompt_len, prefill_ms=prefill_ms,
    )
    batch_sizes = list(batch_sizes)
    rows = []
    total = len(runs) * len(batch_sizes)
    done = 0
    for bs in batch_sizes:
        rate = rate_rps if rate_rps is not None else (default_rate_rps(trace, cost, bs, load) if mode == "open" else None)
        for label, policy in runs:
            try:
                if mode == "closed":
                    run = run_closed_loop(
                        trace, cost, policy, bs, num_steps=num_steps, warmup_steps=warmup_steps, seed=seed,
                        shuffle=shuffle, overhead_ms=overhead_ms, draft_scale=draft_scale, calibrator=calibrator,
                        label=label,
                    )
                    rows.append(closed_loop_row(run))
                else:
                    run = run_open_loop(
                        trace, cost, policy, bs, rate_rps=rate, num_requests=num_requests,
                        warmup_requests=warmup_requests, seed=seed, shuffle=shuffle, overhead_ms=overhead_ms,
                        draft_scale=draft_scale,
                        calibrator=calibrator, prompt_len=prompt_len, prefill_ms=prefill_ms, label=label,
                    )
                    rows.append(open_loop_row(run, slo_tpot_ms))
            except CostCurveRangeError as exc:
                raise SimulationError(f"policy {label!r} at batch size {bs}: {exc}") from None
            done += 1
            if on_run is not None:
                on_run(done, total, f"{label} bs={bs}")

    df = pd.DataFrame(rows)
    df["trace"] = trace.path or trace.name
    df["cost"] = cost.path or repr(cost)
    df["mode"] = mode
    df["seed"] = seed
    df["draft_scale"] = float(draft_scale)
    df["plain_step"] = cost.ar_provenance  # where C_ar comes from ("assumed: ..." for a curve without ar rows)
    if mode == "open":
        df["prefill"] = (f"C_verify(k, k*{prompt_len})" if prompt_len is not None
                         else f"{prefill_ms} ms/request" if prefill_ms is not None else "none (free)")
    df = add_speedups(df, mode)
    lead = CLOSED_COLUMNS + (OPEN_COLUMNS if mode == "open" else [])
    df = df[lead + [c for c in df.columns if c not in lead]]
    df.attrs.update({
        "approximate": not trace.exact_replay,
        "indexing": trace.indexing,
        "mode": mode,
        "trace": str(df["trace"].iat[0]),
        "cost": str(df["cost"].iat[0]),
        "seed": seed,
        "draft_scale": float(draft_scale),
        "plain_step": cost.ar_provenance,
        "num_steps": num_steps if mode == "closed" else None,
        "warmup_steps": warmup_steps if mode == "closed" else None,
        "trace_cycles": int(df["trace_cycles"].max()),
    })
    return df
