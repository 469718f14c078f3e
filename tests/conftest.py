from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def write_suite(tmp_path: Path):
    """Writes a suite TOML into tmp_path and returns its path."""

    def write(text: str, name: str = "suite.toml") -> Path:
        path = tmp_path / name
        path.write_text(text)
        return path

    return write


def hetbench_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "harness.cli.main", *args]


def completed_runs(folder: Path, suite_text: str) -> dict[str, Path]:
    """Run the suite `suite_text` once into `folder` (for a module fixture: several tests
    read one launch); every run must complete. Run name -> run directory."""
    from harness.run.launcher import run_suite
    from harness.spec.suite import load_suite

    (folder / "suite.toml").write_text(suite_text)
    results = run_suite(load_suite(str(folder / "suite.toml")), folder / "out")
    assert all(r.status == "completed" for r in results), [r.reason for r in results]
    return {r.run.name: r.run_dir for r in results}
