"""mypy is clean on harness/, analysis/ and adapters/ with every function typed
(pyproject's [tool.mypy]; DESIGN.md, Style). This test is CI's only mypy run."""

from __future__ import annotations

import sys

import pytest

from tests.conftest import REPO, Spawn


def test_mypy_is_clean_on_harness_analysis_and_adapters(tmp_path, spawn: Spawn) -> None:
    pytest.importorskip("mypy", reason="mypy is in the test extra: pip install -e '.[test]'")
    done = spawn.run([sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path),
                      "-p", "hetbench.harness", "-p", "hetbench.analysis",
                      "-p", "hetbench.adapters"], cwd=REPO, capture_output=True,
                     text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:]
