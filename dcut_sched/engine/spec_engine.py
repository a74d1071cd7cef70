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
engine verifies the whole block to learn it, then plans with it (an upper bound for comparisons, not
a deployable policy; its step cost is that of ``full``).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import torch

from ..controller import ControllerPlan, RatioController
from ..sampling import SamplingParams, request_keys, sample_at, sampling_probs
from .packing import RowPacking, pack_rows

__all__ = ["EngineResult", "SpecEngine", "StepRecord"]


@dataclass
class StepRecord:
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
        draft_ms, plan_ms, verify_ms: wall time of the three phases.
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


@dataclass
class EngineResult:
    """Outputs and measurements of one :meth:`SpecEngine.generate` run.

    Attributes:
        outputs: generated token ids per prompt (prompt excluded), in input order.
        steps: the :class:`StepRecord` of every decode step.
        prefill_ms: wall time of the prefills (prompt processing, including each request's first
            token); ``decode_ms``: wall time of the decode steps.
        policy, block_size, batch_size: the run's settings; ``cost_source``: which cost curve.
        trace_rows: step-indexed trace rows ``(request_id, pos, accept_len, conf[B-1])`` of the
            drafted steps when recorded, else ``None``; sampled runs append ``p[B-1]`` (the target's
            probability of each draft token at the run's temperature; needs every slot verified).
        sampling: the run's :class:`~dcut_sched.sampling.SamplingParams`.
    """

    outputs: list[list[int]]
    steps: list[StepRecord]
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
        import pandas as pd

        return pd.DataFrame([asdict(s) | {"batch_size": s.batch_size} for s in self.steps])

    def trace(self, metadata: dict[str, Any] | None = None):
        """The recorded step-indexed :class:`~dcut_sched.traces.Trace` (``record_trace=True``).

        ``accept_len`` of a row is the drafts accepted at that step; it is exact (what full
        verification gives) only where the plan verified the whole block, else censored at
        ``lengths - 1`` (metadata ``accept_len_censored``).

        Raises:
            ValueError: the run did not record a trace, or recorded no drafted step.
        """
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
        sampling: the target's sampling (default greedy, T = 0); drafts are always greedy.

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
    ):
        if batch_size < 1:
            raise ValueError(f"SpecEngine: batch_size={batch_size} must be >= 1")
        if max_new_tokens < 1:
            raise ValueError(f"SpecEngine: max_new_tokens={max_new_tokens} must be >= 1")
        if controller.block_size < 2:
            raise ValueError("SpecEngine: the controller's block_size must be >= 2 (at least one draft slot)")
        self.model = model
        self.controller = controller
        self.block_size = controller.block_size
        self.batch_size = int(batch_size)
        self.max_new_tokens = int(max_new_tokens)
        self.eos_id = eos_id
        self.skip_layers = skip_layers
        self.cost_source = ""
        self.sampling = sampling if sampling is not None else SamplingParams()

    # ------------------------------------------------------------------ run
    @torch.inference_mode()
    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        *,
        record_trace: bool = False,
        on_request_done: Callable[[int], None] | None = None,
        keys: Sequence[int] | None = None,
        on_step: Callable[[StepRecord], None] | None = None,
    ) -> EngineResult:
        """Generate for every prompt.

        Args:
            prompt_ids: token ids of each prompt (each non-empty).
            record_trace: keep step-indexed trace rows (see :meth:`EngineResult.trace`).
            on_request_done: called with the prompt index when a request finishes (progress bars).
            keys: per-request sampling keys (default ``request_keys(sampling.seed, len(prompt_ids))``);
                a request's output depends only on its prompt and key. Ignored at T = 0.
            on_step: called with each step's :class:`StepRecord` once the step is committed (progress).

        Returns:
            The :class:`EngineResult`.

        Raises:
            ValueError: an empty prompt list or an empty prompt, ``keys`` of the wrong length, or
                ``record_trace`` of a sampled run whose policy does not verify every slot.
        """
        from ..model.drafter import SelfSpecDrafter

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
        self._keys = keys
        sampled_trace = record_trace and not sp.is_greedy
        self._record_probs = sampled_trace
        if sampled_trace and ctrl.policy.name != "full":
            raise ValueError("SpecEngine.generate: a sampled trace records the target's probability of every "
                             f"draft token, so every slot must be verified: use policy 'full', not {ctrl.policy.name!r}")
        dev = model.device
        rows_total = min(self.batch_size, len(prompts))
        max_len = max(len(p) for p in prompts) + self.max_new_tokens + B
        self._scratch = max_len
        cache = model.new_cache(rows_total, max_len + 1)
        drafter = SelfSpecDrafter(model, self.skip_layers, max_batch_size=rows_total, max_seq_len=max_len)
        ctrl.reset()

        queue = deque(range(len(prompts)))
        row_request: list[int | None] = [None] * rows_total
        seqs: dict[int, list[int]] = {}
        outputs: list[list[int] | None] = [None] * len(prompts)
        drafted_steps_of: dict[int, int] = {}
        trace_rows: list[tuple] | None = [] if record_trace else None
        steps: list[StepRecord] = []
        prefill_ms = 0.0
        decode_ms = 0.0

        def finish(row: int) -> None:
            q = row_request[row]
            outputs[q] = seqs.pop(q)[len(prompts[q]):]
            row_request[row] = None
            if on_request_done is not None:
                on_request_done(q)

        def commit(row: int, tokens: list[int]) -> int:
            """Append tokens to the row's request up to EOS / max_new_tokens; return how many."""
            q = row_request[row]
            seq = seqs[q]
            done = 0
            for tok in tokens:
                seq.append(tok)
                done += 1
                if (self.eos_id is not None and tok == self.eos_id) or len(seq) - len(prompts[q]) >= self.max_new_tokens:
                    finish(row)
                    break
            return done

        def admit() -> None:
            nonlocal prefill_ms
            while queue and None in row_request:
                t0 = time.perf_counter()
                free = [r for r, q in enumerate(row_request) if q is None][: len(queue)]
                new = [queue.popleft() for _ in free]
                for r, q in zip(free, new):
                    row_request[r] = q
                    seqs[q] = list(prompts[q])
                drafter.reset(free)
                lengths = [len(prompts[q]) for q in new]
                ids = torch.zeros(len(new), max(lengths), dtype=torch.long)
                for j, q in enumerate(new):
                    ids[j, : lengths[j]] = torch.tensor(prompts[q], dtype=torch.long)
                logits = model.prefill(
                    ids.to(dev), cache, lengths=torch.tensor(lengths, device=dev),
                    batch_index=torch.tensor(free, dtype=torch.long, device=dev),
                )
                for j, (r, q) in enumerate(zip(free, new)):
                    commit(r, sample_at(logits[j : j + 1], sp, keys[q], [lengths[j]]))
                prefill_ms += (time.perf_counter() - t0) * 1e3

        admit()
        draft_next = ctrl.policy.drafts_first_step
        needs_accept = ctrl.policy.needs_accept_len
        step = 0
        while any(q is not None for q in row_request):
            rows = [r for r, q in enumerate(row_request) if q is not None]
            reqs = [row_request[r] for r in rows]
            bs = len(rows)
            t0 = time.perf_counter()
            drafts: list[list[int]] = [[] for _ in rows]
            conf = None
            if draft_next:
                draft_tok, conf = drafter.draft([seqs[q] for q in reqs], B - 1, rows=rows)
                drafts = draft_tok.tolist()
            t1 = time.perf_counter()
            oracle_targets = None
            if conf is None:
                plan = ctrl.plan_without_draft(bs, device=dev)
            elif needs_accept:
                # oracle: learn the true acceptance from a full verification, then plan with it
                full = [B] * bs
                oracle_targets = self._verify(cache, rows, reqs, seqs, drafts, full)
                true_accept = [self._accepted(d, t, B) for d, t in zip(drafts, oracle_targets)]
                plan = ctrl.plan(conf, accept_len=torch.tensor(true_accept, device=conf.device))
            else:
                plan = ctrl.plan(conf)
            lengths = plan.lengths.tolist()
            t2 = time.perf_counter()
            if oracle_targets is not None:
                targets, packing_tokens = oracle_targets, bs * B
            else:
                targets = self._verify(cache, rows, reqs, seqs, drafts, lengths)
                packing_tokens = self._last_packing.padded_tokens
            accepted = [self._accepted(d, t, n) for d, t, n in zip(drafts, targets, lengths)]
            committed = 0
            for row, q, d, t, a in zip(rows, reqs, drafts, targets, accepted):
                committed += commit(row, d[:a] + [t[a]])
            t3 = time.perf_counter()
            if conf is not None:
                ctrl.observe(torch.tensor(accepted, device=conf.device))
                if trace_rows is not None:
                    conf_rows = conf.float().cpu().tolist()
                    probs = self._last_draft_probs if sampled_trace else [None] * bs
                    for q, a, c, pr in zip(reqs, accepted, conf_rows, probs):
                        k = drafted_steps_of.get(q, 0)
                        trace_rows.append((q, k, a, c) if pr is None else (q, k, a, c, pr))
                        drafted_steps_of[q] = k + 1
            else:
                ctrl.observe(torch.zeros(bs, dtype=torch.int64, device=dev))
            steps.append(
                StepRecord(
                    step=step,
                    request_ids=reqs,
                    drafted=conf is not None,
                    lengths=lengths,
                    num_tokens=plan.num_tokens,
                    ratio=plan.ratio,
                    graph_cell=tuple(plan.graph_cell),
                    packed_tokens=packing_tokens,
                    expected_tokens=plan.expected_tokens,
                    accepted=accepted,
                    committed_tokens=committed,
                    draft_ms=(t1 - t0) * 1e3,
                    plan_ms=(t2 - t1) * 1e3,
                    verify_ms=(t3 - t2) * 1e3,
                )
            )
            decode_ms += (t3 - t0) * 1e3
            if on_step is not None:
                on_step(steps[-1])
            draft_next = plan.draft_next
            step += 1
            admit()
        return EngineResult(
            outputs=[o if o is not None else [] for o in outputs],
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

    # ------------------------------------------------------------------ pieces
    @staticmethod
    def _accepted(drafts: list[int], targets: list[int], length: int) -> int:
        """Drafts accepted: the longest prefix of ``drafts[:length-1]`` equal to ``targets``."""
        a = 0
        while a < length - 1 and drafts[a] == targets[a]:
            a += 1
        return a

    def _verify(
        self,
        cache: Any,
        rows: list[int],
        reqs: list[int],
        seqs: dict[int, list[int]],
        drafts: list[list[int]],
        lengths: list[int],
    ) -> list[list[int]]:
        """One packed target forward; returns the target's token at each verified slot per request.

        Greedy: the argmax. Sampled: :func:`~dcut_sched.sampling.sample_at` with the request's key at
        the sequence index each slot's token takes (``len(seq) + slot``). Also keeps, for sampled trace
        recording, the target's probability of each verified draft token (``_last_draft_probs``).
        """
        packing: RowPacking = pack_rows(lengths)
        self._last_packing = packing
        n_rows, T = packing.num_rows, packing.tokens_per_row
        ids = np.zeros((n_rows, T), dtype=np.int64)
        pos = np.zeros((n_rows, T), dtype=np.int64)
        slots = np.full((n_rows, T), self._scratch, dtype=np.int64)
        batch_index = np.zeros(n_rows, dtype=np.int64)
        kv_len = 1
        for r, (j, start, length) in enumerate(zip(packing.request, packing.start, packing.length)):
            seq = seqs[reqs[j]]
            block = [seq[-1]] + drafts[j][: lengths[j] - 1]
            first = len(seq) - 1 + start
            ids[r, :length] = block[start : start + length]
            pos[r, :length] = np.arange(first, first + length)
            pos[r, length:] = first + length - 1
            slots[r, :length] = pos[r, :length]
            batch_index[r] = rows[j]
            kv_len = max(kv_len, first + length)
        dev = self.model.device
        logits = self.model(
            torch.from_numpy(ids).to(dev),
            torch.from_numpy(pos).to(dev),
            cache,
            cache_slots=torch.from_numpy(slots).to(dev),
            batch_index=torch.from_numpy(batch_index).to(dev),
            kv_len=kv_len,
        )
        sp = self.sampling
        if sp.is_greedy:
            argmax = logits.argmax(-1).cpu().numpy()
            targets: list[list[int]] = [[] for _ in reqs]
            for r, (j, length) in enumerate(zip(packing.request, packing.length)):
                targets[j].extend(argmax[r, :length].tolist())
            return targets
        per_request: list[list[torch.Tensor]] = [[] for _ in reqs]
        for r, (j, length) in enumerate(zip(packing.request, packing.length)):
            per_request[j].append(logits[r, :length])
        targets, draft_probs = [], []
        for j, chunks in enumerate(per_request):
            block_logits = torch.cat(chunks, 0)  # [L_j, V]
            n = len(seqs[reqs[j]])
            targets.append(sample_at(block_logits, sp, self._keys[reqs[j]], range(n, n + lengths[j])))
            d = drafts[j][: lengths[j] - 1]
            if d and self._record_probs:
                probs = sampling_probs(block_logits[: len(d)], sp)
                draft_probs.append(probs[torch.arange(len(d)), torch.tensor(d)].float().cpu().tolist())
            else:
                draft_probs.append([])
        self._last_draft_probs = draft_probs
        return targets
