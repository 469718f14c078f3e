"""The shape of the code (docs/DESIGN.md "Layers"): no module imports itself back through
others, and the rooms keep their import contract (pyproject's [tool.importlinter], checked
here with `lint-imports`: CI's only run of it)."""

from __future__ import annotations

import ast
import os
import sys
from pathlib import Path

import grimp
import pytest

from tests.conftest import REPO, Spawn

PACKAGES = ("hetbench",)  # the one import name: hetbench/<room> links to each room


def module_cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iteratively)."""
    modules = sorted(graph.modules)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    for root in modules:
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(
                        graph.find_modules_directly_imported_by(child)))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        cycles.append(sorted(component))
    return cycles


def test_the_cycle_finder_finds_a_cycle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "circle"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from circle import b\n")
    (package / "b.py").write_text("from circle import c\n")
    (package / "c.py").write_text("from circle import a\n")
    (package / "d.py").write_text("from circle import a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    graph = grimp.build_graph("circle", cache_dir=None)
    assert module_cycles(graph) == [["circle.a", "circle.b", "circle.c"]]


def test_no_module_imports_itself_back() -> None:
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)
    assert module_cycles(graph) == []


def test_the_rooms_keep_their_import_contract(spawn: Spawn) -> None:
    linter = Path(sys.executable).parent / "lint-imports"
    if not linter.exists():
        pytest.skip("lint-imports is not installed (pip install -e '.[test]')")
    done = spawn.run([str(linter), "--no-cache"], cwd=REPO, capture_output=True,
                     text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:]


# What an import inside a function may defer: a framework (a worker sets its threads and
# cores before one loads) or a library slow to import that a command may not need.
HEAVY = {"torch", "tensorflow", "mxnet", "keras", "pandas", "matplotlib", "seaborn", "scipy",
         "sklearn", "pyarrow", "ruptures", "PIL"}


def imports_inside_functions(path: Path, module: str) -> list[tuple[int, list[str]]]:
    """(line, internal modules named) of each internal import inside a function."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for inner in ast.walk(node):
            if isinstance(inner, ast.ImportFrom):
                base = inner.module or ""
                if inner.level:
                    parts = package.split(".")[: len(package.split(".")) - inner.level + 1]
                    base = ".".join(parts + ([inner.module] if inner.module else []))
                names = [f"{base}.{alias.name}" for alias in inner.names] + [base]
            elif isinstance(inner, ast.Import):
                names = [alias.name for alias in inner.names]
            else:
                continue
            internal = [n for n in names if n.split(".")[0] in PACKAGES]
            if internal:
                found.append((inner.lineno, internal))
    return found


def defers_nothing_heavy(graph: grimp.ImportGraph, names: list[str]) -> bool:
    modules = [n for n in names if n in graph.modules]
    loaded = set(modules).union(*(graph.find_upstream_modules(m) for m in modules))
    return not any(m.split(".")[0] in HEAVY for m in loaded)


def python_files(folder: Path) -> list[Path]:
    """The package's modules, through links (hetbench/<room> links to the room's folder)."""
    return sorted(Path(top, name) for top, _, names in os.walk(folder, followlinks=True)
                  for name in names if name.endswith(".py"))


def light_imports_inside_functions(root: Path, packages: tuple[str, ...]) -> list[str]:
    graph = grimp.build_graph(*packages, include_external_packages=True, cache_dir=None)
    light = []
    for package in packages:
        for path in python_files(root / package):
            module = ".".join(path.relative_to(root).with_suffix("").parts)
            module = module.removesuffix(".__init__")
            for line, names in imports_inside_functions(path, module):
                if defers_nothing_heavy(graph, names):
                    light.append(f"{path.relative_to(root)}:{line}")
    return light


def test_an_import_inside_a_function_defers_something_heavy() -> None:
    """Other internal imports belong at the top of the module, where a reader sees them."""
    assert light_imports_inside_functions(REPO, PACKAGES) == []


def test_the_lazy_import_check_flags_a_light_one(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "lazy"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "light.py").write_text("VALUE = 1\n")
    (package / "heavy.py").write_text("import pandas\n")
    (package / "user.py").write_text("def f():\n    from lazy import light\n"
                                     "def g():\n    from lazy import heavy\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys.modules[__name__], "PACKAGES", ("lazy",))
    assert light_imports_inside_functions(tmp_path, ("lazy",)) == ["lazy/user.py:2"]


# analysis/ in rooms (issue 59): a reader finds a module by its room's job
ANALYSIS = REPO / "analysis"
MAX_MODULES_PER_FOLDER = 10
MAX_FUNCTION_LINES = 80


def long_functions(folder: Path, limit: int) -> list[str]:
    """`path:line name (N lines)` of each function (or method) longer than `limit` lines."""
    found = []
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > limit:
                    found.append(f"{path.relative_to(folder.parent)}:{node.lineno} "
                                 f"{node.name} ({lines} lines)")
    return found


def crowded_folders(folder: Path, limit: int) -> list[str]:
    """Each folder under `folder` (itself too) holding more than `limit` modules."""
    return [f"{d.relative_to(folder.parent)}: {count}"
            for d in [folder, *sorted(p for p in folder.rglob("*") if p.is_dir())]
            if (count := len([m for m in d.glob("*.py") if m.name != "__init__.py"])) > limit]


def test_analysis_is_in_rooms_of_short_functions() -> None:
    assert crowded_folders(ANALYSIS, MAX_MODULES_PER_FOLDER) == []
    assert long_functions(ANALYSIS, MAX_FUNCTION_LINES) == []
    rooms = [p for p in ANALYSIS.iterdir() if p.is_dir() and (p / "__init__.py").exists()]
    assert rooms and all(ast.get_docstring(ast.parse((p / "__init__.py").read_text()))
                         for p in rooms), "each room's __init__ says what it owns"


def test_the_shape_checks_catch_a_long_function_and_a_crowded_folder(tmp_path: Path) -> None:
    room = tmp_path / "room"
    room.mkdir()
    (room / "long.py").write_text("def f():\n" + "    x = 1\n" * 5)
    for i in range(3):
        (room / f"m{i}.py").write_text("")
    assert long_functions(room, 6) == []
    assert long_functions(room, 5) == ["room/long.py:1 f (6 lines)"]
    assert crowded_folders(room, 4) == []
    assert crowded_folders(room, 3) == ["room: 4"]
