"""Nothing is lost (DESIGN.md principle 6): a worker that dies or a Ctrl-C ends the run
within a bounded time, leaves no process behind, and every flushed step stays readable."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from hetbench.harness.records import collector
from hetbench.harness.records.results import load_run
from tests.conftest import REPO, Spawn, hetbench_command

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


STOPPED = """
[suite]
name = "faults"

[[runs]]
name = "long"
framework = "{framework}"
steps = {steps}
global_batch = 64
timeout_s = {timeout}
aggregator = {aggregator}
workers = [ {{ device = "cpu" }}, {{ device = "cpu" }} ]
"""


def stopped_suite(framework: str, aggregator: str, timeout: int) -> str:
    """STOPPED for a framework's aggregator. Its steps outlast every wait below on any
    host: 100,000, but for tensorflow-ps, whose batch table (steps x workers rows, a graph
    constant shipped to every worker) took 18 s more to start at 100,000 (102 MB): 3,000,
    over a minute for its lone worker, the slowest to be stopped. (On a quiet host a
    tensorflow-collective run of 3,000 steps completed before the test killed its
    launcher.)"""
    steps = 3000 if "tensorflow-ps" in aggregator else 100_000
    return STOPPED.format(framework=framework, aggregator=aggregator, timeout=timeout,
                          steps=steps)



def start_long_run(spawn: Spawn, tmp_path: Path, write_suite, text: str = LONG_RUN,
                   **popen: Any) -> tuple[subprocess.Popen[str], Path, list[int]]:
    """`hetbench run` of a suite `faults` with a run `long` of two workers, once it has
    flushed 40 steps."""
    suite = write_suite(text)
    proc = spawn(hetbench_command("run", str(suite), "--out", str(tmp_path / "out"),
                                  "--no-progress"),
                 cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        runs = list((tmp_path / "out" / "faults").glob("long-*"))
        if runs and collector.steps_done(runs[0], 2) >= 40:
            pids = [json.loads((runs[0] / "parts" / f"rank{r}.json").read_text())["pid"]
                    for r in range(2)]
            return proc, runs[0], pids
        if proc.poll() is not None:  # ended before 40 steps: say why, and what it printed
            out, err = proc.communicate()
            why = [json.loads((r / "manifest.json").read_text()).get("reason") for r in runs]
            pytest.fail(f"the run ended before 40 steps (exit {proc.returncode}; reason "
                        f"{why}; logs {[str(r / 'logs') for r in runs]}):\n{out[-3000:]}"
                        f"\n{err[-2000:]}")
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


def test_dead_worker_fails_the_run_and_keeps_flushed_steps(tmp_path: Path, write_suite,
                                                          spawn: Spawn) -> None:
    proc, run_dir, pids = start_long_run(spawn, tmp_path, write_suite)
    flushed_before = collector.steps_done(run_dir, 2)
    os.kill(pids[1], signal.SIGKILL)
    started = time.monotonic()
    code, err = finish(proc)
    assert time.monotonic() - started < 30  # bounded by the grace period, not the timeout
    assert code == 1, err
    assert not any(alive(p) for p in pids)
    run = load_run(run_dir)
    assert run.status == "failed"
    assert run.manifest["reason"] == "worker 1 killed by SIGKILL"
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


@pytest.mark.parametrize("presses", [1, 4])
def test_ctrl_c_marks_the_run_interrupted(tmp_path: Path, write_suite, spawn: Spawn,
                                          presses: int) -> None:
    """Pressed again (impatient) while the workers are being stopped, Ctrl-C does not cut
    the closing short."""
    proc, run_dir, pids = start_long_run(spawn, tmp_path, write_suite)
    flushed_before = collector.steps_done(run_dir, 2)
    proc.send_signal(signal.SIGINT)
    for _ in range(presses - 1):
        time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
    code, err = finish(proc)
    assert code == 130, err
    assert "Traceback" not in err
    assert not any(alive(p) for p in pids)
    run = load_run(run_dir)
    assert run.status == "interrupted"
    assert (run_dir / "steps.parquet").is_file()
    assert len(run.steps) >= 2 * flushed_before
    # Every worker flushed its last steps on the way out: none is far behind the other.
    last = run.steps.groupby("rank")["step"].max()
    assert abs(last[0] - last[1]) <= 1


# -- signals to the launcher (issue 18: runs never stay `running`) ---------------------------


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT],
                         ids=["SIGTERM", "SIGHUP", "SIGQUIT"])
def test_a_terminating_signal_ends_the_run_like_ctrl_c(tmp_path: Path, write_suite,
                                                       spawn: Spawn, sig: int) -> None:
    """SIGTERM: what `timeout`, `kill` and CI cancellation send; SIGHUP: a terminal that
    closes; SIGQUIT: Ctrl-backslash. Each by default ends Python at once, the run left
    `running` with its records only in parts. The launcher starts with the signal at its
    default, as under a terminal: a test run under `nohup` would hand SIGHUP down ignored,
    and a launcher honours what it inherited ignored (as `nohup hetbench run` asks)."""
    proc, run_dir, pids = start_long_run(spawn, tmp_path, write_suite,
                                         preexec_fn=_defaulting(sig))
    flushed_before = collector.steps_done(run_dir, 2)
    proc.send_signal(sig)
    started = time.monotonic()
    code, err = finish(proc)
    assert time.monotonic() - started < 15
    name = signal.Signals(sig).name
    assert code == 128 + sig, err
    assert f"interrupted by {name}" in err and "Traceback" not in err
    assert not any(alive(p) for p in pids)
    run = load_run(run_dir)
    assert (run.status, run.manifest["reason"]) == ("interrupted", f"interrupted by {name}")
    assert (run_dir / "steps.parquet").is_file()
    assert run.steps["step"].nunique() >= flushed_before


def _defaulting(number: int) -> Callable[[], None]:
    """A child that starts with this signal at its default, whatever its parent ignores."""

    def default() -> None:
        signal.signal(number, signal.SIG_DFL)

    return default


def _ignoring(*numbers: int) -> Callable[[], None]:
    """What a parent leaves a child: these signals ignored (exec keeps SIG_IGN)."""

    def ignore() -> None:
        for number in numbers:
            signal.signal(number, signal.SIG_IGN)

    return ignore


def test_ctrl_c_stops_a_launcher_that_inherited_it_ignored(tmp_path: Path, write_suite,
                                                           spawn: Spawn) -> None:
    """A background job of a non-interactive shell (`bash -c 'hetbench run ... &'`, some CI
    runners) starts with SIGINT ignored; Python then installs no handler of its own."""
    proc, run_dir, pids = start_long_run(spawn, tmp_path, write_suite,
                                         preexec_fn=_ignoring(signal.SIGINT))
    proc.send_signal(signal.SIGINT)
    code, err = finish(proc)
    assert code == 130, err
    assert not any(alive(p) for p in pids)
    run = load_run(run_dir)
    assert (run.status, run.manifest["reason"]) == ("interrupted",
                                                    "interrupted by the user (Ctrl-C)")


def test_under_nohup_a_hangup_leaves_the_run_going(tmp_path: Path, write_suite,
                                                   spawn: Spawn) -> None:
    """nohup ignores SIGHUP so that a run outlives its terminal: hetbench keeps it ignored
    (and a SIGTERM still closes the run)."""
    proc, run_dir, pids = start_long_run(spawn, tmp_path, write_suite,
                                         preexec_fn=_ignoring(signal.SIGHUP))
    proc.send_signal(signal.SIGHUP)
    before = collector.steps_done(run_dir, 2)
    deadline = time.monotonic() + 30
    while collector.steps_done(run_dir, 2) < before + 20 and time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    assert collector.steps_done(run_dir, 2) >= before + 20  # still training
    proc.send_signal(signal.SIGTERM)
    code, err = finish(proc)
    assert code == 128 + signal.SIGTERM, err
    assert load_run(run_dir).manifest["reason"] == "interrupted by SIGTERM"


def hetbench_once(spawn: Spawn, *args: str) -> subprocess.CompletedProcess[str]:
    return spawn.run(hetbench_command(*args), cwd=REPO, capture_output=True, text=True,
                     timeout=120)


@pytest.mark.parametrize(("framework", "aggregator"), [
    ("pytorch", None),
    pytest.param("mxnet", '"mxnet-kvstore"', marks=[pytest.mark.long, pytest.mark.skipif(
        not importlib.util.find_spec("mxnet"), reason="MXNet not installed")]),
    pytest.param("tensorflow", '"tensorflow-collective"', marks=[
        pytest.mark.long, pytest.mark.skipif(not importlib.util.find_spec("tensorflow"),
                                             reason="TensorFlow not installed")]),
])
def test_a_killed_launcher_leaves_a_run_that_recover_closes(
        tmp_path: Path, write_suite, spawn: Spawn, framework: str,
        aggregator: str | None) -> None:
    """SIGKILL cannot be caught: the workers die with the launcher (they are told to at
    start; TensorFlow's and MXNet's, blocked waiting for a peer, stayed for good until a
    watcher ended them), the manifest still says running, and `hetbench recover` closes
    the run as failed from the parts, every flushed row kept, and removes the run's
    temporary folder."""
    from hetbench.harness.system.orphans import LAUNCHER_GONE_GRACE_S

    text = LONG_RUN if aggregator is None else stopped_suite(framework, aggregator, 30)
    proc, run_dir, pids = start_long_run(spawn, tmp_path, write_suite, text)
    proc.kill()
    proc.communicate(timeout=30)
    deadline = time.monotonic() + LAUNCHER_GONE_GRACE_S + 15
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(p) for p in pids), "a worker outlived its launcher"
    meta = json.loads((run_dir / "manifest.json").read_text())
    assert meta["status"] == "running"
    assert Path(meta["tmp"]).is_dir()  # the launcher could not remove it
    flushed = sum(len(a) for a in collector.read_parts(run_dir))

    result = hetbench_once(spawn, "recover", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    assert f"{run_dir}: closed as failed ({flushed} step records kept)" in result.stdout
    assert not Path(meta["tmp"]).exists()
    run = load_run(run_dir)
    assert run.status == "failed"
    assert "launcher" in run.manifest["reason"] and "hetbench recover" in run.manifest["reason"]
    assert len(run.steps) == flushed and (run_dir / "steps.parquet").is_file()
    again = hetbench_once(spawn, "recover", str(run_dir))
    assert (again.returncode, again.stdout.strip()) == (0, "no run says running: nothing to "
                                                           "recover")


def test_recover_leaves_a_live_run_alone(tmp_path: Path, write_suite, spawn: Spawn) -> None:
    proc, run_dir, pids = start_long_run(spawn, tmp_path, write_suite)
    try:
        result = hetbench_once(spawn, "recover", str(run_dir))
        assert result.returncode == 1
        assert f"{run_dir}: still running: its launcher (pid {proc.pid}) lives" in result.stderr
        assert json.loads((run_dir / "manifest.json").read_text())["status"] == "running"
    finally:
        proc.send_signal(signal.SIGINT)
        finish(proc)
    assert load_run(run_dir).status == "interrupted"


# -- a stopped worker, under each aggregator (issue 18: every wait has its timeout) ----------

def _installed(framework: str) -> bool:
    return importlib.util.find_spec(framework) is not None


@pytest.mark.parametrize(("framework", "aggregator", "timeout"), [
    ("pytorch", '"torch"', 5),
    ("pytorch", '{ name = "ps-sync" }', 5),
    ("pytorch", '{ name = "ssp", staleness = 1 }', 5),
    ("pytorch", '{ name = "local-sgd", local_steps = 2 }', 5),
    pytest.param("mxnet", '"mxnet-kvstore"', 10, marks=[pytest.mark.long, pytest.mark.skipif(
        not _installed("mxnet"), reason="MXNet not installed")]),
    pytest.param("tensorflow", '"tensorflow-collective"', 10, marks=[
        pytest.mark.long, pytest.mark.skipif(not _installed("tensorflow"),
                                             reason="TensorFlow not installed")]),
    pytest.param("tensorflow", '"tensorflow-ps"', 10, marks=[
        pytest.mark.long, pytest.mark.skipif(not _installed("tensorflow"),
                                             reason="TensorFlow not installed")]),
])
def test_a_stopped_worker_ends_the_run_within_its_timeout_and_is_named(
        tmp_path: Path, write_suite, spawn: Spawn, framework: str, aggregator: str,
        timeout: int) -> None:
    """SIGSTOP: the peers wait for it, time out, and the reason names the stopped worker,
    not them; MXNet's ps-lite has no timeout of its own, the launcher's watch bounds it."""
    proc, run_dir, pids = start_long_run(spawn, tmp_path, write_suite,
                                         stopped_suite(framework, aggregator, timeout))
    flushed_before = collector.steps_done(run_dir, 2)
    os.kill(pids[1], signal.SIGSTOP)
    stopped_at = time.time()
    code, err = finish(proc)
    assert code == 1, err
    assert not any(alive(p) for p in pids)
    run = load_run(run_dir)
    # the run's end as its manifest records it (after it, `hetbench run` draws figures)
    took = datetime.fromisoformat(run.manifest["end"]).timestamp() - stopped_at
    print(f"\n{aggregator}, timeout_s = {timeout}: run ended {took:.1f} s after the SIGSTOP")
    assert took < timeout + 15, f"{took:.0f} s to end the run"
    assert run.status == "failed"
    assert "worker 1 was stopped" in run.manifest["reason"], run.manifest["reason"]
    assert run.steps["step"].nunique() >= flushed_before


# -- a full disk --------------------------------------------------------------------------

FULL_DISK = """
[suite]
name = "full"

