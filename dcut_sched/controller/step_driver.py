"""One engine step of the ratio controller: sanitise -> calibrate -> plan -> observe.

:class:`StepDriver` is the single implementation of that sequence. The online
:class:`~dcut_sched.controller.RatioController` runs it on torch tensors (or numpy views of CPU
tensors) and adds shape checks and token layouts; the simulator (:mod:`dcut_sched.simulator.loop`)
runs the same object on numpy arrays, so what the simulator evaluates is the controller, not a copy
of it. A step:

1. :meth:`StepDriver.plan` (a drafted step): ``conf [bs, B-1]`` is **sanitised** (a row holding NaN,
   +-inf or a value outside [0, 1] becomes zeros and is counted, never raised on), **calibrated**
   when a calibrator is attached (the policy scores ``calibrator.transform(conf)``), and the policy
   plans the verified lengths with the driver's :class:`~dcut_sched.step_costs.StepCosts` (built
   once by whoever loaded the curve: the controller, or the simulator's run set-up);
   :meth:`StepDriver.plan_without_draft` (a step that ran no draft): every request verifies its
   anchor; the calibrator's decay clock ticks (``observe_plain``, when it has one);
2. :meth:`StepDriver.graph_cell`: the ``(batch_size, num_tokens)`` cell the verification replays, the
   smallest captured one that holds the budget when :class:`GraphCells` (or a
   :class:`~dcut_sched.controller.VerifyGraphBank`) is attached, else the budget itself;
3. :meth:`StepDriver.observe`: the drafts each request got accepted (clipped into
   ``[0, lengths - 1]`` and counted when out of range) go to the calibrator (with the sanitised raw
   confidences) and to the policy.

A graph bank also restricts the budgets a policy may choose (:func:`restrict_to_graph_cells`: a
policy with an ``allowed_num_tokens`` parameter, i.e. ``fine``, only considers the captured token
counts unless it was given its own).

The module imports neither torch nor the simulator (torch is taken from ``sys.modules`` when a tensor arrives,
which requires it to be imported already), so the simulator runs it without torch.

Counters live here too (steps, budgets, bad inputs; device counters summed lazily so counting costs
no host sync); :attr:`StepDriver.metrics` reads them.
"""

from __future__ import annotations

import bisect
from typing import Any, Iterable, Sequence

import numpy as np

from .. import policies as _policies
from ..policies import Policy, VerifyPlan
from ..scores import Array, is_tensor, tensor_module, verified_prefix_tokens
from ..step_costs import StepCosts

__all__ = ["GraphCells", "StepDriver", "restrict_to_graph_cells"]

Cell = tuple[int, int]
_min_reduce, _max_reduce, _sum_reduce = np.minimum.reduce, np.maximum.reduce, np.add.reduce
# float itemsize -> (unsigned integer view, the bits of 1.0): float16, float32, float64
_ONE_BITS = {2: (np.uint16, 0x3C00), 4: (np.uint32, 0x3F800000), 8: (np.uint64, 0x3FF0000000000000)}


