"""One speculative-decoding step of :class:`~dcut_sched.engine.SpecEngine`, as small free functions.

:func:`speculative_step` is the whole step (draft -> plan -> verify -> commit -> feedback, see
:mod:`dcut_sched.engine.spec_engine`); it calls :func:`verify_block` (one packed target forward,
the target's token at every verified slot) and :func:`accepted_drafts` (greedy acceptance).
:class:`DecodeBatch` is the continuous-batching bookkeeping the steps share (which request each
cache row holds, the committed tokens, the waiting queue), :func:`prefill_free_rows` admits waiting
requests into free rows. Everything a step needs is passed in: the run's fixed parts in a
:class:`DecodeContext`, the step's inputs as arguments, its outputs in the returned
:class:`StepOutcome`; no attribute carries data from one call to the next. The step plans, and
feeds the outcome back, through the run's
:class:`~dcut_sched.controller.request_batch.RequestBatch` (the request bookkeeping vLLM's
scheduler uses too), by request id (prompt index).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import torch

from ..controller.request_batch import RequestBatch
from ..sampling import SamplingParams, sample_at, sampling_probs
from .observer import EngineObserver, EngineStepRecord
from .packing import RowPacking, pack_rows

__all__ = [
    "DecodeBatch", "DecodeContext", "StepOutcome", "EngineStepRecord", "Verification",
    "accepted_drafts", "committed_features", "prefill_free_rows", "speculative_step", "verify_block",
]


class DecodeBatch:
    """Continuous-batching state of one run: the request in each cache row, committed tokens, queue.

    Request ``q``'s committed sequence ``seqs[q]`` is its prompt followed by its generated tokens;
    the last one is its *current* token (not fed to the target yet). A request finishes at
    ``eos_id`` (kept in its output) or after ``max_new_tokens`` generated tokens; its row is then
    free for the next waiting request.

    Args:
        prompts: token ids per prompt (each non-empty).
        num_rows: cache rows (requests decoded at a time).
        max_new_tokens, eos_id: the stopping rule.
        on_request_done: called with the prompt index when a request finishes.
    """

    def __init__(self, prompts: Sequence[list[int]], num_rows: int, max_new_tokens: int, eos_id: int | None,
                 on_request_done: Callable[[int], None] | None = None):
        self.prompts = list(prompts)
        self.max_new_tokens = int(max_new_tokens)
        self.eos_id = eos_id
        self.on_request_done = on_request_done
        self.queue: deque[int] = deque(range(len(self.prompts)))
        self.row_request: list[int | None] = [None] * int(num_rows)
        self.seqs: dict[int, list[int]] = {}
        self._outputs: list[list[int] | None] = [None] * len(self.prompts)

    def active_rows(self) -> list[int]:
        """Cache rows holding a request, ascending."""
        return [r for r, q in enumerate(self.row_request) if q is not None]

    @property
    def has_active(self) -> bool:
        return any(q is not None for q in self.row_request)

    def admit(self) -> tuple[list[int], list[int]]:
        """Move waiting requests into free rows (lowest rows first); returns ``(rows, requests)``."""
        free = [r for r, q in enumerate(self.row_request) if q is None][: len(self.queue)]
        new = [self.queue.popleft() for _ in free]
        for r, q in zip(free, new):
            self.row_request[r] = q
            self.seqs[q] = list(self.prompts[q])
        return free, new

    def commit(self, row: int, tokens: Sequence[int]) -> int:
        """Append ``tokens`` to the row's request up to EOS / ``max_new_tokens``; returns how many."""
        q = self.row_request[row]
        seq = self.seqs[q]
        prompt_len = len(self.prompts[q])
        done = 0
        for tok in tokens:
            seq.append(tok)
            done += 1
            if (self.eos_id is not None and tok == self.eos_id) or len(seq) - prompt_len >= self.max_new_tokens:
                self._outputs[q] = self.seqs.pop(q)[prompt_len:]
                self.row_request[row] = None
                if self.on_request_done is not None:
                    self.on_request_done(q)
                break
        return done

    def remaining(self, rows: Sequence[int]) -> list[int] | None:
        """Tokens each request of ``rows`` still generates at most (``max_new_tokens`` less its output so
        far), while no request waits (the batch drains: nothing else will arrive); ``None`` otherwise."""
        if self.queue:
            return None
        return [self.max_new_tokens - (len(self.seqs[q]) - len(self.prompts[q]))
                for q in (self.row_request[r] for r in rows)]

    def outputs(self) -> list[list[int]]:
        """Generated tokens per prompt (prompt excluded), in input order; ``[]`` for unfinished ones."""
        return [o if o is not None else [] for o in self._outputs]


