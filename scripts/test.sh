#!/usr/bin/env bash
# Install what the tests need (scripts/setup.sh), then run the CPU tiers: tests/unit, tests/integration, tests/system
# (what CI runs). --fast: the unit tier alone, for development. Other arguments go to pytest (a path picks a tier).
# GPU tests: `pytest -m gpu tests/gpu` on a GPU host.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--fast" ]; then
  shift
  set -- tests/unit "$@"
fi
bash scripts/setup.sh
# one DeepSpeed JIT build of each op for the whole run (tests/conftest.py uses the same folder), made before the
# tests so that no test's time includes it
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$PWD/.cache/torch_extensions}
export WANDB_MODE=${WANDB_MODE:-offline}
.venv/bin/python scripts/build_ops.py </dev/null
# two pytest workers (PYTEST_WORKERS to change; 0: none), each test file whole on one of them (its module-scoped fits
# are shared by its tests): most of the system tier's time is single-threaded (fresh interpreters importing torch,
# DeepSpeed and Lightning), so on two cores two workers overlap it
exec .venv/bin/python -m pytest -q -p no:cacheprovider -n "${PYTEST_WORKERS:-2}" --dist loadfile "$@" </dev/null