[[runs]]
name = "long"
steps = 100000
global_batch = 64
timeout_s = 20
workers = [ { device = "cpu" }, { device = "cpu" } ]
"""

# Inside a user and mount namespace of its own (no root needed where the kernel allows
# them): a 1 MiB tmpfs as --out, the run, then what the test checks, written outside, as
# the tmpfs goes with the namespace.
IN_NAMESPACE = """
set -e
mount -t tmpfs -o size=1m hetbench-full "$DISK"
set +e
timeout 300 {python} -m hetbench.harness.cli.main run "$SUITE" --out "$DISK/out" --no-progress \
    > "$FACTS/stdout" 2> "$FACTS/stderr"
echo $? > "$FACTS/code"
{python} - "$DISK/out" "$FACTS/facts.json" <<'PY'
import json, sys
from pathlib import Path
from hetbench.harness.records import collector
from hetbench.harness.records.results import load_run
(run_dir,) = Path(sys.argv[1]).glob("full/long-*")
run = load_run(run_dir)
flushed = sum(len(a) for a in collector.read_parts(run_dir))
Path(sys.argv[2]).write_text(json.dumps({
    "status": run.status, "reason": run.manifest["reason"], "rows": len(run.steps),
    "flushed": flushed, "temporary": [p.name for p in run_dir.glob(".*.tmp")]}))
