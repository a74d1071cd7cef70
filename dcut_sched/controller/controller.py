"""The online ratio controller: one verification plan per engine step, over the policy registry
(usage and contract: docs/controller.md, "RatioController"). The per-step sequence is a
:class:`~dcut_sched.controller.step_driver.StepDriver`, the object the simulator runs; this class
adds the shape checks, the CPU-tensor fast path (numpy views), calibration on by default and the
token layouts, with no host sync beyond the policy's one.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from .. import policies as _policies
from ..calibration import CalibrationPrior, LogisticCalibrator
from ..cost_curve import CostCurve, CostCurveError, CostCurveRangeError
from ..defaults import DEFAULT_POLICY
from ..policies import VerifyPlan
from ..scores import Array, host_remaining
from ..step_costs import StepCosts
from .layouts import SlotLayout, slot_layout
from .step_driver import StepDriver, restrict_to_graph_cells

__all__ = ["ControllerPlan", "RatioController"]


@dataclass(frozen=True)
class ControllerPlan:
    """One step's verification plan with the layouts engines use (docs/controller.md).

    ``lengths`` ``[bs]`` int64 in [1, B] on the confidences' device; ``num_tokens`` K as a host int;
    ``expected_tokens`` the sum of the verified (calibrated) slot scores; ``graph_cell`` the captured
    cell to replay (``(bs, K)`` without a graph bank); ``policy_plan`` the policy's own plan. The
    layouts (:class:`~dcut_sched.controller.layouts.SlotLayout`) are built on first access and kept.
    """

    lengths: Array
    num_tokens: int
    block_size: int
    expected_tokens: float
    draft_next: bool
    drafted: bool
    graph_cell: tuple[int, int]
    policy_plan: VerifyPlan = field(repr=False)
    # numpy lengths behind CPU-tensor ``lengths`` (same memory): layouts are built in numpy, then
    # wrapped as tensors, which is several times faster than tiny torch CPU ops
    _host_lengths: np.ndarray | None = field(default=None, repr=False, compare=False)

    @property
    def batch_size(self) -> int:
        return self.policy_plan.batch_size

    @property
    def ratio(self) -> float:
        """Verification ratio rho = num_tokens / (bs * B) (the policy plan's)."""
        return self.policy_plan.ratio

    @functools.cached_property
    def layout(self) -> SlotLayout:
        """All four layouts (:class:`~dcut_sched.controller.layouts.SlotLayout`), built once."""
        if self._host_lengths is None:
            return slot_layout(self.lengths, self.block_size, self.num_tokens)
        host = slot_layout(self._host_lengths, self.block_size, self.num_tokens)
        return SlotLayout(*(torch.from_numpy(a) for a in (
            host.slot_mask, host.gather_indices, host.num_draft_tokens, host.cu_num_draft_tokens)))

    @property
    def slot_mask(self) -> Array:
        return self.layout.slot_mask

    @property
    def gather_indices(self) -> Array:
        return self.layout.gather_indices

    @property
    def num_draft_tokens(self) -> Array:
        return self.layout.num_draft_tokens

    @property
    def cu_num_draft_tokens(self) -> Array:
        return self.layout.cu_num_draft_tokens


def _to_torch(plan: ControllerPlan) -> ControllerPlan:
    """The same plan with numpy lengths wrapped as a CPU tensor (shared memory, no copy)."""
    host = np.ascontiguousarray(plan.lengths)
    lengths = torch.from_numpy(host)
    return replace(plan, lengths=lengths, policy_plan=replace(plan.policy_plan, lengths=lengths), _host_lengths=host)


def _one_number(value: Any) -> bool:
    """Whether ``value`` is one real number: a Python or numpy number, or an array/tensor of one element
    (not a boolean, a string or a list)."""
    if isinstance(value, (bool, np.bool_)):
        return False
    if isinstance(value, (int, float, np.integer, np.floating)):
        return True
    if isinstance(value, np.ndarray):
        return value.size == 1 and value.dtype.kind in "iuf"
    if isinstance(value, torch.Tensor):
        return value.numel() == 1 and value.dtype != torch.bool and not value.is_complex()
    return False


class RatioController:
    """Chooses each step's verification through a registered policy (parameters: docs/controller.md).

    ``cost`` may be ``None`` for policies that need no curve; ``policy`` is a registered name (with
    ``policy_params``) or a built policy. ``graph_bank`` puts the replayed cell in each plan and limits
    ``fine`` to the captured token counts. ``calibrator`` (default: a
    :class:`~dcut_sched.calibration.LogisticCalibrator` from ``calibration_prior``, unless
    ``calibrate=False``) maps the confidences before the policy scores them. Every batch size up to
    ``max_batch_size`` (default: the curve's range) is priced here (:meth:`StepCosts.check
    <dcut_sched.step_costs.StepCosts.check>`), so a curve that cannot serve one is refused now.

    Raises:
        KeyError: unknown policy name.
        CostCurveError / CostCurveRangeError: the curve is for another block size, or cannot price
            (or prices at <= 0 ms) a step the policy reads at a batch size up to ``max_batch_size``.
        ValueError: block size < 2; a policy that needs a curve without one; bad policy parameters.
        TypeError: ``block_size`` not an integer; ``cost`` or ``calibration_prior`` of the wrong type
            (a path, say).
    """

    def __init__(
        self,
        cost: CostCurve | None,
        block_size: int,
        policy: str | _policies.Policy = DEFAULT_POLICY,
        calibrate: bool = True,
        graph_bank: Any = None,
        calibrator: Any = None,
        calibration_prior: CalibrationPrior | None = None,
        max_batch_size: int | None = None,
        **policy_params: Any,
    ):
        if isinstance(block_size, bool) or not isinstance(block_size, (int, np.integer)):
            raise TypeError(f"RatioController: block_size={block_size!r} must be an integer (B, slots per request: "
                            f"the anchor and B-1 drafts)")
        self.block_size = int(block_size)
        if self.block_size < 2:
            raise ValueError(f"RatioController: block_size={block_size} leaves no draft slot (a block is the anchor "
                             f"and B-1 drafts, confidences [bs, B-1]); give a block size >= 2")
        if cost is not None and not isinstance(cost, CostCurve):
            raise TypeError(f"RatioController: cost must be a CostCurve (CostCurve.load(path)) or None, not "
                            f"{type(cost).__name__}")
        if calibration_prior is not None and not isinstance(calibration_prior, CalibrationPrior):
            raise TypeError(f"RatioController: calibration_prior must be a CalibrationPrior "
                            f"(CalibrationPrior.load(path)) or None, not {type(calibration_prior).__name__}")
        # the one StepCosts of this controller: every step time its policy reads (CostCurveError on
        # a curve measured for another block size)
        self.costs = None if cost is None else StepCosts(cost, self.block_size)
        self.graph_bank = graph_bank
        if isinstance(policy, _policies.Policy):  # built (and validated) by the caller: used as it is
            if policy_params:
                raise ValueError(f"RatioController: policy {policy.name!r} is already built; pass its "
                                 f"parameters to dcut_sched.policies.get, not here ({sorted(policy_params)})")
            self.policy = policy if graph_bank is None else restrict_to_graph_cells(policy, graph_bank.token_counts())
        else:  # validated and built once (dcut_sched.policies.get), with the bank's cells when it takes them
            if (graph_bank is not None and "allowed_num_tokens" not in policy_params
                    and "allowed_num_tokens" in _policies.param_defaults(policy)):
                policy_params = {**policy_params, "allowed_num_tokens": [int(k) for k in graph_bank.token_counts()]}
            self.policy = _policies.get(policy, **policy_params)
        policy = self.policy.name
        if self.policy.needs_cost and cost is None:
            raise ValueError(
                f"RatioController: policy {policy!r} needs a cost curve (CostCurve.load(...)); got cost=None"
            )
        if self.costs is not None and self.policy.needs_cost:
            self._check_costs(max_batch_size)
        self.cost = cost
        self.calibrate = bool(calibrate or calibrator is not None)
        self.calibrator = calibrator if calibrator is not None else (
            LogisticCalibrator(self.block_size, prior=calibration_prior) if self.calibrate and self.block_size >= 2
            else None
        )
        # The per-step sequence (sanitise, calibrate, plan, observe) and the counters: the same
        # object the simulator runs (controller/step_driver.py).
        self.driver = StepDriver(self.policy, self.costs, self.block_size, calibrator=self.calibrator,
                                 graph_cells=graph_bank)

    def _check_costs(self, max_batch_size: int | None) -> None:
        """Refuse, now, a curve on which some ``plan`` up to ``max_batch_size`` would raise."""
        policy, costs = self.policy, self.costs
        measured = costs.measured_batch_sizes
        top = measured[-1] if max_batch_size is None else max_batch_size
        if isinstance(top, bool) or not isinstance(top, (int, np.integer)) or top < 1:
            raise ValueError(f"RatioController: max_batch_size={max_batch_size!r} must be an integer >= 1")
        terms = policy.cost_terms
        budgets = ((lambda bs: policy.budgets(bs, self.block_size))
                   if "budgets" in terms and hasattr(policy, "budgets") else None)
        sizes = range(1 if max_batch_size is not None else measured[0], int(top) + 1)
        try:
            costs.check(sizes, drafted="drafted" in terms, undrafted="undrafted" in terms, budgets=budgets)
        except (CostCurveError, CostCurveRangeError) as exc:
            raise type(exc)(f"RatioController: policy {policy.name!r} cannot plan every batch size up to "
                            f"{top} on this curve: {exc}") from None
        if hasattr(policy, "candidates"):  # its budgets (e.g. fine's allowed_num_tokens) meet the curve's range
            for bs in sizes:
                try:
                    policy.candidates(bs, self.block_size, costs)
                except ValueError as exc:
                    raise ValueError(f"RatioController: policy {policy.name!r} cannot plan batch size {bs} <= "
                                     f"{top}: {exc}") from None

    # ------------------------------------------------------------------ state
    def reset(self) -> None:
        """Start a new run: the policy's running state and the metrics (not the calibration)."""
        self.driver.reset()

    @property
    def metrics(self) -> dict[str, Any]:
        """Counters since :meth:`reset` (reading them syncs device counters once): ``steps``,
        ``drafted_steps``, ``plain_steps``, ``num_tokens``, ``expected_tokens``, ``bad_conf_requests``,
        ``observed_steps``, ``accepted_drafts``, ``bad_accept_requests``.
        """
        return self.driver.metrics

    # ------------------------------------------------------------------ planning
    def _check_shape(self, conf: Array) -> None:
        if not isinstance(conf, (np.ndarray, torch.Tensor)):
            raise ValueError(
                f"RatioController: conf must be a numpy array or torch tensor of shape [batch_size, "
                f"{self.block_size - 1}]; got {type(conf).__name__} (wrap it with np.asarray / torch.as_tensor)"
            )
        floating = conf.is_floating_point() if isinstance(conf, torch.Tensor) else conf.dtype.kind == "f"
        if not floating:
            raise TypeError(f"RatioController.plan: conf must be a floating array (draft confidences in [0, 1]); "
                            f"got dtype {conf.dtype}")
        if isinstance(conf, torch.Tensor) and conf.device.type == "meta":
            raise TypeError("RatioController.plan: conf is a meta tensor (no data); pass the confidences themselves")
        shape = tuple(conf.shape)
        if len(shape) != 2 or shape[0] < 1 or shape[1] != self.block_size - 1:
            raise ValueError(
                f"RatioController: conf must have shape [batch_size >= 1, {self.block_size - 1}] "
                f"(block size {self.block_size}); got {shape}"
            )

    def _finish(self, vp: VerifyPlan) -> ControllerPlan:
        cell = self.driver.graph_cell(vp.batch_size, vp.num_tokens)
        return ControllerPlan(vp.lengths, vp.num_tokens, self.block_size, vp.expected_tokens, vp.draft_next,
                              vp.drafted, cell, vp)

    def plan(self, conf: Array, *, accept_len: Array | None = None, remaining: Any = None) -> ControllerPlan:
        """Plan one drafted step from ``conf [bs, B-1]`` (torch on any device, or numpy; bad rows:
        :meth:`StepDriver.sanitize <dcut_sched.controller.step_driver.StepDriver.sanitize>`).
        ``accept_len`` only for ``oracle``. ``remaining [bs]`` (integers; values below 1 count as 1): pass
        it while no request waits and none will arrive (a finite batch draining), each request's tokens
        still to generate at most; ``fine`` then values a step by how much closer it brings the batch's
        end (docs/design.md §2.1, "A draining batch"). Tensors of the plan are on ``conf``'s device.

        Raises:
            TypeError: ``conf`` is not a floating array; ``remaining`` is not integers.
            ValueError: ``conf`` is not ``[bs, B-1]``; ``remaining`` is not ``[bs]``.
            CostCurveRangeError: the batch size is outside the cost curve.
        """
        self._check_shape(conf)
        if remaining is not None:
            remaining = self._host_remaining(remaining, int(conf.shape[0]))
        if isinstance(conf, torch.Tensor) and conf.device.type == "cpu":
            # CPU tensors share memory with numpy arrays: plan on the numpy views (the same policy
            # code, numpy kind; cheaper than many tiny torch CPU ops, docs/controller.md) and hand
            # back tensors that share the results' memory.
            arr = conf.detach()
            if arr.dtype not in (torch.float32, torch.float64):
                arr = arr.to(torch.float32)
            if accept_len is not None and isinstance(accept_len, torch.Tensor):
                accept_len = accept_len.cpu().numpy()
            return _to_torch(self._finish(self.driver.plan(arr.numpy(), accept_len, remaining)))
        return self._finish(self.driver.plan(conf, accept_len, remaining))

    @staticmethod
    def _host_remaining(remaining: Any, batch_size: int) -> np.ndarray:
        """``remaining`` as host int64 ``[bs]``, each at least 1 (:func:`~dcut_sched.scores.host_remaining`)."""
        return host_remaining(remaining, batch_size, "RatioController.plan")

    def plan_without_draft(self, batch_size: int, device: torch.device | str | None = None) -> ControllerPlan:
        """Plan a plain step (every request verifies its anchor) of ``batch_size >= 1`` requests
        (``ValueError`` otherwise; ``CostCurveRangeError`` outside the curve for a policy that prices
        it); layouts on ``device``, or numpy with ``None``.
        """
        if (isinstance(batch_size, bool) or not isinstance(batch_size, (int, float, np.integer, np.floating))
                or not np.isfinite(batch_size) or int(batch_size) != batch_size or batch_size < 1):
            raise ValueError(f"RatioController.plan_without_draft: batch_size={batch_size!r} must be an integer >= 1")
        vp = self.driver.plan_without_draft(int(batch_size))
        if device is not None:
            vp = VerifyPlan(
                torch.as_tensor(vp.lengths, device=device), vp.num_tokens, vp.block_size,
                vp.expected_tokens, vp.draft_next, vp.drafted,
            )
        return self._finish(vp)

    def observe(self, accept_len: Array, *, step_ms: float | None = None) -> None:
        """Feed back the last plan's outcome, once per plan: ``accept_len [bs]`` ints of the confidences'
        kind (clipped as :meth:`StepDriver.observe <dcut_sched.controller.step_driver.StepDriver.observe>`
        says) and, when the engine times steps, ``step_ms`` (ignored unless finite and > 0).

        Raises:
            TypeError: ``accept_len`` is not an integer array, or ``step_ms`` is not one number.
            ValueError: no plan awaits an observation, or ``accept_len`` is not ``[bs]``.
        """
        bs = self.driver.pending_batch_size
        if bs is None:
            raise ValueError(
                "RatioController.observe: no plan to observe; call plan() or plan_without_draft() first "
                "and observe() once per plan"
            )
        if not isinstance(accept_len, (np.ndarray, torch.Tensor)) or tuple(accept_len.shape) != (bs,):
            shape = tuple(accept_len.shape) if hasattr(accept_len, "shape") else type(accept_len).__name__
            raise ValueError(
                f"RatioController.observe: accept_len must be an integer array of shape [{bs}] (the last "
                f"plan's batch size); got {shape}"
            )
        if step_ms is not None and not _one_number(step_ms):
            raise TypeError(f"RatioController.observe: step_ms must be a number of milliseconds (or None); got "
                            f"{type(step_ms).__name__}")
        integer = (not accept_len.is_floating_point() and not accept_len.is_complex() and accept_len.dtype != torch.bool
                   if isinstance(accept_len, torch.Tensor) else accept_len.dtype.kind in "iu")  # not timedelta64
        if not integer:
            raise TypeError(f"RatioController.observe: accept_len must be an integer array (drafts accepted per "
                            f"request); got dtype {accept_len.dtype}")
        self.driver.observe(accept_len, step_ms=step_ms)

    def __repr__(self) -> str:
        return (
            f"RatioController(policy={self.policy!r}, block_size={self.block_size}, calibrate={self.calibrate}, "
            f"graph_bank={self.graph_bank!r})"
        )
