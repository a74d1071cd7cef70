"""The policy interface, the verification plan it returns, and the registry (docs/design.md §2).
A policy decides how many leading slots of each request's block the target verifies, as a pure
function of the confidences ``[bs, B-1]`` (numpy or torch, any device), the step costs
(:class:`~dcut_sched.step_costs.StepCosts`, never the curve) and its parameters; cross-step state
lives in ``policy.state``. The simulator and the controller share these objects; a plan syncs
with the host at most once (the budget decision).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ..scores import Array, check_confidences, expected_tokens, is_tensor, slot_scores, tensor_module
from ..step_costs import StepCosts
from .params import PolicyParamError, UnknownPolicyError, keys_text, params_model, validate_params
from .params import param_defaults as _param_defaults

__all__ = ["Policy", "PolicyParamError", "UnknownPolicyError", "VerifyPlan", "budget_from_ratio", "check_params", "get",
           "names", "param_defaults", "param_help", "policy_class", "register"]


@dataclass(frozen=True)
class VerifyPlan:
    """What to verify this step: ``lengths [bs]`` int64 in ``[1, B]`` (the confidences' kind and device;
    request i verifies slots ``1..lengths[i]``), ``num_tokens`` K = their sum, ``expected_tokens``
    (the sum of the verified slot scores), ``draft_next`` (whether the next step drafts) and
    ``drafted`` (whether this one had a draft).
    """

    lengths: Array
    num_tokens: int
    block_size: int
    expected_tokens: float
    draft_next: bool = True
    drafted: bool = True

    @property
    def batch_size(self) -> int:
        return int(self.lengths.shape[0])

    @property
    def ratio(self) -> float:
        """Verification ratio rho = num_tokens / (bs * B)."""
        return self.num_tokens / (self.batch_size * self.block_size)


def budget_from_ratio(rho: float, batch_size: int, block_size: int) -> int:
    """``K = ceil(rho * bs * B)`` clamped to ``[bs, bs*B]`` (every request keeps its anchor)."""
    if not (0.0 < rho <= 1.0):
        raise ValueError(f"verification ratio rho={rho} must be in (0, 1]")
    k = math.ceil(rho * batch_size * block_size - 1e-9)
    return min(max(k, batch_size), batch_size * block_size)


def constant_lengths(batch_size: int, value: int, like: Array | None = None) -> Array:
    """``[batch_size]`` int64 lengths all equal to ``value``, of ``like``'s kind and device."""
    if is_tensor(like):
        torch = tensor_module()
        return torch.full((batch_size,), int(value), dtype=torch.int64, device=like.device)
    return np.full(batch_size, int(value), dtype=np.int64)


class Policy(ABC):
    """Base class of every verification policy: set ``name``, implement :meth:`plan`, register with
    ``@register``, build with :func:`get`. The constructor's annotations are the parameters' kinds
    (:mod:`dcut_sched.policies.params`); the constructor checks ranges.

    Class attributes: ``needs_cost`` (:meth:`plan` needs step costs), ``cost_terms`` (what it reads
    from them, which the controller prices up front: ``"budgets"``, ``"drafted"``, ``"undrafted"``),
    ``needs_accept_len`` (the oracle), ``reads_remaining`` (:meth:`plan` takes ``remaining``, each
    request's tokens still to generate, while the batch drains: ``fine``), ``drafts_first_step``, ``speculative`` (False only for ``ar``,
    whose steps are plain steps rather than a speculative engine's undrafted ones).
    """

    name: ClassVar[str] = ""
    needs_cost: ClassVar[bool] = False
    cost_terms: ClassVar[frozenset[str]] = frozenset()
    needs_accept_len: ClassVar[bool] = False
    reads_remaining: ClassVar[bool] = False
    drafts_first_step: ClassVar[bool] = True
    speculative: ClassVar[bool] = True

    def params(self) -> dict[str, Any]:
        """The policy's parameters (for result tables and logs)."""
        return {}

    def reset(self) -> None:
        """Forget state kept across steps (start of a new run)."""

    def observe(self, lengths: Array, num_accepted: Array) -> None:
        """Learn from the last drafted step's ``lengths [bs]`` and ``num_accepted [bs]`` (int64,
        ``<= lengths - 1``); called after every drafted step. Default: nothing to learn.
        """

    def observe_time(self, step_ms: float) -> None:
        """Learn the engine's measured wall time (ms) of the last planned step, when the engine times its
        steps (never in the simulator). Default: nothing to learn.
        """

    @abstractmethod
    def plan(
        self,
        conf: Array,
        cost: StepCosts | None = None,
        *,
        accept_len: Array | None = None,
        validate: bool = True,
    ) -> VerifyPlan:
        """Plan one drafted step from ``conf [bs, B-1]`` with step costs ``cost`` (when ``needs_cost``) and
        ``accept_len [bs]`` (when ``needs_accept_len``); ``validate=False`` skips checking ``conf``.

        Raises:
            ValueError: bad confidences, missing step costs or accept_len, costs for another block size.
            TypeError: ``cost`` is not a StepCosts (e.g. a bare curve).
            CostCurveRangeError: the batch size or a budget is outside the cost curve.
        """

    def plan_without_draft(self, batch_size: int, block_size: int, cost: StepCosts | None = None) -> VerifyPlan:
        """Plan a step that ran no draft (every request verifies its anchor); default: draft next step."""
        lengths = np.ones(batch_size, dtype=np.int64)
        return VerifyPlan(lengths, batch_size, block_size, float(batch_size), draft_next=True, drafted=False)

    # -- helpers for subclasses -------------------------------------------------------------
    def _scores(self, conf: Array, validate: bool) -> Array:
        return slot_scores(conf, validate=validate)

    def _check_costs(self, cost: StepCosts | None, block_size: int) -> StepCosts:
        """``cost`` itself, checked: present (``ValueError``), a StepCosts (``TypeError`` otherwise) for
        ``block_size`` (``ValueError`` otherwise).
        """
        if not isinstance(cost, StepCosts):
            if cost is None:
                raise ValueError(f"policy {self.name!r} needs a cost curve, as step costs: "
                                 f"StepCosts(CostCurve.load(...), block_size)")
            raise TypeError(f"policy {self.name!r} plans with StepCosts, got {type(cost).__name__}; build "
                            f"StepCosts(curve, block_size) once where the curve is loaded and pass that")
        if cost.block_size != block_size:
            raise ValueError(f"policy {self.name!r}: the step costs are for block size {cost.block_size}, not "
                             f"{block_size} (the block size of the confidences)")
        return cost

    def _make_plan(
        self,
        scores: Array,
        lengths: Array,
        *,
        num_tokens: int | None = None,
        expected: float | None = None,
        draft_next: bool = True,
    ) -> VerifyPlan:
        if num_tokens is None:
            num_tokens = int(lengths.sum())
        if expected is None:
            expected = expected_tokens(scores, lengths, validate=False)
        return VerifyPlan(lengths, int(num_tokens), int(scores.shape[1]), float(expected), draft_next=draft_next)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params().items())
        return f"{type(self).__name__}({args})"


