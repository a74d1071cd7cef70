"""Real vLLM engine steps, timed, and the cost-curve rows they give (docs/vllm.md, docs/design.md §4).

Two halves:

- :class:`StepTimer` (needs an in-process vLLM 0.32 ``LLM``, ``VLLM_ENABLE_V1_MULTIPROCESSING=0``)
  wraps, on one engine instance, ``LLMEngine.step`` (the wall time of each engine step: schedule,
  target forward, sampling or rejection sampling, the drafter's proposal, output processing),
  ``Scheduler.schedule`` (the step's shape: requests, scheduled tokens, drafts verified, prefill or
  decode), the drafter's ``propose`` and its model's ``forward`` (the real draft pass, with
  attention over each request's context: the time to the end of its first forward, over the
  step's verified tokens, and the rest). One :class:`VllmStepTiming` per engine step.
- :func:`engine_step_rows` (pure, no vLLM): from the records of four runs on held-out prompts
  (the engine without speculation; a speculative engine drafting every step and verifying whole
  blocks, ``full``, K = bs * B; the same drafting every step but verifying anchors only,
  ``uniform`` at rho = 1/B, K = bs; the same not drafting at all, ``ar``, which sets
  ``num_spec_tokens_to_schedule = 0``) and the dummy-batch curve, the ``draft``, ``draft_first``
  and ``step_overhead`` rows, per batch size ``bs`` over the decode steps of a wave of ``bs``
  requests while all ``bs`` run (prefill steps and the wave's tail are left out). A step is
  *drafted* when the drafter proposes drafts in it, *undrafted* when it only runs its first pass:

  - ``draft(bs)`` = median of the drafter's whole ``propose`` in drafted steps at K = bs: the draft
    step at the anchor-only budget, a real pass with attention over each request's context;
  - ``draft_first(bs, K)`` = median time to the end of the drafter's first forward (over the K
    verified tokens) in drafted steps, at every K with steps (bs and bs * B here);
  - ``step_overhead``: the median per-step residual of the wall time over the curve's forwards,
    signed (a negative median is a real step faster than the dummy-batch forwards it is charged),
    ``plain``: ``step - C_ar(bs)``; ``undrafted``: ``step - C_ar(bs) - C_draft_first(bs, bs)``;
    ``drafted``: ``step - C_verify(bs, K) - C_draft(bs) - (C_draft_first(bs, K) - C_draft_first(bs, bs))``,
    one row per K bucket the runs verify (``num_tokens`` = bs and bs * B), since the residual moves
    with K; p20/p80 are the residuals' quantiles.

These are the formulas :class:`~dcut_sched.step_costs.StepCosts` sums, so the rows reproduce the
measured median step by construction at the measured shapes.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np
import torch

from ...cost_curve import CostCurve, DraftFirstRow, DraftRow, StepOverheadRow
from ..vllm.startup_profile import find_model_runner

__all__ = ["VllmStepTiming", "StepTimer", "engine_step_rows"]


@dataclass
class VllmStepTiming:
    """One engine step (ms; ``kind``: ``prefill``, ``plain``, ``drafted``, ``undrafted``).

    ``num_requests``: requests scheduled; ``num_tokens``: tokens the target ran (the verified slots
    of a decode step); ``num_drafts``: draft tokens verified; ``proposed``: draft tokens per request
    the drafter was asked for in this step (0: only its KV-keeping first pass); ``propose_ms``: the drafter's whole
    ``propose`` (0 without a drafter); ``draft_first_ms``: from ``propose``'s start to the end of
    its first model forward; ``draft_first_tokens``: that forward's input tokens; ``wave``: the
    batch size of the run it belongs to (set by the caller)."""

    kind: str
    num_requests: int
    num_tokens: int
    num_drafts: int
    step_ms: float
    proposed: int = 0
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
        records: :class:`VllmStepTiming` per engine step, in order.

    Raises:
        RuntimeError: the engine core is not in this process.
    """

    def __init__(self, llm) -> None:
        self._cuda = torch.cuda.is_available()
        engine = llm.llm_engine
        core = getattr(engine.engine_core, "engine_core", None)
        if core is None:
            raise RuntimeError("StepTimer needs the in-process engine core (VLLM_ENABLE_V1_MULTIPROCESSING=0)")
        self.records: list[VllmStepTiming] = []
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
            torch.cuda.synchronize()
        return time.perf_counter()

    def _wrap_step(self, orig):
        def step(*args, **kwargs):
            self._cur = {"propose_ms": 0.0, "draft_first_ms": 0.0, "draft_first_tokens": 0, "shape": None,
                         "proposed": 0}
            t0 = self._now()
            out = orig(*args, **kwargs)
            t1 = self._now()
            cur, self._cur = self._cur, None
            shape = cur["shape"]
            if shape is not None:  # a step that scheduled nothing is not an engine step
                if shape["kind"] in ("drafted", "undrafted"):
                    shape["kind"] = "drafted" if cur["proposed"] > 0 else "undrafted"
                self.records.append(VllmStepTiming(step_ms=(t1 - t0) * 1e3, propose_ms=cur["propose_ms"],
                                               proposed=cur["proposed"],
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
                kind = "prefill" if prefill else "drafted" if self._speculative else "plain"  # refined in step()
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
                n_spec = kwargs.get("num_speculative_tokens", args[0] if args else 0)
                cur["proposed"] = int(n_spec or 0)
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


def engine_step_rows(curve: CostCurve, records: Iterable[VllmStepTiming | dict], block_size: int,
                     batch_sizes: Sequence[int]) -> tuple[list[DraftRow], list[DraftFirstRow],
                                                          list[StepOverheadRow], dict[str, Any]]:
    """The ``draft``, ``draft_first`` and ``step_overhead`` rows of real engine steps (module docstring).

    Args:
        curve: the dummy-batch curve (its ``verify`` and ``ar`` rows price the target's forwards).
        records: :class:`VllmStepTiming` (or their dicts) of the three held-out runs; only decode
            steps of full waves (``num_requests == wave``) at ``batch_sizes`` count.
        block_size: B.
        batch_sizes: where to write rows.

    Returns:
        ``(draft, draft_first, step_overhead, notes)``; ``notes`` per ``kind/bs``: steps used and
        the median residual (and per K for drafted steps), for the curve's provenance.

    Raises:
        ValueError: a batch size without the steps a row needs (names the kind and bs).
    """
    recs = [r if isinstance(r, VllmStepTiming) else VllmStepTiming(**{k: v for k, v in r.items() if k != "extra"})
            for r in records]
    draft, first, overhead, notes = [], [], [], {}

    def pick(kind: str, bs: int) -> list[VllmStepTiming]:
        return [r for r in recs if r.kind == kind and r.wave == bs and r.num_requests == bs]

    def overhead_row(kind: str, bs: int, resid: np.ndarray, num_tokens: int | None = None) -> None:
        med, p20, p80 = _quantiles(resid)
        if num_tokens is None:
            notes[f"{kind}/bs{bs}"] = {"steps": int(resid.size), "median_residual_ms": round(med, 3)}
        overhead.append(StepOverheadRow(kind, bs, med, p20, p80, int(resid.size), "measured", num_tokens))

    for bs in sorted(set(int(b) for b in batch_sizes)):
        plain = pick("plain", bs)
        if plain:
            step = np.array([r.step_ms for r in plain])
            overhead_row("plain", bs, step - curve.ar_ms(bs))
        drf = [r for r in pick("drafted", bs) if r.num_tokens <= bs * block_size]
        if not drf:
            continue
        anchor = [r for r in drf if r.num_tokens == bs]
        if not anchor:
            raise ValueError(f"batch size {bs}: no drafted decode step verifying anchors only (K = bs) of a full "
                             "wave was timed; the anchor-only run (uniform at rho = 1/B) is missing or too short")
        m, a, b = _quantiles(np.array([r.propose_ms for r in anchor]))
        draft.append(DraftRow(bs, m, a, b, len(anchor), "measured"))
        for k in sorted(set(r.num_tokens for r in drf)):
            at_k = np.array([r.draft_first_ms for r in drf if r.num_tokens == k])
            if k == bs or (at_k.size >= 2 and k % bs == 0):  # the uniform widths the runs verify
                m, a, b = _quantiles(at_k)
                first.append(DraftFirstRow(bs, k, m, a, b, int(at_k.size), "measured"))
    tmp = CostCurve(hardware=curve.hardware, model=curve.model, block_size=curve.block_size,
                    context_len=curve.context_len, verify=curve.verify, ar=curve.ar, draft=draft,
                    draft_first=first, graph_mode=curve.graph_mode)
    for bs in sorted(set(r.batch_size for r in draft)):
        und = pick("undrafted", bs)
        if und:
            step = np.array([r.step_ms for r in und])
            overhead_row("undrafted", bs, step - curve.ar_ms(bs) - tmp.draft_first_ms(bs, bs))
        drf = [r for r in pick("drafted", bs) if tmp.token_range(bs)[0] <= r.num_tokens <= bs * block_size
               and r.num_tokens <= tmp._draft_first_cells.token_range(bs)[1]]
        model = np.array([tmp.draft_ms(bs) + float(tmp.verify_ms(bs, r.num_tokens))
                          + float(tmp.draft_first_ms(bs, r.num_tokens)) - float(tmp.draft_first_ms(bs, bs))
                          for r in drf])
        resid = np.array([r.step_ms for r in drf]) - model
        med = float(np.median(resid))
        notes[f"drafted/bs{bs}"] = {"steps": int(resid.size), "median_residual_ms": round(med, 3)}
        buckets = [row.num_tokens for row in first if row.batch_size == bs]  # the K the runs verify
        for k in sorted(set(r.num_tokens for r in drf)):
            sel = np.array([r.num_tokens == k for r in drf])
            notes[f"drafted/bs{bs}"].setdefault("median_residual_ms_by_num_tokens", {})[str(k)] = round(
                float(np.median(resid[sel])), 3)
            if k in buckets:
                overhead_row("drafted", bs, resid[sel], num_tokens=k)
    return draft, first, overhead, notes