class GraphCells:
    """The captured ``(batch_size, num_tokens)`` cells of a CUDA-graph bank and the padding rule.

    Torch-free, so the simulator can charge what a bank replays; :class:`VerifyGraphBank` keeps its
    cells in one of these.

    Args:
        cells: ``(batch_size, num_tokens)`` pairs (duplicates ignored).

    Raises:
        ValueError: no cells, or a cell with ``num_tokens < batch_size`` or ``batch_size < 1``.
    """

    def __init__(self, cells: Iterable[Sequence[int]]):
        cell_set = sorted({(int(c[0]), int(c[1])) for c in cells})
        if not cell_set:
            raise ValueError("no cells to capture")
        for bs, k in cell_set:
            if bs < 1 or k < bs:
                raise ValueError(f"cell (batch_size={bs}, num_tokens={k}) needs 1 <= batch_size <= num_tokens")
        self.cells: list[Cell] = cell_set
        self._tokens_by_bs: dict[int, list[int]] = {}
        for bs, k in cell_set:
            self._tokens_by_bs.setdefault(bs, []).append(k)
        self.batch_sizes: list[int] = sorted(self._tokens_by_bs)

    @classmethod
    def at_batch_sizes(cls, token_counts: Iterable[int], batch_sizes: Iterable[int]) -> "GraphCells":
        """Cells ``(bs, k)`` for every batch size and every token count ``k >= bs`` (a bank captured
        at the same token counts for each batch size)."""
        counts = sorted({int(k) for k in token_counts})
        return cls([(int(bs), k) for bs in batch_sizes for k in counts if k >= int(bs)])

    def token_counts(self, batch_size: int | None = None) -> list[int]:
        """Captured token counts (ascending) at ``batch_size``, or of every cell when ``None``."""
        if batch_size is None:
            return sorted({k for _, k in self.cells})
        return list(self._tokens_by_bs.get(int(batch_size), []))

    def cell_for(self, batch_size: int, num_tokens: int) -> Cell:
        """The cell a step of ``(batch_size, num_tokens)`` replays: the smallest captured batch size
        >= ``batch_size``, then its smallest token count >= ``num_tokens``.

        Raises:
            ValueError: no captured cell is that large (names the largest ones).
        """
        j = bisect.bisect_left(self.batch_sizes, int(batch_size))
        for bs in self.batch_sizes[j:]:
            tokens = self._tokens_by_bs[bs]
            t = bisect.bisect_left(tokens, int(num_tokens))
            if t < len(tokens):
                return bs, tokens[t]
        raise ValueError(
            f"no captured cell holds batch_size={batch_size}, num_tokens={num_tokens}; "
            f"largest cells: {self.cells[-3:]} (capture larger cells or lower the budget)"
        )

    def __repr__(self) -> str:
        return f"GraphCells({len(self.cells)} cells, batch_sizes={self.batch_sizes})"


def restrict_to_graph_cells(policy: Policy, token_counts: Sequence[int]) -> Policy:
    """``policy`` limited to budgets among a graph bank's captured ``token_counts``.

    A policy that takes ``allowed_num_tokens`` (``fine``) and was not given its own gets a fresh
    instance with ``allowed_num_tokens = token_counts``; any other policy is returned as it is (its
    budget is padded up to the nearest captured cell when it runs, :meth:`StepDriver.graph_cell`).
    """
    defaults = _policies.param_defaults(policy.name)
    params = policy.params()
    if "allowed_num_tokens" not in defaults or params.get("allowed_num_tokens") is not None:
        return policy
    return _policies.get(policy.name, **{**params, "allowed_num_tokens": [int(k) for k in token_counts]})


