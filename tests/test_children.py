"""Issue 58 (1, 2): a command hetbench starts and waits for (`testbed up -- COMMAND`, `hetbench
ci`'s launches) gets a signal sent to hetbench once, and hetbench waits a bounded time for
it to close before it goes on; a second signal ends the wait and names `hetbench recover`.
Real processes and real signals (harness/system/children.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import REPO, Spawn

TIMEOUT_S = 60

# hetbench's side, as the CLI runs it: handlers installed, the interrupt's exit status
DRIVER = """
import sys
from hetbench.harness.system import children, signals
signals.install()
try:
    sys.exit(children.run_and_wait(sys.argv[2:], "the command", "hetbench recover OUT",
                                   close_wait_s=float(sys.argv[1])))
except KeyboardInterrupt as exc:
    print(f"hetbench: {signals.describe(exc)}", file=sys.stderr)
    sys.exit(signals.exit_status(exc))
"""

# the command: counts the SIGINT/SIGTERM it gets in a file, starts a grandchild that does
# the same and closes a second later than it (as launchers under a shell that ends first),
# and takes `close_s` to close after the first (inf: it never ends by itself)
COMMAND = """
import os, signal, subprocess, sys, time
log, close_s, grandchild = sys.argv[1], float(sys.argv[2]), sys.argv[3] == "1"
got = []
def note(number, frame):
    got.append(number)
    with open(log, "a") as f:
        f.write(f"{os.getpid()} {signal.Signals(number).name}\\n")
for number in (signal.SIGINT, signal.SIGTERM):
    signal.signal(number, note)
if grandchild:
    subprocess.Popen([sys.executable, __file__, log + ".grandchild", str(close_s + 1), "0"])
print("ready", flush=True)
while not got:
    time.sleep(0.05)
time.sleep(min(close_s, 3600))
sys.exit(0)
"""


def start(tmp_path: Path, spawn: Spawn, close_wait_s: float, close_s: str,
          grandchild: bool = False) -> tuple[subprocess.Popen[str], Path]:
    command = tmp_path / "command.py"
    command.write_text(textwrap.dedent(COMMAND))
    log = tmp_path / "signals.log"
    proc = spawn([sys.executable, "-c", DRIVER, str(close_wait_s), sys.executable,
                  str(command), str(log), close_s, "1" if grandchild else "0"],
                 cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    if grandchild:
        deadline = time.monotonic() + TIMEOUT_S
        while len(psutil.Process(proc.pid).children(recursive=True)) < 2:
            assert time.monotonic() < deadline, "the grandchild never started"
            time.sleep(0.05)
    return proc, log


def ended(proc: psutil.Process, within_s: float = 10) -> bool:
    """Gone, or a zombie (ended; a parent that is not ours reaps it)."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def received(log: Path) -> list[str]:
    return log.read_text().split("\n")[:-1] if log.exists() else []


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_reaches_the_command_and_its_children_once_and_hetbench_waits_for_it(
        tmp_path: Path, spawn: Spawn, number: int) -> None:
    proc, log = start(tmp_path, spawn, close_wait_s=30, close_s="1.0", grandchild=True)
    family = psutil.Process(proc.pid).children(recursive=True)
    began = time.monotonic()
    proc.send_signal(number)
    _, err = proc.communicate(timeout=TIMEOUT_S)
    waited = time.monotonic() - began
    assert proc.returncode == 128 + number, err
    name = signal.Signals(number).name
    # once each: the command and its own child, in the group hetbench passes it on to
    assert [line.split()[1] for line in received(log)] == [name]
    assert [line.split()[1] for line in received(Path(f"{log}.grandchild"))] == [name]
    assert waited >= 2.0, "hetbench went on before its command's child had closed"
    assert "passed on to the command; waiting up to 30 s" in err
    assert "the command ended (exit status 0)" in err
    assert all(ended(p, within_s=0) for p in family)


def test_a_command_that_does_not_close_is_killed_after_the_wait_naming_recover(
        tmp_path: Path, spawn: Spawn) -> None:
    proc, log = start(tmp_path, spawn, close_wait_s=1.5, close_s="inf")
    child = psutil.Process(proc.pid).children()[0]
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=TIMEOUT_S)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert received(log) == [f"{child.pid} SIGTERM"]
    assert ("the command did not end within 1.5 s: killed it; the records it flushed stay, "
            "and `hetbench recover OUT` closes the runs it left running") in err
    assert ended(child)


def test_a_second_ctrl_c_ends_the_wait_at_once(tmp_path: Path, spawn: Spawn) -> None:
    proc, log = start(tmp_path, spawn, close_wait_s=TIMEOUT_S, close_s="inf")
    child = psutil.Process(proc.pid).children()[0]
    assert proc.stderr is not None
    proc.send_signal(signal.SIGINT)
    line = ""
    while "waiting up to" not in line:
        line = proc.stderr.readline()
        assert line, "hetbench ended without waiting"
    while not received(log):  # the command has it (a busy machine may take a while)
        assert proc.poll() is None, "hetbench ended without waiting"
        time.sleep(0.05)
    began = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=TIMEOUT_S)
    assert time.monotonic() - began < TIMEOUT_S / 2
    assert proc.returncode == 130, err
    assert "stopped waiting: killed it" in err and "`hetbench recover OUT`" in err
    assert received(log) == [f"{child.pid} SIGINT"]
    assert ended(child)


def test_without_a_signal_the_commands_exit_status_is_returned(spawn: Spawn) -> None:
    done = spawn.run([sys.executable, "-c", DRIVER, "5", sys.executable, "-c",
                      "import sys; sys.exit(7)"], cwd=REPO, capture_output=True, text=True,
                     timeout=TIMEOUT_S)
    assert (done.returncode, done.stderr) == (7, "")


def test_the_command_reads_no_terminal_it_cannot_own(spawn: Spawn) -> None:
    """Outside the terminal's foreground group, a read of the terminal would stop the
    command (SIGTTIN) and hetbench would wait for good: its stdin is /dev/null instead."""
    leader, follower = os.openpty()
    try:
        done = spawn.run([sys.executable, "-c", DRIVER, "5", sys.executable, "-c",
                          "import sys; print(repr(sys.stdin.read()))"], cwd=REPO,
                         stdin=follower, capture_output=True, text=True, timeout=TIMEOUT_S)
    finally:
        os.close(leader)
        os.close(follower)
    assert (done.returncode, done.stdout.strip()) == (0, "''"), done.stderr
