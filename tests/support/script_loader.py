"""Load one of the repository's scripts as a module (``scripts/*.py``, or ``tests/support/scripts/*.py``: neither
folder is a package), for tests of their functions, without putting the folder on ``sys.path``."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
#: The scripts the tests run in their own processes (two ranks, FSDP, peak RSS).
SUPPORT_SCRIPTS = Path(__file__).resolve().parent / "scripts"


def load_script(name: str, folder: Path = SCRIPTS) -> ModuleType:
    """``{folder}/{name}.py`` (``scripts/`` by default) executed as a fresh module named ``name``."""
    spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