_REGISTRY: dict[str, type[Policy]] = {}


def register(cls: type[Policy]) -> type[Policy]:
    """Class decorator: add a :class:`Policy` subclass to the registry under ``cls.name`` and build its
    parameter model (:func:`~dcut_sched.policies.params.params_model`) as its module is imported."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no name")
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise ValueError(f"policy name {cls.name!r} is already registered by {_REGISTRY[cls.name].__name__}")
    params_model(cls)
    _REGISTRY[cls.name] = cls
    return cls


def names() -> list[str]:
    """Registered policy names, in registration order."""
    return list(_REGISTRY)


def get(name: str, **params: Any) -> Policy:
    """A fresh instance of policy ``name`` with ``params``, the one place a policy is built: the
    parameters are checked (:func:`check_params`), then the constructor checks ranges. Raises
    ``UnknownPolicyError`` (a KeyError) or ``PolicyParamError`` (a ValueError), naming the valid keys.
    """
    cls = policy_class(name)
    validate_params(cls, params)
    try:
        return cls(**params)
    except PolicyParamError:
        raise
    except (TypeError, ValueError, OverflowError) as exc:
        if isinstance(exc, TypeError):
            raise PolicyParamError(f"policy {name}: bad parameter value ({exc}); valid keys: {keys_text(cls)}") from None
        raise PolicyParamError(str(exc)) from None


def policy_class(name: str) -> type[Policy]:
    """The registered class of policy ``name`` (``UnknownPolicyError`` if none), without building one."""
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise UnknownPolicyError(f"unknown policy {name!r}; known policies: {', '.join(names())}") from None


def param_defaults(name: str) -> dict[str, Any]:
    """The constructor parameters of policy ``name`` and their defaults (``inspect.signature``)."""
    return _param_defaults(policy_class(name))


def param_help() -> str:
    """One line per policy, ``name: key=default, ...``, for ``--help`` texts."""
    lines = []
    for n in names():
        keys = param_defaults(n)
        lines.append(f"  {n}: " + (", ".join(f"{k}={v!r}" for k, v in keys.items()) or "(no parameters)"))
    return "\n".join(lines)


def check_params(name: str, params: dict[str, Any]) -> dict[str, Any]:
    """The one validation path of policy names and parameters (:mod:`dcut_sched.policies.params`),
    without building the policy; returns ``params`` unchanged. Raises ``UnknownPolicyError`` or
    ``PolicyParamError`` naming the policy, the key and the valid keys or expected kind.
    """
    return validate_params(policy_class(name), params)


def check_accept_len(accept_len: Array | None, batch_size: int, block_size: int, like: Array) -> Array:
    """Validate ``[bs]`` acceptance lengths in ``[0, B-1]``; return them as int64 of ``like``'s kind."""
    if accept_len is None:
        raise ValueError("this policy needs accept_len, the true number of accepted drafts per request")
    if tuple(accept_len.shape) != (batch_size,):
        raise ValueError(f"accept_len must have shape [{batch_size}]; got {tuple(accept_len.shape)}")
    lo, hi = int(accept_len.min()), int(accept_len.max())
    if lo < 0 or hi > block_size - 1:
        raise ValueError(f"accept_len values must be in [0, {block_size - 1}]; got range [{lo}, {hi}]")
    if is_tensor(like):
        torch = tensor_module()
        return torch.as_tensor(accept_len, dtype=torch.int64, device=like.device)
    if is_tensor(accept_len):
        accept_len = accept_len.cpu().numpy()
    return np.asarray(accept_len, dtype=np.int64)


def check_conf_shape(conf: Array, validate: bool) -> tuple[int, int]:
    """(bs, B) of a confidence batch, validating it when asked."""
    if validate:
        check_confidences(conf)
    return int(conf.shape[0]), int(conf.shape[1]) + 1
