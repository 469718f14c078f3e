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
