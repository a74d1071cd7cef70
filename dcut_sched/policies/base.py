"""The policy interface, the verification plan it returns, and the registry.

A policy decides, for one engine step, how many leading slots of each request's block the target
verifies. It is a pure function of the batch's draft confidences ``[bs, B-1]``, the cost curve and its
own parameters (plus, for the ``oracle``, the true acceptance lengths). A policy that learns across
steps keeps that in one small state object, ``policy.state`` (``fine``'s running utility and probe
account, ``FineState``; the peers' lagged confidences and rates), replaced by :meth:`Policy.reset`;
the decision itself is a pure function of arrays (e.g. ``fine.choose_budget``). The same objects
serve the simulator and the online controller: there is no second implementation of any policy.

Step times come from one owner, :class:`~dcut_sched.step_costs.StepCosts`, the only cost type a
policy takes: the controller builds it once from its cost curve, the simulator once per run (so a
policy sees exactly the times the simulator charges: draft scale and controller overhead included).
A policy never reads the cost curve itself.

Inputs may be numpy arrays or torch tensors (CPU or CUDA); ``lengths`` in the plan is of the same kind
and on the same device. A policy syncs with the host at most once per step (the budget decision).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ..scores import Array, check_confidences, expected_tokens, is_tensor, slot_scores, tensor_module
from ..step_costs import StepCosts
from .params import PolicyParamError, UnknownPolicyError, keys_text, validate_params
from .params import param_defaults as _param_defaults

__all__ = ["Policy", "PolicyParamError", "UnknownPolicyError", "VerifyPlan", "budget_from_ratio", "check_params", "get",
           "names", "param_defaults", "param_help", "policy_class", "register"]


@dataclass(frozen=True)
class VerifyPlan:
    """What to verify this step.

    Attributes:
        lengths: ``[bs]`` int64 slots to verify per request (numpy array or torch tensor on the
            confidences' device); each in ``[1, B]``; request i verifies slots ``1..lengths[i]``.
        num_tokens: ``sum(lengths)``, the verification budget K in tokens (the CUDA-graph cell).
        block_size: B.
        expected_tokens: expected tokens this step produces (sum of the verified slot scores; DESIGN §1).
        draft_next: whether the *next* step should run the draft model (False: a plain
            autoregressive step, which costs ``C_ar(bs)``).
        drafted: whether this step had a draft (False for a plan made without one).
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
    """Base class of every verification policy.

    Subclasses set ``name`` and implement :meth:`plan`; registering is ``@register``. Construct them
    through :func:`get` so parameters are checked in one place. The constructor's annotations are
    the parameters' kinds (:mod:`dcut_sched.policies.params`); the constructor checks the ranges.

    Class attributes:
        name: registry key.
        needs_cost: :meth:`plan` needs :class:`~dcut_sched.step_costs.StepCosts`.
        cost_terms: what :meth:`plan` / :meth:`plan_without_draft` read from the step costs, which
            :class:`~dcut_sched.controller.RatioController` checks at construction
            (:meth:`StepCosts.check <dcut_sched.step_costs.StepCosts.check>`): ``"budgets"``
            (``C_verify`` at :meth:`budgets`), ``"drafted"`` (whole drafted steps at the budgets the
            curve covers), ``"undrafted"`` (the step without a draft).
        needs_accept_len: :meth:`plan` needs the true acceptance lengths (only the oracle).
        drafts_first_step: whether the first step of a run drafts.
        speculative: whether the policy runs on a speculative engine (its steps without a draft
            cost ``StepCosts.undrafted_ms``); False only for ``ar``, the engine without speculation
            (``StepCosts.plain_ms``).
    """

    name: ClassVar[str] = ""
    needs_cost: ClassVar[bool] = False
    cost_terms: ClassVar[frozenset[str]] = frozenset()
    needs_accept_len: ClassVar[bool] = False
    drafts_first_step: ClassVar[bool] = True
    speculative: ClassVar[bool] = True

    def params(self) -> dict[str, Any]:
        """The policy's parameters (for result tables and logs)."""
        return {}

    def reset(self) -> None:
        """Forget state kept across steps (start of a new run)."""

    def observe(self, lengths: Array, num_accepted: Array) -> None:
        """Learn from the outcome of the last drafted step (default: nothing to learn).

        Called by the simulator and by ``RatioController.observe`` after every drafted step, with
        the plan's ``lengths [bs]`` int64 and ``num_accepted [bs]`` int64 (drafts the verification
        accepted, ``<= lengths - 1``). Policies that estimate acceptance from outcomes (``smartspec``)
        override it and keep what they learn in their state object.
        """

    def observe_time(self, step_ms: float) -> None:
        """Learn the engine's measured wall time of the last planned step, drafted or not, in ms
        (default: nothing to learn). Called through ``RatioController.observe`` (``StepDriver.observe``)
        when the engine times its steps (never by the simulator, whose steps take what the cost curve prices)."""

    @abstractmethod
    def plan(
        self,
        conf: Array,
        cost: StepCosts | None = None,
        *,
        accept_len: Array | None = None,
        validate: bool = True,
    ) -> VerifyPlan:
        """Plan one drafted step.

        Args:
            conf: ``[bs, B-1]`` float draft confidences in [0, 1] (numpy or torch, any device).
            cost: the step times (:class:`~dcut_sched.step_costs.StepCosts` for this block size;
                required when ``needs_cost``).
            accept_len: ``[bs]`` ints in ``[0, B-1]``, the drafts each request would get accepted
                (required when ``needs_accept_len``; ignored otherwise).
            validate: check ``conf`` (the controller sanitises on the device and passes False).

        Returns:
            The :class:`VerifyPlan`.

        Raises:
            ValueError: bad confidences (shape, NaN/inf, range), missing step costs or accept_len, step
                costs for another block size.
            TypeError: ``cost`` is not a :class:`~dcut_sched.step_costs.StepCosts` (e.g. a bare curve).
            CostCurveRangeError: the batch size or a budget is outside the cost curve's range.
        """

    def plan_without_draft(self, batch_size: int, block_size: int, cost: StepCosts | None = None) -> VerifyPlan:
        """Plan a step that ran no draft: every request verifies its anchor only (plain decoding).

        The default asks for a draft again on the next step.
        """
        lengths = np.ones(batch_size, dtype=np.int64)
        return VerifyPlan(lengths, batch_size, block_size, float(batch_size), draft_next=True, drafted=False)

    # -- helpers for subclasses -------------------------------------------------------------
    def _scores(self, conf: Array, validate: bool) -> Array:
        return slot_scores(conf, validate=validate)

    def _check_costs(self, cost: StepCosts | None, block_size: int) -> StepCosts:
        """``cost`` itself, checked: present, a :class:`~dcut_sched.step_costs.StepCosts`, and for
        ``block_size`` (no conversion: the caller built it once where the curve entered).

        Raises:
            ValueError: no cost given, or step costs for another block size.
            TypeError: anything but a StepCosts (a bare :class:`~dcut_sched.CostCurve` included).
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
    """Class decorator: add a :class:`Policy` subclass to the registry under ``cls.name``."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no name")
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise ValueError(f"policy name {cls.name!r} is already registered by {_REGISTRY[cls.name].__name__}")
    _REGISTRY[cls.name] = cls
    return cls


def names() -> list[str]:
    """Registered policy names, in registration order."""
    return list(_REGISTRY)


def get(name: str, **params: Any) -> Policy:
    """A fresh instance of the policy ``name`` with ``params``: the one place a policy is built.

    The parameters are checked first (:func:`check_params`: names, keys, kinds, finite values), then
    the constructor checks the ranges.

    Raises:
        UnknownPolicyError (a KeyError): unknown name (the message lists the known ones).
        PolicyParamError (a ValueError): an unknown parameter (the message lists the policy's valid
            keys), a value of another kind, a non-finite number, or a value the constructor rejects.
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
    """The registered class of policy ``name`` (its class attributes, e.g. ``needs_cost``, without
    building one).

    Raises:
        UnknownPolicyError (a KeyError): unknown name (the message lists the known ones).
    """
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
    without building the policy: refuse an unknown name, parameters policy ``name`` does not take,
    values of another kind than the constructor's annotation (a boolean for a number, a string for
    an integer, ...), and non-finite numbers. Returns ``params`` unchanged.

    Raises:
        UnknownPolicyError (a KeyError): unknown policy.
        PolicyParamError (a ValueError): naming the policy, the key and the valid keys or the
            expected kind.
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
