"""``simulate``: replay a trace under policies x batch sizes and return the results DataFrame."""

from __future__ import annotations

import os
from typing import Any, Callable, Sequence

import pandas as pd

from ..cost_curve import CostCurve, CostCurveError, CostCurveRangeError
from ..policies import Policy
from ..step_costs import StepCosts
from ..traces import Trace, TraceError, check_trace_columns
from .config import (
    DEFAULT_LOAD,
    DEFAULT_OPEN_REQUESTS,
    MODES,
    PolicySpec,
    SimConfig,
    SimulationError,
    policy_specs,
    resolve_policies,
)
from .parallel import run_cells, run_one
from .replay import output_lengths
from .results import CLOSED_COLUMNS, OPEN_COLUMNS, add_speedups

__all__ = [
    "DEFAULT_LOAD", "DEFAULT_OPEN_REQUESTS", "MODES", "PolicySpec", "SimConfig", "SimulationError", "check_simulation",
    "default_rate_rps", "policy_specs", "resolve_policies", "result_frame", "run_one", "run_tasks", "simulate",
]

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

    :meth:`StepCosts.check` (the step costs the runs will use) prices, at each batch size the runs
    reach (open loop: every one up to each maximum, as the batch drains), the plain step and, for
    drafting policies, every budget ``bs..bs*B`` of a drafted step and the undrafted step; so a
    curve that cannot answer one of them fails here, before anything runs. (The batch sizes
    themselves were checked by :class:`SimConfig`.)
    """
    cost = costs.cost
    measured = ", ".join(map(str, cost.batch_sizes))
    for bs in batch_sizes:
        for b in (range(1, bs + 1) if mode == "open" else (bs,)):
            try:
                costs.check([b], drafted=drafting, undrafted=drafting, plain=True, every_budget=drafting)
            except (CostCurveRangeError, CostCurveError) as exc:
                why = (f" (open loop: the batch size varies over 1..{bs}, so the curve must cover each of them; "
                       f"measured batch sizes: {measured})" if mode == "open" else "")
                raise SimulationError(f"batch size {b} cannot be simulated{why}: {exc}") from None


def default_rate_rps(trace: Trace, cost: CostCurve, max_batch_size: int, load: float = DEFAULT_LOAD) -> float:
    """Arrival rate (requests/s) at ``load`` times the ``ar`` capacity at ``max_batch_size``.

    ``ar`` capacity = ``1000 * bs / C_ar(bs)`` tokens/s divided by the trace's mean output length.
    """
    tokens_per_s = 1000.0 * StepCosts(cost, trace.block_size).plain_tokens_per_ms(max_batch_size)
    return float(load * tokens_per_s / output_lengths(trace).mean())


def sim_config(config: SimConfig | None = None, **options: Any) -> SimConfig:
    """``config`` with ``options`` (SimConfig fields) applied, or a SimConfig built from ``options``:
    how :func:`simulate`, :func:`check_simulation`, the protocol and the sweep accept both forms.

    Raises:
        SimulationError: a bad value; TypeError: an unknown option name.
    """
    if config is None:
        return SimConfig(**options)
    if not isinstance(config, SimConfig):
        raise TypeError(f"config must be a SimConfig; got {type(config).__name__} (use SimConfig.from_dict)")
    return config.replace(**options) if options else config


def _prepare(trace, cost, config: SimConfig) -> tuple[Trace, CostCurve, list[tuple[str, Policy]]]:
    """Load and check everything :func:`simulate` needs before it runs anything (the options were
    validated by :class:`SimConfig`; here what needs the trace and the cost curve). The policies are
    the config's, built once per config (:attr:`SimConfig.built_policies`); every run works on a reset
    deep copy."""
    trace, cost = _load(trace, cost)
    runs = config.built_policies
    drafting = any(p.name != "ar" for _, p in runs)
    # the step costs every run will build (StepCosts checks the block size)
    costs = StepCosts(cost, trace.block_size, overhead_ms=config.overhead_ms, draft_scale=config.draft_scale)
    _check_batch_sizes(costs, config.batch_sizes, drafting, config.mode)
    if config.mode == "open" and config.prompt_len is not None:
        prompt_len = config.prompt_len
        for bs in config.batch_sizes:
            for k in range(1, bs + 1):
                try:
                    costs.prefill_ms(k, prompt_len)
                except CostCurveRangeError as exc:
                    raise SimulationError(
                        f"prefill of prompt_len={prompt_len} is outside the cost curve: {exc}. Give a fixed "
                        f"per-request prefill time instead (prefill_ms / --prefill-ms)"
                    ) from None
    return trace, cost, runs


def check_simulation(trace, cost, config: SimConfig | None = None, **options: Any) -> None:
    """Raise what :func:`simulate` would raise for bad input, without simulating.

    Takes :func:`simulate`'s arguments. Raises TraceError, CostCurveError or SimulationError.
    """
    _prepare(trace, cost, sim_config(config, **options))


def simulate(
    trace: Trace | str | os.PathLike,
    cost: CostCurve | str | os.PathLike,
    config: SimConfig | None = None,
    *,
    on_run: Callable[[int, int, str], None] | None = None,
    jobs: int = 1,
    **options: Any,
) -> pd.DataFrame:
    """Replay ``trace`` with ``cost`` once per (policy, batch size); one result row each.

    Every run uses the same request sequence (``seed``), so differences between policies are the
    policy's. ``ar`` is always run (first) as the speedup baseline. Each run drives the online
    controller's step code (:class:`~dcut_sched.controller.step_driver.StepDriver`) on numpy arrays.

    Args:
        trace: a :class:`Trace` or a trace file path (validated on load).
        cost: a :class:`CostCurve` or a cost-curve JSON path; its block size must equal the trace's.
        config: the options, a :class:`~.config.SimConfig` (validated when built).
        on_run: called as ``on_run(done, total, label)`` after each run (progress bars).
        jobs: worker processes for the independent runs (1: this process; :func:`~.parallel.run_cells`).
            The rows are the same for every ``jobs``.
        **options: SimConfig fields (``policies``, ``policy_params``, ``batch_sizes``, ``mode``,
            ``num_steps``, ``warmup_steps``, ``seed``, ``shuffle``, ``overhead_ms``, ``draft_scale``,
            ``calibrator``, ``graph_token_counts``, ``rate_rps``, ``load``, ``num_requests``,
            ``warmup_requests``, ``prompt_len``, ``prefill_ms``, ``slo_tpot_ms``; see SimConfig):
            applied over ``config``, or, without one, building it
            (``simulate(t, c, batch_sizes=[4, 16])`` works as before).

    Returns:
        One row per (policy, batch_size) with the columns of :data:`~.results.CLOSED_COLUMNS` first
        (plus :data:`~.results.OPEN_COLUMNS` in open loop), then run details (steps, trace_cycles,
        ``approximate`` = step-indexed trace, ``trace``, ``cost``, ``mode``, ``seed``, ``draft_scale``,
        ``plain_step`` = provenance of ``C_ar``, ``prefill``).
        ``df.attrs`` holds the same run-level facts (``approximate``, ``mode``, ``warmup_steps``, ...).

    Raises:
        TraceError / CostCurveError: unreadable or invalid files, block-size mismatch.
        SimulationError: bad options, batch sizes/budgets outside the cost curve, or a budget no
            captured graph cell holds (``graph_token_counts``).
    """
    config = sim_config(config, **options)
    trace, cost, runs = _prepare(trace, cost, config)
    tasks = run_tasks(trace, cost, config, runs)
    total = len(tasks)

    def progress(done: int, n: int) -> None:
        if on_run is not None:
            label, _, bs, _ = tasks[n]
            on_run(done, total, f"{label} bs={bs}")

    rows = run_cells([(trace, cost, config)], [(0, *t) for t in tasks], jobs, progress)
    return result_frame(rows, trace, cost, config)


def run_tasks(trace: Trace, cost: CostCurve, config: SimConfig,
              runs: list[tuple[str, Policy]]) -> list[tuple[str, Policy, int, float | None]]:
    """The independent runs of :func:`simulate`, in its row order: ``(label, policy, bs, rate_rps)``
    for each batch size, then each policy (``rate_rps`` None in closed loop)."""
    tasks = []
    for bs in config.batch_sizes:
        rate = config.rate_rps if config.rate_rps is not None else (
            default_rate_rps(trace, cost, bs, config.load) if config.mode == "open" else None)
        tasks += [(label, policy, int(bs), rate) for label, policy in runs]
    return tasks


def result_frame(rows: list[dict], trace: Trace, cost: CostCurve, config: SimConfig) -> pd.DataFrame:
    """:func:`simulate`'s DataFrame from its run rows (in :func:`run_tasks` order): run details,
    speedups over ``ar`` at each batch size, the documented column order and ``attrs``."""
    mode = config.mode
    seed, draft_scale = config.seed, config.draft_scale
    prompt_len, prefill_ms = config.prompt_len, config.prefill_ms
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
        "num_steps": config.num_steps if mode == "closed" else None,
        "warmup_steps": config.warmup_steps if mode == "closed" else None,
        "trace_cycles": int(df["trace_cycles"].max()),
    })
    return df
