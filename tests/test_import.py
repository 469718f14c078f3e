"""`hetbench import`: a job's torch.profiler traces (one per rank) as a run directory that
report, simulate and advise read; against a profiled run hetbench made itself, its idle
before the all-reduce agrees with the run's own records."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hetbench.harness.records.results import load_run
from tests.conftest import REPO, Spawn

PROFILED_DDP = REPO / "tests" / "fixtures" / "own_loop" / "profiled_ddp.py"

PROFILED_SUITE = """
[suite]
name = "profiled"

[[runs]]
name = "pair"
workload = "cnn"
dataset = "digits"
steps = 24
global_batch = 64
profile = { steps = "10-17", ranks = "all" }
workers = [ { threads = 1 }, { threads = 1, slowdown = 3.0 } ]
"""


def hetbench(spawn: Spawn, *words: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return spawn.run([sys.executable, "-m", "hetbench.harness.cli.main", *words],
                     capture_output=True, text=True, timeout=240, cwd=cwd)


def idle_by_rank(steps: object) -> np.ndarray:
    frame = steps.copy()  # type: ignore[attr-defined]
    arrival = frame.groupby("step")["ready_ns"].transform("max")
    return ((arrival - frame["ready_ns"]).groupby(frame["rank"]).mean() / 1e6).to_numpy()


@pytest.mark.slow
def test_a_profiled_hetbench_run_imported_has_the_idle_its_records_have(
        tmp_path: Path, spawn: Spawn) -> None:
    (tmp_path / "profiled.toml").write_text(PROFILED_SUITE)
    done = hetbench(spawn, "run", "profiled.toml", "--out", "out", "--no-figures",
                    cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:]
    (recorded_dir,) = list((tmp_path / "out" / "profiled").glob("pair-r0-*"))
    imported = hetbench(spawn, "import", str(recorded_dir / "profile"), "--global-batch",
                        "64", "--warmup-steps", "0", "--out", "imported", cwd=tmp_path)
    assert imported.returncode == 0, imported.stderr
    assert "imported 8 step(s) of 2 rank(s)" in imported.stdout
    assert "not in a trace: batch sizes" in imported.stderr
    (run_dir,) = list((tmp_path / "imported" / "imported").glob("profile-r0-*"))
    run = load_run(run_dir)
    assert run.status == "completed" and run.manifest["imported"]["steps"] == list(range(10, 18))
    steps = run.steps
    assert len(steps) == 16 and steps["batch_size"].tolist() == [32] * 16
    assert (steps["begin_ns"] <= steps["ready_ns"]).all()
    assert (steps["ready_ns"] <= steps["reduced_ns"]).all()
    assert (steps["reduced_ns"] <= steps["end_ns"]).all()
    recorded = load_run(recorded_dir).steps
    window = recorded[recorded["step"].between(10, 17)]
    # the fast rank waits for the slowed one in both; the traces' instants and the
    # records' are of the same moments, so the waits agree
    mine, theirs = idle_by_rank(steps), idle_by_rank(window)
    assert theirs[0] > 1.0 and theirs[1] == 0.0 and mine[1] == 0.0
    assert abs(mine[0] - theirs[0]) <= 0.1 * theirs[0], (mine, theirs)
    report = hetbench(spawn, "report", str(run_dir), "--no-figures", cwd=tmp_path)
    assert report.returncode == 0, report.stderr


@pytest.mark.slow
def test_a_job_hetbench_never_ran_is_imported_and_simulated(tmp_path: Path,
                                                            spawn: Spawn) -> None:
    traces = tmp_path / "traces"
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    done = spawn.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                      "--nnodes", "1", "--nproc-per-node", "2", str(PROFILED_DDP),
                      str(traces), "--slow-rank", "1"], capture_output=True, text=True,
                     timeout=240, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(list(traces.glob("*.pt.trace.json"))) == 2
    imported = hetbench(spawn, "import", "traces", "--global-batch", "64", "--sizes",
                        "40,24", "--out", "out", cwd=tmp_path)
    assert imported.returncode == 0, imported.stderr
    (run_dir,) = list((tmp_path / "out" / "imported").glob("traces-r0-*"))
    run = load_run(run_dir)
    # DDP's bucket shapes, recorded with record_shapes: the model's 2,372 parameters
    assert {w["parameters"] for w in run.manifest["workers"]} == {2372}
    assert run.steps.groupby("rank")["batch_size"].first().tolist() == [40, 24]
    # the slowed rank hands its gradients over last: the other one waits
    idle = idle_by_rank(run.steps)
    assert idle[0] > 1.0 and idle[1] < idle[0]
    simulated = hetbench(spawn, "simulate", str(run_dir), "--mix", "rank0:2,rank1:2",
                         "--scheme", "bsp", "--out", "sim", "--no-figures", cwd=tmp_path)
    assert simulated.returncode == 0, simulated.stderr
    advised = hetbench(spawn, "advise", str(run_dir), "--out", "advice", "--no-figures",
                       cwd=tmp_path)
    assert advised.returncode == 0, advised.stderr
    assert "an imported job: no suite" in advised.stdout
    assert not (tmp_path / "advice" / "advised.toml").exists()


def trace(rank: int, world: int = 2, **more: object) -> dict[str, object]:
    return {"distributedInfo": {"rank": rank, "world_size": world, "backend": "gloo"},
            "traceEvents": [], **more}


@pytest.mark.parametrize(("files", "words", "message"), [
    ({}, [], "traces: holds no trace"),
    ({"a.json": "{"}, [], "a.json: not a readable trace"),
    ({"a.json": json.dumps({"traceEvents": []})}, [], "a.json: no distributedInfo"),
    ({"a.json": json.dumps(trace(0))}, [], "traces of ranks [0], world size [2]: one "
                                          "trace per rank"),
    ({"a.json": json.dumps(trace(0)), "b.json": json.dumps(trace(1))}, [],
     "no profiled step (ProfilerStep#N) with an all-reduce on every rank"),
    ({"a.json": json.dumps(trace(0)), "b.json": json.dumps(trace(1))},
     ["--sizes", "40,20"], "--sizes: '40,20': 2 slices of at least 1 adding up to "
                           "--global-batch 64"),
    ({"a.json": json.dumps(trace(0)), "b.json": json.dumps(trace(1))},
     ["--device", "tpu"], "--device: 'tpu': allowed: cpu, cuda"),
])
def test_traces_that_cannot_be_imported_are_refused_in_one_line(
        tmp_path: Path, spawn: Spawn, files: dict[str, str], words: list[str],
        message: str) -> None:
    folder = tmp_path / "traces"
    folder.mkdir()
    for name, text in files.items():
        (folder / name).write_text(text)
    done = hetbench(spawn, "import", "traces", "--global-batch", "64", *words, cwd=tmp_path)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert not (tmp_path / "results").exists()
