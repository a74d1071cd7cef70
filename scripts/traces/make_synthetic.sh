#!/usr/bin/env bash
# Re-create the shipped synthetic DFlash-like traces from the presets (seconds).
# The presets themselves are re-fitted by: PYTHONPATH=. python analysis/fit_presets.py --max-evals 800
set -euo pipefail
cd "$(dirname "$0")/../.."
for ds in gsm8k math500 humaneval mbpp mt-bench; do
  python -m dcut_sched.cli.trace synth --preset "dflash-qwen3-8b-$ds" --num-requests 48 --seed 0 \
    --out "dcut_sched/data/traces/dflash-qwen3-8b-$ds-b16.parquet"
done