@dataclass(frozen=True)
class DecodeContext:
    """The fixed parts of one :meth:`SpecEngine.generate` run that every step reads.

    Attributes:
        model: the target ``LlamaModel``; ``cache``: its KV cache (``[rows, max_len + 1]`` slots).
        verify_runtime: runs the packed verification forward
            (:class:`~dcut_sched.engine.verify_runtime.VerifyRuntime`: CUDA-graph replay or eager).
        controller: the :class:`~dcut_sched.controller.RatioController`.
        drafter: the :class:`~dcut_sched.model.drafter.SelfSpecDrafter`.
        block_size: B.
        scratch_slot: cache slot that padded tokens write (no query ever reads it).
        sampling: the target's sampling; ``keys``: per-request sampling keys (prompt index order).
        record_draft_probs: keep the target's probability of each verified draft (sampled traces).
        observer: the timing hooks (:class:`EngineObserver`).
        requests: the run's :class:`~dcut_sched.controller.request_batch.RequestBatch` over
            ``controller`` (default: a new one, which writes no records).
    """

    model: Any
    cache: Any
    verify_runtime: Any
    controller: Any
    drafter: Any
    block_size: int
    scratch_slot: int
    sampling: SamplingParams
    keys: Sequence[int]
    record_draft_probs: bool = False
    observer: EngineObserver = field(default_factory=EngineObserver)
    requests: RequestBatch | None = None

    def __post_init__(self) -> None:
        if self.requests is None:
            object.__setattr__(self, "requests", RequestBatch(self.controller))


@dataclass(frozen=True)
class Verification:
    """What one packed target forward tells about each request's verified slots.

    Attributes:
        targets: per request, the target's token at each of its ``L_i`` verified slots (greedy:
            the argmax; sampled: the keyed draw).
        packing: the :class:`RowPacking` of the forward.
        draft_probs: per request, the target's probability of each verified draft token, when the
            context records them (sampled traces), else ``None``.
        features: the packed forward's hidden states ``[rows, T, n * hidden]`` at the drafter's
            ``target_feature_layers`` (a block drafter's context; :func:`committed_features` picks
            each request's slots), else ``None``.
    """

    targets: list[list[int]]
    packing: RowPacking
    draft_probs: list[list[float]] | None = None
    features: list[torch.Tensor] | None = None


@dataclass(frozen=True)
class StepOutcome:
    """What :func:`speculative_step` returns.

    Attributes:
        record: the step's :class:`EngineStepRecord`.
        conf: ``[bs, B-1]`` draft confidences (drafted steps) else ``None``.
        draft_probs: the verification's :attr:`Verification.draft_probs`.
        draft_next: whether the next step drafts (the plan's ``draft_next``).
        step_ms: the step's timed wall time (draft + plan + verify phases).
    """

    record: EngineStepRecord
    conf: torch.Tensor | None
    draft_probs: list[list[float]] | None
    draft_next: bool
    step_ms: float


def accepted_drafts(drafts: Sequence[int], targets: Sequence[int], length: int) -> int:
    """Drafts accepted: the longest prefix of ``drafts[:length-1]`` equal to ``targets``.

    Greedy acceptance (and sampled, where ``targets`` are the keyed draws): draft ``t`` is kept iff
    every draft before it was and it equals the target's token at the slot before it.
    """
    a = 0
    while a < length - 1 and drafts[a] == targets[a]:
        a += 1
    return a


def committed_features(packing: RowPacking, features: torch.Tensor, keep: Sequence[int]) -> torch.Tensor:
    """The features of the first ``keep[j]`` verified slots of every request ``j``, concatenated in
    request order: ``[sum(keep), feature_size]``, gathered from the packed ``[rows, T, F]`` features
    in one indexing op (request ``j``'s slot ``s`` sits in its ``s // T``-th row, column ``s % T``)."""
    keep_np = np.asarray(keep, dtype=np.int64)
    first_row = np.searchsorted(np.asarray(packing.request, dtype=np.int64), np.arange(len(keep_np)))
    total = int(keep_np.sum())
    slot = np.arange(total) - np.repeat(np.cumsum(keep_np) - keep_np, keep_np)
    T = packing.tokens_per_row
    row = np.repeat(first_row, keep_np) + slot // T
    dev = features.device
    return features[torch.from_numpy(row).to(dev), torch.from_numpy(slot % T).to(dev)]


def drafter_feature_layers(drafter: Any) -> tuple[int, ...] | None:
    """The target layers a block drafter reads its context from (``None``: the drafter keeps its own
    cache, as the self-speculative one)."""
    return getattr(drafter, "target_feature_layers", None)


