"""The package's layout: the engine never imports the lab, planning imports only the standard library, no module
imports one that imports it back, the package root holds few modules, and the update phase reaches DeepSpeed's
optimizer through the seam's calls only, writing none of its attributes (docs/architecture.md).

The engine trains (``strategies``, ``update``, ``planning``, ``zero``, ``activations``); the lab measures and drives it
(``telemetry``, ``models``, ``data``, ``bench``) and imports it, never the reverse, and of the lab ``telemetry``, which
every training run uses, imports nothing of the bench. Modules are read with ``ast``, not imported. Every ``import``
statement counts: at module level, inside functions and under ``if TYPE_CHECKING:`` alike (an import inside a
function is a dependency all the same; it only runs later). ``import lightning_dos.a.b`` and
``from lightning_dos.a import b`` (a module ``b``) depend on ``lightning_dos.a.b`` alone, not on the parent packages
Python initialises on the way (every module would otherwise depend on the root package, which imports the
strategies); ``from lightning_dos.a import name`` (not a module) depends on ``lightning_dos.a``.

The tests keep a layout too: the GPU tier (``tests/gpu``, which runs only on GPU hosts, never in CI) imports nothing
from the other tiers, whose private helpers could then change unseen; what the tiers share lives in ``tests/support``,
which holds no tests.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "lightning_dos"
TESTS = PACKAGE.parent / "tests"
#: The tiers the GPU tier may not import from (CI runs them, never the GPU tier): shared helpers go to tests/support.
CPU_TIERS = ("tests.integration", "tests.system", "tests.unit")
ENGINE = ("strategies", "update", "planning", "zero", "activations")
LAB = ("telemetry", "models", "data", "bench")
MAX_ROOT_MODULES = 6
#: What the planning package may import besides itself: it is pure, so plans can be computed without torch.
PLANNING_STDLIB = {
    "__future__", "collections", "dataclasses", "enum", "fractions", "math", "numbers", "re", "statistics", "typing",
}


def module_name(path: Path) -> str:
    """``lightning_dos/update/executor.py`` -> ``lightning_dos.update.executor``; a package's ``__init__`` is the
    package."""
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES: dict[str, Path] = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def import_targets(name: str, path: Path) -> list[tuple[ast.stmt, str, str | None]]:
    """Each (statement, module, name) that module ``name`` (at ``path``) imports: ``import a.b`` gives ``("a.b",
    None)``, ``from a import b`` gives ``("a", "b")`` (``b`` may be a module); relative imports are resolved from the
    module's package, one level up per extra dot."""
    found: list[tuple[ast.stmt, str, str | None]] = []
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node, alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = name.split(".") if is_package else name.split(".")[:-1]
                package = package[:len(package) - node.level + 1]
                base = ".".join([*package, base] if base else package)
            found += [(node, base, alias.name) for alias in node.names]
    return found


def imports(name: str, path: Path) -> tuple[set[str], set[str]]:
    """What module ``name`` (at ``path``) imports: the package's modules it depends on, and the top-level names of
    everything else."""
    inside: set[str] = set()
    outside: set[str] = set()
    for _, module, attribute in import_targets(name, path):
        if module.split(".")[0] != "lightning_dos":
            outside.add(module.split(".")[0])
        elif attribute is not None and f"{module}.{attribute}" in MODULES:
            inside.add(f"{module}.{attribute}")
        else:
            inside.add(module)
    inside.discard(name)
    return inside, outside


GRAPH: dict[str, set[str]] = {name: imports(name, path)[0] for name, path in MODULES.items()}


