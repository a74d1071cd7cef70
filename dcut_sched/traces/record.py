"""Record position-indexed acceptance traces from a real target model and a real draft model.

For each prompt the target decodes greedily (up to ``max_new_tokens``, stopping after EOS), giving its
output ``y_0..y_{n-1}``. Then, for **every** output position p (the request has produced
``y_0..y_{p-1}``; the anchor is the last committed token, ``y_{p-1}`` or the prompt's last token), the
draft proposes B-1 tokens greedily from the committed prefix, ``d_1..d_{B-1}``, with confidences
``c_t = exp(max_logit - logsumexp(logits))`` (docs/design.md §1), and

    accept_len[p] = min(#leading t with d_t == y_{p+t-1}, n - p - 1)

(the cap keeps ``p + 1 + accept_len`` inside the output; docs/design.md §3). The draft's proposals after
its first wrong token are recorded too: they decide what a policy verifies.

Backends (the model pairs, in :mod:`dcut_sched.engine.trace_backends`; this module drives any object
with the :class:`RecordBackend` methods and imports no torch): ``NativeBackend`` (the project's own
Llama forward with a self-speculative drafter, drafting all positions of a request in a few batched
forwards) and ``HFBackend`` (a local Hugging Face pair).

Sampled traces (``sampling`` with temperature T > 0, native backend): the target *samples* its output
(:func:`dcut_sched.model.sample_generate`, request i keyed by ``request_keys(seed, R)[i]``), the draft
still proposes greedily from every position of that output, and the backend's ``target_probs``
(:func:`dcut_sched.engine.trace_backends.target_probs_all_positions`) adds ``p[p, t]``, the target's probability (at T, after top-k/top-p) of draft ``d_t`` given the prefix
and ``d_1..d_{t-1}`` (docs/design.md §3). ``accept_len`` is then the draw the engine makes with the same
keys: a draft is accepted iff it equals the target's sample at that index (:mod:`dcut_sched.sampling`).

Recording is resumable: after each finished request the trace so far is written atomically to
``<out>.partial.parquet``; a later run with the same settings continues from it.
"""

from __future__ import annotations

import inspect
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, Sequence

import numpy as np

from dcut_sched.util.progress import RunProgress, format_duration

from .format import TraceError, accept_len_dtype
from .prompts import Prompt, prompts_digest
from .trace import Trace

if TYPE_CHECKING:  # pragma: no cover - typing only; dcut_sched.sampling imports torch
    from ..sampling import SamplingParams

__all__ = [
    "RecordError",
    "RecordBackend",
    "accept_lengths",
    "load_partial",
    "partial_path",
    "record_trace",
]


class RecordError(RuntimeError):
    """Recording cannot start or continue (bad settings, a partial file from other settings)."""


# ----------------------------------------------------------------------------- pure helpers
def accept_lengths(draft_tokens: np.ndarray, output_ids: Sequence[int]) -> np.ndarray:
    """Accepted drafts at every output position under greedy verification.

    Args:
        draft_tokens: ``[n, k]`` int draft tokens; row p are the drafts from position p.
        output_ids: the target's greedy output ``y_0..y_{n-1}``.

    Returns:
        ``[n]`` int8: the number of leading ``t`` with ``draft_tokens[p, t-1] == y[p+t-1]``, capped at
        ``n - p - 1`` so the bonus token stays inside the output (docs/design.md §3).
    """
    y = np.asarray(output_ids, dtype=np.int64)
    n, k = draft_tokens.shape
    if n != len(y):
        raise ValueError(f"draft_tokens has {n} rows but the output has {len(y)} tokens")
    idx = np.arange(n)[:, None] + np.arange(k)[None, :]
    window = np.where(idx < n, y[np.minimum(idx, n - 1)], -1)
    matched = np.cumprod(draft_tokens == window, axis=1).sum(axis=1)
    return np.minimum(matched, n - 1 - np.arange(n)).astype(accept_len_dtype(k + 1))


# ----------------------------------------------------------------------------- backends
class RecordBackend(Protocol):
    """What the recorder needs from a target/draft pair."""

    target_name: str
    draft_name: str
    eos_id: int | None

    def encode_prompt(self, text: str) -> list[int]: ...

    def generate(self, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]: ...
    # A backend may also accept ``on_step(done, total)``: called during the target decode (progress).

    def draft_positions(self, prompt_ids: list[int], output_ids: list[int],
                        num_draft: int) -> tuple[np.ndarray, np.ndarray]: ...

    def describe(self) -> dict[str, Any]: ...


