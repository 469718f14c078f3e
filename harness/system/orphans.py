"""A process of a run does not outlive its launcher, even one killed by SIGKILL.

The kernel sends SIGTERM when the launcher dies (PR_SET_PDEATHSIG), which lets a worker
flush its records on the way out. A worker blocked where that SIGTERM is not acted on (a
TensorFlow collective or MXNet's ps-lite waiting for a peer that was stopped too) would
wait for good: a watcher thread ends the process LAUNCHER_GONE_GRACE_S after the launcher
is gone.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

PR_SET_PDEATHSIG = 1  # prctl(2)
LAUNCHER_ENV = "HETBENCH_LAUNCHER_PID"
LAUNCHER_GONE_GRACE_S = 10.0  # to flush and close after the SIGTERM
WATCH_S = 1.0


def follow_launcher(grace_s: float = LAUNCHER_GONE_GRACE_S) -> None:
    """In a process the launcher started (LAUNCHER_ENV names it): end with it. Exits at
    once when the launcher is already gone (it died before this call)."""
    launcher = os.environ.get(LAUNCHER_ENV)
    if not launcher:
        return  # torchrun mode: torchrun's agent stops its workers
    die_with_parent()
    if os.getppid() != int(launcher):
        sys.exit(1)
    threading.Thread(target=_end_after, args=(int(launcher), grace_s), daemon=True,
                     name="hetbench-follow-launcher").start()


def die_with_parent() -> None:
    """SIGTERM to this process when its parent dies, even by a SIGKILL nothing can catch
    (Linux only; elsewhere nothing). Also a preexec_fn: the services set it before exec."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass


def _end_after(launcher: int, grace_s: float) -> None:
    while os.getppid() == launcher:
        time.sleep(WATCH_S)
    time.sleep(grace_s)  # the SIGTERM's own way out first
    os.kill(os.getpid(), signal.SIGKILL)
