"""The test suite's process hygiene (tests/conftest.py, issue 26): what a test starts does not
outlive it, whether it passed, failed or timed out. Inner pytest sessions (pytester, in a
process of their own) run tests that start a child which starts a grandchild; afterwards
neither may run. Each grandchild and child carries a marker of its own in its command line,
so that only they are looked for, and killed if they survived."""

from __future__ import annotations

import ast
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import psutil
import pytest

from tests.conftest import REPO, Spawn

pytest_plugins = ["pytester"]

# argv: PIDS MODE MARKER. Starts a grandchild, in the child's process group (MODE "group")
# or in a session of its own ("session", "orphan"), writes "CHILD GRANDCHILD" to PIDS once
# both run, then sleeps; "orphan": the child exits, leaving the grandchild to init.
CHILD = """
import os, subprocess, sys, time
from pathlib import Path
pids, mode, marker = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", marker],
                              start_new_session=mode != "group")
pids.with_suffix(".tmp").write_text(f"{os.getpid()} {grandchild.pid}")
pids.with_suffix(".tmp").rename(pids)
if mode != "orphan":
    time.sleep(120)
"""

INNER = """
import subprocess, sys, time
from pathlib import Path

import psutil
import pytest

CHILD, PIDS, MARKER = {child!r}, Path({pids!r}), {marker!r}


def start(starter, mode):
    proc = starter([sys.executable, "-c", CHILD, str(PIDS), mode, MARKER])
    deadline = time.monotonic() + 60
    while not PIDS.exists():
        assert time.monotonic() < deadline, "the child wrote no pids in 60 s"
        time.sleep(0.02)
    pids = [int(p) for p in PIDS.read_text().split()]
    if mode == "orphan":
        proc.wait()
        pids = pids[1:]
    assert all(psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids)
    return proc


def test_spawned_then_failed(spawn):
    start(spawn, "group")
    pytest.fail("on purpose")


@pytest.mark.timeout(3)
def test_spawned_then_timed_out(spawn):
    start(spawn, "group")
    time.sleep(60)


def test_spawned_orphan_then_failed(spawn):
    start(spawn, "orphan")
    pytest.fail("on purpose")


def test_spawned_then_passed(spawn):
    start(spawn, "session")


def test_started_in_pytest_then_passed():
    start(subprocess.Popen, "session")
"""


def running(pid: int, marker: str) -> psutil.Process | None:
    """The process `pid` if it still runs and is one of the test's (its marker)."""
    try:
        proc = psutil.Process(pid)
        if proc.status() != psutil.STATUS_ZOMBIE and marker in proc.cmdline():
            return proc
    except psutil.Error:
        pass
    return None


def run_inner(pytester: pytest.Pytester, test: str) -> tuple[pytest.RunResult, list[int], str]:
    """Inner test `test` in a pytest process of its own, with this suite's conftest; the
    result, the pids of the child and grandchild it started and their marker."""
    pids, marker = pytester.path / "pids", f"hetbench-hygiene-{uuid.uuid4().hex}"
    pytester.makeini(f"[pytest]\npythonpath = {REPO}\n")
    pytester.makeconftest('pytest_plugins = ["tests.conftest"]\n')
    pytester.makepyfile(test_inner=INNER.format(child=CHILD, pids=str(pids), marker=marker))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-k", test, timeout=120)
    assert pids.exists(), result.stdout.str()
    return result, [int(p) for p in pids.read_text().split()], marker


def survivors(pids: list[int], marker: str) -> list[int]:
    """Those of pids still running: killed, so that a failing check leaves none either."""
    left = [proc for pid in pids if (proc := running(pid, marker)) is not None]
    for proc in left:
        proc.kill()
    return [proc.pid for proc in left]


