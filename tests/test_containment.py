"""A user's code contained (issue 72): whatever a user's factory starts (a daemon in a
session of its own, its stdio kept or closed) ends with the job check or the run that
started it, on every path (done, timed out, Ctrl-C or SIGTERM to hetbench); no wait on it
outlasts its limit; and what it prints reaches the run's logs capped, so a factory
printing tens of megabytes neither fills the disk under the records nor the launcher's
memory."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from hetbench.harness.run import jobcheck
from hetbench.harness.spec.errors import UsageError
from hetbench.harness.system import capped_log
from tests.conftest import Spawn, hetbench_command

MARK = "HETBENCH_TEST_CONTAINED"  # in the environment of all a test starts, and inherited

FACTORIES = '''
import os, sys, time
import torch
from torch import nn
from torch.utils.data import TensorDataset
import hetbench


def job():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(256, 8, generator=g)
    y = (x[:, 0] > 0).long()
    return hetbench.Job(model=nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 2)),
                        loss=nn.CrossEntropyLoss(), reduction="mean",
                        train=TensorDataset(x[:192], y[:192]),
                        heldout=TensorDataset(x[192:], y[192:]))


def daemon(close):
    """A daemon as the textbook makes one: two forks and a session of its own."""
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            if close:
                for fd in (0, 1, 2):
                    os.close(fd)
            time.sleep(600)
        os._exit(0)
    os.wait()


def hang():
    time.sleep(600)


def keeps_stdio():
    daemon(close=False)
    return job()


def keeps_stdio_and_hangs():
    daemon(close=False)
    hang()


def closes_stdio():
    daemon(close=True)
    return job()


def loud():
    line = "x" * 1023 + "\\n"
    for _ in range(int(os.environ["LOUD_KIB"])):
        sys.stdout.write(line)
    sys.stdout.write("the last line of the factory\\n")
    return job()
'''

SUITE = """
[suite]
name = "contained"

[[runs]]
name = "pair"
workload = "userjob:{factory}"
steps = 4
global_batch = 32
workers = [ {{ threads = 1 }}, {{ threads = 1 }} ]
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "userjob.py").write_text(FACTORIES)
    return folder


@pytest.fixture
def marked(monkeypatch: pytest.MonkeyPatch) -> str:
    """A mark in this test's environment: every process it starts, and all they start,
    carry it (a daemon keeps its parent's environment)."""
    mark = uuid.uuid4().hex
    monkeypatch.setenv(MARK, mark)
    return mark


