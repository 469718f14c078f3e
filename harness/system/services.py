"""Processes an aggregator needs beside the workers (parameter servers, MXNet's ps-lite
scheduler and server), started by the launcher before the workers and stopped by it after
them, whatever happened in between: every process hetbench starts, hetbench stops.

This module imports no framework: the launcher uses it.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from harness.system import netns

STOP_GRACE_S = 5.0
PR_SET_PDEATHSIG = 1  # prctl(2)


@dataclass
class Services:
    """The processes, and what the workers must be told (environment variables)."""

    env: dict[str, str] = field(default_factory=dict)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    # the holder of the workers' private network namespace (harness/system/netns.py), if any
    holder: subprocess.Popen[bytes] | None = None
    network: str = "host"  # what the manifest records of the workers' network

    def isolate_network(self, logs: Path) -> None:
        """Start the workers in a network namespace of their own with loopback only (for
        listeners that bind every interface); where that is not allowed, say why in
        `network` and leave them in the host's."""
        started = netns.start_holder(logs / "netns.log")
        if isinstance(started, str):
            self.network = f"host (no private namespace: {started})"
        else:
            self.holder, self.network = started, "private namespace, loopback only"

    def worker_command(self, command: list[str]) -> list[str]:
        """How to start a worker running `command`: inside the private namespace if any."""
        return command if self.holder is None else netns.join_command(self.holder.pid,
                                                                      command)

    def start(self, name: str, command: list[str], env: dict[str, str], logs: Path) -> None:
        """One process in its own session (so a signal to its group reaches only it), its
        output in logs/<name>.log; in the workers' network namespace where they have one."""
        with open(logs / f"{name}.log", "wb") as log:
            self.procs[name] = subprocess.Popen(
                self.worker_command(command), env=env, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
                preexec_fn=_die_with_parent)

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
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines()
                 if ln.strip()] if path.is_file() else []
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
                netns.stop_holder(self.holder)


def _die_with_parent() -> None:
    """In the child, before its program starts: SIGTERM when the launcher dies, even by a
    SIGKILL nothing can catch (a service does not outlive `hetbench run`; Linux only)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass


def _wait_or_signal(p: subprocess.Popen[bytes], grace_s: float, sig: int) -> None:
    try:
        p.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            pass
