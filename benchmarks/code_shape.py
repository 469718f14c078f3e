"""The shape of the code, measured (issue 26): module cycles, internal imports and how many
sit inside functions, the largest modules, parameters typed `Any`, README's size.

    python benchmarks/code_shape.py            # this checkout
    python benchmarks/code_shape.py --repo DIR  # another checkout (a git worktree of a commit)

The rules themselves are tests (tests/test_layers.py, tests/test_docs.py) and lint-imports;
this prints the numbers a closing note quotes.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOMS = ("harness", "adapters", "workloads", "analysis")
# Since issue 56 the rooms import as hetbench.<room>; a checkout from before imports them bare.
PACKAGES = ("hetbench", *ROOMS)


def import_prefix(repo: Path) -> str:
    return "hetbench." if (repo / "hetbench" / "__init__.py").is_file() else ""


def modules(repo: Path) -> list[tuple[str, Path]]:
    found = []
    for room in ROOMS:
        for path in sorted((repo / room).rglob("*.py")):
            name = ".".join(path.relative_to(repo).with_suffix("").parts)
            found.append((import_prefix(repo) + name.removesuffix(".__init__"), path))
    return found


def room_of(module: str) -> str:
    return module.removeprefix("hetbench.").split(".")[0]


def import_statements(path: Path) -> tuple[int, int]:
    """(internal import statements, of them inside a function body)."""
    total = inside = 0

    def walk(node: ast.AST, depth: int) -> None:
        nonlocal total, inside
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                walk(child, depth + 1)
                continue
            if isinstance(child, ast.ImportFrom):
                base = child.module or ""
                internal = bool(child.level) or base.split(".")[0] in PACKAGES
            elif isinstance(child, ast.Import):
                internal = any(a.name.split(".")[0] in PACKAGES for a in child.names)
            else:
                walk(child, depth)
                continue
            if internal:
                total += 1
                inside += depth > 0
    walk(ast.parse(path.read_text()), 0)
    return total, inside


def any_parameters(path: Path) -> int:
    count = 0
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            count += sum(1 for a in node.args.args + node.args.kwonlyargs
                         if a.annotation is not None and ast.unparse(a.annotation) == "Any")
    return count


def cycles(repo: Path) -> list[list[str]]:
    """Strongly connected components of more than one module in `repo` (grimp's import
    graph; the finder tests/test_layers.py checks this checkout with)."""
    import grimp

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.test_layers import module_cycles

    sys.path.insert(0, str(repo))  # the packages of `repo`, whichever checkout it is
    roots = ("hetbench",) if import_prefix(repo) else ROOMS
    return module_cycles(grimp.build_graph(*roots, cache_dir=None))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[1])
    repo = parser.parse_args().repo.resolve()
    found = modules(repo)
    statements = [import_statements(path) for _, path in found]
    lines = sorted(((len(path.read_text().splitlines()), name) for name, path in found),
                   reverse=True)
    typed_any = sum(any_parameters(path) for name, path in found
                    if room_of(name) in ("harness", "analysis", "adapters"))
    print(f"modules: {len(found)}")
    print(f"module cycles: {len(cycle_list := cycles(repo))} {cycle_list}")
    print(f"internal import statements: {sum(t for t, _ in statements)}, inside functions: "
          f"{sum(i for _, i in statements)}")
    print("largest modules: " + ", ".join(f"{name} {n}" for n, name in lines[:3]))
    print(f"parameters typed Any (harness, analysis, adapters): {typed_any}")
    print(f"README.md: {(repo / 'README.md').stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
