"""Where a run's processes live, and the ones an aggregator needs beside the workers
(parameter servers, MXNet's ps-lite scheduler and server), started by the launcher before
the workers and stopped by it after them, whatever happened in between: every process
hetbench starts, hetbench stops.

A run's own (`Services.make_private`): a network namespace whose only interface is
loopback, so that no other local user reaches a rendezvous store, an RPC server (which
runs pickled calls) or a listener that binds every interface; and a temporary folder
(TMPDIR) that only the run's user may read, removed when the run stops (TensorFlow leaves
its autograph files there: its processes end without its clean-up). Each process's output
reaches its log through a pipe, capped (harness/system/capped_log.py), and what a user's
code forked out of the run's processes is ended with the namespace's holder
(harness/system/netns.py).

This module imports no framework: the launcher uses it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hetbench.harness.system import netns, orphans
from hetbench.harness.system.capped_log import SETTLE_S, CappedLog

STOP_GRACE_S = 5.0
LOG_TAIL_BYTES = 64 * 1024  # of a log, read for a failure's reason
PRIVATE_TMP_PREFIX = "hetbench-run-"  # a run's TMPDIR: remove_private_tmp removes only such


@dataclass
class Services:
    """The processes, and what the workers must be told (environment variables)."""

    env: dict[str, str] = field(default_factory=dict)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    # the holder of the workers' private network namespace (harness/system/netns.py), if any
    holder: subprocess.Popen[bytes] | None = None
    network: str = "host"  # what the manifest records of the workers' network
    tmp: Path | None = None  # the run's private temporary folder (TMPDIR), if any
    # where the run's rendezvous listen (loopback; across hosts the master's address), the
    # node whose services this launcher starts (and whether other hosts start theirs), and
    # what makes their libraries bind this host's interface (harness/system/interfaces.py)
    address: str = "127.0.0.1"
    node: int = 0
    across_hosts: bool = False
    binding: dict[str, str] = field(default_factory=lambda: {
        "GLOO_SOCKET_IFNAME": "lo", "TP_SOCKET_IFNAME": "lo"})
    logs: dict[Path, CappedLog] = field(default_factory=dict)  # each process's, by path

    def make_private(self, logs: Path, network: bool = True) -> None:
        """The run's processes in a temporary folder of their own, and (`network`) in a
        network namespace of their own with loopback only; where namespaces are not
        allowed, say why in `network` (the run stays on the host's loopback). Across
        hosts the workers need the host's network: `network` False."""
        self.tmp = Path(tempfile.mkdtemp(prefix=PRIVATE_TMP_PREFIX))  # mode 0700
        if not network:
            return
        started = netns.start_holder(logs / "netns.log")
        if isinstance(started, str):
            self.network = f"host (no private namespace: {started})"
        else:
            self.holder, self.network = started, "private namespace, loopback only"

    def worker_command(self, command: list[str]) -> list[str]:
        """How to start a worker running `command`: inside the private namespace if any."""
        return command if self.holder is None else netns.join_command(self.holder.pid,
                                                                      command)

    def environment(self, env: dict[str, str]) -> dict[str, str]:
        """`env` for a process of the run, with the run's own TMPDIR."""
        return env if self.tmp is None else {**env, "TMPDIR": str(self.tmp)}

    def start(self, name: str, command: list[str], env: dict[str, str], logs: Path) -> None:
        """One process in its own session (so a signal to its group reaches only it), its
        output in logs/<name>.log; in the workers' network namespace where they have one."""
        self.procs[name] = self.spawn(self.worker_command(command), self.environment(env),
                                      logs / f"{name}.log", preexec_fn=orphans.die_with_parent)

    def spawn(self, command: list[str], env: dict[str, str], log: Path,
              **popen: Any) -> subprocess.Popen[bytes]:
        """A process of the run in a session of its own, stdin /dev/null, its output
        (stdout and stderr) in `log`, capped."""
        capped = CappedLog(log)
        try:
            proc = subprocess.Popen(command, env=env, stdout=capped.writer,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True, **popen)
        except BaseException:
            capped.abandon()
            raise
        capped.started()
        self.logs[log] = capped
        return proc

    def settle_logs(self, paths: Iterable[Path] | None = None, wait_s: float = SETTLE_S) -> None:
        """The logs at `paths` (default: all) whole once their processes' output ended,
        waiting `wait_s` at most in all: a failure's reason reads their last lines."""
        deadline = time.monotonic() + wait_s
        for path in self.logs if paths is None else paths:
            if (log := self.logs.get(path)) is not None:
                log.settle(max(0.0, deadline - time.monotonic()))

    def failed(self) -> tuple[str, int] | None:
        """(name, exit status) of a process that ended badly while the run went on."""
        for name, p in self.procs.items():
            code = p.poll()
            if code not in (None, 0):
                return name, code
        return None

    def last_words(self, name: str, logs: Path) -> str:
        """The last line service `name` wrote to its log ("" when none)."""
        path = logs / f"{name}.log"
        self.settle_logs([path])
        lines = [ln.strip() for ln in log_tail(path).splitlines() if ln.strip()]
        return lines[-1] if lines else ""

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """The services end once every worker has left; stop any that did not: SIGTERM
        after the grace period, SIGKILL after another."""
        for p in self.procs.values():
            _wait_or_signal(p, grace_s, signal.SIGTERM)
        for p in self.procs.values():
            _wait_or_signal(p, grace_s, signal.SIGKILL)
            p.wait()
        if self.holder is not None:  # the workers are gone: nothing uses the namespace
            netns.stop_holder(self.holder)  # (and what they forked ends with it)
        self.settle_logs()
        if self.tmp is not None:
            remove_private_tmp(str(self.tmp))


def log_tail(path: Path, size: int = LOG_TAIL_BYTES) -> str:
    """The last `size` bytes of a log as text ("" where there is none): read in bounded
    memory, whatever the log's size."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - size))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def remove_private_tmp(path: str | None) -> None:
    """A run's TMPDIR with what its processes left there: by the launcher as the run stops,
    by `hetbench recover` after a launcher that was killed (the manifest's `tmp`)."""
    if path and Path(path).name.startswith(PRIVATE_TMP_PREFIX):
        shutil.rmtree(path, ignore_errors=True)


def _wait_or_signal(p: subprocess.Popen[bytes], grace_s: float, sig: int) -> None:
    try:
        p.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            pass
