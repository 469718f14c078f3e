"""Interference by other processes, named (issue 16): while a real two-worker run trains, the
test starts three CPU-bound processes outside the run for a second. The launcher's samples of
the host (system.parquet) show them, joined to the steps, and the straggler steps they
delayed are attributed to interference, not to the workers' own preemption."""

from __future__ import annotations

import select
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import psutil
import pytest

from hetbench.analysis.measures.stragglers import attribute
from hetbench.harness.records import collector
from hetbench.harness.records.results import load_run
from hetbench.harness.system import sampler as system
from tests.conftest import REPO, Spawn, hetbench_command

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not Path("/proc/stat").exists(), reason="reads Linux's /proc")]

SUITE = REPO / "benchmarks" / "interference.toml"
# says when it spins: the window starts there, not at the interpreter's start, which on a
# loaded host takes a share of the window (0.33 of a core seen once against the 0.4 wanted)
HOG = ("import time\nprint('spinning', flush=True)\nend = time.monotonic() + 30\n"
       "while time.monotonic() < end:\n    pass\n")
HOG_S = 1.0
# three, not two: with two the sampler saw them at 0.1-0.9 of a core from one 100 ms bin to
# the next, and in a full test run a step whose bin fell under the analysis's threshold
# (INTERFERENCE_CORES) had its delay put on preemption instead (the last check below failed
# so once: 11.7 ms of interference against 26.0 of the workers' own causes)
HOGS = 3


def hogs_cpu_s(hogs: list[subprocess.Popen[bytes]]) -> float:
    """The CPU time the processes have had so far (user + system), as psutil reads it."""
    return sum(sum(psutil.Process(h.pid).cpu_times()[:2]) for h in hogs)


def test_processes_outside_the_run_are_seen_and_named_as_interference(tmp_path: Path,
                                                                       spawn: Spawn) -> None:
    run = spawn(hetbench_command("run", str(SUITE), "--out", str(tmp_path / "out"),
                                 "--no-progress"),
                cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    hogs: list[subprocess.Popen[bytes]] = []
    try:
        deadline = time.monotonic() + 90
        while not (dirs := list((tmp_path / "out" / "host").glob("pair-*"))) \
                or collector.steps_done(dirs[0], 2) < 150:
            assert run.poll() is None and time.monotonic() < deadline, run.communicate()
            time.sleep(0.05)
        hogs = [spawn([sys.executable, "-c", HOG], stdout=subprocess.PIPE)
                for _ in range(HOGS)]
        for hog in hogs:  # each says so within 30 s
            assert hog.stdout is not None and select.select([hog.stdout], [], [], 30)[0]
            assert hog.stdout.readline() == b"spinning\n"
        started = time.perf_counter_ns()
        spun = -hogs_cpu_s(hogs)
        time.sleep(HOG_S)
        spun += hogs_cpu_s(hogs)
        given = spun / ((time.perf_counter_ns() - started) / 1e9)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
        stopped = time.perf_counter_ns()
        out, err = run.communicate(timeout=180)
    assert run.returncode == 0, err
    data = load_run(dirs[0])
    samples = pd.read_parquet(dirs[0] / system.SYSTEM_FILE)
    assert list(samples.columns) == list(system.COLUMNS)
    assert samples["t_ns"].is_monotonic_increasing and len(samples) >= 10
    during = samples[(samples["t_ns"] > started + 2e8) & (samples["t_ns"] < stopped)]
    before = samples[samples["t_ns"] < started]
    assert len(during) >= 4
    # processes spinning beside two workers on the host's cores: their share is busy
    # outside the run, on top of whatever else ran here before. Two of them would fairly get
    # about one core of two, but in two full test runs the sampler saw 0.32-0.33 (its samples
    # 0.1 to 0.9) where the test alone always saw more: what the kernel gave them is read
    # apart from the sampler (psutil), the sampler held to it, and they must have got enough
    # to matter (the next failure says which of the two fell short)
    assert given > 0.2, f"the spinning processes got {given:.2f} of a core: nothing to see"
    usual = before["others_cores"].median()
    # outside the run: more than before, and at least most of what they got. (Not most of
    # it *more* than before: where other processes already held the cores, the spinning
    # ones took part of their share, and outside load rose only 0.15 core of 0.87 given.)
    seen = during["others_cores"].mean()
    assert seen > max(usual, 0.6 * given), (given, usual, during.to_string())
    assert samples["run_cores"].median() > 0.5  # the workers' own time is the run's
    # joined to the steps: those computed while the hogs ran saw them
    steps = data.steps
    hit = steps[(steps["begin_ns"] > started + 2e8) & (steps["ready_ns"] < stopped)]
    assert len(hit) and hit["others_cores"].mean() > max(usual, 0.6 * given)
    # and the delays they caused are interference
    causes = attribute(steps, manifest=data.manifest).set_index("step")
    window = causes.loc[causes.index.isin(hit["step"])]
    assert (window["cause"] == "interference").sum() >= 1
    own = window[["preempted_ms", "blocked_ms", "off_cpu_ms", "on_cpu_ms"]].sum().sum()
    assert window["interference_ms"].sum() > own
    # the kernel's counts name it: at least 60% of the excess of the steps it delayed (the
    # rest their noise and their own causes)
    assert window["interference_ms"].sum() >= 0.6 * window["excess_ms"].sum(), \
        window.to_string()


# A worker that starts, every 0.15 s, a child that spins 0.12 s of CPU and reaps it (as a
# DataLoader's processes are shut down at each repartition): most of each child's life falls
# between two samples
SHORT_LIVED = """
import multiprocessing, time
def spin():
    end = time.process_time() + 0.12
    while time.process_time() < end:
        pass
if __name__ == "__main__":
    fork = multiprocessing.get_context("fork")
    for _ in range(15):
        child = fork.Process(target=spin)
        child.start()
        child.join()
        time.sleep(0.03)
"""


def test_children_that_end_between_samples_count_as_the_runs(spawn: Spawn) -> None:
    """Their CPU time is the run's, not "others": read from the parent's reaped children
    once they are gone (before, 0.43 cores of 0.84 went to others here)."""
    worker = spawn([sys.executable, "-c", SHORT_LIVED])
    sampling = system.Sampler(lambda: [worker.pid]).start()
    try:
        worker.wait(timeout=60)
    finally:
        samples = sampling.stop()
    assert worker.returncode == 0
    spun_s = 15 * 0.12  # the children's CPU time, at least
    t_s = samples[:, system.COLUMNS.index("t_ns")] / 1e9
    intervals_s = np.diff(t_s, prepend=t_s[0] - system.INTERVAL_S)
    counted_s = float(samples[:, system.COLUMNS.index("run_cores")] @ intervals_s)
    assert counted_s >= 0.8 * spun_s, (counted_s, samples[:, 2:4].round(2).tolist())