@pytest.mark.parametrize(("test", "outcome"), [
    ("test_spawned_then_failed", "failed"),
    ("test_spawned_then_timed_out", "failed"),
    ("test_spawned_orphan_then_failed", "failed"),
    ("test_spawned_then_passed", "passed"),
])
def test_spawn_ends_the_processes_of_its_test_however_it_ends(pytester: pytest.Pytester,
                                                              test: str, outcome: str) -> None:
    """spawn's teardown ends the child and the grandchild (in the child's group, in a session
    of its own, or orphaned when the child exited): not the net, which would add an error."""
    result, pids, marker = run_inner(pytester, test)
    assert survivors(pids, marker) == [], result.stdout.str()
    result.assert_outcomes(**{outcome: 1}, deselected=4)  # and no error at teardown
    if test == "test_spawned_then_timed_out":
        result.stdout.fnmatch_lines(["*Timeout*"])


def test_a_process_left_by_a_test_fails_it_naming_the_command(pytester: pytest.Pytester) -> None:
    """Started without spawn (as run_suite's launcher starts workers inside pytest): the net
    kills the child and its grandchild (in a session of its own), and fails the test at
    teardown with their command lines."""
    result, pids, marker = run_inner(pytester, "test_started_in_pytest_then_passed")
    assert survivors(pids, marker) == []
    result.assert_outcomes(passed=1, errors=1, deselected=4)
    result.stdout.fnmatch_lines([
        "*test_inner.py::test_started_in_pytest_then_passed left 2 process(es) running "
        "(killed now):*"])
    text = result.stdout.str()
    assert all(f"pid {pid}: " in text for pid in pids)
    assert "time.sleep(120)" in text and marker in text


def test_a_run_past_its_timeout_ends_with_its_group(spawn: Spawn, tmp_path: Path) -> None:
    """spawn.run as subprocess.run, but a timeout kills the grandchild too (subprocess.run
    kills the child alone)."""
    pids, marker = tmp_path / "pids", f"hetbench-hygiene-{uuid.uuid4().hex}"
    with pytest.raises(subprocess.TimeoutExpired):
        spawn.run([sys.executable, "-c", CHILD, str(pids), "group", marker], timeout=5)
    assert pids.exists(), "the child wrote no pids within its 5 s"
    assert survivors([int(p) for p in pids.read_text().split()], marker) == []


def test_a_spawned_process_takes_ctrl_c_though_pytest_ignores_it(spawn: Spawn) -> None:
    """pytest run as a background job of a script ignores SIGINT; what a test starts does
    not inherit that (the Ctrl-C tests signal `hetbench run`), and pytest keeps ignoring."""
    code = "import signal; print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)"
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        done = spawn.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
        kept = signal.getsignal(signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert done.stdout.strip() == "True", done.stderr
    assert kept == signal.SIG_IGN


# Calls that start a process; tests make them through spawn (tests/conftest.py) alone.
STARTERS = {"subprocess": {"Popen", "run", "call", "check_call", "check_output", "getoutput",
                           "getstatusoutput"},
            "os": {"system", "popen", "fork", "forkpty", "posix_spawn", "posix_spawnp",
                   "spawnl", "spawnle", "spawnlp", "spawnlpe", "spawnv", "spawnve", "spawnvp",
                   "spawnvpe", "execv", "execve", "execl", "execlp", "execvp", "execvpe"}}


def test_tests_start_processes_through_spawn_alone() -> None:
    found = []
    for path in sorted((REPO / "tests").glob("*.py")):
        if path.name == "conftest.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module in STARTERS:
                found += [f"{path.name}:{node.lineno}: from {node.module} import {a.name}"
                          for a in node.names if a.name in STARTERS[node.module]]
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Name)
                    and node.func.attr in STARTERS.get(node.func.value.id, ())):
                found.append(f"{path.name}:{node.lineno}: {node.func.value.id}."
                             f"{node.func.attr}")
    assert not found, "start these through the spawn fixture (tests/conftest.py):\n" + \
        "\n".join(found)
