"""``python -m dcut_sched.cli.model_bench``: the numbers docs/model.md quotes (load time, decode-step
speed, drafter acceptance), measured by :mod:`dcut_sched.model.bench`."""

from __future__ import annotations

import argparse
import time

__all__ = ["main"]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description="Measure the numbers quoted in docs/model.md: load time, decode-step speed, drafter acceptance.")
    ap.add_argument("--cold", action="store_true", help="also time an uncached GGUF load")
    ap.add_argument("--prompts", type=int, default=None)  # None: every BENCH_QUESTIONS prompt
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--num-draft", type=int, default=8)
    args = ap.parse_args(argv)
    import torch

    from ..model.bench import BENCH_QUESTIONS, decode_step_ms, preset_acceptance
    from ..model.drafter import DRAFTER_PRESETS
    from ..model.llama import LlamaModel
    from ..model.tokenizer import chat_prompt_ids, load_smollm2_tokenizer

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
        accs = preset_acceptance(model, name, prompts, args.new_tokens, tok.eos_id, args.num_draft)
        per = [round(sum(r) / len(r), 2) for r in [accs]]
        hist = [accs.count(a) for a in range(args.num_draft + 1)]
        print(f"drafter {name}: mean accepted {per[0]} of {args.num_draft} over {len(accs)} verify steps "
              f"({len(prompts)} prompts x {args.new_tokens} tokens); histogram 0..{args.num_draft}: {hist}")


if __name__ == "__main__":
    main()