# ----------------------------------------------------------------------------- recorder
def partial_path(out_path: str | os.PathLike) -> Path:
    """Where unfinished recordings of ``out_path`` are kept: ``<stem>.partial.parquet`` beside it."""
    out = Path(out_path)
    return out.with_name(out.name.removesuffix(".parquet") + ".partial.parquet")


@dataclass
class _Rows:
    request_id: list[np.ndarray]
    pos: list[np.ndarray]
    accept_len: list[np.ndarray]
    conf: list[np.ndarray]
    target_prob: list[np.ndarray] | None = None  # sampled traces only

    def trace(self, metadata: dict[str, Any], block_size: int) -> Trace:
        sampled = self.target_prob is not None
        if not self.request_id:
            empty = np.zeros(0, np.int32)
            none = np.zeros((0, block_size - 1), np.float32)
            return Trace(empty, empty, np.zeros(0, accept_len_dtype(block_size)), none, metadata, target_prob=none if sampled else None)
        return Trace(np.concatenate(self.request_id).astype(np.int32), np.concatenate(self.pos).astype(np.int32),
                     np.concatenate(self.accept_len).astype(accept_len_dtype(block_size)),
                     np.concatenate(self.conf).astype(np.float32), metadata,
                     target_prob=np.concatenate(self.target_prob).astype(np.float32) if sampled else None)


def record_trace(backend: RecordBackend, prompts: Sequence[Prompt], out_path: str | os.PathLike, *,
                 block_size: int = 16, max_new_tokens: int = 256, dataset: str = "prompts",
                 resume: bool = True, progress: bool = True, max_positions: int | None = None,
                 extra_metadata: dict[str, Any] | None = None,
                 sampling: SamplingParams | None = None) -> Trace:
    """Record a position-indexed trace of ``prompts`` and write it to ``out_path`` (Parquet).

    Requests are processed in batches of the backend's ``generate_batch`` (target decoding), then
    drafted one request at a time; after each request the trace so far is written atomically to
    :func:`partial_path`. With ``resume`` a partial file recorded with the same settings (a DFlash
    drafter's included by the hash of its files, ``drafter_sha256``) is continued; at the end the full trace is written to ``out_path`` atomically and the partial file
    removed.

    Args:
        backend: the model pair.
        prompts: the prompt set; request ids are the prompts' indices in it.
        block_size: B; each position records B-1 drafts.
        max_new_tokens: longest target output per prompt.
        dataset: metadata label of the prompt set.
        resume: continue a matching partial file (False: start over and overwrite it).
        progress: show progress on stderr (a bar on a terminal, else a status line with rate and
            ETA every ``DCUT_PROGRESS_INTERVAL_S`` s, also during the target decode; see
            :mod:`dcut_sched.util.progress`).
        max_positions: stop after the request that brings the total to at least this many.
        extra_metadata: more file metadata (JSON-encoded when not a string).
        sampling: the target's sampling (default greedy); T > 0 records a sampled trace (``p`` columns,
            metadata ``temperature``, ``top_p``, ``top_k``, ``seed``); needs a backend with ``target_probs``.

    Returns:
        The recorded :class:`Trace`.

    Raises:
        RecordError: bad settings, or a partial file recorded with other settings (with ``resume``).
    """
    sampling, keys = _checked_sampling(backend, block_size, max_new_tokens, sampling, len(prompts))
    settings, metadata = _run_metadata(backend, prompts, block_size, max_new_tokens, dataset, sampling,
                                       extra_metadata)
    part = partial_path(out_path)
    state = _Recording(_Rows([], [], [], [], None if sampling.is_greedy else []))
    if resume and part.is_file():
        _resume_from(part, metadata, settings, state, prompts)
    _record_requests(backend, prompts, out_path, part, state, metadata, block_size=block_size,
                     max_new_tokens=max_new_tokens, sampling=sampling, keys=keys, max_positions=max_positions,
                     progress=progress)
    trace = _sorted_trace(state.trace(metadata, block_size))
    trace.save(out_path)
    trace.path = str(out_path)
    part.unlink(missing_ok=True)
    return trace


