"""Shared fixtures, and the test suite's process hygiene (issue 26): no test leaves a process
running after it, whether it passed, failed or timed out (pytest-timeout).

- `spawn` starts every process a test starts (`spawn(command, ...)` as subprocess.Popen,
  `spawn.run(command, ...)` as subprocess.run): each in a session, so a process group, of
  its own, with a token in its environment that everything it starts inherits. At the
  test's teardown what still lives is ended: SIGTERM to each group whose leader runs, a
  short grace, then SIGKILL to the groups and to every process carrying one of the tokens,
  which also finds what left the group (the launcher starts each worker and service in a
  session of its own) or outlived its parent (orphans of a killed launcher).
- `no_process_left` (autouse) is the net for what runs in the pytest process itself
  (run_suite: its launcher's workers are pytest's children): a descendant of pytest still
  running at the end of a test is killed, and the test fails at teardown naming it.
  `completed_runs` checks the same right after its launch, for the module fixtures that
  call it.
- The `gpu` marker skips a test where torch sees no CUDA GPU.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
import pytest

REPO = Path(__file__).resolve().parent.parent

# The environment variable naming, in each process `spawn` starts and in their descendants,
# the command they came from.
SPAWN_TOKEN = "HETBENCH_TEST_SPAWN"
TERM_GRACE_S = 2.0  # SIGTERM, then SIGKILL after this long
# The pytest process's own long-lived helpers (torch.multiprocessing's "spawn" starts
# multiprocessing's resource tracker once, and reuses it): not a test's leftovers.
PYTEST_HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")


@pytest.fixture
def write_suite(tmp_path: Path):
    """Writes a suite TOML into tmp_path and returns its path."""

    def write(text: str, name: str = "suite.toml") -> Path:
        path = tmp_path / name
        path.write_text(text)
        return path

    return write


def hetbench_command(*args: str, figures: bool = False) -> list[str]:
    """`hetbench ARGS` as a command; a `run` draws no figures at its end unless `figures`
    (about 10 s a launch on two cores, a quarter of the suite's time: the tests that
    check the figures draw them)."""
    no_figures = ["--no-figures"] if args[:1] == ("run",) and not figures else []
    return [sys.executable, "-m", "hetbench.harness.cli.main", *args, *no_figures]


def completed_runs(folder: Path, suite_text: str) -> dict[str, Path]:
    """Run the suite `suite_text` once into `folder` (for a module fixture: several tests
    read one launch); every run must complete, and leave no process behind. Run name ->
    run directory."""
    from hetbench.harness.run.launcher import run_suite
    from hetbench.harness.spec.suite import load_suite

    (folder / "suite.toml").write_text(suite_text)
    before = live_descendants()
    who = f"the launch of {folder / 'suite.toml'}"
    try:
        results = run_suite(load_suite(str(folder / "suite.toml")), folder / "out")
    except BaseException:
        end_leftovers(who, before, fail=False)  # what went wrong is the exception's to say
        raise
    end_leftovers(who, before)
    assert all(r.status == "completed" for r in results), [r.reason for r in results]
    return {r.run.name: r.run_dir for r in results}


# -- processes a test starts ------------------------------------------------------------------


class Spawn:
    """Starts processes for one test and ends whatever of them is left (`close`)."""

    def __init__(self) -> None:
        self.started: list[tuple[subprocess.Popen[Any], str]] = []  # (process, its token)

    def __call__(self, command: Sequence[str | os.PathLike[str]], *,
                 env: dict[str, str] | None = None, **popen: Any) -> subprocess.Popen[Any]:
        """subprocess.Popen(command, **popen) in a new session (its own process group)."""
        if "start_new_session" in popen or "process_group" in popen:
            raise TypeError("spawn starts every process in a session of its own")
        token = f"{os.getpid()}-{uuid.uuid4().hex}"
        env = {**(os.environ if env is None else env), SPAWN_TOKEN: token}
        with _ctrl_c_not_ignored():
            proc = subprocess.Popen(command, env=env, start_new_session=True, **popen)
        self.started.append((proc, token))
        return proc

    def run(self, command: Sequence[str | os.PathLike[str]], *, input: Any = None,
            capture_output: bool = False, timeout: float | None = None, check: bool = False,
            **popen: Any) -> subprocess.CompletedProcess[Any]:
        """subprocess.run(command, ...), the process started by `spawn`; on a timeout or an
        exception its whole group is killed (subprocess.run kills the child alone)."""
        if capture_output:
            popen["stdout"] = popen["stderr"] = subprocess.PIPE
        if input is not None:
            popen["stdin"] = subprocess.PIPE
        proc = self(command, **popen)
        try:
            stdout, stderr = proc.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            self._end([(proc, self._token(proc))], grace_s=0.0)
            try:
                exc.stdout, exc.stderr = proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:  # a pipe kept open by a process out of reach
                pass
            raise
        except BaseException:
            self._end([(proc, self._token(proc))], grace_s=0.0)
            raise
        done = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
        if check:
            done.check_returncode()
        return done

    def close(self) -> None:
        """End every process started, and every process they started."""
        self._end(self.started, TERM_GRACE_S)
        for proc, _ in self.started:
            for pipe in (proc.stdin, proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()

    def _token(self, proc: subprocess.Popen[Any]) -> str:
        return next(token for p, token in self.started if p is proc)

    @staticmethod
    def _end(started: Sequence[tuple[subprocess.Popen[Any], str]], grace_s: float) -> None:
        if not started:
            return
        # Only a child not yet reaped has its pid, hence its group's id, for sure: the
        # processes of a group whose leader was already waited for are found by token.
        unreaped = [proc for proc, _ in started if proc.returncode is None]
        running = [proc for proc in unreaped if not _exited(proc)]
        for proc in running:
            _signal_group(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while any(not _exited(proc) for proc in running) and time.monotonic() < deadline:
            time.sleep(0.05)
        for proc in unreaped:
            _signal_group(proc.pid, signal.SIGKILL)
        for proc in unreaped:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        kill(carrying({token for _, token in started}))


@contextmanager
def _ctrl_c_not_ignored() -> Iterator[None]:
    """Children started within take SIGINT as they would from an interactive shell. pytest
    run as a background job of a script (`pytest &`, nohup) ignores SIGINT, and its children
    would inherit that: `hetbench run` would not see the Ctrl-C the tests send it. A handler
    that does nothing keeps it ignored here, but is reset to the default by exec."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) != signal.SIG_IGN):
        yield
        return
    signal.signal(signal.SIGINT, _still_ignored)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def _still_ignored(number: int, frame: Any) -> None:
    pass


