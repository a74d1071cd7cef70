"""``python -m dcut_sched.cli.vllm_profile``: the process ``dcut-profile --vllm`` runs in the vLLM
environment; times vLLM's forward on dummy batches and, with ``--draft``, real engine steps
(:func:`dcut_sched.integrations.vllm_tools.profile.profile_engine`) and writes the cost curve."""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import Sequence

from ..integrations.vllm_tools.profile import HELDOUT_OFFSET, ModelRunnerNotFound, profile_engine
from ..paths import prompts_path
from .args import comma_list

__all__ = ["main"]

PROG = "python -m dcut_sched.cli.vllm_profile"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog=PROG,
        description="Time vLLM's own forward on dummy batches and, with --draft, real engine steps on held-out "
                    "prompts (per-step overheads, the real draft pass); write a v2 cost curve.")
    ap.add_argument("--model", required=True, help="target model folder")
    ap.add_argument("--draft", help="draft model folder (vLLM method draft_model): also time the draft step")
    ap.add_argument("--block-size", type=int, default=8)
    ap.add_argument("--batch-sizes", default="1,2,4,8,16",
                    type=comma_list(item="batch size", minimum=1, need="positive integers"))
    ap.add_argument("--context-len", type=int, default=128)
    ap.add_argument("--warmups", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--engine-steps", type=int, default=40, metavar="TOKENS",
                    help="with --draft: time real engine steps (no speculation, drafted with full verification, "
                         "undrafted) on waves of held-out prompts, TOKENS new tokens per request; 0 = dummy "
                         "batches only (the draft step is then vLLM's dummy pass, without attention)")
    ap.add_argument("--prompts", default=str(prompts_path()),
                    help="engine steps: prompt file (JSON lines with 'prompt'); rows from --prompt-offset")
    ap.add_argument("--prompt-offset", type=int, default=HELDOUT_OFFSET,
                    help="engine steps: first held-out prompt row (default %(default)s: not the benchmark's)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    given = list(sys.argv[1:] if argv is None else argv)
    try:
        curve = profile_engine(args.model, args.out, draft=args.draft, block_size=args.block_size,
                               batch_sizes=args.batch_sizes, context_len=args.context_len, warmups=args.warmups,
                               repeats=args.repeats, dtype=args.dtype, engine_steps=args.engine_steps,
                               prompts_file=args.prompts, prompt_offset=args.prompt_offset,
                               command=f"{PROG} {shlex.join(given)}")
    except ModelRunnerNotFound as exc:
        print(f"error: {exc}")
        return 2
    curve.save(args.out)
    print(f"wrote {args.out} in {curve.profile_seconds:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