def prefill_free_rows(ctx: DecodeContext, batch: DecodeBatch) -> float:
    """Admit waiting requests into free rows and prefill them, until no row is free or none waits.

    A prefill commits each request's first token (which may finish it, freeing its row again, hence
    the loop). Returns the wall time spent, ms.
    """
    model, sp = ctx.model, ctx.sampling
    dev = model.device
    total_ms = 0.0
    while batch.queue and None in batch.row_request:
        t0 = time.perf_counter()
        free, new = batch.admit()
        ctx.drafter.reset(free)
        lengths = [len(batch.prompts[q]) for q in new]
        ids = torch.zeros(len(new), max(lengths), dtype=torch.long)
        for j, q in enumerate(new):
            ids[j, : lengths[j]] = torch.tensor(batch.prompts[q], dtype=torch.long)
        layers = drafter_feature_layers(ctx.drafter)
        out = model.prefill(
            ids.to(dev), ctx.cache, lengths=torch.tensor(lengths, device=dev),
            batch_index=torch.tensor(free, dtype=torch.long, device=dev), capture_layers=layers,
        )
        logits = out if layers is None else out[0]
        if layers is not None:  # a block drafter's context: the prompt's tokens
            ctx.drafter.extend(free, [out[1][j, : lengths[j]] for j in range(len(new))], [0] * len(new))
        for j, (r, q) in enumerate(zip(free, new)):
            batch.commit(r, sample_at(logits[j : j + 1], sp, ctx.keys[q], [lengths[j]]))
        total_ms += (time.perf_counter() - t0) * 1e3
    return total_ms


def verify_block(ctx: DecodeContext, seqs: Sequence[list[int]], rows: Sequence[int], request_ids: Sequence[int],
                 drafts: Sequence[list[int]], lengths: Sequence[int]) -> Verification:
    """One packed target forward over each request's current token and its first ``L_i - 1`` drafts.

    Request ``j`` (committed sequence ``seqs[j]`` of length ``n``, cache row ``rows[j]``) verifies
    ``[seqs[j][-1]] + drafts[j][:L_j - 1]`` at positions ``n-1 ..``; the slots are packed into
    dense rows by :func:`~dcut_sched.engine.packing.pack_rows` (padding writes ``scratch_slot``) and
    run through ``ctx.verify_runtime`` (a CUDA-graph replay or the eager forward).
    Greedy: the target's token is the argmax. Sampled: :func:`~dcut_sched.sampling.sample_at` with
    the request's key at the sequence index each slot's token takes (``n + slot``).

    Args:
        seqs: ``[bs]`` committed sequences; ``rows``: ``[bs]`` cache rows;
        request_ids: ``[bs]`` prompt indices (sampling keys); drafts: ``[bs]`` draft tokens
            (``[]`` on a plain step); lengths: ``[bs]`` ``L_i >= 1``.

    Returns:
        The :class:`Verification`.
    """
    packing: RowPacking = pack_rows(lengths)
    n_rows, T = packing.num_rows, packing.tokens_per_row
    ids = np.zeros((n_rows, T), dtype=np.int64)
    pos = np.zeros((n_rows, T), dtype=np.int64)
    slots = np.full((n_rows, T), ctx.scratch_slot, dtype=np.int64)
    batch_index = np.zeros(n_rows, dtype=np.int64)
    for r, (j, start, length) in enumerate(zip(packing.request, packing.start, packing.length)):
        seq = seqs[j]
        block = [seq[-1]] + drafts[j][: lengths[j] - 1]
        first = len(seq) - 1 + start
        ids[r, :length] = block[start : start + length]
        pos[r, :length] = np.arange(first, first + length)
        pos[r, length:] = first + length - 1
        slots[r, :length] = pos[r, :length]
        batch_index[r] = rows[j]
    dev = ctx.model.device
    # attention window: slots [0, kv_len) = [0, max position + 1) (the runtime derives it)
    out = ctx.verify_runtime(
        torch.from_numpy(ids).to(dev),
        torch.from_numpy(pos).to(dev),
        torch.from_numpy(slots).to(dev),
        torch.from_numpy(batch_index).to(dev),
    )
    logits, features = (out, None) if isinstance(out, torch.Tensor) else out
    sp = ctx.sampling
    if sp.is_greedy:
        argmax = logits.argmax(-1).cpu().numpy()
        targets: list[list[int]] = [[] for _ in seqs]
        for r, (j, length) in enumerate(zip(packing.request, packing.length)):
            targets[j].extend(argmax[r, :length].tolist())
        return Verification(targets, packing, features=features)
    per_request: list[list[torch.Tensor]] = [[] for _ in seqs]
    for r, (j, length) in enumerate(zip(packing.request, packing.length)):
        per_request[j].append(logits[r, :length])
    targets, draft_probs = [], []
    for j, chunks in enumerate(per_request):
        block_logits = torch.cat(chunks, 0)  # [L_j, V]
        n = len(seqs[j])
        targets.append(sample_at(block_logits, sp, ctx.keys[request_ids[j]], range(n, n + lengths[j])))
        d = drafts[j][: lengths[j] - 1]
        if d and ctx.record_draft_probs:
            probs = sampling_probs(block_logits[: len(d)], sp)
            draft_probs.append(probs[torch.arange(len(d)), torch.tensor(d)].float().cpu().tolist())
        else:
            draft_probs.append([])
    return Verification(targets, packing, draft_probs, features)