PY
"""


def test_a_full_disk_fails_the_run_naming_what_could_not_be_written(tmp_path: Path,
                                                                   write_suite,
                                                                   spawn: Spawn) -> None:
    probe = spawn.run(["unshare", "-rm", "sh", "-c",
                       f"mount -t tmpfs -o size=64k probe {tmp_path}"],
                      capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (unshare -rm: {probe.stderr.strip()})")
    disk, facts = tmp_path / "disk", tmp_path / "facts"
    disk.mkdir()
    facts.mkdir()
    env = {**os.environ, "DISK": str(disk), "FACTS": str(facts),
           "SUITE": str(write_suite(FULL_DISK))}
    script = IN_NAMESPACE.replace("{python}", sys.executable)
    started = time.monotonic()
    spawn.run(["unshare", "-rm", "sh", "-c", script], cwd=REPO, env=env, timeout=330,
              check=True)
    assert time.monotonic() - started < 120
    code = int((facts / "code").read_text())
    stderr = (facts / "stderr").read_text()
    assert code == 1, stderr
    assert "Traceback" not in stderr
    got = json.loads((facts / "facts.json").read_text())
    assert got["status"] == "failed"
    assert "No space left on device" in got["reason"] or "no space left" in got["reason"]
    assert str(disk) in got["reason"]  # names where
    assert got["temporary"] == []  # the half-written files and the reserve are gone
    assert got["rows"] == got["flushed"] > 0  # every flushed row readable


@contextmanager
def unwritable(folder: Path, spawn: Spawn) -> Iterator[None]:
    """`folder` and everything in it made unwritable while the block runs: immutable for
    root (whom permissions do not stop), read-only for others; writable again after."""
    if os.geteuid() == 0:
        made = spawn.run(["chattr", "-R", "+i", str(folder)], capture_output=True, text=True,
                         timeout=30)
        if made.returncode != 0:
            spawn.run(["chattr", "-R", "-i", str(folder)], timeout=30)
            pytest.skip(f"cannot make a folder immutable here: {made.stderr.strip()}")
        try:
            yield
        finally:
            spawn.run(["chattr", "-R", "-i", str(folder)], timeout=30, check=True)
        return
    paths = [folder, *folder.rglob("*")]
    for path in paths:
        path.chmod(path.stat().st_mode & ~0o222)
    try:
        yield
    finally:
        for path in paths:
            path.chmod(path.stat().st_mode | 0o200)


def test_an_output_folder_made_unwritable_stops_the_run_and_says_how_to_close_it(
        tmp_path: Path, write_suite, spawn: Spawn) -> None:
    """It exited 2 naming `.reserve.tmp`, and nothing said how to close the run."""
    proc, run_dir, pids = start_long_run(spawn, tmp_path, write_suite)
    with unwritable(tmp_path / "out", spawn):
        code, err = finish(proc)
        deadline = time.monotonic() + 15
        while any(alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(alive(p) for p in pids), "a worker outlived the run"
    assert code == 1, err
    assert "Traceback" not in err
    line = err.splitlines()[-1]
    assert line.startswith(f"hetbench: error: {run_dir}: the run could not be closed (writing "
                           "manifest.json: ")
    assert line.endswith("); its workers are stopped and its flushed records stay in parts/: "
                         f"once the folder is writable, close it with `hetbench recover "
                         f"{run_dir}`")
    assert json.loads((run_dir / "manifest.json").read_text())["status"] == "running"
    flushed = sum(len(a) for a in collector.read_parts(run_dir))
    assert flushed > 0
    result = hetbench_once(spawn, "recover", str(run_dir))  # as the line says
    assert result.returncode == 0, result.stderr
    assert f"{run_dir}: closed as failed ({flushed} step records kept)" in result.stdout


def test_a_worker_that_aborts_is_named_with_its_last_words(tmp_path: Path) -> None:
    from hetbench.harness.run.launcher import _worker_reason

    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "rank2.log").write_text(
        "UserWarning: something earlier\nterminate called without an active exception\n\n")
    assert _worker_reason(tmp_path, 2, -signal.SIGABRT) == (
        "worker 2 killed by SIGABRT (terminate called without an active exception)")
    # a signal sent from outside says nothing of the worker's log
    assert _worker_reason(tmp_path, 2, -signal.SIGKILL) == "worker 2 killed by SIGKILL"


def test_a_hetbench_process_ends_with_its_status_and_output_but_no_teardown(
        spawn: Spawn) -> None:
    # the teardown is where native threads abort a finished worker (harness/system/exits.py)
    program = ("import atexit, sys\n"
               "from hetbench.harness.system.exits import exit_skipping_teardown\n"
               "atexit.register(lambda: print('teardown ran'))\n"
               "print('written', end='')\n"
               "sys.stderr.write('said')\n"
               "exit_skipping_teardown(3)\n")
    done = spawn.run([sys.executable, "-c", program], cwd=REPO, capture_output=True,
                     text=True, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (3, "written", "said")


LATE_SIGNAL = """
import os, signal, sys, threading, time
from hetbench.harness.system.exits import exit_after

