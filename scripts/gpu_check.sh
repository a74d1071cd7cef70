#!/usr/bin/env bash
# Every CUDA check of dcut-sched in one run (<= 6 minutes on one H200), from the source tree:
#   scripts/gpu_check.sh OUT              real checks on a CUDA machine
#   scripts/gpu_check.sh --dry-run OUT    every step on the CPU with a tiny model (what CI runs)
# Uses the machine's own python3 and packages and installs nothing (set PYTHON to pick another
# interpreter). Writes OUT/summary.md, OUT/summary.json, OUT/curves/, OUT/steps/, OUT/logs/.
# Exit status 0: nothing failed; 1: a check failed (see OUT/summary.md); 2: bad usage.
# See docs/profiler.md, "The GPU check", and `scripts/gpu_check.sh --help`.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec "${PYTHON:-python3}" scripts/gpu_check "$@"
