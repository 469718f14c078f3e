"""Nothing is lost (DESIGN.md principle 6): a worker that dies or a Ctrl-C ends the run
within a bounded time, leaves no process behind, and every flushed step stays readable."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from harness import collector
from harness.results import load_run
from tests.conftest import REPO, hetbench_command

pytestmark = pytest.mark.slow

LONG_RUN = """
[suite]
name = "faults"

[[runs]]
name = "long"
steps = 100000
global_batch = 64
timeout_s = 20
partition = { policy = "proportional", every = 5, dead_band = 0.0 }
workers = [ { device = "cpu" }, { device = "cpu", slowdown = 2.0 } ]
"""


def start_long_run(tmp_path: Path, write_suite, text: str = LONG_RUN
                   ) -> tuple[subprocess.Popen[str], Path, list[int]]:
    """`hetbench run` of a suite `faults` with a run `long` of two workers, once it has
    flushed 40 steps."""
    suite = write_suite(text)
    proc = subprocess.Popen(hetbench_command("run", str(suite), "--out", str(tmp_path / "out"),
                                             "--no-progress"),
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        runs = list((tmp_path / "out" / "faults").glob("long-*"))
        if runs and collector.steps_done(runs[0], 2) >= 40:
            pids = [json.loads((runs[0] / "parts" / f"rank{r}.json").read_text())["pid"]
                    for r in range(2)]
            return proc, runs[0], pids
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    proc.kill()
    pytest.fail("the run did not reach 40 steps in 90 s")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def finish(proc: subprocess.Popen[str]) -> tuple[int, str]:
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err


def test_dead_worker_fails_the_run_and_keeps_flushed_steps(tmp_path: Path, write_suite) -> None:
    proc, run_dir, pids = start_long_run(tmp_path, write_suite)
    flushed_before = collector.steps_done(run_dir, 2)
    os.kill(pids[1], signal.SIGKILL)
    started = time.monotonic()
    code, err = finish(proc)
    assert time.monotonic() - started < 30  # bounded by the grace period, not the timeout
    assert code == 1, err
    assert not any(alive(p) for p in pids)
    run = load_run(run_dir)
    assert run.status == "failed"
    assert "worker 1" in run.manifest["reason"] and "-9" in run.manifest["reason"]
    assert (run_dir / "steps.parquet").is_file() and (run_dir / "trace.json").is_file()
    assert run.steps["step"].nunique() >= flushed_before
    assert set(run.steps["rank"]) == {0, 1}
    # The partition changes made before the crash are in the manifest: the slowed worker
    # was given the smaller slice.
    history = run.manifest["partition_history"]
    assert len(history) >= 2 and history[-1]["sizes"][1] < history[-1]["sizes"][0]
    # The records of a real run keep the design's order of timestamps, and only the slowed
    # worker was stretched.
    s = run.steps
    assert ((s["begin_ns"] <= s["ready_ns"]) & (s["ready_ns"] <= s["reduced_ns"])
            & (s["reduced_ns"] <= s["end_ns"])).all()
    stretched = s.groupby("rank")["stretch_ns"].sum()
    assert stretched[0] == 0 and stretched[1] > 0


def test_ctrl_c_marks_the_run_interrupted(tmp_path: Path, write_suite) -> None:
    proc, run_dir, pids = start_long_run(tmp_path, write_suite)
    flushed_before = collector.steps_done(run_dir, 2)
    proc.send_signal(signal.SIGINT)
    code, err = finish(proc)
    assert code == 130, err
    assert "Traceback" not in err
    assert not any(alive(p) for p in pids)
    run = load_run(run_dir)
    assert run.status == "interrupted"
    assert len(run.steps) >= 2 * flushed_before
    # Every worker flushed its last steps on the way out: none is far behind the other.
    last = run.steps.groupby("rank")["step"].max()
    assert abs(last[0] - last[1]) <= 1
