"""Batched speculative decoding (greedy or sampled) with the ratio controller choosing each step's verification.

The target is a :class:`~dcut_sched.model.llama.LlamaModel` (the project's own forward with a static
KV cache), the drafter its self-speculative version (:class:`~dcut_sched.model.drafter.SelfSpecDrafter`,
the same weights with some layers skipped). ``batch_size`` requests run at a time (continuous
batching: a finished request's cache row is refilled with the next prompt).

One step, for the active requests (request i has committed ``n_i`` tokens; the last one, its
*current* token, has not been fed to the target yet):

1. **Draft** (when the previous plan's ``draft_next``, or the policy's ``drafts_first_step`` on the
   first step): the drafter proposes ``B-1`` tokens ``d_1..d_{B-1}`` and their confidences
   ``[bs, B-1]`` per request.
2. **Plan**: ``RatioController.plan(conf)`` picks ``L_i`` slots per request (a plain step, without a
   draft, verifies ``L_i = 1``).
3. **Verify**: one target forward over the current token and ``d_1..d_{L_i-1}`` of every request,
   at positions ``n_i-1 ..``, packed into dense rows (:mod:`dcut_sched.engine.packing`). Greedy
   acceptance: ``a_i`` = the longest prefix of drafts equal to the target's argmax at the previous
   slot; the request commits ``d_1..d_{a_i}`` and the target's token after them (the bonus token).
4. **Roll back**: the target cache needs no copy: a request's valid length becomes
   ``n_i + a_i`` (rows beyond hold rejected drafts' K/V, which no later query sees because queries
   only attend to slots at or before their position, and which later writes overwrite). The drafter
   cache is re-synchronised on its next call (it feeds the accepted tokens it did not produce and the
   bonus token; ``SelfSpecDrafter.draft`` works out what it is missing).
5. **Feedback**: ``RatioController.observe(a)``.

Steps 2 and 5 go through a :class:`~dcut_sched.controller.request_batch.RequestBatch`, by request
id (prompt index): the request bookkeeping vLLM's scheduler uses too.

Sampling (``sampling=SamplingParams(temperature=T, ...)``, T > 0): the drafter stays greedy; the
target's token at every verified slot is drawn by :func:`dcut_sched.sampling.sample_at` from the
request's own key and the token's index in its sequence, a draft is accepted iff it equals that
draw (accept with probability ``p_t(d_t)``, else the target's distribution without ``d_t``), and the
bonus/correction is the draw itself. Each request's output is then exactly what plain sampled
decoding (:func:`dcut_sched.model.generate.sample_generate`) gives with the same key, for every policy
and batch composition (the proof is in :mod:`dcut_sched.sampling`).

Greedy verification is lossless: every committed token is the target's argmax given the committed
prefix, so the output equals plain greedy decoding (:func:`dcut_sched.model.generate.greedy_generate`)
token for token, whatever the policy (up to floating-point near-ties between differently shaped
forwards; see ``greedy_generate``'s note). ``oracle`` needs the true acceptance before planning: the
engine verifies the whole block to learn it, then plans with it (a reference for comparisons, not
a deployable policy, and no upper bound: its step cost is that of ``full``).

Code layout (after gpt-fast's ``speculative_decode()`` beside ``generate()``): one step is the free
function :func:`~dcut_sched.engine.decode_step.speculative_step` (draft, plan, verify, commit, feedback),
built from :func:`~dcut_sched.engine.decode_step.verify_block` and
:func:`~dcut_sched.engine.decode_step.accepted_drafts`; :meth:`SpecEngine.generate` is the loop around it
(prefill into free rows, step, repeat). Timing hooks: pass an
:class:`~dcut_sched.engine.observer.EngineObserver` to ``generate`` to be called around each step
and its draft / plan / verify phases (how ``analysis/fidelity.py`` times the engine).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import pandas as pd
import torch

from ..controller import RatioController
from ..controller.request_batch import RequestBatch
from ..drafters.runtime import DFlashDrafter, NoDrafter
from ..model.drafter import SelfSpecDrafter
from ..sampling import SamplingParams, request_keys
from .decode_step import (
    DecodeBatch,
    DecodeContext,
    EngineStepRecord,
    prefill_free_rows,
    speculative_step,
)
from .observer import EngineObserver
from .verify_runtime import VerifyRuntime

__all__ = ["EngineObserver", "EngineResult", "EngineStepRecord", "SpecEngine"]


@dataclass
class EngineResult:
    """Outputs and measurements of one :meth:`SpecEngine.generate` run.

    Attributes:
        outputs: generated token ids per prompt (prompt excluded), in input order.
        steps: the :class:`EngineStepRecord` of every decode step.
        prefill_ms: wall time of the prefills (prompt processing, including each request's first
            token); ``decode_ms``: wall time of the decode steps.
        policy, block_size, batch_size: the run's settings; ``cost_source``: which cost curve.
        trace_rows: step-indexed trace rows ``(request_id, pos, accept_len, conf[B-1])`` of the
            drafted steps when recorded, else ``None``; sampled runs append ``p[B-1]`` (the target's
            probability of each draft token at the run's temperature; needs every slot verified).
        sampling: the run's :class:`~dcut_sched.sampling.SamplingParams`.
    """

    outputs: list[list[int]]
    steps: list[EngineStepRecord]
    prefill_ms: float
    decode_ms: float
    policy: str
    block_size: int
    batch_size: int
    cost_source: str = ""
    trace_rows: list[tuple] | None = None
    controller_metrics: dict[str, Any] = field(default_factory=dict)
    sampling: SamplingParams = field(default_factory=SamplingParams)

    @property
    def generated_tokens(self) -> int:
        return sum(len(o) for o in self.outputs)

    @property
    def decode_tokens(self) -> int:
        """Tokens committed by decode steps (each request's first token comes from its prefill)."""
        return sum(s.committed_tokens for s in self.steps)

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens per second of wall time (prefill + decode)."""
        total_s = (self.prefill_ms + self.decode_ms) / 1e3
        return self.generated_tokens / total_s if total_s > 0 else float("nan")

    @property
    def decode_tokens_per_s(self) -> float:
        """Decode-step tokens per second of decode wall time."""
        return self.decode_tokens / (self.decode_ms / 1e3) if self.decode_ms > 0 else float("nan")

    @property
    def accepted_per_step(self) -> float:
        """Mean drafts accepted per request per drafted step."""
        acc = [a for s in self.steps if s.drafted for a in s.accepted]
        return float(np.mean(acc)) if acc else 0.0

    @property
    def tokens_per_request_step(self) -> float:
        """Mean tokens committed per request per step (1 = plain decoding)."""
        n = sum(s.batch_size for s in self.steps)
        return self.decode_tokens / n if n else 0.0

    def summary(self) -> dict[str, Any]:
        """Headline figures (JSON-ready)."""
        steps = self.steps
        return {
            "policy": self.policy,
            "block_size": self.block_size,
            "batch_size": self.batch_size,
            "cost_source": self.cost_source,
            "sampling": self.sampling.describe(),
            "requests": len(self.outputs),
            "generated_tokens": self.generated_tokens,
            "steps": len(steps),
            "drafted_steps": sum(s.drafted for s in steps),
            "tokens_per_s": self.tokens_per_s,
            "decode_tokens_per_s": self.decode_tokens_per_s,
            "accepted_per_step": self.accepted_per_step,
            "tokens_per_request_step": self.tokens_per_request_step,
            "mean_ratio": float(np.mean([s.ratio for s in steps])) if steps else 0.0,
            "prefill_ms": self.prefill_ms,
            "decode_ms": self.decode_ms,
            "draft_ms": sum(s.draft_ms for s in steps),
            "plan_ms": sum(s.plan_ms for s in steps),
            "verify_ms": sum(s.verify_ms for s in steps),
            "bad_conf_requests": self.controller_metrics.get("bad_conf_requests", 0),
        }

    def steps_frame(self):
        """One row per step (pandas DataFrame); list columns hold per-request values."""
        return pd.DataFrame([asdict(s) | {"batch_size": s.batch_size} for s in self.steps])

    def trace(self, metadata: dict[str, Any] | None = None):
        """The recorded step-indexed :class:`~dcut_sched.traces.Trace` (``record_trace=True``).

        ``accept_len`` of a row is the drafts accepted at that step; it is exact (what full
        verification gives) only where the plan verified the whole block, else censored at
        ``lengths - 1`` (metadata ``accept_len_censored``).

        Raises:
            ValueError: the run did not record a trace, or recorded no drafted step.
        """
        # traces read and write Parquet: pyarrow is imported only where a trace is made (the
        # device check's environment serves the engine without it)
        from ..traces import Trace
        from ..traces.format import accept_len_dtype

        if self.trace_rows is None:
            raise ValueError("this run did not record a trace; call generate(..., record_trace=True)")
        if not self.trace_rows:
            raise ValueError("the run had no drafted steps, so there is no trace to write")
        rows = sorted(self.trace_rows, key=lambda r: (r[0], r[1]))
        sampled = not self.sampling.is_greedy
        meta = {
            "indexing": "step",
            "block_size": str(self.block_size),
            "source": "recorded",
            "temperature": f"{float(self.sampling.temperature):g}",
            "policy": self.policy,
            "accept_len_censored": "false" if self.policy == "full" else "true",
        }
        if sampled:
            meta.update(top_p=f"{self.sampling.top_p:g}", top_k=str(self.sampling.top_k), seed=str(self.sampling.seed))
        meta.update(metadata or {})
        k = self.block_size - 1
        return Trace(
            request_id=np.array([r[0] for r in rows], dtype=np.int32),
            pos=np.array([r[1] for r in rows], dtype=np.int32),
            accept_len=np.array([r[2] for r in rows], dtype=accept_len_dtype(self.block_size)),
            conf=np.array([r[3] for r in rows], dtype=np.float32).reshape(len(rows), k),
            metadata=meta,
            target_prob=np.array([r[4] for r in rows], dtype=np.float32).reshape(len(rows), k) if sampled else None,
        )


class SpecEngine:
    """Batched speculative decoding driven by a :class:`RatioController` (module docstring).

    Args:
        model: the target ``LlamaModel`` (any dtype/device).
        controller: the ratio controller; its ``block_size`` is B (B-1 drafts per step).
        batch_size: requests decoded at a time (cache rows).
        max_new_tokens: generated tokens per request (the first comes from the prefill).
        eos_id: stop a request after this token (included in its output); ``None``: never.
        skip_layers: the drafter's skipped layers (``SelfSpecDrafter``; default 14, 15 of SmolLM2).
        dflash: a :class:`~dcut_sched.drafters.dflash.DFlashDraftModel`: draft with it instead (one
            block forward per step over context features the target's forwards hand it;
            :mod:`dcut_sched.drafters.runtime`); ``skip_layers`` is then unused.
        sampling: the target's sampling (default greedy, T = 0); drafts are always greedy.
        cuda_graphs: replay the verification forward from CUDA graphs
            (:class:`~dcut_sched.engine.verify_runtime.VerifyRuntime`); ``None`` = when CUDA is
            available and the model is on it; ``False`` = eager (always on CPU).

    Raises:
        ValueError: ``batch_size < 1``, ``max_new_tokens < 1`` or a controller with ``B < 2``.
    """

    def __init__(
        self,
        model: Any,
        controller: RatioController,
        *,
        batch_size: int = 8,
        max_new_tokens: int = 32,
        eos_id: int | None = None,
        skip_layers: Iterable[int] | str = (14, 15),
        sampling: SamplingParams | None = None,
        cuda_graphs: bool | None = None,
        dflash: Any = None,
    ):
        if batch_size < 1:
            raise ValueError(f"SpecEngine: batch_size={batch_size} must be >= 1")
        if max_new_tokens < 1:
            raise ValueError(f"SpecEngine: max_new_tokens={max_new_tokens} must be >= 1")
        assert controller.block_size >= 2, "RatioController guarantees block_size >= 2 (one draft slot)"
        self.model = model
        self.controller = controller
        self.block_size = controller.block_size
        self.batch_size = int(batch_size)
        self.max_new_tokens = int(max_new_tokens)
        self.eos_id = eos_id
        self.skip_layers = skip_layers
        self.dflash = dflash
        if dflash is not None and self.block_size > dflash.config.block_size:
            raise ValueError(f"SpecEngine: block size {self.block_size} exceeds the DFlash drafter's "
                             f"{dflash.config.block_size}")
        self.cost_source = ""
        self.sampling = sampling if sampling is not None else SamplingParams()
        self.cuda_graphs = cuda_graphs

    # ------------------------------------------------------------------ run
    @torch.inference_mode()
    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        *,
        record_trace: bool = False,
        on_request_done: Callable[[int], None] | None = None,
        keys: Sequence[int] | None = None,
        on_step: Callable[[EngineStepRecord], None] | None = None,
        observer: EngineObserver | None = None,
    ) -> EngineResult:
        """Generate for every prompt.

        The loop is: prefill waiting requests into free cache rows, run one
        :func:`~dcut_sched.engine.decode_step.speculative_step` over the active requests, repeat.

        Args:
            prompt_ids: token ids of each prompt (each non-empty).
            record_trace: keep step-indexed trace rows (see :meth:`EngineResult.trace`).
            on_request_done: called with the prompt index when a request finishes (progress bars).
            keys: per-request sampling keys (default ``request_keys(sampling.seed, len(prompt_ids))``);
                a request's output depends only on its prompt and key. Ignored at T = 0.
            on_step: called with each step's :class:`EngineStepRecord` once the step is committed (progress).
            observer: timing hooks called around each step and its draft / plan / verify phases
                (:class:`~dcut_sched.engine.observer.EngineObserver`); ``None``: none.

        Returns:
            The :class:`EngineResult`.

        Raises:
            ValueError: an empty prompt list or an empty prompt, ``keys`` of the wrong length, or
                ``record_trace`` of a sampled run whose policy does not verify every slot.
        """
        prompts = [list(map(int, p)) for p in prompt_ids]
        if not prompts:
            raise ValueError("SpecEngine.generate: no prompts")
        if any(len(p) == 0 for p in prompts):
            raise ValueError("SpecEngine.generate: every prompt needs at least one token")
        model, ctrl, B = self.model, self.controller, self.block_size
        sp = self.sampling
        keys = request_keys(sp.seed, len(prompts)) if keys is None else [int(k) for k in keys]
        if len(keys) != len(prompts):
            raise ValueError(f"SpecEngine.generate: {len(keys)} keys for {len(prompts)} prompts")
        sampled_trace = record_trace and not sp.is_greedy
        if sampled_trace and ctrl.policy.name != "full":
            raise ValueError("SpecEngine.generate: a sampled trace records the target's probability of every "
                             f"draft token, so every slot must be verified: use policy 'full', not {ctrl.policy.name!r}")
        obs = observer if observer is not None else EngineObserver()
        rows_total = min(self.batch_size, len(prompts))
        max_len = max(len(p) for p in prompts) + self.max_new_tokens + B
        cache = model.new_cache(rows_total, max_len + 1)
        if self.dflash is not None and ctrl.policy.speculative:
            # (a policy that never drafts, `ar`, is plain decoding: no context features, no drafter updates)

            drafter = DFlashDrafter(self.dflash, model, max_batch_size=rows_total, max_seq_len=max_len + 1)
            capture = drafter.target_feature_layers
        elif self.dflash is not None:
            drafter, capture = NoDrafter(), None
        else:
            drafter = SelfSpecDrafter(model, self.skip_layers, max_batch_size=rows_total, max_seq_len=max_len)
            capture = None
        ctrl.reset()
        runtime = VerifyRuntime(model, cache, max_rows=rows_total * B, block_size=B, scratch_slot=max_len,
                                cuda_graphs=self.cuda_graphs, capture_layers=capture)
        ctx = DecodeContext(model=model, cache=cache, verify_runtime=runtime, controller=ctrl, drafter=drafter, block_size=B,
                            scratch_slot=max_len, sampling=sp, keys=keys, record_draft_probs=sampled_trace,
                            observer=obs, requests=RequestBatch(ctrl))
        batch = DecodeBatch(prompts, rows_total, self.max_new_tokens, self.eos_id, on_request_done)
        trace_rows: list[tuple] | None = [] if record_trace else None
        drafted_steps_of: dict[int, int] = {}
        steps: list[EngineStepRecord] = []
        prefill_ms = prefill_free_rows(ctx, batch)
        decode_ms = 0.0
        draft = ctrl.policy.drafts_first_step
        while batch.has_active:
            out = speculative_step(ctx, batch, len(steps), draft)
            if trace_rows is not None and out.conf is not None:
                _append_trace_rows(trace_rows, drafted_steps_of, out)
            steps.append(out.record)
            decode_ms += out.step_ms
            obs.step_ended(out.record)
            if on_step is not None:
                on_step(out.record)
            draft = out.draft_next
            prefill_ms += prefill_free_rows(ctx, batch)
        return EngineResult(
            outputs=batch.outputs(),
            steps=steps,
            prefill_ms=prefill_ms,
            decode_ms=decode_ms,
            policy=ctrl.policy.name,
            block_size=B,
            batch_size=self.batch_size,
            cost_source=self.cost_source,
            trace_rows=trace_rows,
            controller_metrics=ctrl.metrics,
            sampling=sp,
        )


def _append_trace_rows(trace_rows: list[tuple], drafted_steps_of: dict[int, int], out) -> None:
    """Append one drafted step's trace rows ``(request_id, k, accept_len, conf[B-1][, p[B-1]])``;
    ``k`` counts the request's drafted steps (the step-indexed trace's position)."""
    rec = out.record
    conf_rows = out.conf.float().cpu().tolist()
    probs = out.draft_probs if out.draft_probs is not None else [None] * rec.batch_size
    for q, a, c, pr in zip(rec.request_ids, rec.accepted, conf_rows, probs):
        k = drafted_steps_of.get(q, 0)
        trace_rows.append((q, k, a, c) if pr is None else (q, k, a, c, pr))
        drafted_steps_of[q] = k + 1
