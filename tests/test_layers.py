"""The layers import one way: tasks and kernels depend on nothing above them, inside runners/
the rooms depend on each other in one direction (commands on the library, never the reverse),
and no module imports, directly or through others, a module that imports it back.

Read from the source (every import statement, at module level or inside a function), so a lazy
import that points the wrong way counts as much as one at the top of a file; an import that the
source spells as a string (importlib) would be invisible, so there must be none. Every package
folder is in pyproject.toml's package list, or an install would leave it out.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# import name -> folder, as pyproject.toml maps them
PACKAGES = {"pathbench": "pathbench", "pathbench.tasks": "tasks", "pathbench.kernels": "kernels",
            "pathbench.models": "models", "pathbench.runners": "runners"}
BASE = {"pathbench", "pathbench.tasks", "pathbench.kernels", "pathbench.models"}
ROOMS = {f"pathbench.runners.{room}" for room in ("training", "sweep", "analysis", "bench", "cli")}
# what each layer may import besides itself
ALLOWED = {
    "pathbench": set(),
    "pathbench.tasks": {"pathbench"},
    "pathbench.kernels": {"pathbench"},
    "pathbench.models": {"pathbench", "pathbench.kernels"},
    "pathbench.runners": set(),  # runners/__init__.py: a docstring
    "pathbench.runners.training": BASE,
    "pathbench.runners.analysis": BASE | {"pathbench.runners.training"},
    "pathbench.runners.sweep": BASE | {"pathbench.runners.training", "pathbench.runners.analysis"},
    "pathbench.runners.bench": BASE | {"pathbench.runners.training"},
    "pathbench.runners.cli": BASE | ROOMS,
}
LAYERS = list(ALLOWED)


def _modules() -> dict[str, Path]:
    modules = {}
    for package, folder in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join((package, *parts))] = path
    return modules


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The pathbench modules that a module's import statements name."""
    found = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {module for module in found if module in MODULES and module != name}


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _layer(module: str) -> str:
    return max((p for p in LAYERS if module == p or module.startswith(p + ".")), key=len)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_down(module):
    layer = _layer(module)
    wrong = sorted(other for other in GRAPH[module]
                   if _layer(other) != layer and _layer(other) not in ALLOWED[layer])
    assert not wrong, f"{module} ({layer}) imports {wrong}"


def test_no_import_cycles():
    def is_package_of(parent: str, child: str) -> bool:  # importing a package's own parts
        return child.startswith(parent + ".")

    state: dict[str, int] = {}  # 1: on the current path, 2: finished

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for other in sorted(GRAPH[module]):
            if is_package_of(other, module):
                continue  # a module imports its own package's __init__ on the way
            if state.get(other) == 1:
                cycle = path[path.index(other):] + [other]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if other not in state:
                visit(other, [*path, other])
        state[module] = 2

    for module in sorted(GRAPH):
        if module not in state:
            visit(module, [module])


def test_the_checker_sees_a_wrong_import(tmp_path):
    """The reader finds a function-level import of a higher layer."""
    source = tmp_path / "x.py"
    source.write_text("def f():\n    from pathbench.runners.training.store import write_atomic\n")
    assert "pathbench.runners.training.store" in _imports("pathbench.tasks.x", source)


def test_every_runners_module_is_in_a_room():
    rooms = {_layer(module) for module in MODULES if module.startswith("pathbench.runners.")}
    assert rooms == ROOMS
    assert [m for m in MODULES if _layer(m) == "pathbench.runners"] == ["pathbench.runners"]


def _string_imports(path: Path) -> list[str]:
    """Calls that import a module named by a string: importlib.import_module, __import__."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            name = getattr(node.func, "attr", None) or getattr(node.func, "id", None)
            if name in ("import_module", "__import__"):
                found.append(f"{path.name}:{node.lineno}")
    return found


def test_no_module_is_imported_through_a_string():
    found = [where for path in MODULES.values() for where in _string_imports(path)]
    assert not found, f"imports the layer checks cannot see: {found}"


def test_the_checker_sees_an_import_through_a_string(tmp_path):
    source = tmp_path / "x.py"
    source.write_text("import importlib\n\ndef f(name):\n    return importlib.import_module(name)\n")
    assert _string_imports(source) == ["x.py:4"]


def _package_folders() -> set[str]:
    """Every folder of a package (one with an __init__.py), by its import name."""
    names = set()
    for package, folder in PACKAGES.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT / folder).parts
            names.add(".".join((package, *parts)))
    return names


def test_every_package_folder_is_installed():
    settings = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    missing = sorted(_package_folders() - set(settings["packages"]))
    assert not missing, f"pyproject.toml's [tool.setuptools] packages lacks {missing}"
