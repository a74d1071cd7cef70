#!/usr/bin/env bash
# Measure dcut_sched/profiler/profiles/cpu-smollm2-135m-dflash-b16.json: SmolLM2-135M shapes (random weights,
# float32), two torch threads (as the engine benchmark runs), B = 16, context 80 (the benchmark's mean
# decode context), bs 1..16, buckets + every multiple of 8 + the AR point, and the draft step of the
# shipped DFlash drafter (its real weights: one context-feature update per request + the block forward).
# Run it on a quiet machine; the curve records the load it saw. Interrupted? Re-run with --resume.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m dcut_sched.cli.profile --cpu --model smollm2-135m --batch-sizes 1,2,4,8,16 --block-size 16 \
    --grid-step 8 --draft dflash:drafters/smollm2-135m-dflash --context-len 80 --warmups 2 --repeats 5 --rounds 5 \
    --threads 2 --no-progress --out dcut_sched/profiler/profiles/cpu-smollm2-135m-dflash-b16.json "$@"
