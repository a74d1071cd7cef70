"""``SimConfig``: every option of a simulation, validated once.

One frozen dataclass carries the options from the CLI (or a caller) through
:func:`~.simulate.simulate`, :func:`~.loop.run_closed_loop` / :func:`~.loop.run_open_loop`,
:func:`~.protocol.simulate_benchmarks` and :func:`~.sweep.sweep` (one picklable object per sweep
job). ``__post_init__`` checks every field that needs no input file (the batch sizes against the
cost curve, and prefill against it, are checked by ``simulate`` once the curve is loaded) and raises
:class:`SimulationError` naming the field; the policy names and parameters go through the one
validation path of :func:`dcut_sched.policies.check_params` (no policy is built: ``simulate``
builds each once). :meth:`SimConfig.to_dict` / :meth:`SimConfig.from_dict`
round-trip through JSON-able dicts (result metadata, job files).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Union

from .. import policies as policy_registry
from ..policies import Policy
from ..util.inputs import shown
from .defaults import DEFAULT_BATCH_SIZES, DEFAULT_NUM_STEPS, DEFAULT_WARMUP_STEPS

__all__ = ["DEFAULT_LOAD", "DEFAULT_OPEN_REQUESTS", "MODES", "SimConfig", "SimulationError"]

MODES = ("closed", "open")
#: Open loop without a rate: arrivals at this fraction of the ``ar`` capacity at the max batch size.
DEFAULT_LOAD = 0.7
DEFAULT_OPEN_REQUESTS = 400


class SimulationError(ValueError):
    """A simulation cannot run as asked (batch size outside the cost curve, bad option, ...)."""


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) or type(value).__module__ == "numpy" and \
        hasattr(value, "dtype") and value.dtype.kind in "iu"


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) or \
        hasattr(value, "dtype") and value.dtype.kind in "iuf" and math.isfinite(float(value))


#: A policy given by name, as an instance, or as ``(name, params)``.
PolicySpec = Union[str, Policy, tuple]




def _label(name: str, params: Mapping[str, Any]) -> str:
    """``name``, or ``name(key=value,...)`` with the parameters that differ from the constructor's
    defaults (read from its signature: no policy is built for a label)."""
    default = policy_registry.param_defaults(name)
    changed = {k: v for k, v in params.items() if default.get(k) != v}
    if not changed:
        return name
    return f"{name}(" + ",".join(f"{k}={v}" for k, v in changed.items()) + ")"


def policy_specs(
    specs: Iterable[PolicySpec] | None = None, policy_params: Mapping[str, Mapping[str, Any]] | None = None
) -> list[tuple[str, str, dict[str, Any] | Policy]]:
    """``[(label, name, params or the instance given)]``, ``ar`` first if missing, every name and
    parameter checked (:func:`dcut_sched.policies.check_params`, the one validation path) and no
    policy built: what :class:`SimConfig` validates and :func:`resolve_policies` builds.

    Raises:
        SimulationError: unknown policy name, bad parameter key or kind, or a duplicate label.
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
    out: list[tuple[str, str, dict[str, Any] | Policy]] = []
    for spec in specs:
        if isinstance(spec, Policy):
            out.append((_label(spec.name, spec.params()), spec.name, spec))
            continue
        name, params = (spec, dict(policy_params.get(spec, {}))) if isinstance(spec, str) else (spec[0], dict(spec[1]))
        try:
            policy_registry.check_params(name, params)
        except KeyError as exc:
            raise SimulationError(str(exc.args[0])) from None
        except ValueError as exc:
            raise SimulationError(f"policy {name!r} with parameters {shown(params, 120)}: {exc}") from None
        out.append((_label(name, params), name, params))
    labels = [label for label, _, _ in out]
    dupes = sorted({lab for lab in labels if labels.count(lab) > 1})
    if dupes:
        raise SimulationError(f"policy {dupes[0]!r} is listed twice")
    if not any(name == "ar" and label == "ar" for label, name, _ in out):
        out.insert(0, ("ar", "ar", {}))
    return out


