"""One engine step of the ratio controller, sanitise -> calibrate -> plan -> observe, in
:class:`StepDriver`: the single implementation, run by the online controller on tensors and by the
simulator on numpy arrays (so the simulator evaluates the controller, not a copy). Also the
captured graph cells and their padding rule (:class:`GraphCells`). Imports neither torch nor the
simulator; counters on a device are summed lazily (no host sync).
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
    """The captured ``(batch_size, num_tokens)`` cells of a CUDA-graph bank and the padding rule,
    torch-free so that the simulator charges what a bank replays. ``ValueError`` for no cells, or a
    cell with ``batch_size < 1`` or ``num_tokens < batch_size``.
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
        >= ``batch_size``, then its smallest token count >= ``num_tokens`` (``ValueError`` if none is).
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
    """``policy`` limited to a graph bank's captured ``token_counts``: a policy that takes
    ``allowed_num_tokens`` (``fine``) and has none of its own gets a fresh instance with them; any
    other is returned as it is (its budget is padded up when it runs, :meth:`StepDriver.graph_cell`).
    """
    defaults = _policies.param_defaults(policy.name)
    params = policy.params()
    if "allowed_num_tokens" not in defaults or params.get("allowed_num_tokens") is not None:
        return policy
    return _policies.get(policy.name, **{**params, "allowed_num_tokens": [int(k) for k in token_counts]})


class StepDriver:
    """The controller's per-step sequence around one policy instance (whose state is this driver's).
    Per step: :meth:`plan` or :meth:`plan_without_draft`, then :meth:`observe` once.

    ``costs``: the :class:`~dcut_sched.step_costs.StepCosts` the policy plans with (``None`` if it needs
    none; a bare curve is a ``TypeError``, another block size a ``ValueError``). ``calibrator``:
    ``transform(conf)`` before the policy, ``observe(conf, num_accepted, lengths)`` after a drafted
    step, ``observe_plain(bs)`` (if it has one) after a plain step. ``graph_cells``: anything with
    ``cell_for(bs, num_tokens)``. ``validate_scored``: the policy checks the confidences it scores
    (the simulator's calibrators; the controller trusts its own).
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
        """``conf`` with every row that holds NaN, +-inf or a value outside [0, 1] replaced by zeros, never
        raised on (counted in ``bad_conf_requests``): its drafts score 0, so score-driven policies verify
        its anchor only, and fixed-length ones keep a length that is harmless (verification is lossless).
        Integer input becomes float32; same kind and device; clean numpy input is returned as it is.
        """
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

    def plan(self, conf: Array, accept_len: Array | None = None, remaining: np.ndarray | None = None) -> VerifyPlan:
        """Plan one drafted step from ``conf [bs, B-1]`` (shape checked by the caller): sanitise, calibrate,
        then the policy's :class:`~dcut_sched.policies.VerifyPlan` (lengths of ``conf``'s kind).
        ``accept_len`` only reaches a policy that needs it (``oracle``); ``remaining`` (host ``[bs]``
        ints, given while no request waits) one that reads it (``fine``).

        Raises:
            CostCurveRangeError: the batch size or a budget is outside the cost curve.
            ValueError: with ``validate_scored``, a calibrator output outside [0, 1].
        """
        conf = self.sanitize(conf)
        scored = conf if self.calibrator is None else self.calibrator.transform(conf)
        extra: dict[str, Any] = {}
        if self._needs_accept_len:
            extra["accept_len"] = accept_len
        if remaining is not None and self.policy.reads_remaining:
            extra["remaining"] = remaining
        vp = self.policy.plan(scored, self.costs, validate=self.validate_scored, **extra)
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
        """The ``(batch_size, num_tokens)`` cell a step replays: :meth:`GraphCells.cell_for` with cells
        attached, else the budget itself (``ValueError`` if no captured cell is large enough).
        """
        if self.graph_cells is None:
            return batch_size, num_tokens
        return self.graph_cells.cell_for(batch_size, num_tokens)

    def observe(self, num_accepted: Array, *, in_range: bool = False, step_ms: float | None = None) -> None:
        """Feed back the last plan's outcome: ``num_accepted [bs]`` (the plan's kind), clipped into
        ``[0, lengths - 1]`` and counted in ``bad_accept_requests`` when out of range, unless ``in_range``
        (the caller guarantees it as int64). ``step_ms``: the step's measured wall time for the policy
        (ignored unless finite and > 0). After a plain step only the step is counted; the caller checks
        that a plan awaits and the shape.
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