class Stopped(BaseException):
    pass

def stop(number, frame):
    raise Stopped(number)

def main():
    signal.signal(signal.SIGTERM, stop)
    # a thread the interpreter's teardown would wait for (as MXNet's engine held a worker)
    threading.Thread(target=time.sleep, args=(600,)).start()
    if sys.argv[1] == "late":
        os.kill(os.getpid(), signal.SIGTERM)  # as the work ends
    return 0

exit_after(main)
"""


@pytest.mark.parametrize(("when", "status"), [("late", 1), ("none", 0)])
def test_a_signal_as_the_work_ends_still_skips_the_teardown(spawn: Spawn, when: str,
                                                            status: int) -> None:
    """An MXNet worker whose launcher was killed got SIGTERM as it returned from its work:
    the exception ran the interpreter's teardown, which waited for good."""
    done = spawn.run([sys.executable, "-c", LATE_SIGNAL, when], cwd=REPO, capture_output=True,
                     text=True, timeout=60)
    assert done.returncode == status, done.stderr
    assert ("Stopped: 15" in done.stderr) == (when == "late")
    help_text = spawn.run(hetbench_command("--help"), cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert help_text.returncode == 0 and "usage: hetbench" in help_text.stdout


# -- too few file descriptors (issue 58, 6) --------------------------------------------------

PAIR = """
[suite]
name = "fds"

[[runs]]
name = "pair"
steps = 10
global_batch = 32
timeout_s = 4
workers = [ { threads = 1 }, { threads = 1 } ]
"""

# a launch in a process whose limit on open files is argv[3] (its workers inherit it),
# the launcher's floor lowered to let it start: what a limit between that floor and a
# worker's needs does
LOW_LIMIT_LAUNCH = """
import resource, sys
from pathlib import Path
from hetbench.harness.run import launcher
from hetbench.harness.spec.suite import load_suite
launcher.MIN_OPEN_FILES = 0
hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[3]), hard))
[result] = launcher.run_suite(load_suite(sys.argv[1]), Path(sys.argv[2]))
print(result.status, result.reason)
"""


def test_a_limit_on_open_files_no_worker_can_start_under_is_refused_first(
        tmp_path: Path, write_suite, spawn: Spawn) -> None:
    suite = write_suite(PAIR)
    done = spawn.run(hetbench_command("run", str(suite), "--out", str(tmp_path / "out")),
                     cwd=REPO, capture_output=True, text=True, timeout=120,
                     preexec_fn=lambda: _limit_open_files(20))
    assert done.returncode == 2, done.stderr
    assert done.stderr == ("hetbench: error: ulimit -n: a process here may open 20 files, and "
                           "a worker needs more than that (at least 64): raise the limit "
                           "(ulimit -n 1024)\n")
    assert done.stdout == "" and not (tmp_path / "out").exists()


def test_a_worker_short_of_file_descriptors_is_named_not_the_peer_left_waiting(
        tmp_path: Path, write_suite, spawn: Spawn) -> None:
    """With 14 open files for a worker, worker 0 (which serves the run's store) cannot take
    worker 1's connection, or fails on its own: the reason names worker 0 and the files,
    never 'worker 1 stopped answering' (the campaign saw that)."""
    suite = write_suite(PAIR)
    done = spawn.run([sys.executable, "-c", LOW_LIMIT_LAUNCH, str(suite),
                      str(tmp_path / "out"), "14"], cwd=REPO, capture_output=True, text=True,
                     timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    status, reason = done.stdout.strip().split(" ", 1)
    print(f"\n{reason}")
    assert status == "failed"
    assert reason.startswith("worker 0") and "files" in reason, reason
    assert "stopped answering" not in reason, reason


def _limit_open_files(soft: int) -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, resource.getrlimit(
        resource.RLIMIT_NOFILE)[1]))
