"""Real vLLM engine steps, timed, and the cost-curve rows they give (docs/vllm.md, docs/design.md §4).

Two halves:

- :class:`StepTimer` (needs an in-process vLLM 0.32 ``LLM``, ``VLLM_ENABLE_V1_MULTIPROCESSING=0``)
  wraps, on one engine instance, ``LLMEngine.step`` (the wall time of each engine step: schedule,
  target forward, sampling or rejection sampling, the drafter's proposal, output processing),
  ``Scheduler.schedule`` (the step's shape: requests, scheduled tokens, drafts verified, prefill or
  decode), the drafter's ``propose`` and its model's ``forward`` (the real draft pass, with
  attention over each request's context: the time to the end of its first forward, over the
  step's verified tokens, and the rest). One :class:`StepRecord` per engine step.
- :func:`engine_step_rows` (pure, no vLLM): from the records of three runs on held-out prompts
  (the engine without speculation; a speculative engine verifying whole blocks, ``full``; the same
  engine verifying anchors only, ``ar`` with ``num_spec_tokens_to_schedule = 0``) and the
  dummy-batch curve, the ``draft``, ``draft_first`` and ``step_overhead`` rows, per batch size
  ``bs`` over the decode steps of a wave of ``bs`` requests while all ``bs`` run (prefill steps and
  the wave's tail are left out):

  - ``draft_first(bs, bs)`` = median time to the end of the drafter's first forward in
    undrafted steps (it runs over the ``bs`` anchors); ``draft_first(bs, K)`` at the drafted steps'
    ``K = bs * B`` = the same in drafted steps;
  - ``draft(bs)`` = median of the rest of the draft pass in drafted steps (the ``B - 2`` one-token
    forwards and sampling) + ``draft_first(bs, bs)``: the draft step at the anchor-only budget;
  - ``step_overhead``: the median per-step residual of the wall time over the curve's forwards,
    ``plain``: ``step - C_ar(bs)``; ``undrafted``: ``step - C_ar(bs) - C_draft_first(bs, bs)``;
    ``drafted``: ``step - C_verify(bs, K) - C_draft(bs) - (C_draft_first(bs, K) - C_draft_first(bs, bs))``,
    clipped at 0 (a negative median, a step faster than the curve's forwards, is reported in the
    row's provenance note by the caller); p20/p80 are the residuals' quantiles.

These are the formulas :class:`~dcut_sched.step_costs.StepCosts` sums, so the rows reproduce the
measured median step by construction at the measured shapes.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np

from ...cost_curve import CostCurve, DraftFirstRow, DraftRow, StepOverheadRow

__all__ = ["StepRecord", "StepTimer", "engine_step_rows"]


@dataclass
class StepRecord:
    """One engine step (ms; ``kind``: ``prefill``, ``plain``, ``drafted``, ``undrafted``).

    ``num_requests``: requests scheduled; ``num_tokens``: tokens the target ran (the verified slots
    of a decode step); ``num_drafts``: draft tokens verified; ``propose_ms``: the drafter's whole
    ``propose`` (0 without a drafter); ``draft_first_ms``: from ``propose``'s start to the end of
    its first model forward; ``draft_first_tokens``: that forward's input tokens; ``wave``: the
    batch size of the run it belongs to (set by the caller)."""

    kind: str
    num_requests: int
    num_tokens: int
    num_drafts: int
    step_ms: float
    propose_ms: float = 0.0
    draft_first_ms: float = 0.0
    draft_first_tokens: int = 0
    wave: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("extra")
        return d


class StepTimer:
    """Wrap one in-process ``vllm.LLM`` so that every engine step is timed (module docstring).

    Args:
        llm: a ``vllm.LLM`` built with ``VLLM_ENABLE_V1_MULTIPROCESSING=0``.

    Attributes:
        records: :class:`StepRecord` per engine step, in order.

    Raises:
        RuntimeError: the engine core is not in this process.
    """

    def __init__(self, llm) -> None:
        import torch

        from .profile import find_model_runner

        self._cuda = torch.cuda.is_available()
        engine = llm.llm_engine
        core = getattr(engine.engine_core, "engine_core", None)
        if core is None:
            raise RuntimeError("StepTimer needs the in-process engine core (VLLM_ENABLE_V1_MULTIPROCESSING=0)")
        self.records: list[StepRecord] = []
        self.wave = 0
        self._cur: dict[str, Any] | None = None
        self._speculative = core.scheduler.vllm_config.speculative_config is not None
        self._patched: list[tuple[Any, str]] = []
        self._patch(engine, "step", self._wrap_step(engine.step))
        self._patch(core.scheduler, "schedule", self._wrap_schedule(core.scheduler.schedule))
        runner = find_model_runner(llm)
        drafter = getattr(runner, "drafter", None)
        if drafter is not None:
            self._patch(drafter, "propose", self._wrap_propose(drafter.propose))
            self._patch(drafter.model, "forward", self._wrap_forward(drafter.model.forward))

    def _patch(self, obj: Any, name: str, fn) -> None:
        setattr(obj, name, fn)
        self._patched.append((obj, name))

    def restore(self) -> None:
        """Remove the wrappers (the instance attributes; the classes were never touched)."""
        for obj, name in self._patched:
            try:
                delattr(obj, name)
            except AttributeError:
                pass
        self._patched.clear()

    def _now(self) -> float:
        if self._cuda:
            import torch

            torch.cuda.synchronize()
        return time.perf_counter()

    def _wrap_step(self, orig):
        def step(*args, **kwargs):
            self._cur = {"propose_ms": 0.0, "draft_first_ms": 0.0, "draft_first_tokens": 0, "shape": None}
            t0 = self._now()
            out = orig(*args, **kwargs)
            t1 = self._now()
            cur, self._cur = self._cur, None
            shape = cur["shape"]
            if shape is not None:  # a step that scheduled nothing is not an engine step
                self.records.append(StepRecord(step_ms=(t1 - t0) * 1e3, propose_ms=cur["propose_ms"],
                                               draft_first_ms=cur["draft_first_ms"],
                                               draft_first_tokens=cur["draft_first_tokens"], wave=self.wave, **shape))
            return out
        return step

    def _wrap_schedule(self, orig):
        def schedule(*args, **kwargs):
            out = orig(*args, **kwargs)
            n_sched = dict(out.num_scheduled_tokens)
            if self._cur is not None and n_sched:
                spec = {r: len(v) for r, v in (out.scheduled_spec_decode_tokens or {}).items()}
                prefill = bool(out.scheduled_new_reqs) or any(n > 1 + spec.get(r, 0) for r, n in n_sched.items())
                drafts = int(sum(spec.values()))
                kind = ("prefill" if prefill else "drafted" if drafts else
                        "undrafted" if self._speculative else "plain")
                self._cur["shape"] = {"kind": kind, "num_requests": len(n_sched),
                                      "num_tokens": int(out.total_num_scheduled_tokens), "num_drafts": drafts}
            return out
        return schedule

    def _wrap_propose(self, orig):
        def propose(*args, **kwargs):
            cur = self._cur
            if cur is not None:
                cur["_propose_t0"] = self._now()
                cur["_first_done"] = False
            out = orig(*args, **kwargs)
            if cur is not None:
                cur["propose_ms"] += (self._now() - cur["_propose_t0"]) * 1e3
            return out
        return propose

    def _wrap_forward(self, orig):
        def forward(*args, **kwargs):
            out = orig(*args, **kwargs)
            cur = self._cur
            if cur is not None and "_propose_t0" in cur and not cur["_first_done"]:
                cur["_first_done"] = True
                cur["draft_first_ms"] += (self._now() - cur["_propose_t0"]) * 1e3
                ids = kwargs.get("input_ids", args[0] if args else None)
                cur["draft_first_tokens"] = int(ids.shape[0]) if ids is not None and hasattr(ids, "shape") else 0
            return out
        return forward


def _quantiles(x: np.ndarray) -> tuple[float, float, float]:
    p20, med, p80 = np.percentile(x, [20, 50, 80])
    return float(med), float(p20), float(p80)


def engine_step_rows(curve: CostCurve, records: Iterable[StepRecord | dict], block_size: int,
                     batch_sizes: Sequence[int]) -> tuple[list[DraftRow], list[DraftFirstRow],
                                                          list[StepOverheadRow], dict[str, Any]]:
    """The ``draft``, ``draft_first`` and ``step_overhead`` rows of real engine steps (module docstring).

    Args:
        curve: the dummy-batch curve (its ``verify`` and ``ar`` rows price the target's forwards).
        records: :class:`StepRecord` (or their dicts) of the three held-out runs; only decode
            steps of full waves (``num_requests == wave``) at ``batch_sizes`` count.
        block_size: B.
        batch_sizes: where to write rows.

    Returns:
        ``(draft, draft_first, step_overhead, notes)``; ``notes`` per ``kind/bs``: steps used and
        the raw median residual (before clipping at 0), for the curve's provenance.

    Raises:
        ValueError: a batch size without the steps a row needs (names the kind and bs).
    """
    recs = [r if isinstance(r, StepRecord) else StepRecord(**{k: v for k, v in r.items() if k != "extra"})
            for r in records]
    draft, first, overhead, notes = [], [], [], {}

    def pick(kind: str, bs: int) -> list[StepRecord]:
        return [r for r in recs if r.kind == kind and r.wave == bs and r.num_requests == bs]

    def overhead_row(kind: str, bs: int, resid: np.ndarray) -> None:
        med, p20, p80 = _quantiles(resid)
        notes[f"{kind}/bs{bs}"] = {"steps": int(resid.size), "median_residual_ms": round(med, 3)}
        overhead.append(StepOverheadRow(kind, bs, max(0.0, med), p20, p80, int(resid.size), "measured"))

    for bs in sorted(set(int(b) for b in batch_sizes)):
        plain = pick("plain", bs)
        if plain:
            step = np.array([r.step_ms for r in plain])
            overhead_row("plain", bs, step - curve.ar_ms(bs))
        und = pick("undrafted", bs)
        drf = [r for r in pick("drafted", bs) if r.num_tokens <= bs * block_size]
        if not und and not drf:
            continue
        if not und or not drf:
            missing = "undrafted" if not und else "drafted"
            raise ValueError(f"batch size {bs}: no {missing} decode steps of a full wave were timed; "
                             f"run more tokens per request or check the {missing} run")
        f_anchor = np.array([r.draft_first_ms for r in und])
        med, p20, p80 = _quantiles(f_anchor)
        first.append(DraftFirstRow(bs, bs, med, p20, p80, int(f_anchor.size), "measured"))
        full_k = bs * block_size
        f_full = np.array([r.draft_first_ms for r in drf if r.num_tokens == full_k])
        if f_full.size and full_k > bs:
            m, a, b = _quantiles(f_full)
            first.append(DraftFirstRow(bs, full_k, m, a, b, int(f_full.size), "measured"))
        rest = np.array([r.propose_ms - r.draft_first_ms for r in drf])
        m, a, b = _quantiles(rest)
        draft.append(DraftRow(bs, m + med, a + med, b + med, int(rest.size), "measured"))
    tmp = CostCurve(hardware=curve.hardware, model=curve.model, block_size=curve.block_size,
                    context_len=curve.context_len, verify=curve.verify, ar=curve.ar, draft=draft,
                    draft_first=first, graph_mode=curve.graph_mode)
    for bs in sorted(set(r.batch_size for r in draft)):
        und = pick("undrafted", bs)
        step = np.array([r.step_ms for r in und])
        overhead_row("undrafted", bs, step - curve.ar_ms(bs) - tmp.draft_first_ms(bs, bs))
        drf = [r for r in pick("drafted", bs) if r.num_tokens <= bs * block_size]
        model = np.array([tmp.draft_ms(bs) + float(tmp.verify_ms(bs, r.num_tokens))
                          + float(tmp.draft_first_ms(bs, r.num_tokens)) - float(tmp.draft_first_ms(bs, bs))
                          for r in drf])
        overhead_row("drafted", bs, np.array([r.step_ms for r in drf]) - model)
    return draft, first, overhead, notes
