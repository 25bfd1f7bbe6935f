#!/usr/bin/env bash
# Create .venv and install lightning-dos with its test extra. Idempotent: a second run only checks.
# On a machine without an NVIDIA GPU, the CPU build of torch 2.13.0 is installed first, so the
# package's `torch>=2.4` is already satisfied and no multi-GB CUDA wheels are pulled.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $($PYTHON --version 2>&1)"
  "$PYTHON" -m venv .venv
fi
PY=.venv/bin/python
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo "setup: GPU found, installing torch (CUDA build)"
    "$PY" -m pip install -q "torch>=2.4"
  else
    echo "setup: no GPU, installing the CPU build of torch 2.13.0"
    "$PY" -m pip install -q "torch==2.13.0"
  fi
fi
if ! "$PY" -c "import lightning_dos, pytest, transformers, xdist" >/dev/null 2>&1; then
  echo "setup: installing lightning-dos and its dependencies (first time: a few minutes)"
  "$PY" -m pip install -q -e ".[test]"
fi
echo "setup: ready ($("$PY" -c 'import torch, lightning, deepspeed; print(f"torch {torch.__version__}, lightning {lightning.__version__}, deepspeed {deepspeed.__version__}")' 2>/dev/null | tail -n 1))"
