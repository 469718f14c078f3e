"""Runs recorded by an earlier hetbench still read (issue 26: behaviour unchanged).

tests/fixtures/legacy/ holds a small run directory written by hetbench at fdd7a22, before
harness/ was split into rooms (two CPU workers, one slowed 2x, 12 steps, evaluations), and
expected.json holds what that version's own analysis computed from it (its `run_row` and
its `load_steps` table's shape). Today's code must read the same directory to the same
numbers, and the CLI must report on it."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from hetbench.analysis.tables.runs import run_row
from hetbench.harness.records.results import load_run, load_steps
from tests.conftest import REPO, Spawn, hetbench_command

FIXTURE = REPO / "tests" / "fixtures" / "legacy"
EXPECTED = json.loads((FIXTURE / "expected.json").read_text())


@pytest.fixture
def legacy(tmp_path: Path) -> Path:
    """A copy of the fixture: reading must not depend on writing beside it."""
    copy = tmp_path / "legacy"
    shutil.copytree(FIXTURE, copy, ignore=shutil.ignore_patterns("expected.json"))
    return copy


def the_run(folder: Path) -> Path:
    (run_dir,) = folder.glob("two-unequal-*")
    return run_dir


def same(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-15)
    return a == b


def test_an_earlier_run_reads_to_the_same_numbers(legacy: Path) -> None:
    data = load_run(the_run(legacy))
    row = run_row(data)
    expected = EXPECTED["run_row"]
    assert set(expected) <= set(row)
    differ = {k: (row[k], v) for k, v in expected.items()
              if not (v is None and isinstance(row[k], float) and math.isnan(row[k]))
              and not same(row[k], v)}
    assert not differ
    steps = load_steps(legacy)
    assert len(steps) == EXPECTED["steps_rows"] == 24
    assert list(steps.columns) == EXPECTED["steps_columns"]


def test_the_cli_reports_on_an_earlier_run(legacy: Path, tmp_path: Path, spawn: Spawn) -> None:
    out = tmp_path / "report"
    done = spawn.run(hetbench_command("report", str(legacy), "--out", str(out), "--no-figures"),
                     cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "two-unequal" in done.stdout
    assert "two-unequal" in (out / "report.md").read_text()