class StepDriver:
    """The controller's per-step sequence (module docstring) around one policy instance.

    Args:
        policy: the :class:`~dcut_sched.policies.Policy` (kept; its state is this driver's).
        costs: what the policy plans with: the :class:`~dcut_sched.step_costs.StepCosts` for
            ``block_size``, or ``None`` for policies that need none.
        block_size: B (confidences are ``[bs, B-1]``).
        calibrator: optional; ``transform(conf)`` before the policy, ``observe(conf, num_accepted,
            lengths)`` after each drafted step, ``observe_plain(batch_size)`` (if it has one) after
            each step without a draft (e.g. :class:`~dcut_sched.calibration.OnlineCalibrator`).
        graph_cells: the captured cells (:class:`GraphCells` or a ``VerifyGraphBank``: anything with
            ``cell_for(bs, num_tokens)``); ``None``: every budget is its own cell.
        validate_scored: let the policy check the confidences it scores (the sanitised ones, after
            the calibrator). ``False`` (the controller) trusts the calibrator's output; the simulator
            sets it for calibrators of its own protocol, whose range nothing else guarantees.

    Call order per step: :meth:`plan` or :meth:`plan_without_draft`, then :meth:`observe` once.

    Raises:
        TypeError: ``costs`` is neither ``None`` nor a StepCosts (a bare cost curve: build
            ``StepCosts(curve, block_size)`` once where it is loaded).
        ValueError: step costs for another block size.
    """

    def __init__(self, policy: Policy, costs: StepCosts | None, block_size: int, *, calibrator: Any = None,
                 graph_cells: Any = None, validate_scored: bool = False):
        self.policy = policy
        self.block_size = int(block_size)
        if costs is not None:
            if not isinstance(costs, StepCosts):
                raise TypeError(f"StepDriver: costs must be StepCosts or None, got {type(costs).__name__}; build "
                                f"StepCosts(curve, block_size) once where the curve is loaded")
            if costs.block_size != self.block_size:
                raise ValueError(f"StepDriver: the step costs are for block size {costs.block_size}, not "
                                 f"{self.block_size}")
        self.costs = costs
        self.calibrator = calibrator
        self.graph_cells = graph_cells
        self.validate_scored = bool(validate_scored)
        self._needs_accept_len = bool(policy.needs_accept_len)
        self._observe_plain = getattr(calibrator, "observe_plain", None)
        self.reset()

    # ------------------------------------------------------------------ state
    def reset(self) -> None:
        """Start a new run: the policy's running state and the counters (not the calibration)."""
        self.policy.reset()
        self._last: tuple[Array, Array] | None = None
        self.pending_batch_size: int | None = None  # batch size of the plan awaiting observe(), if any
        # Counters that may live on the device (a torch scalar per device, or a host int).
        self._device_counters: dict[str, dict[Any, Any]] = {
            "bad_conf_requests": {}, "accepted_drafts": {}, "bad_accept_requests": {}}
        self._host_accepted = 0  # accepted drafts of numpy steps (the simulator's), summed on the host
        self.steps = self.drafted_steps = 0
        self.num_tokens = 0
        self.expected_tokens = 0.0
        self.observed_steps = 0

    @property
    def metrics(self) -> dict[str, Any]:
        """Counters since :meth:`reset` (reading them syncs device counters once); the keys of
        :attr:`RatioController.metrics <dcut_sched.controller.RatioController.metrics>`."""
        return {
            "steps": self.steps,
            "drafted_steps": self.drafted_steps,
            "plain_steps": self.steps - self.drafted_steps,
            "num_tokens": self.num_tokens,
            "expected_tokens": self.expected_tokens,
            "bad_conf_requests": self._read_counter("bad_conf_requests"),
            "observed_steps": self.observed_steps,
            "accepted_drafts": int(self._host_accepted) + self._read_counter("accepted_drafts"),
            "bad_accept_requests": self._read_counter("bad_accept_requests"),
        }

    def _count(self, name: str, value: Any) -> None:
        per_device = self._device_counters[name]
        key = value.device if is_tensor(value) else "host"
        held = per_device.get(key)
        per_device[key] = value if held is None else held + value

    def _read_counter(self, name: str) -> int:
        return sum(int(v) for v in self._device_counters[name].values())

    # ------------------------------------------------------------------ one step
    def sanitize(self, conf: Array) -> Array:
        """``conf`` with every row that holds NaN, +-inf or a value outside [0, 1] replaced by zeros
        (counted in ``bad_conf_requests``); integer input becomes float32. Same kind and device;
        numpy input that is already clean is returned as it is (two reductions, no copy)."""
        if is_tensor(conf):
            torch = tensor_module()
            if not conf.is_floating_point():
                conf = conf.to(torch.float32)
            ok = (conf == conf.clamp(0.0, 1.0)).all(dim=1)  # False on NaN, +-inf and out of range
            self._count("bad_conf_requests", (~ok).sum())
            return conf.where(ok[:, None], 0.0)
        if type(conf) is not np.ndarray:
            conf = np.asarray(conf)
        if conf.dtype.kind != "f":
            conf = conf.astype(np.float32)
        # Fast path, one reduction (this runs every simulated step): an IEEE float is in [+0, 1]
        # exactly when its bits, read as an unsigned integer, are at most those of 1.0 (negative
        # values, -0.0 included, have the sign bit; inf and NaN lie above 1.0). A row that fails goes
        # to the exact check below (so -0.0 is kept).
        bits = _ONE_BITS.get(conf.dtype.itemsize) if conf.dtype.isnative else None
        if bits is not None:
            if _max_reduce(conf.view(bits[0]), None) <= bits[1]:
                return conf
        elif _min_reduce(conf, None) >= 0 and _max_reduce(conf, None) <= 1:
            return conf
        with np.errstate(invalid="ignore"):
            ok = ((conf >= 0) & (conf <= 1)).all(axis=1)
        self._count("bad_conf_requests", int((~ok).sum()))
        return np.where(ok[:, None], conf, conf.dtype.type(0))

    def plan(self, conf: Array, accept_len: Array | None = None) -> VerifyPlan:
        """Plan one drafted step from ``conf [bs, B-1]`` (shape already checked by the caller).

        Args:
            conf: draft confidences (numpy array or torch tensor); bad rows are zeroed, not raised on.
            accept_len: ``[bs]`` true accepted drafts, passed only to a policy that needs them (the
                ``oracle``).

        Returns:
            The policy's :class:`~dcut_sched.policies.VerifyPlan` (lengths of ``conf``'s kind).

        Raises:
            CostCurveRangeError: the batch size or a budget is outside the cost curve.
            ValueError: with ``validate_scored``, a calibrator output outside [0, 1].
        """
        conf = self.sanitize(conf)
        scored = conf if self.calibrator is None else self.calibrator.transform(conf)
        if self._needs_accept_len:
            vp = self.policy.plan(scored, self.costs, accept_len=accept_len, validate=self.validate_scored)
        else:
            vp = self.policy.plan(scored, self.costs, validate=self.validate_scored)
        self._last = (conf, vp.lengths)
        self.pending_batch_size = vp.batch_size
        self._count_plan(vp)
        return vp

    def plan_without_draft(self, batch_size: int) -> VerifyPlan:
        """Plan a step that ran no draft (every request verifies its anchor); numpy lengths."""
        vp = self.policy.plan_without_draft(batch_size, self.block_size, self.costs)
        if self._observe_plain is not None:
            self._observe_plain(batch_size)  # the decay clock of unobserved confidence ranges
        self._last = None
        self.pending_batch_size = batch_size
        self._count_plan(vp)
        return vp

    def _count_plan(self, vp: VerifyPlan) -> None:
        self.steps += 1
        self.drafted_steps += vp.drafted
        self.num_tokens += vp.num_tokens
        self.expected_tokens += vp.expected_tokens

    def graph_cell(self, batch_size: int, num_tokens: int) -> Cell:
        """The ``(batch_size, num_tokens)`` cell a step replays (module docstring, step 2).

        Raises:
            ValueError: no captured cell is large enough.
        """
        if self.graph_cells is None:
            return batch_size, num_tokens
        return self.graph_cells.cell_for(batch_size, num_tokens)

    def observe(self, num_accepted: Array, *, in_range: bool = False, step_ms: float | None = None) -> None:
        """Feed back the last plan's outcome: ``num_accepted [bs]`` drafts accepted per request.

        Args:
            num_accepted: ints of the plan's kind (numpy, or torch on the lengths' device: converted
                when not). Values outside ``[0, lengths - 1]`` are clipped into that range and
                counted in ``bad_accept_requests``.
            in_range: the caller guarantees ``0 <= num_accepted <= lengths - 1`` as int64 of the
                lengths' kind (the simulator, which computes it with
                :func:`~dcut_sched.scores.verified_prefix_tokens`): skip the check and the clip.

            step_ms: the engine's measured wall time of the step, ms, for the policy
                (:meth:`~dcut_sched.policies.Policy.observe_time`); ignored unless finite and > 0.

        After a plan without draft only the step is counted (there were no drafts). The caller checks
        that a plan awaits (``pending_batch_size``) and the shape.
        """
        self.pending_batch_size = None
        self.observed_steps += 1
        if step_ms is not None and 0.0 < step_ms < float("inf"):
            self.policy.observe_time(float(step_ms))
        if self._last is None:
            return
        conf, lengths = self._last
        self._last = None
        if not in_range:
            num_accepted = self._clip_accepted(num_accepted, lengths)
        if type(num_accepted) is np.ndarray:
            self._host_accepted += _sum_reduce(num_accepted)
        else:
            self._count("accepted_drafts", num_accepted.sum())
        if self.calibrator is not None:
            self.calibrator.observe(conf, num_accepted, lengths)
        self.policy.observe(lengths, num_accepted)

    def _clip_accepted(self, accept: Array, lengths: Array) -> Array:
        """Reported accepted drafts -> drafts accepted among the ``lengths - 1`` verified ones."""
        hi = lengths - 1
        if is_tensor(lengths):
            torch = tensor_module()
            accept = torch.as_tensor(accept, device=lengths.device).to(torch.int64)
            self._count("bad_accept_requests", ((accept < 0) | (accept > hi)).sum())
            return verified_prefix_tokens(accept.clamp(min=0), lengths) - 1
        if is_tensor(accept):
            accept = accept.cpu().numpy()
        accept = np.asarray(accept, dtype=np.int64)
        self._count("bad_accept_requests", int(((accept < 0) | (accept > hi)).sum()))
        return verified_prefix_tokens(np.maximum(accept, 0), lengths) - 1

    def __repr__(self) -> str:
        return (f"StepDriver(policy={self.policy!r}, calibrator={self.calibrator!r}, "
                f"graph_cells={self.graph_cells!r})")