def _exited(proc: subprocess.Popen[Any]) -> bool:
    """Whether the child has ended, without reaping it (its pid stays its own)."""
    try:
        return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:  # reaped already
        return True


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def carrying(tokens: Collection[str]) -> list[psutil.Process]:
    """The running processes whose environment holds one of `tokens`."""
    found = []
    for proc in psutil.process_iter(["environ"]):
        environ = proc.info["environ"]  # None where it may not be read (another user's)
        if environ and environ.get(SPAWN_TOKEN) in tokens:
            found.append(proc)
    return found


def kill(procs: Sequence[psutil.Process]) -> None:
    """SIGKILL each (psutil checks that its pid was not reused), and wait until they are
    gone (reaped where they are children of this process)."""
    for proc in procs:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=10)


@pytest.fixture
def spawn(no_process_left: None) -> Iterator[Spawn]:
    """Starts the test's processes (`spawn(command, **popen)`, `spawn.run(command, ...)`);
    whatever of them still lives at teardown is ended, pass, fail or timeout. (After
    no_process_left: ended before the net looks.)"""
    processes = Spawn()
    try:
        yield processes
    finally:
        processes.close()


# -- the net: processes started inside pytest ------------------------------------------------


def live_descendants() -> list[psutil.Process]:
    """Every descendant of this process still running (not a zombie), but pytest's own
    helpers (PYTEST_HELPERS). One psutil call where there is none."""
    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            command = " ".join(proc.cmdline())
        except psutil.Error:  # gone meanwhile
            continue
        if not any(helper in command for helper in PYTEST_HELPERS):
            found.append(proc)
    return found


def _describe(proc: psutil.Process) -> str:
    try:
        command = " ".join(proc.cmdline()) or proc.name()
    except psutil.Error:
        command = "(gone)"
    return f"  pid {proc.pid}: {command[:400]}"


def end_leftovers(who: str, before: Collection[psutil.Process] = (), fail: bool = True
                  ) -> None:
    """Kill the descendants of this process still running but those of `before`, and fail
    naming `who` and their command lines."""
    left = [proc for proc in live_descendants() if proc not in before]
    if not left:
        return
    described = "\n".join(_describe(proc) for proc in left)
    kill(left)
    if fail:
        pytest.fail(f"{who} left {len(left)} process(es) running (killed now):\n{described}",
                    pytrace=False)


HETBENCH_TIMEOUT_S = 120.0  # a module may set its own TIMEOUT_S


@pytest.fixture
def hetbench(spawn: Spawn, request: pytest.FixtureRequest
             ) -> Callable[..., subprocess.CompletedProcess[str]]:
    """hetbench(cwd, *args, env=None, figures=False): `hetbench ARGS` run in folder cwd, to
    its end (the test module's TIMEOUT_S, else HETBENCH_TIMEOUT_S); a `run` draws figures
    only with figures=True (hetbench_command)."""
    timeout = getattr(request.module, "TIMEOUT_S", HETBENCH_TIMEOUT_S)

    def run(cwd: Path, *args: str, env: dict[str, str] | None = None, figures: bool = False
            ) -> subprocess.CompletedProcess[str]:
        return spawn.run(hetbench_command(*args, figures=figures), cwd=cwd,
                         capture_output=True, text=True, timeout=timeout, env=env)

    return run


@pytest.fixture(autouse=True)
def no_process_left(request: pytest.FixtureRequest) -> Iterator[None]:
    """At the end of every test: any process it started that still runs is killed, and
    the test fails at teardown naming them."""
    yield
    end_leftovers(request.node.nodeid)


# -- markers ----------------------------------------------------------------------------------


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`gpu`: skipped where torch sees no CUDA GPU (torch imported only if one is marked)."""
    marked = [item for item in items if item.get_closest_marker("gpu")]
    if not marked:
        return
    import torch

    if torch.cuda.is_available():
        return
    for item in marked:  # first: before any other reason it has to skip
        item.add_marker(pytest.mark.skipif(True, reason="no CUDA GPU here"), append=False)
