"""A run keeps to itself (issue 30): its temporary files in a folder of its own, removed
when it closes; two launches at the same moment on one host do not collide (each run has
its own network namespace, so ports cannot clash). That no other local user reaches a
run's listeners is tests/test_listeners.py's."""

from __future__ import annotations

import json
import os
import subprocess
from datetime import datetime
from pathlib import Path

import pytest

from tests.conftest import REPO, Spawn, hetbench_command
from tests.test_mixed_frameworks import installed

pytestmark = pytest.mark.slow

SUITE = """
[suite]
name = "{name}"

[[runs]]
name = "short"
framework = "{framework}"
aggregator = "{aggregator}"
workload = "mlp"
dataset = "digits"
steps = {steps}
global_batch = 64
timeout_s = 60
workers = [ {{ device = "cpu" }}, {{ device = "cpu" }} ]
"""


def test_a_run_leaves_nothing_in_the_temporary_folder(tmp_path: Path, spawn: Spawn) -> None:
    """TensorFlow writes `__autograph_generated_file*.py` into TMPDIR and removes them at
    exit, which its workers skip (os._exit): a 2-worker, 5-step run left 12 there. Each
    run's processes now get a TMPDIR of their own, removed as the run closes."""
    if not installed("tensorflow"):
        pytest.skip("needs tensorflow (pip install 'hetbench[tensorflow]')")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    suite = tmp_path / "suite.toml"
    suite.write_text(SUITE.format(name="tmp", framework="tensorflow",
                                  aggregator="tensorflow-collective", steps=5))
    done = spawn.run(hetbench_command("run", str(suite), "--out", str(tmp_path / "out"),
                                      "--no-progress"),
                     cwd=REPO, env={**os.environ, "TMPDIR": str(tmp)}, capture_output=True,
                     text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    (run_dir,) = (tmp_path / "out" / "tmp").glob("short-*")
    assert json.loads((run_dir / "manifest.json").read_text())["status"] == "completed"
    left = sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*"))
    assert left == [], f"left in TMPDIR: {left}"


def test_two_launches_at_once_both_complete(tmp_path: Path, spawn: Spawn) -> None:
    """Two suites started at the same moment into different --out folders, one of them
    with parameter servers (RPC): no port or namespace collision."""
    launches = []
    for name, aggregator in (("first", "torch"), ("second", "ps-sync")):
        suite = tmp_path / f"{name}.toml"
        suite.write_text(SUITE.format(name=name, framework="pytorch", aggregator=aggregator,
                                      steps=30))
        launches.append(spawn(hetbench_command("run", str(suite), "--out",
                                               str(tmp_path / name), "--no-progress"),
                              cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True))
    outputs = [p.communicate(timeout=300)[0] for p in launches]
    assert [p.returncode for p in launches] == [0, 0], outputs
    spans = []
    for name in ("first", "second"):
        (run_dir,) = (tmp_path / name / name).glob("short-*")
        meta = json.loads((run_dir / "manifest.json").read_text())
        assert (meta["status"], meta["rows"]) == ("completed", 60), (name, meta["reason"])
        spans.append((datetime.fromisoformat(meta["start"]), datetime.fromisoformat(meta["end"])))
    # side by side, not one after the other by chance of scheduling
    (first_start, first_end), (second_start, second_end) = spans
    assert first_start < second_end and second_start < first_end, spans
