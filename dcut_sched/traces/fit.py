"""Fit the synthetic generator's parameters to a trace or to published figures (simulated moments).

The fit minimises a weighted sum of squared differences between **summary statistics** of a
synthetic trace (:mod:`dcut_sched.traces.synth`, common random numbers: the same seed at every
evaluation) and the same statistics of the target, with ``scipy.optimize.differential_evolution``
(bounded, derivative-free: the simulated statistics are piecewise constant in the parameters)
followed by a Nelder-Mead polish. The statistics (:func:`moments`):

- the selection curve at ``bs`` = 32: tokens per request produced by ``uniform`` at rho = 0.25, 0.5,
  0.75, 1 and by ``topk`` at rho = 0.25, 0.5, 0.75, from the project's policies
  (:func:`dcut_sched.traces.stats.selection_curve_arrays`);
- the acceptance-length histogram of the full-verification replay (shares);
- mean confidence of reached draft slots, of accepted ones and of rejected ones (calibration and
  separation);
- s.d. across requests of the per-request tau (request difficulty spread).

A published figure set (e.g. the DFlash selection curve) uses only the statistics it gives.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
from rich.table import Table
from scipy.optimize import differential_evolution, minimize

from ..util.console import make_console
from .stats import reached_slots, replay_rows, selection_curve_arrays
from .synth import SynthParams, generate
from .trace import Trace

__all__ = ["FIT_BOUNDS", "FitResult", "fit_moments", "fit_trace", "moments", "print_fit"]

#: Search bounds of the fitted parameters.
FIT_BOUNDS: dict[str, tuple[float, float]] = {
    "accept_logit": (-3.0, 7.0),
    "depth_decay": (-0.3, 1.0),
    "request_sd": (0.0, 3.0),
    "position_sd": (0.0, 4.0),
    "separation": (0.0, 4.0),
    "calibration_slope": (0.2, 3.0),
    "calibration_bias": (-3.0, 3.0),
}
POPSIZE = 6  # differential evolution's population per fitted parameter
CURVE_RATIOS = (0.25, 0.5, 0.75, 1.0)
CURVE_BATCH = 32


def moments(trace: Trace, num_batches: int = 100, seed: int = 0, batch_size: int = CURVE_BATCH) -> dict[str, np.ndarray]:
    """The summary statistics the fit matches (see the module docstring), as named arrays.

    Keys: ``uniform`` [4] and ``topk`` [3] tokens per request at ``CURVE_RATIOS``;
    ``hist`` [B] replay acceptance-length shares; ``conf`` [3] mean confidence of reached, accepted
    and rejected slots; ``request_tau_sd`` [1]; ``tau`` [1] (full-verification replay).
    """
    steps = replay_rows(trace)
    curve = selection_curve_arrays(trace, batch_size=batch_size, ratios=CURVE_RATIOS, num_batches=num_batches,
                            seed=seed, steps=steps)
    a = trace.accept_len[steps].astype(np.int64)
    hist = np.bincount(a, minlength=trace.block_size) / max(len(a), 1)
    conf, ok = reached_slots(trace)

    def mean(x: np.ndarray) -> float:
        return float(x.mean()) if x.size else 0.0

    req = np.searchsorted(trace.starts, steps, side="right") - 1
    per_req = np.bincount(req, weights=1 + a, minlength=trace.num_requests) / np.maximum(
        np.bincount(req, minlength=trace.num_requests), 1)
    return {
        "uniform": curve["uniform"] / batch_size,
        "topk": curve["topk"][:-1] / batch_size,
        "hist": hist,
        "conf": np.array([mean(conf), mean(conf[ok]), mean(conf[~ok])]),
        "request_tau_sd": np.array([float(per_req.std())]),
        "tau": np.array([float((1 + a).mean()) if a.size else 1.0]),
    }


#: Weight of each statistic in the objective (per element).
WEIGHTS = {"uniform": 1.0, "topk": 1.0, "hist": 20.0, "conf": 4.0, "request_tau_sd": 0.5, "tau": 1.0}


@dataclass
class FitResult:
    """Outcome of a fit.

    Attributes:
        params: fitted generator parameters.
        target: the target statistics used (name -> array).
        fitted: the same statistics of a synthetic trace from ``params``.
        rel_errors: per fitted curve point / tau, relative error ``(fitted - target) / target``.
        rms_rel_error: root mean square of ``rel_errors``.
        objective: final objective value.
        evaluations: objective evaluations used.
    """

    params: SynthParams
    target: dict[str, np.ndarray]
    fitted: dict[str, np.ndarray]
    rel_errors: dict[str, list[float]] = field(default_factory=dict)
    rms_rel_error: float = float("nan")
    objective: float = float("nan")
    evaluations: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "params": self.params.to_dict(),
            "target": {k: v.tolist() for k, v in self.target.items()},
            "fitted": {k: v.tolist() for k, v in self.fitted.items() if k in self.target},
            "rel_errors": self.rel_errors,
            "rms_rel_error": self.rms_rel_error,
            "objective": self.objective,
            "evaluations": self.evaluations,
        }


def _objective_terms(sim: dict[str, np.ndarray], target: dict[str, np.ndarray]) -> float:
    total = 0.0
    for key, want in target.items():
        total += WEIGHTS.get(key, 1.0) * float(np.sum((sim[key] - want) ** 2))
    return total


def min_evals(num_names: int) -> int:
    """The fewest evaluations a fit of ``num_names`` parameters runs: the initial population and one generation."""
    return 2 * POPSIZE * num_names


def fit_moments(target: dict[str, np.ndarray], base: SynthParams, fit_names: Sequence[str], *,
                num_requests: int = 96, num_batches: int = 100, seed: int = 0, max_evals: int = 400,
                bounds: dict[str, tuple[float, float]] | None = None) -> FitResult:
    """Fit ``fit_names`` of ``base`` so that :func:`moments` of synthetic traces match ``target``.

    Args:
        target: statistic name -> target array (a subset of :func:`moments`' keys).
        base: parameters to start from; the others stay fixed.
        fit_names: parameters to fit (keys of :data:`FIT_BOUNDS`).
        num_requests: requests per synthetic trace at each evaluation.
        num_batches: selection-curve batches per evaluation.
        seed: seed of the synthetic traces and the batch sampling (common random numbers).
        max_evals: evaluation budget (differential evolution gets ~75%, the polish the rest); at least
            :func:`min_evals` of the fitted names, else ``ValueError`` (the budget would be exceeded).

    Returns:
        :class:`FitResult`.
    """
    bounds = {**FIT_BOUNDS, **(bounds or {})}
    names = list(fit_names)
    unknown = [n for n in names if n not in bounds]
    if unknown:
        raise ValueError(f"cannot fit {unknown}; fittable parameters: {sorted(bounds)}")
    if max_evals < min_evals(len(names)):
        raise ValueError(f"max_evals={max_evals} is below the {min_evals(len(names))} evaluations a fit of "
                         f"{len(names)} parameters runs at least")
    box = [bounds[n] for n in names]
    evals = 0

    def params_of(x: np.ndarray) -> SynthParams:
        vals = {n: float(np.clip(v, lo, hi)) for n, v, (lo, hi) in zip(names, x, box)}
        return base.replace(**vals)

    def sim(p: SynthParams) -> dict[str, np.ndarray]:
        return moments(generate(p, num_requests=num_requests, seed=seed), num_batches=num_batches, seed=seed)

    def f(x: np.ndarray) -> float:
        nonlocal evals
        evals += 1
        return _objective_terms(sim(params_of(x)), target)

    popsize = POPSIZE
    per_gen = popsize * len(names)
    maxiter = max(1, int(0.75 * max_evals) // per_gen - 1)
    x0 = np.array([np.clip(getattr(base, n), lo, hi) for n, (lo, hi) in zip(names, box)])
    de = differential_evolution(f, box, seed=seed, maxiter=maxiter, popsize=popsize, tol=1e-6, polish=False,
                                init="latinhypercube", x0=x0)
    best_x, best_f = de.x, de.fun
    left = max_evals - evals
    if left > 2 * len(names):
        nm = minimize(f, best_x, method="Nelder-Mead",
                      options={"maxfev": left, "xatol": 1e-3, "fatol": 1e-7, "initial_simplex": None})
        if nm.fun < best_f:
            best_x, best_f = nm.x, nm.fun
    params = params_of(best_x)
    fitted = sim(params)
    rel: dict[str, list[float]] = {}
    for key in ("uniform", "topk"):
        if key in target:
            rel[key] = ((fitted[key] - target[key]) / target[key]).tolist()
    if "tau" in target or "hist" in target:
        tau_t = float(target["tau"][0]) if "tau" in target else float(
            np.sum(target["hist"] * np.arange(1, len(target["hist"]) + 1)))
        rel["tau"] = [(float(fitted["tau"][0]) - tau_t) / tau_t]
    flat = [x for v in rel.values() for x in v]
    rms = float(np.sqrt(np.mean(np.square(flat)))) if flat else float("nan")
    return FitResult(params, target, fitted, rel, rms, float(best_f), evals)


def fit_trace(trace: Trace, *, seed: int = 0, max_evals: int = 400, num_batches: int = 100) -> FitResult:
    """Fit every parameter of :data:`FIT_BOUNDS` to a position-indexed trace.

    The block size and output-length distribution are copied from the trace (median and s.d. of
    log length); the rest is fitted to all of :func:`moments`.
    """
    lengths = trace.num_positions.astype(np.float64)
    base = SynthParams(
        block_size=trace.block_size,
        length_median=float(np.median(lengths)),
        length_sd=float(np.std(np.log(lengths))),
        min_length=int(lengths.min()),
        max_length=int(lengths.max()),
    )
    target = moments(trace, num_batches=num_batches, seed=seed)
    target.pop("tau")  # carried by the histogram
    return fit_moments(target, base, list(FIT_BOUNDS), seed=seed, max_evals=max_evals, num_batches=num_batches,
                       num_requests=max(64, trace.num_requests))


def print_fit(result: FitResult) -> None:
    """Print a fit result as rich tables and a labelled summary line."""
    console = make_console()
    p = Table(title="Fitted generator parameters")
    p.add_column("parameter")
    p.add_column("value", justify="right")
    for k, v in result.params.to_dict().items():
        p.add_row(k, f"{v:.4g}" if isinstance(v, float) else str(v))
    console.print(p)
    t = Table(title=f"Fit (RMS relative error {result.rms_rel_error:.2%}, {result.evaluations} evaluations)")
    for col in ("statistic", "target", "fitted", "relative error"):
        t.add_column(col, justify="right")
    worst = ("", 0.0)
    for key, want in result.target.items():
        got = result.fitted[key]
        errs = list(result.rel_errors.get(key, []))
        for i, e in enumerate(errs):
            if abs(e) > abs(worst[1]):
                worst = (f"{key}[{i}]" if len(errs) > 1 else key, e)
        t.add_row(key, " ".join(f"{x:.3f}" for x in want), " ".join(f"{x:.3f}" for x in got),
                  " ".join(f"{e:+.1%}" for e in errs))
    for key in (k for k in result.rel_errors if k not in result.target):  # e.g. tau, derived from the histogram
        errs = list(result.rel_errors[key])
        for i, e in enumerate(errs):
            if abs(e) > abs(worst[1]):
                worst = (key, e)
        fitted = result.fitted.get(key)
        t.add_row(key, "(from hist)", "" if fitted is None else " ".join(f"{x:.3f}" for x in np.atleast_1d(fitted)),
                  " ".join(f"{e:+.1%}" for e in errs))
    console.print(t)
    points = sum(len(v) for v in result.rel_errors.values())
    console.print(f"fit result: RMS relative error {result.rms_rel_error:.2%} over {points} statistics, worst "
                  f"{worst[0]} {worst[1]:+.1%}; objective {result.objective:.4g} after {result.evaluations} "
                  f"evaluations", highlight=False, soft_wrap=True)
