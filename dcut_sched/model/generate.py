"""Reference decoding, greedy and sampled: the ground truth the speculative engine must match token for token."""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from dcut_sched.model.llama import LlamaModel
from dcut_sched.sampling import SamplingParams, request_keys, sample_at


@torch.inference_mode()
def greedy_generate(model: LlamaModel, prompt_ids: Sequence[Sequence[int]], max_new_tokens: int,
                    eos_id: int | None, batch_size: int | None = None,
                    on_step: Callable[[int, int], None] | None = None) -> list[list[int]]:
    """Plain autoregressive greedy decoding (argmax, first index on exact ties, as torch.argmax).

    Prompts are processed `batch_size` at a time (default: all together), right-padded; each
    request decodes at its own position, so padding never affects results except through
    floating-point batch effects (see below).

    Args:
        model: the target model (any dtype/device).
        prompt_ids: one list of token ids per request (each non-empty).
        max_new_tokens: maximum number of generated tokens per request.
        eos_id: generation of a request stops after it emits this id (included in the output);
            None = never stop early.
        batch_size: requests per batch (None = all).
        on_step: called after every decode step of a batch with (steps done, max_new_tokens)
            (progress reports; a batch may stop before max_new_tokens when every request hit EOS).
    Returns:
        The generated ids of each request (prompt excluded), in input order.
    Raises:
        ValueError: an empty prompt or max_new_tokens < 0.

    Determinism: at fp32 on CPU a batched matmul may use a different blocking than a bs=1 one,
    so logits differ in the last ulps between batch sizes; on near-ties the argmax can in
    principle flip. The tests check batched == unbatched on real prompts; for a bit-exact
    reference, compare at the same batch size (or use batch_size=1).
    """
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    prompts = [list(p) for p in prompt_ids]
    if any(len(p) == 0 for p in prompts):
        raise ValueError("greedy_generate: every prompt needs at least one token")
    if not prompts or max_new_tokens == 0:
        return [[] for _ in prompts]
    return _generate(model, prompts, max_new_tokens, eos_id, batch_size, SamplingParams(), None, on_step)


@torch.inference_mode()
def sample_generate(model: LlamaModel, prompt_ids: Sequence[Sequence[int]], max_new_tokens: int,
                    eos_id: int | None, sampling: SamplingParams, keys: Sequence[int] | None = None,
                    batch_size: int | None = None,
                    on_step: Callable[[int, int], None] | None = None) -> list[list[int]]:
    """Plain autoregressive sampled decoding: the token at sequence index n of request i is
    :func:`dcut_sched.sampling.sample_at` of the target's logits with key ``keys[i]`` at index n.

    Same arguments as :func:`greedy_generate`, plus ``sampling`` (T = 0 is greedy decoding) and
    ``keys`` (default ``request_keys(sampling.seed, len(prompt_ids))``). The speculative engine with
    the same keys produces the same tokens under every policy (``dcut_sched.sampling``).

    Raises:
        ValueError: an empty prompt, max_new_tokens < 0 or ``keys`` of the wrong length.
    """
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    prompts = [list(p) for p in prompt_ids]
    if any(len(p) == 0 for p in prompts):
        raise ValueError("sample_generate: every prompt needs at least one token")
    keys = request_keys(sampling.seed, len(prompts)) if keys is None else [int(k) for k in keys]
    if len(keys) != len(prompts):
        raise ValueError(f"sample_generate: {len(keys)} keys for {len(prompts)} prompts")
    if not prompts or max_new_tokens == 0:
        return [[] for _ in prompts]
    return _generate(model, prompts, max_new_tokens, eos_id, batch_size, sampling, keys, on_step)


def _generate(model, prompts, max_new_tokens, eos_id, batch_size, sampling, keys, on_step=None) -> list[list[int]]:
    bsz = batch_size or len(prompts)
    out: list[list[int]] = []
    for i in range(0, len(prompts), bsz):
        out.extend(_decode_batch(model, prompts[i:i + bsz], max_new_tokens, eos_id, sampling,
                                 None if keys is None else keys[i:i + bsz], on_step))
    return out


def _decode_batch(model: LlamaModel, prompts: list[list[int]], max_new: int, eos_id: int | None,
                  sampling: SamplingParams, keys: list[int] | None,
                  on_step: Callable[[int, int], None] | None = None) -> list[list[int]]:
    dev = model.device
    bs = len(prompts)
    lengths = torch.tensor([len(p) for p in prompts], device=dev)
    T = int(lengths.max())
    ids = torch.zeros(bs, T, dtype=torch.long, device=dev)
    for b, p in enumerate(prompts):
        ids[b, :len(p)] = torch.tensor(p, dtype=torch.long)
    cache = model.new_cache(bs, T + max_new)
    logits = model.prefill(ids, cache, lengths=lengths)
    pos = lengths.clone()  # position of the next token to feed
    outs: list[list[int]] = [[] for _ in range(bs)]
    done = [False] * bs
    for step in range(max_new):
        if sampling.is_greedy:
            nxt = logits.argmax(-1)  # [bs]
        else:
            index = (lengths + step).tolist()  # sequence index of the token drawn now
            nxt = torch.tensor([sample_at(logits[b:b + 1], sampling, keys[b], [index[b]])[0] for b in range(bs)],
                               dtype=torch.long, device=dev)
        for b, t in enumerate(nxt.tolist()):
            if not done[b]:
                outs[b].append(t)
                done[b] = (eos_id is not None and t == eos_id) or len(outs[b]) >= max_new
        if on_step is not None:
            on_step(step + 1, max_new)
        if all(done) or step == max_new - 1:
            break
        logits = model(nxt[:, None], pos[:, None], cache)[:, 0]
        pos = pos + 1
    return outs