@dataclass
class _Recording:
    """What a recording holds so far: its rows, its finished requests ``[id, prompt id, category,
    prompt tokens]``, the seconds of the runs it resumed and the start of this run's clock."""

    rows: _Rows
    done: list[list[Any]] = field(default_factory=list)
    seconds: float = 0.0
    total_positions: int = 0
    t_start: float = 0.0

    def trace(self, metadata: dict[str, Any], block_size: int) -> Trace:
        """The rows so far as a trace, with the finished requests and the record time in its metadata."""
        elapsed = self.seconds + time.perf_counter() - self.t_start
        return self.rows.trace({**metadata, "requests": self.done, "record_seconds": f"{elapsed:.1f}"}, block_size)


def _checked_sampling(backend: RecordBackend, block_size: int, max_new_tokens: int, sampling: SamplingParams | None,
                      num_prompts: int) -> tuple[SamplingParams, Any]:
    """The run's sampling (default greedy) and the sampling keys of its requests
    (:func:`dcut_sched.sampling.request_keys`), after the settings checks (:class:`RecordError`)."""
    from ..sampling import SamplingParams, request_keys

    if block_size < 2:
        raise RecordError(f"block_size={block_size} must be >= 2")
    if max_new_tokens < 1:
        raise RecordError(f"max_new_tokens={max_new_tokens} must be >= 1")
    sampling = sampling if sampling is not None else SamplingParams()
    if not sampling.is_greedy and not hasattr(backend, "target_probs"):
        raise RecordError(f"{type(backend).__name__} cannot record a sampled trace (temperature "
                          f"{sampling.temperature:g}); use the native backend")
    return sampling, request_keys(sampling.seed, num_prompts)


