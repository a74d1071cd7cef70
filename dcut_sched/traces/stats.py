"""Statistics of an acceptance trace: tau, per-depth acceptance, histogram, calibration, selection curve.

Definitions (docs/design.md §1, §3):

- **Full-verification replay**: each request starts at position 0 and, verifying all B slots, moves
  from p to ``p + 1 + accept_len[p]``. The positions it visits are the *steps* an engine running
  full verification would log. ``tau`` = tokens / steps over this replay (the published "mean
  acceptance length", bonus token included). ``tau_per_position`` averages ``1 + accept_len`` over
  every position instead (higher on autoregressive-drafter traces, whose accepted runs contribute
  every suffix of the run).
- **Per-depth acceptance rate** at depth t: ``P(accept_len >= t | accept_len >= t-1)`` over the steps.
- **Calibration**: every draft slot that is *reached* (all earlier drafts accepted, i.e.
  ``accept_len >= t-1``) at every position, its confidence against whether it was accepted
  (``accept_len >= t``). Reliability table on equal-width confidence bins; ECE = sum over bins of
  ``count/total * |accept_rate - mean_conf|`` (Guo et al. 2017).
- **Selection curve**: mean tokens produced by a batch of ``bs`` replay steps (drawn uniformly
  from all steps, so step-weighted like a running batch) when a policy verifies K slots, computed with the project's policies
  (``dcut_sched.policies``), so it is the simulator's own selection.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pandas as pd
from rich.table import Table
from scipy.stats import binned_statistic

from .. import policies
from ..scores import verified_prefix_tokens
from ..util.console import make_console
from .format import TraceError, check_trace_columns
from .trace import Trace, read_trace_file

__all__ = [
    "calibration_by_depth",
    "print_stats",
    "reliability",
    "replay_rows",
    "sample_replay_batches",
    "selection_curve_arrays",
    "selection_frame",
    "trace_stats",
    "validate_file",
]


def replay_rows(trace: Trace) -> np.ndarray:
    """Row indices visited by the full-verification replay, request by request (int64)."""
    nxt = np.arange(trace.num_rows) + 1 + trace.accept_len.astype(np.int64)
    out: list[int] = []
    for start, n in zip(trace.starts.tolist(), trace.num_positions.tolist()):
        r, end = start, start + n
        while r < end:
            out.append(r)
            r = int(nxt[r])
    return np.asarray(out, dtype=np.int64)


def reliability(conf: np.ndarray, accepted: np.ndarray, bins: int = 10) -> tuple[list[dict[str, float]], float]:
    """Reliability table and expected calibration error.

    Args:
        conf: ``[M]`` confidences in [0, 1].
        accepted: ``[M]`` bool outcomes.
        bins: equal-width bins on [0, 1].

    Returns:
        (rows ``{"lo", "hi", "count", "mean_conf", "accept_rate"}`` for non-empty bins, ECE).
    """
    conf = np.asarray(conf, dtype=np.float64)
    accepted = np.asarray(accepted, dtype=np.float64)
    if conf.size == 0:
        return [], float("nan")
    edges = np.linspace(0.0, 1.0, bins + 1)
    count, _, _ = binned_statistic(conf, conf, statistic="count", bins=edges)
    mean_conf, _, _ = binned_statistic(conf, conf, statistic="mean", bins=edges)
    rate, _, _ = binned_statistic(conf, accepted, statistic="mean", bins=edges)
    rows, ece = [], 0.0
    for b in range(bins):
        if count[b] == 0:
            continue
        rows.append({"lo": float(edges[b]), "hi": float(edges[b + 1]), "count": int(count[b]),
                     "mean_conf": float(mean_conf[b]), "accept_rate": float(rate[b])})
        ece += count[b] / conf.size * abs(rate[b] - mean_conf[b])
    return rows, float(ece)


def reached_slots(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """Confidences and outcomes of every reached draft slot at every position (for calibration)."""
    k = trace.block_size - 1
    a = trace.accept_len.astype(np.int64)[:, None]
    depth = np.arange(1, k + 1)[None, :]
    reached = a >= depth - 1
    # The length cap makes the slot right after the last position unreachable, not rejected.
    remaining = (np.repeat(trace.starts + trace.num_positions, trace.num_positions) - np.arange(trace.num_rows) - 1)
    reached &= depth <= remaining[:, None]
    return trace.conf[reached], (a >= depth)[reached]


def calibration_by_depth(trace: Trace, bins: int = 10) -> list[dict[str, float]]:
    """Per draft depth t = 1..B-1, the calibration of the reached slots' confidences.

    A slot at depth t is reached when drafts 1..t-1 were accepted (and the output is long enough);
    its outcome is whether draft t was accepted. Each row: ``depth``, ``reached`` (slots),
    ``mean_conf``, ``accept_rate``, ``gap`` = mean_conf - accept_rate (> 0 over-confident, < 0
    under-confident) and ``ece`` (expected calibration error of that depth's slots, ``bins`` bins).
    """
    k = trace.block_size - 1
    a = trace.accept_len.astype(np.int64)
    remaining = (np.repeat(trace.starts + trace.num_positions, trace.num_positions) - np.arange(trace.num_rows) - 1)
    rows = []
    for t in range(1, k + 1):
        reached = (a >= t - 1) & (t <= remaining)
        conf, ok = trace.conf[reached, t - 1].astype(np.float64), (a[reached] >= t)
        if conf.size == 0:
            rows.append({"depth": t, "reached": 0, "mean_conf": float("nan"), "accept_rate": float("nan"),
                         "gap": float("nan"), "ece": float("nan")})
            continue
        _, ece = reliability(conf, ok, bins)
        rows.append({"depth": t, "reached": int(conf.size), "mean_conf": float(conf.mean()),
                     "accept_rate": float(ok.mean()), "gap": float(conf.mean() - ok.mean()), "ece": float(ece)})
    return rows


def trace_stats(trace: Trace, bins: int = 10) -> dict[str, Any]:
    """All summary statistics of a trace as a JSON-ready dict (see the module docstring)."""
    k = trace.block_size - 1
    steps = replay_rows(trace)
    a_steps = trace.accept_len[steps].astype(np.int64)
    hist = np.bincount(a_steps, minlength=k + 1)
    at_least = hist[::-1].cumsum()[::-1]  # at_least[t] = #(a >= t)
    with np.errstate(invalid="ignore", divide="ignore"):
        depth_rate = at_least[1:] / at_least[:-1]
    conf, ok = reached_slots(trace)
    table, ece = reliability(conf, ok, bins)
    return {
        "file": trace.path,
        "block_size": trace.block_size,
        "source": trace.metadata.get("source"),
        "num_requests": trace.num_requests,
        "num_positions": trace.num_rows,
        "num_steps": int(len(steps)),
        "tau": float((1 + a_steps).mean()),
        "tau_per_position": float((1 + trace.accept_len.astype(np.int64)).mean()),
        "accept_rate_by_depth": [None if not np.isfinite(x) else float(x) for x in depth_rate],
        "accept_len_hist": hist.astype(int).tolist(),
        "mean_conf_by_depth": [float(x) for x in trace.conf[steps].mean(axis=0)],
        "reliability": table,
        "ece": ece,
        "calibration_by_depth": calibration_by_depth(trace, bins),
        "num_reached_slots": int(conf.size),
        **(_sampled_stats(trace, steps) if trace.sampled else {}),
    }


def _sampled_stats(trace: Trace, steps: np.ndarray) -> dict[str, Any]:
    """Sampled traces: temperature, mean target probability of each draft slot, and the expected tau.

    ``expected_tau`` = mean over the full-verification replay's steps of ``1 + sum_t prod_{j<=t} p_j``
    (greedy drafts under rejection sampling accept draft t with probability ``p_t`` given drafts < t),
    the exact expectation of which ``tau`` (from the recorded draws) is one sample.
    """
    prob = trace.target_prob[steps].astype(np.float64)
    return {
        "temperature": trace.temperature,
        "mean_target_prob_by_depth": [float(x) for x in prob.mean(axis=0)],
        "expected_tau": float((1 + np.cumprod(prob, axis=1).sum(axis=1)).mean()),
    }


def print_stats(stats: dict[str, Any]) -> None:
    """Print :func:`trace_stats` as rich tables."""
    console = make_console()
    console.print(f"[bold]{stats['file']}[/bold]: {stats['num_requests']} requests, {stats['num_positions']} "
                  f"positions, B={stats['block_size']}, source={stats['source']}")
    console.print(f"tau (full-verification replay, incl. bonus) = [bold]{stats['tau']:.3f}[/bold] over "
                  f"{stats['num_steps']} steps; per-position mean 1+accept_len = {stats['tau_per_position']:.3f}; "
                  f"ECE = {stats['ece']:.4f}")
    if "expected_tau" in stats:
        console.print(f"sampled trace, T = {stats['temperature']:g}: expected tau from p1..p{stats['block_size'] - 1} "
                      f"= [bold]{stats['expected_tau']:.3f}[/bold] (tau above is one recorded draw); mean p by depth: "
                      + " ".join(f"{x:.2f}" for x in stats["mean_target_prob_by_depth"]))
    depth = Table(title="Per-depth acceptance (replay steps)")
    for col in ("depth t", "P(accept t | t-1 accepted)", "steps with accept_len = t-1", "mean conf"):
        depth.add_column(col, justify="right")
    hist = stats["accept_len_hist"]
    for t, rate in enumerate(stats["accept_rate_by_depth"], start=1):
        depth.add_row(str(t), "-" if rate is None else f"{rate:.3f}", str(hist[t - 1]),
                      f"{stats['mean_conf_by_depth'][t - 1]:.3f}")
    console.print(depth)
    h = Table(title="Acceptance-length histogram (replay steps)")
    h.add_column("accept_len", justify="right")
    h.add_column("steps", justify="right")
    h.add_column("share", justify="right")
    total = max(sum(hist), 1)
    for a, c in enumerate(hist):
        h.add_row(str(a), str(c), f"{c / total:.3f}")
    console.print(h)
    rel = Table(title=f"Reliability (reached draft slots: {stats['num_reached_slots']})")
    for col in ("confidence bin", "slots", "mean conf", "accept rate", "gap"):
        rel.add_column(col, justify="right")
    for r in stats["reliability"]:
        rel.add_row(f"[{r['lo']:.1f}, {r['hi']:.1f})", str(r["count"]), f"{r['mean_conf']:.3f}",
                    f"{r['accept_rate']:.3f}", f"{r['accept_rate'] - r['mean_conf']:+.3f}")
    console.print(rel)


def sample_replay_batches(trace: Trace, batch_size: int, num_batches: int = 200, seed: int = 0,
                          steps: np.ndarray | None = None) -> np.ndarray:
    """``[num_batches, batch_size]`` int64 trace rows, each batch ``batch_size`` distinct replay steps.

    Rows are drawn uniformly from the positions a full-verification replay visits (with replacement
    only if the trace has fewer): in a running batch a request that accepts little stays for more
    steps, so batches are step-weighted, and at rho = 1 the mean tokens per request is the trace's
    tau. (Drawing uniformly from all rows would over-weight positions inside long accepted runs.)
    """
    if num_batches < 1 or batch_size < 1:
        raise ValueError(f"need num_batches >= 1 and batch_size >= 1; got {num_batches}, {batch_size}")
    rng = np.random.default_rng(seed)
    steps = replay_rows(trace) if steps is None else steps
    return np.stack([rng.choice(steps, size=batch_size, replace=len(steps) < batch_size) for _ in range(num_batches)])


def selection_frame(trace: Trace, batches: np.ndarray, budgets: Sequence[int],
                    policy_names: Sequence[str] = ("uniform", "topk")) -> pd.DataFrame:
    """Mean tokens per step when each policy verifies each budget on the given batches of trace rows.

    Each policy runs as ``policies.get(name, rho=K / (bs * B))`` (so ``uniform`` verifies
    ``ceil(K / bs)`` slots per request and ``topk`` the global top-K), plans every batch, and the
    batch produces ``sum(verified_prefix_tokens(accept_len, L))`` tokens (docs/design.md §1,
    :func:`dcut_sched.scores.verified_prefix_tokens`).

    Args:
        trace: the trace.
        batches: ``[num_batches, bs]`` row indices (e.g. :func:`sample_replay_batches`).
        budgets: verification budgets K in slots, each in ``[bs, bs*B]``.
        policy_names: registry names that take a ``rho`` parameter.

    Returns:
        One row per (policy, budget): ``policy, batch_size, budget, ratio, num_tokens`` (mean slots
        verified), ``accepted_tokens`` (mean tokens per step, bonus included), ``accepted_drafts``,
        ``expected_tokens`` (the plans' estimate), ``approximate`` (step-indexed trace).

    Raises:
        ValueError: bad batches or a budget outside ``[bs, bs*B]``.
    """
    batches = np.asarray(batches, dtype=np.int64)
    block = trace.block_size
    if batches.ndim != 2 or batches.size == 0 or batches.min() < 0 or batches.max() >= trace.num_rows:
        raise ValueError(f"batches must be [num_batches, bs] row indices in [0, {trace.num_rows})")
    bs, num_batches = batches.shape[1], batches.shape[0]
    bad = [k for k in budgets if not bs <= k <= bs * block]
    if bad:
        raise ValueError(f"budget {bad[0]} is outside [{bs}, {bs * block}] (bs={bs}, B={block})")
    accept = trace.accept_len.astype(np.int64)
    out = []
    for name in policy_names:
        for k in budgets:
            policy = policies.get(name, rho=k / (bs * block))
            verified = drafts = expected = 0.0
            for rows in batches:
                acc = accept[rows]
                kwargs = {"accept_len": acc} if policy.needs_accept_len else {}
                plan = policy.plan(trace.conf[rows], None, validate=False, **kwargs)
                verified += plan.num_tokens
                drafts += float((verified_prefix_tokens(acc, plan.lengths) - 1).sum())
                expected += plan.expected_tokens
            out.append({
                "policy": name, "batch_size": bs, "budget": int(k), "ratio": k / (bs * block),
                "num_tokens": verified / num_batches, "accepted_tokens": bs + drafts / num_batches,
                "accepted_drafts": drafts / num_batches, "expected_tokens": expected / num_batches,
                "approximate": not trace.exact_replay,
            })
    return pd.DataFrame(out)


def selection_curve_arrays(trace: Trace, batch_size: int = 32, ratios: Sequence[float] = (0.25, 0.5, 0.75, 1.0),
                           policy_names: Sequence[str] = ("uniform", "topk"), num_batches: int = 200, seed: int = 0,
                           steps: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Mean tokens a step-weighted batch produces when each policy verifies at each ratio.

    The array form of :func:`selection_frame` on :func:`sample_replay_batches` batches, with
    ``K = ceil(rho * bs * B)`` per ratio (what the preset fit compares with published figures).
    :func:`dcut_sched.simulator.selection_curve.selection_curve` is the table form for ``dcut-sim``
    (a DataFrame per policy and budget).

    Returns:
        ``{policy name: [len(ratios)] float64 mean tokens per batch}`` plus ``"num_tokens"``: the
        verified slots of each ratio.
    """
    budgets = [policies.budget_from_ratio(r, batch_size, trace.block_size) for r in ratios]
    batches = sample_replay_batches(trace, batch_size, num_batches, seed, steps)
    df = selection_frame(trace, batches, budgets, policy_names)
    out = {name: df.loc[df["policy"] == name, "accepted_tokens"].to_numpy(np.float64) for name in policy_names}
    out["num_tokens"] = np.array(budgets)
    return out


def validate_file(path: str, max_faults: int = 50) -> tuple[list[str], str]:
    """Validate one trace file without raising.

    Returns:
        (fault lines, each naming file, row, request, position and field; a short summary when OK).
    """
    try:
        df, meta = read_trace_file(path)
    except TraceError as exc:
        return [str(exc)], ""
    faults = check_trace_columns(df, meta, str(path), max_faults=max_faults)
    if faults:
        return [str(f) for f in faults], ""
    n_req = int(df["request_id"].nunique())
    return [], f"{n_req} requests, {len(df)} {meta.get('indexing', 'position')}s, B={meta.get('block_size')}"
