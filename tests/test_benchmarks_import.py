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


def test_the_ci_check_against_ddp_fails_only_a_pair_slower_in_every_repeat(monkeypatch
                                                                           ) -> None:
    """`ddp_compare.py --fail-above R` (run by .ci/run): a hetbench variant whose step is
    1.3x its DDP counterpart's in every repeat fails at R = 1.2; one that is as fast as its
    counterpart, give or take the machine's noise, does not, even where it is slower than
    the other DDP variant (overlapped or not) beyond R."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    spec = importlib.util.spec_from_file_location("benchmark_ddp_compare",
                                                  REPO / "benchmarks" / "ddp_compare.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    ddp = [70.0, 72.0, 69.0, 75.0]
    overlap = [v * 1.3 for v in ddp]  # overlap paying badly: DDP's own 1.3x slower
    medians = {"hetbench": [v * 1.3 for v in ddp],
               "hetbench-ddp-overlap": [v * f for v, f in zip(overlap, (0.95, 1.08, 1.01, 0.97),
                                                              strict=True)],
               "ddp": ddp, "ddp-overlap": overlap}
    lines, slower = module.ratio_lines(medians, 1.2)
    assert len(lines) == 4 and lines[0].startswith("hetbench / ddp: ratio 1.300")
    assert [s.split(" (")[0] for s in slower] == ["hetbench / ddp"]
    medians["hetbench-ddp-overlap"] = [v * 1.25 for v in overlap]
    assert [s.split(" (")[0] for s in module.ratio_lines(medians, 1.2)[1]] == [
        "hetbench / ddp", "hetbench-ddp-overlap / ddp-overlap"]
    assert module.ratio_lines(medians, None)[1] == []