def carrying(mark: str) -> list[int]:
    """The living processes (zombies aside) whose environment carries `mark`."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.status() != psutil.STATUS_ZOMBIE and proc.environ().get(MARK) == mark:
                found.append(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return found


def none_left(mark: str, within_s: float = 5.0) -> list[int]:
    """What still carries `mark` after `within_s` (a killed process takes a moment to go)."""
    deadline = time.monotonic() + within_s
    while (left := carrying(mark)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def end(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def check(project: Path, factory: str, timeout_s: float) -> dict[str, object]:
    return jobcheck.check_job(f"userjob:{factory}", str(project), 32, 0, "runs[0].workload",
                              timeout_s)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_daemon_keeping_the_checks_stdio_holds_neither_the_check_nor_a_process(
        project: Path, marked: str) -> None:
    # it used to keep hetbench reading its pipe until the daemon ended (600 s here)
    described = check(project, "keeps_stdio", timeout_s=120)
    assert described["network"] == "loopback only"
    assert (left := none_left(marked)) == [], end(left)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_check_limit_holds_whatever_the_factory_left_holding_its_stdio(
        project: Path, marked: str) -> None:
    started = time.monotonic()
    with pytest.raises(UsageError, match=r"runs\[0\].workload: userjob:keeps_stdio_and_hangs:"
                       r" making the job took more than 8 s"):
        check(project, "keeps_stdio_and_hangs", timeout_s=8)
    # hetbench answered, though the daemon holds the pipe for 600 s (pytest's timeout
    # stops the test otherwise); the 30 s is the bound of ending what the check left
    assert time.monotonic() - started < 8 + 30
    assert (left := none_left(marked)) == [], end(left)


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("sig, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_while_the_check_hangs_ends_the_check_too(
        project: Path, marked: str, spawn: Spawn, sig: int, status: int) -> None:
    (project / "suite.toml").write_text(SUITE.format(factory="hang"))
    proc = spawn(hetbench_command("run", "suite.toml", "--out", "out"), cwd=project,
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 90
    while not any("jobcheck" in " ".join(psutil.Process(p).cmdline())
                  for p in carrying(marked) if psutil.pid_exists(p)):
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    time.sleep(1.0)  # the factory's sleep reached
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == status, (out, err)
    assert (left := none_left(marked)) == [], end(left)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_daemons_a_factory_forks_end_with_the_run(project: Path, marked: str,
                                                  spawn: Spawn) -> None:
    (project / "suite.toml").write_text(SUITE.format(factory="closes_stdio"))
    done = spawn.run(hetbench_command("run", "suite.toml", "--out", "out"), cwd=project,
                     capture_output=True, text=True, timeout=200)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    # the check's daemon, and each worker's (the factory is made in every worker)
    assert (left := none_left(marked)) == [], end(left)
    (run_dir,) = (project / "out" / "contained").glob("pair-r0-*")
    manifest = json.loads((run_dir / "manifest.json").read_text())
    if manifest["network"].startswith("private"):
        ended = (run_dir / "logs" / "netns.log").read_text()
        assert "ended 2 process(es) left in the namespace" in ended, ended


LOUD_KIB = 24 * 1024  # each process prints 24 MiB: more than its log keeps


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_factory_printing_megabytes_leaves_capped_logs_beside_whole_records(
        project: Path, spawn: Spawn, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    # on a small file system of its own where this test may mount one (root): two
    # workers' 24 MiB each did not fit, and the run was left without its records
    mounted = os.geteuid() == 0 and spawn.run(
        ["mount", "-t", "tmpfs", "-o", "size=40m,mode=0700", "tmpfs", str(out)],
        capture_output=True, timeout=30).returncode == 0
    try:
        (project / "suite.toml").write_text(SUITE.format(factory="loud"))
        done = spawn.run(hetbench_command("run", "suite.toml", "--out", str(out)),
                         cwd=project, capture_output=True, text=True, timeout=240,
                         env={**os.environ, "LOUD_KIB": str(LOUD_KIB)})
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        (run_dir,) = (out / "contained").glob("pair-r0-*")
        assert json.loads((run_dir / "manifest.json").read_text())["status"] == "completed"
        assert (run_dir / "steps.parquet").is_file()
        for rank in (0, 1):
            log = run_dir / "logs" / f"rank{rank}.log"
            size = log.stat().st_size
            assert size <= capped_log.HEAD_BYTES + capped_log.TAIL_BYTES + 1024, size
            with open(log, "rb") as f:
                head = f.read(4096)
                f.seek(-capped_log.TAIL_BYTES - 1024, os.SEEK_END)
                tail = f.read().decode(errors="replace")
            assert b"x" * 1023 in head  # the head as printed
            said = f"bytes of this log left out: it keeps the first {capped_log.HEAD_BYTES}"
            assert said in tail, tail[:300]
            # the tail as printed: the factory's last line, then what the worker said after
            assert "the last line of the factory" in tail
    finally:
        if mounted:
            spawn.run(["umount", "-l", str(out)], timeout=30)


def test_a_capped_log_keeps_its_head_and_tail_and_says_what_it_left_out(
        tmp_path: Path, spawn: Spawn) -> None:
    log = capped_log.CappedLog(tmp_path / "a.log", head_bytes=10, tail_bytes=6)
    writer = spawn([sys.executable, "-c", "import sys; sys.stdout.write("
                    "'0123456789' + 'abcdefghij' * 100 + 'END\\n')"],
                   stdout=log.writer)
    log.started()
    writer.wait(timeout=30)
    assert log.settle(10)
    text = (tmp_path / "a.log").read_text()
    assert text.startswith("0123456789\n[hetbench: 998 bytes of this log left out: it keeps "
                           "the first 10 and the last 6 of the 1014 bytes written]\n")
    assert text.endswith("ij" + "END\n")
