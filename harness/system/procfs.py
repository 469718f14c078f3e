"""What Linux's /proc says of a process: its state and its start time (which, with its pid,
names it uniquely: pids are reused, start times are not; None where /proc has no entry for
it: gone, or not Linux), and of the calling thread: its scheduler statistics."""

from __future__ import annotations

import os
from pathlib import Path


def _stat_fields(pid: int) -> list[str] | None:
    """Fields 3 onwards of /proc/PID/stat: the command name before them is in parentheses
    and may itself hold spaces and parentheses, so the split is after the last ')'."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rfind(")") + 2:].split()


def state(pid: int) -> str | None:
    """R running, S sleeping, D disk wait, T stopped by a signal, t stopped by a tracer,
    Z zombie (exited, not yet reaped)..."""
    fields = _stat_fields(pid)
    return fields[0] if fields else None


def stopped(pid: int) -> bool:
    return state(pid) in ("T", "t")


def start_ticks(pid: int) -> int | None:
    """When the process started, in clock ticks since boot (field 22)."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields and len(fields) > 19 else None


def alive(pid: int, started: int) -> bool:
    """Whether the process that had this pid and start time still runs (a zombie does
    not: it has exited and waits for its parent to read its status)."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] != "Z" and start_ticks(pid) == started


def group_members(group: int) -> list[int]:
    """The processes of process group `group` that have not exited (no zombie): a group
    outlives its leader while a process of it runs."""
    members: list[int] = []
    try:
        entries = list(Path("/proc").iterdir())
    except OSError:  # no /proc (not Linux): nothing it can tell
        return members
    for entry in entries:
        if entry.name.isdigit() and (fields := _stat_fields(int(entry.name))) is not None \
                and len(fields) > 2 and fields[2] == str(group) and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def open_files(pid: int) -> tuple[int, int] | None:
    """(descriptors open, the soft limit on them) of a process, or None where /proc does
    not say (gone, another user's, not Linux)."""
    try:
        opened = sum(1 for _ in Path(f"/proc/{pid}/fd").iterdir())
        limits = Path(f"/proc/{pid}/limits").read_text().splitlines()
    except OSError:
        return None
    for line in limits:
        if line.startswith("Max open files"):
            soft = line[len("Max open files"):].split()[0]
            return opened, (int(soft) if soft.isdigit() else 1 << 62)
    return None


class ThreadSchedstat:
    """The calling thread's /proc schedstat, read through a descriptor kept open (one
    system call, ~1.7 us here): `read()` the raw line, `decode` it into the ns it ran, the
    ns it waited on a run queue for a CPU and the times it was put on one. The wait is up
    to date at any read (the kernel adds it as the thread gets a CPU); the ns it ran is not
    for a running thread (folded in at a tick or a switch): read the thread's CPU clock
    for that. `available` is False off Linux or where the kernel keeps no sched_info."""

    def __init__(self) -> None:
        try:
            self._fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        except OSError:
            self._fd = -1
        self.available = self._fd >= 0

    def read(self) -> bytes:
        return os.pread(self._fd, 64, 0) if self._fd >= 0 else b"-1 -1 -1"

    @staticmethod
    def decode(raw: bytes) -> tuple[int, int, int]:
        ran, waited, slices = raw.split()
        return int(ran), int(waited), int(slices)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
