"""The no-torch guarantee, in a fresh interpreter: ``lightning_dos.planning`` loads and plans without torch (that it
imports only the standard library is in tests/unit/test_layout.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PLANNING_DIR = Path(__file__).resolve().parents[2] / "lightning_dos" / "planning"


def test_planning_package_loads_and_plans_without_torch():
    # load the planning package from its files under another name, so the torch-importing parent package never runs
    script = f"""
import importlib.util, sys
directory = {str(PLANNING_DIR)!r}
spec = importlib.util.spec_from_file_location(
    "planning_alone", directory + "/__init__.py", submodule_search_locations=[directory])
module = importlib.util.module_from_spec(spec)
sys.modules["planning_alone"] = module
spec.loader.exec_module(module)
plan = module.best_plan([30_000_000] * 8, module.CostParams(), memory_budget_bytes=None)
module.Calibrator(module.CostParams()).params
print(plan)
leaked = sorted(name for name in sys.modules if name.split(".")[0] in ("torch", "lightning_dos", "numpy"))
assert not leaked, leaked
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("plan auto [")
