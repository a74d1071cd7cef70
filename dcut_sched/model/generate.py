"""Reference greedy decoding: the ground truth the speculative engine must match token for token."""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from dcut_sched.model.llama import LlamaModel


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
    bsz = batch_size or len(prompts)
    out: list[list[int]] = []
    for i in range(0, len(prompts), bsz):
        out.extend(_greedy_batch(model, prompts[i:i + bsz], max_new_tokens, eos_id, on_step))
    return out


def _greedy_batch(model: LlamaModel, prompts: list[list[int]], max_new: int, eos_id: int | None,
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
        nxt = logits.argmax(-1)  # [bs]
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
