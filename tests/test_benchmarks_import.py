"""The benchmarks stay runnable: CI runs none of them (they measure, on a quiet machine),
so an API they use can change under them unseen (bench_adapter.py imported a function
that no longer existed for several sessions). Every script imports, and pytest collects
every pytest-benchmark module."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from tests.conftest import REPO, Spawn

SCRIPTS = sorted(p for p in (REPO / "benchmarks").glob("*.py")
                 if not p.name.startswith(("bench_", "conftest")))


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_a_benchmark_script_imports(path, monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))  # scripts import their neighbours
    spec = importlib.util.spec_from_file_location(f"benchmark_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    spec.loader.exec_module(importlib.util.module_from_spec(spec))  # main() is not called


def test_pytest_collects_every_benchmark_module(spawn: Spawn) -> None:
    done = spawn.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                      "-p", "no:cacheprovider", "benchmarks/"],
                     cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:]
    assert " tests collected" in done.stdout or "tests collected" in done.stdout
