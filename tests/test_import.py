"""`hetbench import`: a job's torch.profiler traces (one per rank) as a run directory that
report, simulate and advise read; against a profiled run hetbench made itself, its idle
before the all-reduce agrees with the run's own records."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hetbench.harness.records import kineto
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
    assert sorted(set(steps["step"])) == list(range(10, 18))  # the records' numbers too
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


def trace(rank: int, world: object = 2, **more: object) -> dict[str, object]:
    return {"distributedInfo": {"rank": rank, "world_size": world, "backend": "gloo"},
            "traceEvents": [], **more}


def pair(event: dict[str, object]) -> dict[str, str]:
    """Two ranks' traces, rank 0's holding `event`."""
    return {"a.json": json.dumps(trace(0, traceEvents=[event])), "b.json": json.dumps(trace(1))}


def step_event(number: int, ts: float, dur: float) -> dict[str, object]:
    return {"ph": "X", "name": f"ProfilerStep#{number}", "ts": ts, "dur": dur, "tid": 1}


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
    # damaged fields: each was an internal error (KeyError, ValueError, OverflowError)
    *[(pair(event), [], message) for event, message in [
        ({"ph": "X", "name": "x", "dur": 1}, "a.json: traceEvents[0].ts: None: microseconds"),
        ({"ph": "X", "name": "x", "ts": "abc", "dur": 1}, "traceEvents[0].ts: 'abc'"),
        ({"ph": "X", "name": "x", "ts": float("nan"), "dur": 1}, "traceEvents[0].ts: nan"),
        ({"ph": "X", "name": "x", "ts": 1e16, "dur": 1}, "traceEvents[0].ts: 1e+16"),
        ({"ph": "X", "name": "x", "ts": 5, "dur": float("inf")}, "traceEvents[0].dur: inf"),
        # a collective of negative length (was accepted, its phase printed negative)
        ({"ph": "X", "name": "gloo:all_reduce", "ts": 5, "dur": -3},
         "traceEvents[0].dur: -3: microseconds, a finite number from 0"),
    ]],
    ({"a.json": json.dumps(trace(0, world="two")), "b.json": json.dumps(trace(1))}, [],
     "a.json: distributedInfo.world_size: 'two': a whole number of ranks"),
    ({"a.json": "[" * 100_000 + "]" * 100_000}, [], "a.json: not a readable trace (JSON "
                                                    "nested too deep)"),
    # steps going back in time (were accepted: samples/s from negative times)
    ({"a.json": json.dumps(trace(0, traceEvents=[step_event(1, 100, 50),
                                                 step_event(2, 120, 50)])),
      "b.json": json.dumps(trace(1))}, [],
     "a.json: ProfilerStep#2: begins 30 us before ProfilerStep#1 ends"),
    ({"a.json": json.dumps(trace(0)), "b.json": json.dumps(trace(1))},
     ["--global-batch", str(10 ** 20)],
     "--global-batch: 100000000000000000000 is outside 1..2147483647"),
])
def test_traces_that_cannot_be_imported_are_refused_in_one_line(
        tmp_path: Path, spawn: Spawn, files: dict[str, str], words: list[str],
        message: str) -> None:
    folder = tmp_path / "traces"
    folder.mkdir()
    for name, text in files.items():
        (folder / name).write_text(text)
    done = hetbench(spawn, "import", "traces", *(words if "--global-batch" in words else
                                                 ["--global-batch", "64", *words]),
                    cwd=tmp_path)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "results").exists()


@pytest.mark.timeout(60)  # a FIFO was opened and read: it blocked for ever
def test_only_regular_files_are_read_as_traces(tmp_path: Path, spawn: Spawn) -> None:
    folder = tmp_path / "traces"
    folder.mkdir()
    os.mkfifo(folder / "rank0.json")
    done = hetbench(spawn, "import", "traces", "--global-batch", "64", cwd=tmp_path)
    assert done.returncode == 2
    assert "rank0.json: not a regular file" in done.stderr, done.stderr


def test_a_trace_unpacking_beyond_the_cap_is_refused_before_it_is_parsed(
        tmp_path: Path, spawn: Spawn) -> None:
    folder = tmp_path / "traces"
    folder.mkdir()
    # 4 MB of zeros in a few kilobytes: a bomb in small (the campaign's unpacked to 4 GB)
    with gzip.open(folder / "rank0.json.gz", "wb") as f:
        f.write(b"0" * 4_000_000)
    assert (folder / "rank0.json.gz").stat().st_size < 50_000
    done = spawn.run([sys.executable, "-m", "hetbench.harness.cli.main", "import", "traces",
                      "--global-batch", "64"], capture_output=True, text=True, timeout=120,
                     cwd=tmp_path, env={**os.environ, kineto.MAX_BYTES_VARIABLE: "1000000"})
    assert done.returncode == 2
    assert "rank0.json.gz: more than 1000000 bytes unpacked" in done.stderr, done.stderr


def test_damaged_optional_fields_leave_the_elements_unsaid(tmp_path: Path) -> None:
    path = tmp_path / "rank0.json"
    events = [{"ph": "X", "name": kineto.ENQUEUE, "ts": 10, "dur": 1, "args": ["x"]},
              {"ph": "X", "name": kineto.ENQUEUE, "ts": 20, "dur": 1,
               "args": {"Input Dims": [["a", "b"]]}},
              {"ph": "X", "name": kineto.ENQUEUE, "ts": 30, "dur": 1,
               "args": {"Input Dims": [[[3, 4]]]}}]
    path.write_text(json.dumps(trace(0, traceEvents=events)))
    assert kineto.read_trace(path).exchanged == [(10_000, 0), (20_000, 0), (30_000, 12)]


def many_steps(rank: int, steps: int) -> kineto.RankTrace:
    """A rank's profiled steps of 1 ms, each with a backward, an all-reduce call and its
    collective (what kineto reads of a step)."""
    events = []
    for n in range(steps):
        t = n * 1000 + 10  # us
        events += [(f"ProfilerStep#{n + 7}", "1", t * 1000, (t + 900) * 1000),
                   (kineto.BACKWARD_PREFIX + ": x", "1", (t + 300) * 1000, (t + 400) * 1000),
                   (kineto.ENQUEUE, "1", (t + 500) * 1000, (t + 510) * 1000),
                   ("gloo:all_reduce", "2", (t + 505) * 1000, (t + 700) * 1000)]
    return kineto.RankTrace(rank, 2, "gloo", "h", Path(f"rank{rank}.json"), events, [])


def test_many_profiled_steps_are_imported_in_order() -> None:
    # (the steps were found by a scan of every event per step: 5,000 steps took 80 s)
    rows, partial, numbers = kineto.records([many_steps(0, 5000), many_steps(1, 5000)],
                                            (32, 32))
    assert partial == [] and numbers == list(range(7, 5007))
    assert rows["step"][:5000].tolist() == list(range(7, 5007))  # the profiler's numbers
    first = rows[0]
    assert (first["ready_ns"] - first["begin_ns"], first["reduced_ns"] - first["ready_ns"]) \
        == (500_000, 200_000)
    assert first["backward_ns"] == 200_000 and first["apply_ns"] == 200_000


def as_json(rank_trace: kineto.RankTrace) -> str:
    """A RankTrace's events written back as a trace file (complete events, microseconds)."""
    events = [{"ph": "X", "name": name, "tid": tid, "ts": begin / 1000,
               "dur": (end - begin) / 1000} for name, tid, begin, end in rank_trace.events]
    return json.dumps(trace(rank_trace.rank, traceEvents=events))


def test_an_import_keeps_the_profilers_step_numbers_and_warms_up_on_the_first(
        tmp_path: Path, spawn: Spawn) -> None:
    traces = tmp_path / "traces"
    traces.mkdir()
    for rank in (0, 1):
        (traces / f"rank{rank}.json").write_text(as_json(many_steps(rank, 6)))
    done = hetbench(spawn, "import", "traces", "--global-batch", "64", "--warmup-steps", "2",
                    "--out", "out", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    (run_dir,) = (tmp_path / "out" / "imported").glob("traces-r0-*")
    run = load_run(run_dir)
    assert run.manifest["imported"]["steps"] == list(range(7, 13))
    steps = run.steps  # ProfilerStep#7 to #12 were numbered 0 to 5 while the manifest kept 7-12
    assert sorted(set(steps["step"])) == list(range(7, 13))
    warm = steps[steps["warmup"]]
    assert sorted(set(warm["step"])) == [7, 8] and len(warm) == 4