def resolve_policies(
    specs: Iterable[PolicySpec] | None = None, policy_params: Mapping[str, Mapping[str, Any]] | None = None
) -> list[tuple[str, Policy]]:
    """``[(label, policy)]`` from names, instances or ``(name, params)``; ``ar`` first if missing.
    Each policy given by name is built here, once (:func:`dcut_sched.policies.get`); every run then
    works on a reset deep copy of it.

    Args:
        specs: policies (None: every registered policy, in registry order).
        policy_params: extra parameters per policy name for specs given by name,
            e.g. ``{"uniform": {"rho": 0.25}}``.

    Raises:
        SimulationError: unknown policy name, bad parameters (a value out of range included), or a
            duplicate label.
    """
    out: list[tuple[str, Policy]] = []
    for label, name, given in policy_specs(specs, policy_params):
        if isinstance(given, Policy):
            out.append((label, given))
            continue
        try:
            out.append((label, policy_registry.get(name, **given)))
        except (TypeError, ValueError) as exc:
            raise SimulationError(f"policy {name!r} with parameters {shown(given, 120)}: {exc}") from None
    return out


@dataclass(frozen=True)
class SimConfig:
    """The options of one simulation (all keyword; defaults = ``dcut-sim``'s for one trace).

    Attributes:
        policies: policy names, :class:`~dcut_sched.policies.Policy` instances or ``(name, params)``
            (``None``: every registered policy); ``ar`` is always run as the baseline.
        policy_params: parameters for policies given by name, e.g. ``{"topk": {"rho": 0.25}}``.
        batch_sizes: closed loop: concurrent requests; open loop: maximum batch sizes (distinct
            integers >= 1).
        mode: ``"closed"`` (fixed concurrency, steady state) or ``"open"`` (Poisson arrivals).
        num_steps / warmup_steps: closed loop: steps per run (>= 1), and leading steps left out of
            the figures (``0 <= warmup_steps < num_steps``).
        seed: seeds the request order, the arrival times and a sampled trace's draws (>= 0).
        shuffle: shuffle the request order (False: the trace's order).
        overhead_ms: fixed time added to every drafted step (controller overhead), finite, >= 0.
        draft_scale: multiplier on the curve's draft step (what-if), finite, > 0.
        calibrator: optional confidence calibrator (:class:`~.loop.Calibrator`, e.g.
            :class:`~dcut_sched.calibration.OnlineCalibrator`); each run gets a deep copy as given.
        graph_token_counts: the token counts a CUDA-graph bank captured (at every batch size): the
            controller's policy only chooses among them (``fine``, unless given its own
            ``allowed_num_tokens``) and every drafted step is charged at its padded cell
            (:class:`~dcut_sched.controller.step_driver.GraphCells`). ``None``: every budget has a graph.
        rate_rps: open loop: arrival rate, requests/s (> 0; ``None``: ``load`` x the ``ar``
            capacity at each max batch size).
        load: open loop: the load used when ``rate_rps`` is None (> 0).
        num_requests: open loop: arrivals per run (>= 1).
        warmup_requests: open loop: first arrivals left out of latency figures (``None``: 10 %).
        prompt_len / prefill_ms: open loop prefill cost, ``C_verify(k, k * prompt_len)`` or ``k *
            prefill_ms`` for k admitted requests (``prompt_len`` wins when both are given); neither:
            free.
        slo_tpot_ms: open loop: TPOT objective for goodput (> 0).

    Raises:
        SimulationError: from ``__post_init__``, naming the field, its value and the valid range.
    """

    policies: tuple | None = None
    policy_params: Mapping[str, Mapping[str, Any]] | None = None
    batch_sizes: tuple[int, ...] = tuple(DEFAULT_BATCH_SIZES)
    mode: str = "closed"
    num_steps: int = DEFAULT_NUM_STEPS
    warmup_steps: int = DEFAULT_WARMUP_STEPS
    seed: int = 0
    shuffle: bool = True
    overhead_ms: float = 0.0
    draft_scale: float = 1.0
    calibrator: Any = field(default=None, compare=False)
    graph_token_counts: tuple[int, ...] | None = None
    rate_rps: float | None = None
    load: float = DEFAULT_LOAD
    num_requests: int = DEFAULT_OPEN_REQUESTS
    warmup_requests: int | None = None
    prompt_len: int | None = None
    prefill_ms: float | None = None
    slo_tpot_ms: float | None = None

    def __post_init__(self) -> None:
        def fail(name: str, why: str) -> None:
            raise SimulationError(f"{name}={getattr(self, name)!r} {why}")

        def put(name: str, value: Any) -> None:  # normalise a field of the frozen instance
            object.__setattr__(self, name, value)

        if self.mode not in MODES:
            raise SimulationError(f"mode {self.mode!r} must be one of {MODES}")
        if self.policies is not None:
            if isinstance(self.policies, (str, bytes)):
                put("policies", (self.policies,))
            put("policies", tuple(tuple(p) if isinstance(p, list) else p for p in self.policies))
        if self.policy_params is not None:
            if not isinstance(self.policy_params, Mapping) or not all(
                    isinstance(v, Mapping) for v in self.policy_params.values()):
                fail("policy_params", "must map policy names to {parameter: value} dicts")
            put("policy_params", {str(k): dict(v) for k, v in self.policy_params.items()})
        if self.policies is not None or self.policy_params:
            policy_specs(self.policies, self.policy_params)
        sizes = list(self.batch_sizes) if not isinstance(self.batch_sizes, (int, str)) else [self.batch_sizes]
        if not sizes:
            raise SimulationError("no batch sizes given (batch_sizes is empty)")
        for bs in sizes:
            if not _is_int(bs) or bs < 1:
                raise SimulationError(
                    f"batch size {bs!r} must be a positive integer (batch_sizes={self.batch_sizes!r})")
        if len(set(sizes)) != len(sizes):
            raise SimulationError(f"batch sizes {sizes} repeat a value (batch_sizes)")
        put("batch_sizes", tuple(int(b) for b in sizes))
        if not _is_int(self.num_steps) or self.num_steps < 1:
            fail("num_steps", "must be an integer >= 1")
        if not _is_int(self.warmup_steps):
            fail("warmup_steps", "must be an integer")
        if self.mode == "closed" and not (0 <= self.warmup_steps < self.num_steps):
            raise SimulationError(f"need 0 <= warmup_steps ({self.warmup_steps}) < num_steps ({self.num_steps})")
        if not _is_int(self.seed) or self.seed < 0:
            fail("seed", "must be an integer >= 0")
        if not (_finite(self.overhead_ms) and self.overhead_ms >= 0):
            fail("overhead_ms", "must be a finite number >= 0")
        if not (_finite(self.draft_scale) and self.draft_scale > 0):
            fail("draft_scale", "must be a finite number > 0")
        put("overhead_ms", float(self.overhead_ms))
        put("draft_scale", float(self.draft_scale))
        put("shuffle", bool(self.shuffle))
        if self.graph_token_counts is not None:
            counts = list(self.graph_token_counts)
            if not counts or not all(_is_int(k) and k >= 1 for k in counts):
                fail("graph_token_counts", "must be a non-empty list of token counts >= 1 (or None)")
            put("graph_token_counts", tuple(sorted({int(k) for k in counts})))
        if self.rate_rps is not None and not (_finite(self.rate_rps) and self.rate_rps > 0):
            fail("rate_rps", "must be a finite number > 0 (or None)")
        if not (_finite(self.load) and self.load > 0):
            fail("load", "must be a finite number > 0")
        if not _is_int(self.num_requests) or self.num_requests < 1:
            fail("num_requests", "must be an integer >= 1")
        if self.warmup_requests is not None and not (_is_int(self.warmup_requests) and
                                                     0 <= self.warmup_requests < self.num_requests):
            fail("warmup_requests", f"must be an integer in [0, num_requests={self.num_requests}) (or None)")
        if self.prompt_len is not None and not (_is_int(self.prompt_len) and self.prompt_len >= 1):
            fail("prompt_len", "must be an integer >= 1 (or None)")
        if self.prefill_ms is not None and not (_finite(self.prefill_ms) and self.prefill_ms >= 0):
            fail("prefill_ms", "must be a finite number >= 0 (or None)")
        if self.slo_tpot_ms is not None and not (_finite(self.slo_tpot_ms) and self.slo_tpot_ms > 0):
            fail("slo_tpot_ms", "must be a finite number > 0 (or None)")

    # ------------------------------------------------------------------ derived
    @property
    def open_warmup_requests(self) -> int:
        """Open-loop warm-up arrivals: ``warmup_requests``, or 10 % of ``num_requests``."""
        return self.num_requests // 10 if self.warmup_requests is None else int(self.warmup_requests)

    @property
    def drafting(self) -> bool:
        """Whether any policy other than ``ar`` may run (``None``: every policy)."""
        if self.policies is None:
            return True
        return any(_policy_name(p) != "ar" for p in self.policies)

    def replace(self, **changes: Any) -> "SimConfig":
        """A copy with ``changes`` (validated again; its policies are built again when used)."""
        return dataclasses.replace(self, **changes)

    @functools.cached_property
    def built_policies(self) -> list:
        """``[(label, policy)]``, ``ar`` first: this config's policies, built on first use
        (:func:`resolve_policies`) and kept; every run works on a reset deep copy.

        Raises:
            SimulationError: a parameter the policy's constructor refuses (a value out of range).
        """
        return resolve_policies(self.policies, self.policy_params)

    # ------------------------------------------------------------------ dicts
    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict of every field: policies as names or ``[name, params]``, the calibrator as
        ``None`` or its constructor parameters (``calibrator.params()``; a calibrator without one
        is written as its class name and cannot be read back)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "policies" and value is not None:
                value = [p if isinstance(p, str) else [_policy_name(p), dict(_policy_params(p))] for p in value]
            elif f.name == "calibrator" and value is not None:
                value = dict(value.params()) if hasattr(value, "params") else type(value).__name__
                if isinstance(value, dict) and isinstance(value.get("depth_bands"), tuple):
                    value["depth_bands"] = list(value["depth_bands"])
            elif isinstance(value, tuple):
                value = list(value)
            elif f.name == "policy_params" and value is not None:
                value = {k: dict(v) for k, v in value.items()}
            out[f.name] = value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "SimConfig":
        """A config from :meth:`to_dict`'s output (or any subset of the fields).

        ``calibrator``: ``None``, a :class:`~dcut_sched.calibration.OnlineCalibrator`'s parameters
        (dict; ``True``: the default one), or a calibrator object.

        Raises:
            SimulationError: an unknown key (the message lists the fields) or a bad value.
        """
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = [k for k in data if k not in names]
        if unknown:
            raise SimulationError(f"SimConfig has no field {unknown[0]!r}; fields: {', '.join(names)}")
        values = dict(data)
        cal = values.get("calibrator")
        if cal is True or isinstance(cal, Mapping):
            from ..calibration import OnlineCalibrator  # torch: only when a calibrator is asked for

            params = {} if cal is True else dict(cal)
            block_size = params.pop("block_size", None)
            try:
                values["calibrator"] = OnlineCalibrator(block_size, **params)
            except (TypeError, ValueError) as exc:
                raise SimulationError(f"calibrator={cal!r}: {exc}") from None
        elif isinstance(cal, str):
            raise SimulationError(f"calibrator={cal!r}: a custom calibrator cannot be rebuilt from its name; "
                                  f"pass the object")
        return cls(**values)


def _policy_name(spec: Any) -> str:
    if isinstance(spec, str):
        return spec
    if isinstance(spec, (tuple, list)):
        return str(spec[0])
    return spec.name


def _policy_params(spec: Any) -> Mapping[str, Any]:
    if isinstance(spec, (tuple, list)):
        return spec[1]
    return spec.params()