def shelf(name: str) -> str:
    """The folder (or root module) a module sits in: ``lightning_dos.update.executor`` -> ``update``; the root
    package is ``""``."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else ""


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (``[a, b, ..., a]``), or None when there is none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in state:
                found = visit(target)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def edges_between(sources: tuple[str, ...], targets: tuple[str, ...]) -> list[str]:
    return sorted(f"{a} -> {b}" for a, deps in GRAPH.items() if shelf(a) in sources
                  for b in deps if shelf(b) in targets)


def test_every_shelf_is_where_the_layout_says() -> None:
    folders = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert folders == set(ENGINE) | set(LAB)


@pytest.mark.parametrize(("sources", "targets"), [
    (ENGINE, (*LAB, "cli")),  # the engine trains without the lab and without the command line
    (("telemetry",), ("bench",)),  # what every training run logs does not depend on the bench
], ids=["engine-not-lab", "telemetry-not-bench"])
def test_no_import_crosses_the_layers(sources: tuple[str, ...], targets: tuple[str, ...]) -> None:
    crossing = edges_between(sources, targets)
    assert not crossing, f"imports from {', '.join(sources)} into {', '.join(targets)}: {crossing}"


def test_planning_imports_only_the_standard_library_and_itself() -> None:
    for name, path in MODULES.items():
        if shelf(name) != "planning":
            continue
        inside, outside = imports(name, path)
        assert outside <= PLANNING_STDLIB, f"{name} imports {sorted(outside - PLANNING_STDLIB)}"
        assert {shelf(target) for target in inside} <= {"planning"}, f"{name} imports {sorted(inside)}"


def test_no_import_cycles() -> None:
    cycle = find_cycle(GRAPH)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_package_root_holds_few_modules() -> None:
    root = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(root) <= MAX_ROOT_MODULES, f"{len(root)} modules at the package root: {root}"


def test_the_checks_see_what_they_check() -> None:
    """The graph is read right (a relative import, a function-level one, ``from package import module``), and the cycle
    finder finds a cycle where there is one."""
    assert "lightning_dos.planning.calibration" in GRAPH["lightning_dos.planning"]  # from .calibration import ...
    assert "lightning_dos.update.manager" in GRAPH["lightning_dos.strategies.dos"]  # inside a method
    assert "lightning_dos.bench.ranks" in GRAPH["lightning_dos.bench.worker"]  # from lightning_dos.bench import ranks
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def optimizer_attribute_writes(source: str) -> list[str]:
    """``x.optimizer.name = ...`` / ``optimizer.name = ...`` (and augmented) assignments in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AugAssign, ast.AnnAssign)) else []
        for target in targets:
            if isinstance(target, ast.Attribute):
                owner = target.value
                name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
                if name == "optimizer":
                    found.append(ast.unparse(target))
    return found


def test_the_update_phase_writes_no_attribute_of_deepspeeds_optimizer() -> None:
    """The manager attaches itself by one call (``InterleavedZeroOptimizer.attach``) and the seam reads what it
    needs from it; nothing in ``update/`` sets an attribute on the optimizer."""
    writes = {p.name: optimizer_attribute_writes(p.read_text()) for p in (PACKAGE / "update").glob("*.py")}
    assert not {k: v for k, v in writes.items() if v}, writes
    assert optimizer_attribute_writes("self.optimizer.in_flight = None\noptimizer.x += 1\nself.y = 2") == [
        "self.optimizer.in_flight", "optimizer.x"]


def import_statements(path: Path, root: Path) -> list[tuple[ast.stmt, set[str]]]:
    """Every ``import`` statement of ``path`` (a module below ``root``'s parent), with the dotted names it names
    (:func:`import_targets`; ``from a import b`` names ``a`` and ``a.b``)."""
    name = ".".join(path.relative_to(root.parent).with_suffix("").parts)
    statements: dict[int, tuple[ast.stmt, set[str]]] = {}
    for node, module, attribute in import_targets(name, path):
        named = statements.setdefault(id(node), (node, set()))[1]
        named.update({module} if attribute is None else {module, f"{module}.{attribute}"})
    return list(statements.values())


def reaches(name: str, targets: tuple[str, ...]) -> bool:
    return any(name == target or name.startswith(f"{target}.") for target in targets)


def test_the_gpu_tier_imports_nothing_from_the_cpu_tiers() -> None:
    """A helper the GPU tier took from an integration test module would break it unseen when renamed there: CI never
    runs the GPU tier. What both tiers use lives in ``tests/support``."""
    crossing = [f"{p.relative_to(TESTS.parent)}:{node.lineno}: {ast.unparse(node)}"
                for p in sorted((TESTS / "gpu").rglob("*.py")) for node, names in import_statements(p, TESTS)
                if any(reaches(name, CPU_TIERS) for name in names)]
    assert not crossing, f"the GPU tier imports from the CPU tiers (move what it uses to tests/support): {crossing}"


def test_tests_support_holds_no_tests() -> None:
    found = [f"{p.relative_to(TESTS.parent)}: {node.name}" for p in sorted((TESTS / "support").rglob("*.py"))
             for node in ast.walk(ast.parse(p.read_text(), str(p)))
             if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_")]
    assert not found, f"tests in tests/support (a tier's folder is where tests go): {found}"


def test_the_test_layout_checks_see_what_they_check(tmp_path: Path) -> None:
    """Each way to import a CPU tier's module is seen (absolute, ``from tests import``, relative, inside a function),
    and what is not one of them is not."""
    gpu = tmp_path / "tests" / "gpu"
    gpu.mkdir(parents=True)
    (gpu / "test_x.py").write_text(
        "import tests.unit.test_a\nfrom tests import integration\nfrom ..system.test_b import helper\n"
        "def f():\n    from .. import unit\nfrom tests.support.parity import train\nimport tests_other\n")
    statements = import_statements(gpu / "test_x.py", tmp_path / "tests")
    crossing = [node.lineno for node, names in statements if any(reaches(name, CPU_TIERS) for name in names)]
    assert len(statements) == 6 and sorted(crossing) == [1, 2, 3, 5]