def _run_metadata(backend: RecordBackend, prompts: Sequence[Prompt], block_size: int, max_new_tokens: int,
                  dataset: str, sampling: SamplingParams,
                  extra_metadata: dict[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """The recorder settings a partial file must share to be resumed, and the trace's file metadata."""
    settings = {
        "max_new_tokens": max_new_tokens,
        "prompts_sha256_16": prompts_digest(list(prompts)),
        **backend.describe(),
    }
    metadata: dict[str, Any] = {
        "indexing": "position", "source": "recorded", "block_size": str(block_size),
        "target_model": backend.target_name, "draft_model": backend.draft_name, "dataset": dataset,
        "temperature": f"{float(sampling.temperature):g}", "recorder": settings, **(extra_metadata or {}),
    }
    if not sampling.is_greedy:
        metadata.update(top_p=f"{sampling.top_p:g}", top_k=str(sampling.top_k), seed=str(sampling.seed))
    return settings, metadata


def load_partial(part: Path, prompts: Sequence[Prompt] | None = None) -> Trace | None:
    """The partial file ``part`` (:func:`partial_path`) loaded and validated, its ``requests``,
    ``recorder`` and ``record_seconds`` metadata included; None when there is none. Its ``requests``
    list must name exactly the requests its rows hold, each once, and (given the run's ``prompts``)
    each as the prompt of that index. The CLI calls it before any model loads.

    Raises:
        RecordError: the partial file is damaged (the fault named, with the fix: delete it or --fresh).
    """
    if not part.exists():
        return None
    try:
        old = Trace.load(part)
    except TraceError as exc:
        raise RecordError(f"cannot resume from the partial recording: {exc}; or delete {part} (or rerun with "
                          f"--fresh) to start over") from None
    fault = _requests_fault(json.loads(old.metadata.get("requests", "[]")), old, prompts)
    if fault is not None:  # resumed, it lost a request's rows or wrote a trace with a request twice
        raise RecordError(f"cannot resume from the partial recording: {part}: field requests: {fault}; delete "
                          f"{part} (or rerun with --fresh) to start over")
    return old


def _requests_fault(done: list[Any], old: Trace, prompts: Sequence[Prompt] | None) -> str | None:
    """What is wrong with a partial file's finished-request list ``done`` (``[id, prompt id, category,
    prompt tokens]`` each), or None."""
    ids: list[int] = []
    for entry in done:
        if (not isinstance(entry, list) or len(entry) != 4 or isinstance(entry[0], bool)
                or not isinstance(entry[0], int) or entry[0] < 0):
            return f"{str(entry)[:80]} is not a finished request [id, prompt id, category, prompt tokens]"
        if entry[0] in ids:
            return f"request {entry[0]} is listed twice"
        ids.append(entry[0])
        if prompts is not None and (entry[0] >= len(prompts) or entry[1:3] != [prompts[entry[0]].id,
                                                                              prompts[entry[0]].category]):
            here = (f"prompt {entry[0]} of this run is {prompts[entry[0]].id!r} ({prompts[entry[0]].category})"
                    if entry[0] < len(prompts) else f"this run has {len(prompts)} prompts")
            return f"request {entry[0]} is {entry[1]!r} ({entry[2]}), but {here}"
    rows = {int(r) for r in np.unique(old.request_id)}
    if rows - set(ids):
        return f"request {min(rows - set(ids))} has rows but is not listed as finished"
    if set(ids) - rows:
        return f"request {min(set(ids) - rows)} is listed as finished but has no rows"
    return None


def _resume_from(part: Path, metadata: dict[str, Any], settings: dict[str, Any], state: _Recording,
                 prompts: Sequence[Prompt]) -> None:
    """Load the partial file ``part`` into ``state`` when it was recorded with the same metadata and
    settings (else :class:`RecordError`, naming the key and ``--fresh``)."""
    old = load_partial(part, prompts)
    if old is None:
        return
    old_settings = json.loads(old.metadata.get("recorder", "{}"))
    for key in ("block_size", "target_model", "draft_model", "temperature", "top_p", "top_k", "seed"):
        if old.metadata.get(key) != (None if metadata.get(key) is None else str(metadata[key])):
            raise RecordError(f"{part}: partial file has {key}={old.metadata.get(key)!r}, this run "
                              f"{metadata.get(key)!r}; run with --fresh to start over")
    for key in ("max_new_tokens", "prompts_sha256_16", "skip_layers", "drafter_sha256"):
        if old_settings.get(key) != settings.get(key) and key == "drafter_sha256":
            was = "no hash" if old_settings.get(key) is None else f"SHA-256 {old_settings[key][:12]}..."
            raise RecordError(f"{part}: partial file was recorded with other drafter weights ({settings.get('drafter')}: "
                              f"{was}, now {str(settings.get(key))[:12]}...); run with --fresh to start over")
        if old_settings.get(key) != settings.get(key):
            raise RecordError(f"{part}: partial file has {key}={old_settings.get(key)!r}, this run "
                              f"{settings.get(key)!r}; run with --fresh to start over")
    rows = state.rows
    for s, n in zip(old.starts, old.num_positions):
        sl = slice(int(s), int(s + n))
        rows.request_id.append(old.request_id[sl]); rows.pos.append(old.pos[sl])
        rows.accept_len.append(old.accept_len[sl]); rows.conf.append(old.conf[sl])
        if rows.target_prob is not None:
            rows.target_prob.append(old.target_prob[sl])
    state.done = json.loads(old.metadata.get("requests", "[]"))
    state.seconds = float(old.metadata.get("record_seconds", "0"))


def _record_requests(backend: RecordBackend, prompts: Sequence[Prompt], out_path: str | os.PathLike, part: Path,
                     state: _Recording, metadata: dict[str, Any], *, block_size: int, max_new_tokens: int,
                     sampling: SamplingParams, keys: Sequence[Any], max_positions: int | None,
                     progress: bool) -> None:
    """Record every prompt not in ``state`` yet (until ``max_positions``), a batch of target decodes
    at a time, then each request's drafts; save ``part`` after each request."""
    done_ids = {int(r[0]) for r in state.done}
    state.total_positions = sum(len(r) for r in state.rows.request_id)
    todo = [(i, p) for i, p in enumerate(prompts) if i not in done_ids]
    batch = max(1, int(getattr(backend, "generate_batch", 1)))
    num_batches = -(-len(todo) // batch)
    bar = RunProgress(f"dcut-trace record {Path(out_path).name}", len(prompts), "requests", enabled=progress)
    bar.update(completed=len(done_ids), detail=f"{state.total_positions} positions")
    state.t_start = time.perf_counter()
    with bar:
        bar.note(f"dcut-trace record: {len(todo)} prompts to go ({len(done_ids)} done) in {num_batches} "
                 f"batch(es) of {batch}: the target decodes up to {max_new_tokens} tokens each, then the draft "
                 f"proposes {block_size - 1} tokens at every output position; an estimate of the run time follows the "
                 f"first request")
        estimated = False
        for b in range(0, len(todo), batch):
            if max_positions is not None and state.total_positions >= max_positions:
                break
            group = todo[b:b + batch]
            label = f"batch {b // batch + 1}/{num_batches}"
            ids, outputs, decode_s = _decode_batch(backend, group, label, bar, state, max_new_tokens, sampling, keys)
            for j, ((rid, prompt), prompt_ids, out) in enumerate(zip(group, ids, outputs)):
                if max_positions is not None and state.total_positions >= max_positions:
                    break
                if not out:
                    continue
                bar.update(detail=f"{label}: drafting request {j + 1}/{len(group)} ({len(out)} positions); "
                                  f"{state.total_positions} positions")
                t_draft = time.perf_counter()
                _draft_request(backend, state, rid, prompt, prompt_ids, out, block_size - 1, sampling)
                state.trace(metadata, block_size).save(part)
                bar.update(advance=1, detail=f"{state.total_positions} positions")
                if not estimated:
                    estimated = True
                    draft_s = time.perf_counter() - t_draft
                    guess = (num_batches - 1) * decode_s + (len(todo) - 1) * draft_s  # what is left
                    bar.note(f"dcut-trace record: estimate ~{format_duration(guess)} to go (target decode "
                             f"{format_duration(decode_s)} per batch, drafting {format_duration(draft_s)} per "
                             f"request, from the first ones)")


def _decode_batch(backend: RecordBackend, group: list[tuple[int, Prompt]], label: str, bar: RunProgress,
                  state: _Recording, max_new_tokens: int, sampling: SamplingParams,
                  keys: Sequence[Any]) -> tuple[list[list[int]], list[list[int]], float]:
    """The target's outputs for one batch of requests: (prompt ids, outputs, decode seconds)."""
    ids = [backend.encode_prompt(p.text) for _, p in group]
    t_decode = time.perf_counter()

    def on_step(done: int, total: int) -> None:
        dt = time.perf_counter() - t_decode
        eta = format_duration((total - done) * dt / done) if done else "?"
        bar.update(detail=f"{label}: target decode {done}/{total} ({done / dt:.1f}/s, ETA ~{eta}); "
                          f"{state.total_positions} positions")

    bar.update(detail=f"{label}: target decode of {len(group)} prompts; {state.total_positions} positions")
    gen_kwargs = {"on_step": on_step} if "on_step" in inspect.signature(backend.generate).parameters else {}
    if not sampling.is_greedy:
        gen_kwargs.update(sampling=sampling, keys=[keys[rid] for rid, _ in group])
    outputs = backend.generate(ids, max_new_tokens, **gen_kwargs)
    return ids, outputs, time.perf_counter() - t_decode


def _draft_request(backend: RecordBackend, state: _Recording, rid: int, prompt: Prompt, prompt_ids: list[int],
                   out: list[int], k: int, sampling: SamplingParams) -> None:
    """Draft ``k`` tokens at every position of one request's output ``out`` and add its rows to ``state``."""
    toks, conf = backend.draft_positions(prompt_ids, out, k)
    n = len(out)
    rows = state.rows
    rows.request_id.append(np.full(n, rid, np.int32)); rows.pos.append(np.arange(n, dtype=np.int32))
    rows.accept_len.append(accept_lengths(toks, out)); rows.conf.append(np.clip(conf, 0.0, 1.0))
    if not sampling.is_greedy:
        rows.target_prob.append(backend.target_probs(prompt_ids, out, toks, sampling))
    state.done.append([rid, prompt.id, prompt.category, len(prompt_ids)])
    state.total_positions += n


def _sorted_trace(trace: Trace) -> Trace:
    """``trace`` sorted by request id, so the file does not depend on the order requests finished in
    (:class:`RecordError` when it holds no position)."""
    if trace.num_rows == 0:
        raise RecordError("no positions recorded (every output was empty)")
    order = np.argsort(trace.request_id, kind="stable")
    return Trace(trace.request_id[order], trace.pos[order], trace.accept_len[order], trace.conf[order],
                 trace.metadata, target_prob=None if trace.target_prob is None else trace.target_prob[order])
