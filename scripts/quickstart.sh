#!/usr/bin/env bash
# Install (scripts/setup.sh), then train the quickstart recipe: a ~10M-parameter GPT on the Python
# standard library's own source, through strategy deep_optimizer_states. Extra arguments go to `fit`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$PWD/.cache/torch_extensions}
exec .venv/bin/lightning-dos fit --config recipes/quickstart.yaml "$@" </dev/null
