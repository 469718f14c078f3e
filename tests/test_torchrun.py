"""The worker entry point joins a torchrun (env://) rendezvous: no home-made launcher."""

from __future__ import annotations

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


def test_torchrun_starts_workers_that_write_one_run_directory(tmp_path: Path,
                                                              write_suite) -> None:
    suite = write_suite(SUITE)
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
         "--nproc-per-node", "2", "-m", "harness.worker", "--suite", str(suite),
         "--run-name", "pair", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=180,
        env={**__import__("os").environ, "GLOO_SOCKET_IFNAME": "lo"},
    )
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
