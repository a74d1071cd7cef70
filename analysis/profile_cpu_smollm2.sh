#!/usr/bin/env bash
# Re-measure the shipped CPU curve dcut_sched/profiler/profiles/cpu-smollm2-135m-b16.json (SmolLM2-135M shapes,
# random weights, float32, one torch thread, B=16, context 256, bs 1..16, buckets + every multiple of 8
# + the AR point, self-speculative draft step skipping layers 14-15). Takes ~10-15 min on 2 shared cores.
# Interrupted? Run it again with --resume appended.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHONPATH=. python -m dcut_sched.cli.profile --cpu --model smollm2-135m --batch-sizes 1,2,4,8,16 --block-size 16 \
    --grid-step 8 --draft self-skip:14,15 --context-len 256 --warmups 1 --repeats 5 --rounds 5 --threads 1 \
    --report analysis/cpu-smollm2-135m-b16-interp.csv \
    --out dcut_sched/profiler/profiles/cpu-smollm2-135m-b16.json "$@"
