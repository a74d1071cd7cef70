"""Timing hooks of :meth:`~dcut_sched.engine.SpecEngine.generate`: the phases of a decode step.

A measurement harness (``analysis/fidelity.py``, a profiler of the engine, a progress display)
subclasses :class:`EngineObserver`, overrides the methods it needs and passes an instance as
``SpecEngine.generate(..., observer=...)``. The engine calls, for decode step ``s`` (from 0), in
this order:

=====================================================  =================================================
call                                                   when
=====================================================  =================================================
``step_started(s, request_ids)``                       before anything of the step runs
``phase_started(s, "draft")`` / ``phase_ended(...)``   around the drafter call (drafted steps only)
``phase_started(s, "oracle_verify")`` / ``..ended``    around the full-block verification the ``oracle``
                                                       policy runs before planning (oracle, drafted steps)
``phase_started(s, "plan")`` / ``phase_ended(...)``    around the controller's ``plan`` /
                                                       ``plan_without_draft``
``phase_started(s, "verify")`` / ``phase_ended(...)``  around the target's verification forward of the
                                                       plan, the acceptance and the commit
``step_ended(record)``                                 once the step is committed, with its
                                                       :class:`~dcut_sched.engine.EngineStepRecord`
=====================================================  =================================================

``phase_ended`` gets the phase's wall time in ms (``time.perf_counter``). The record's
``draft_ms`` is the ``draft`` phase, ``plan_ms`` is ``oracle_verify`` + ``plan`` and ``verify_ms``
is ``verify``. The controller's feedback (``observe``) runs after ``verify`` and the prefill of
newly admitted requests between steps; neither is inside a phase nor in the step's
``decode_ms``. Hooks run synchronously inside the timed phases: keep them cheap (a counter, a
``perf_counter`` read). Every model forward of a phase runs between its ``phase_started`` and
``phase_ended``, so forward-level timing can attribute forwards to phases with torch's module
hooks (``model.register_forward_pre_hook`` / ``register_forward_hook``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["PHASES", "EngineObserver", "EngineStepRecord", "Phase"]

Phase = Literal["draft", "oracle_verify", "plan", "verify"]
#: The phases of a decode step, in the order they run.
PHASES: tuple[str, ...] = ("draft", "oracle_verify", "plan", "verify")


@dataclass
class EngineStepRecord:
    """One engine step.

    Attributes:
        step: index from 0.
        request_ids: ``[bs]`` prompt index of each active request.
        drafted: whether the step ran the drafter.
        lengths: ``[bs]`` slots verified per request (the plan).
        num_tokens: ``sum(lengths)``; ``ratio``: ``num_tokens / (bs * B)``.
        graph_cell: ``(batch_size, num_tokens)`` cell the plan maps to.
        packed_tokens: token-forwards of the packed verification input (``rows * T``).
        expected_tokens: the plan's expected tokens.
        accepted: ``[bs]`` drafts accepted per request.
        committed_tokens: tokens committed this step (after truncation at EOS / max_new_tokens).
        draft_ms, plan_ms, verify_ms: wall time of the three phases (``plan_ms`` includes the
            oracle's full-block verification; :mod:`dcut_sched.engine.observer`).
    """

    step: int
    request_ids: list[int]
    drafted: bool
    lengths: list[int]
    num_tokens: int
    ratio: float
    graph_cell: tuple[int, int]
    packed_tokens: int
    expected_tokens: float
    accepted: list[int]
    committed_tokens: int
    draft_ms: float
    plan_ms: float
    verify_ms: float

    @property
    def batch_size(self) -> int:
        return len(self.request_ids)


class EngineObserver:
    """Base class of the engine's timing hooks (module docstring): every method does nothing.

    Override any of :meth:`step_started`, :meth:`phase_started`, :meth:`phase_ended` and
    :meth:`step_ended`; the engine never reads a return value and never calls anything else.
    """

    def step_started(self, step: int, request_ids: list[int]) -> None:
        """Step ``step`` begins with the requests ``request_ids`` (prompt indices, cache-row order)."""

    def phase_started(self, step: int, phase: Phase) -> None:
        """Phase ``phase`` (one of :data:`PHASES`) of step ``step`` is about to run."""

    def phase_ended(self, step: int, phase: Phase, elapsed_ms: float) -> None:
        """Phase ``phase`` of step ``step`` ran for ``elapsed_ms`` ms of wall time."""

    def step_ended(self, record: EngineStepRecord) -> None:
        """Step ``record.step`` is committed; ``record`` is its :class:`EngineStepRecord`."""