def speculative_step(ctx: DecodeContext, batch: DecodeBatch, step: int, draft: bool) -> StepOutcome:
    """Run decode step ``step`` for every active request of ``batch`` (module docstring of
    :mod:`dcut_sched.engine.spec_engine`): draft (when ``draft``), plan, verify, commit, feedback.

    The observer's hooks bracket each phase (:mod:`dcut_sched.engine.observer`). ``oracle`` (a
    policy that needs the true acceptance) verifies the whole block first and plans with what it
    learnt; its step then reuses that verification.
    """
    ctrl, obs, B, requests = ctx.controller, ctx.observer, ctx.block_size, ctx.requests
    rows = batch.active_rows()
    reqs = [batch.row_request[r] for r in rows]
    seqs = [batch.seqs[q] for q in reqs]
    bs = len(rows)
    obs.step_started(step, reqs)
    t0 = time.perf_counter()
    drafts: list[list[int]] = [[] for _ in rows]
    conf = None
    if draft:
        obs.phase_started(step, "draft")
        draft_tok, conf = ctx.drafter.draft(seqs, B - 1, rows=rows)
        drafts = draft_tok.tolist()
    t1 = time.perf_counter()
    if draft:
        obs.phase_ended(step, "draft", (t1 - t0) * 1e3)
    oracle: Verification | None = None
    if conf is None:
        obs.phase_started(step, "plan")
        planned = requests.plan_without_draft(bs, device=ctx.model.device)
    elif ctrl.policy.needs_accept_len:
        # oracle: learn the true acceptance from a full verification, then plan with it
        obs.phase_started(step, "oracle_verify")
        oracle = verify_block(ctx, seqs, rows, reqs, drafts, [B] * bs)
        true_accept = [accepted_drafts(d, t, B) for d, t in zip(drafts, oracle.targets)]
        t_oracle = time.perf_counter()
        obs.phase_ended(step, "oracle_verify", (t_oracle - t1) * 1e3)
        obs.phase_started(step, "plan")
        planned = requests.plan(reqs, drafts, conf, accept_len=torch.tensor(true_accept, device=conf.device))
    else:
        obs.phase_started(step, "plan")
        planned = requests.plan(reqs, drafts, conf, remaining=batch.remaining(rows))
    plan = planned.plan
    lengths = planned.lengths if planned.drafted else plan.lengths.tolist()
    t2 = time.perf_counter()
    obs.phase_ended(step, "plan", (t2 - (t1 if oracle is None else t_oracle)) * 1e3)
    obs.phase_started(step, "verify")
    if oracle is not None:
        verification, packed_tokens = oracle, bs * B
    else:
        verification = verify_block(ctx, seqs, rows, reqs, drafts, lengths)
        packed_tokens = verification.packing.padded_tokens
    targets = verification.targets
    accepted = [accepted_drafts(d, t, n) for d, t, n in zip(drafts, targets, lengths)]
    if verification.features is not None:  # the current token and the accepted drafts become context
        keep = [a + 1 for a in accepted]
        ctx.drafter.extend_flat(rows, keep, [len(s) - 1 for s in seqs],
                                committed_features(verification.packing, verification.features, keep), defer=True)
    committed = 0
    for row, d, t, a in zip(rows, drafts, targets, accepted):
        committed += batch.commit(row, d[:a] + [t[a]])
    t3 = time.perf_counter()
    obs.phase_ended(step, "verify", (t3 - t2) * 1e3)
    # every planned request ran its plan: nothing dropped, nothing unplanned
    flight = requests.schedule(planned, reqs, {q: n - 1 for q, n in zip(reqs, lengths)} if planned.drafted else {})
    requests.observe(flight, dict(zip(reqs, accepted)), step_ms=(t3 - t0) * 1e3)
    record = EngineStepRecord(
        step=step,
        request_ids=reqs,
        drafted=conf is not None,
        lengths=lengths,
        num_tokens=plan.num_tokens,
        ratio=plan.ratio,
        graph_cell=tuple(plan.graph_cell),
        packed_tokens=packed_tokens,
        expected_tokens=plan.expected_tokens,
        accepted=accepted,
        committed_tokens=committed,
        draft_ms=(t1 - t0) * 1e3,
        plan_ms=(t2 - t1) * 1e3,
        verify_ms=(t3 - t2) * 1e3,
    )
    return StepOutcome(record, conf, verification.draft_probs, bool(plan.draft_next), (t3 - t0) * 1e3)
