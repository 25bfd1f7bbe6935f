#!/usr/bin/env bash
# Install what the tests need (scripts/setup.sh), then run the CPU test tier. GPU tests: `-m gpu` on a GPU host.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# one DeepSpeed CPU Adam JIT build for the whole run (tests/conftest.py uses the same folder)
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$PWD/.cache/torch_extensions}
export WANDB_MODE=${WANDB_MODE:-offline}
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@" </dev/null
