"""A command hetbench starts and waits for (`testbed up -- COMMAND`, each launch of
`hetbench ci`): a signal to hetbench reaches it once, and hetbench waits a bounded time for
it to close its runs before it tears anything down under it.

The command runs in a process group of its own, so a terminal's Ctrl-C (sent to the
foreground group: hetbench's) reaches it once, passed on by hetbench, as `timeout`'s or a
CI runner's SIGTERM to hetbench alone does; a launcher that got the same signal twice
could be cut short while it closes. Being outside the foreground group, it cannot read
the terminal (it would be stopped, SIGTTIN): its stdin is /dev/null where hetbench's is
a terminal.

While hetbench waits, a second signal ends the wait: the command's group is killed, its
flushed records stay where they are, and hetbench names the `hetbench recover` command
that closes what it left `running`. A command that does not end within the wait is
treated alike. The command dies with hetbench (PR_SET_PDEATHSIG), even by a SIGKILL that
reaches hetbench's group alone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from hetbench.harness.system import orphans, procfs, signals

# by default: long enough for a launcher to stop its workers, write its run's steps.parquet
# and wait for the other hosts (at most the run's timeout_s + nodes.CLOSE_MARGIN_S); a
# caller that knows the runs passes their own bound (`close_wait_s`)
CLOSE_WAIT_S = 300.0
KILLED_WAIT_S = 10.0  # for the kernel to reap a killed group
LEFT_GRACE_S = 5.0  # for what the command left running to end on SIGTERM
POLL_S = 0.1


def run_and_wait(command: Sequence[str], what: str, recover: str,
                 close_wait_s: float = CLOSE_WAIT_S, **popen: Any) -> int:
    """Run `command` (described as `what` in messages) to its end and return its exit
    status. A handled signal (signals.install) is passed on to its process group; then
    this waits up to `close_wait_s` for it to end and raises the interrupt again (the CLI
    exits 128 + N). A second signal, or the wait running out, kills the group and says
    that `recover` (a command line) closes the runs it left behind."""
    if "stdin" not in popen and _terminal(sys.stdin):
        popen["stdin"] = subprocess.DEVNULL
    proc: subprocess.Popen[Any] | None = None
    try:
        # it dies with hetbench even by SIGKILL (a CI runner's, to hetbench's group)
        proc = subprocess.Popen(list(command), process_group=0,
                                preexec_fn=orphans.die_with_parent, **popen)
        code = proc.wait()
        _end_group(proc)
        return code
    except KeyboardInterrupt as interrupt:
        if proc is not None:
            _close_after(interrupt, proc, what, recover, close_wait_s)
        raise interrupt from None
    except BaseException:  # an error of ours: nothing is left behind
        if proc is not None:
            _signal_group(proc, signal.SIGKILL)
            _reap(proc)
        raise


def _close_after(interrupt: KeyboardInterrupt, proc: subprocess.Popen[Any], what: str,
                 recover: str, close_wait_s: float) -> None:
    """The interrupt passed on to the command's group, and the wait for it to close; a
    second signal anywhere in here ends the wait."""
    deadline = time.monotonic() + close_wait_s
    try:
        _signal_group(proc, signals.number(interrupt))
        print(f"\nhetbench: {signals.describe(interrupt)}: passed on to {what}; waiting up to "
              f"{close_wait_s:g} s for it to close its runs (a second Ctrl-C stops waiting)",
              file=sys.stderr, flush=True)
        # its leader may end first (a shell's `wait`): what it started closes on
        _wait_for_group(proc, deadline)
        print(f"hetbench: {what} ended (exit status {proc.poll()})", file=sys.stderr,
              flush=True)
        return
    except (subprocess.TimeoutExpired, KeyboardInterrupt) as cut:
        waited = ("stopped waiting" if isinstance(cut, KeyboardInterrupt)
                  else f"{what} did not end within {close_wait_s:g} s")
    _signal_group(proc, signal.SIGKILL)
    _reap(proc)
    with signals.held():  # said once the group is gone, whatever else arrives
        print(f"hetbench: {waited}: killed it; the records it flushed stay, and "
              f"`{recover}` closes the runs it left running", file=sys.stderr, flush=True)


def _wait_for_group(proc: subprocess.Popen[Any], deadline: float) -> None:
    """Until the command and every process of its group have ended; TimeoutExpired at
    `deadline` (monotonic)."""
    while proc.poll() is None or procfs.group_members(proc.pid):
        if time.monotonic() >= deadline:
            raise subprocess.TimeoutExpired(proc.args, 0)
        time.sleep(POLL_S)


def _end_group(proc: subprocess.Popen[Any]) -> None:
    """What the command left running in its group when it ended (a child it did not wait
    for) gets SIGTERM, then SIGKILL after LEFT_GRACE_S (at once on a signal meanwhile)."""
    if not procfs.group_members(proc.pid):
        return
    _signal_group(proc, signal.SIGTERM)
    try:
        _wait_for_group(proc, time.monotonic() + LEFT_GRACE_S)
    except subprocess.TimeoutExpired:
        _signal_group(proc, signal.SIGKILL)
    except KeyboardInterrupt:
        _signal_group(proc, signal.SIGKILL)
        raise


def _reap(proc: subprocess.Popen[Any]) -> None:
    try:
        proc.wait(timeout=KILLED_WAIT_S)
    except (subprocess.TimeoutExpired, KeyboardInterrupt):
        pass


def _signal_group(proc: subprocess.Popen[Any], number: int) -> None:
    """`number` to every process of the command's group (its leader may have ended and
    left children: the group outlives it)."""
    try:
        os.killpg(proc.pid, number)
    except (ProcessLookupError, PermissionError):
        pass


def _terminal(stream: Any) -> bool:
    try:
        return bool(stream is not None and os.isatty(stream.fileno()))
    except (AttributeError, OSError, ValueError):  # a replaced or closed stdin (pytest's)
        return False
