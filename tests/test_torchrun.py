"""The worker entry point joins a torchrun (env://) rendezvous: no home-made launcher."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from harness.results import load_run
from tests.conftest import REPO

pytestmark = pytest.mark.slow

SUITE = """
[suite]
name = "multinode"

[[runs]]
name = "pair"
steps = 12
global_batch = 32
partition = { policy = "sizes", sizes = [8, 24] }
workers = [ { device = "cpu" }, { device = "cpu", slowdown = 2.0 } ]
"""


# Worker 1 stalls from step 6 (a 2000x slowdown); worker 0's all-reduce times out after 2 s.
STALLING_SUITE = SUITE.replace("steps = 12", "steps = 12\ntimeout_s = 2").replace(
    '{ device = "cpu", slowdown = 2.0 }',
    '{ device = "cpu", slowdown_at = [[5, 1.0], [6, 2000.0]] }')


def torchrun(suite: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
         "--nproc-per-node", "2", "-m", "harness.worker", "--suite", str(suite),
         "--run-name", "pair", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=180,
        env={**os.environ, "GLOO_SOCKET_IFNAME": "lo"},
    )


def test_torchrun_starts_workers_that_write_one_run_directory(tmp_path: Path,
                                                              write_suite) -> None:
    suite = write_suite(SUITE)
    out = tmp_path / "out"
    done = torchrun(suite, out)
    assert done.returncode == 0, done.stderr[-3000:]
    (run_dir,) = list((out / "multinode").glob("pair-r0-*"))
    run = load_run(run_dir)
    assert run.status == "completed"
    assert run.manifest["clock"]["same_host"] is True
    assert sorted(run.steps["rank"].unique()) == [0, 1]
    assert run.steps.groupby("rank")["batch_size"].first().tolist() == [8, 24]
    assert len(run.steps) == 24
    params = np.load(run_dir / "params.npz")
    assert params["fc1.weight"].dtype == np.float32


def test_a_failed_torchrun_job_is_marked_failed_with_its_steps(tmp_path: Path,
                                                               write_suite) -> None:
    """No hetbench launcher watches a torchrun job: rank 0 closes the run directory."""
    out = tmp_path / "out"
    done = torchrun(write_suite(STALLING_SUITE), out)
    assert done.returncode != 0
    (run_dir,) = list((out / "multinode").glob("pair-r0-*"))
    run = load_run(run_dir)
    assert run.status == "failed"
    assert run.manifest["reason"].startswith("worker 0: ")
    assert (run_dir / "steps.parquet").is_file()
    assert set(run.steps.loc[run.steps["rank"] == 0, "step"]) >= set(range(6))
