"""The kernel's own counts of a process's work, through perf_event_open: what a step's
threads spent on a CPU, the page faults they took, their context switches and migrations
(software events, which every Linux kernel has), and instructions, cycles and cache misses
where the host has a PMU (bare metal, most GPU hosts; not the VMs CI runs on:
instructions' open answers ENOENT there).

Each group is opened once, inherited, on the thread that will drive the steps, before it
starts any other (harness/loop/worker.py opens it before the framework is imported): the
kernel then counts every thread and process that thread starts after (the intra-op pool,
gloo's threads, a DataLoader's worker processes), and a read of the group leader gives
the sum over all of them, brought up to date by the kernel at the read (one system call,
~2 us here; ../shared/LINUX-COUNTERS.md). A group opened later counts the threads born
after it and its own thread.

The readings are raw bytes, decoded when a record is built (`decode`), not in the step:
right after a step's compute every Python operation costs several times what it costs in a
loop of its own (benchmarks/overhead.py).
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
from dataclasses import dataclass

# perf_event_open(2): the system call's number by architecture (unistd.h)
_SYSCALL = {"x86_64": 298, "aarch64": 241}.get(platform.machine())
_TYPE_HARDWARE, _TYPE_SOFTWARE = 0, 1
_SW_TASK_CLOCK, _SW_CONTEXT_SWITCHES, _SW_CPU_MIGRATIONS = 1, 3, 4
_SW_PAGE_FAULTS_MIN, _SW_PAGE_FAULTS_MAJ = 5, 6
_HW_CPU_CYCLES, _HW_INSTRUCTIONS, _HW_CACHE_MISSES = 0, 1, 3
_FORMAT_GROUP = 8
_INHERIT, _EXCLUDE_KERNEL, _EXCLUDE_HV = 1 << 1, 1 << 5, 1 << 6
_FLAG_FD_CLOEXEC = 8

# In the order a group's read gives them (the leader first).
SOFTWARE = ("cpu_ns", "faults", "major_faults", "switches", "migrations")
_SOFTWARE_CONFIGS = (_SW_TASK_CLOCK, _SW_PAGE_FAULTS_MIN, _SW_PAGE_FAULTS_MAJ,
                     _SW_CONTEXT_SWITCHES, _SW_CPU_MIGRATIONS)
HARDWARE = ("instructions", "cycles", "cache_misses")
_HARDWARE_CONFIGS = (_HW_INSTRUCTIONS, _HW_CPU_CYCLES, _HW_CACHE_MISSES)


class _Attr(ctypes.Structure):
    """struct perf_event_attr up to PERF_ATTR_SIZE_VER0 (64 bytes): every kernel takes it."""

    _fields_ = [("type", ctypes.c_uint32), ("size", ctypes.c_uint32),
                ("config", ctypes.c_uint64), ("sample_period", ctypes.c_uint64),
                ("sample_type", ctypes.c_uint64), ("read_format", ctypes.c_uint64),
                ("flags", ctypes.c_uint64), ("wakeup_events", ctypes.c_uint32),
                ("bp_type", ctypes.c_uint32), ("config1", ctypes.c_uint64)]


assert ctypes.sizeof(_Attr) == 64


def _open(kind: int, config: int, group: int, flags: int) -> int:
    """One event on the calling thread, any CPU; its fd, or OSError with the errno."""
    if _SYSCALL is None:
        raise OSError(errno.ENOSYS, f"perf_event_open: not known on {platform.machine()}")
    attr = _Attr(type=kind, size=ctypes.sizeof(_Attr), config=config,
                 read_format=_FORMAT_GROUP, flags=flags)
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.syscall(_SYSCALL, ctypes.byref(attr), 0, -1, group, _FLAG_FD_CLOEXEC)
    if fd < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"perf_event_open: {errno.errorcode.get(code, code)} "
                            f"({os.strerror(code)})")
    return int(fd)


@dataclass
class Group:
    """Events opened together and read in one system call: `read()` the raw bytes, `decode`
    them; `names` the values' names in order."""

    names: tuple[str, ...]
    fds: list[int]

    @property
    def size(self) -> int:
        return 8 * (len(self.names) + 1)

    def read(self) -> bytes:
        return os.read(self.fds[0], self.size)

    def decode(self, raw: bytes) -> tuple[int, ...]:
        return struct.unpack_from(f"{len(self.names)}Q", raw, 8)

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []


def open_group(names: tuple[str, ...], kind: int, configs: tuple[int, ...]) -> Group:
    """The events inherited, as a group on the calling thread. Without the privilege to
    count the kernel's side (perf_event_paranoid 2 and not root), their user side."""
    flags = _INHERIT
    fds: list[int] = []
    try:
        for config in configs:
            try:
                fds.append(_open(kind, config, fds[0] if fds else -1, flags))
            except PermissionError:
                if fds or flags & _EXCLUDE_KERNEL:
                    raise
                flags |= _EXCLUDE_KERNEL | _EXCLUDE_HV
                fds.append(_open(kind, config, -1, flags))
    except OSError:
        for fd in fds:
            os.close(fd)
        raise
    return Group(names, fds)


@dataclass
class ProcessCounters:
    """The process's groups: `software` (None, and `software_missing` says why, where the
    kernel refuses), `hardware` (None where no PMU: `hardware_missing` says so)."""

    software: Group | None
    hardware: Group | None
    software_missing: str = ""
    hardware_missing: str = ""

    def describe(self) -> dict[str, str]:
        """What the manifest says of the counters this worker had."""
        return {"software": "counted" if self.software else f"not available here: "
                f"{self.software_missing}",
                "hardware": "counted" if self.hardware else f"not available here: "
                f"{self.hardware_missing}"}


# the process that opened them and its groups (a forked child opens its own)
_PROCESS: tuple[int, ProcessCounters] | None = None


def open_process_counters() -> ProcessCounters:
    """This process's groups, opened on the first call (from the thread that drives the
    steps, before it starts others: the module docstring), the same ones after."""
    global _PROCESS
    if _PROCESS is not None and _PROCESS[0] == os.getpid():
        return _PROCESS[1]
    software = hardware = None
    software_missing = hardware_missing = ""
    try:
        software = open_group(SOFTWARE, _TYPE_SOFTWARE, _SOFTWARE_CONFIGS)
    except OSError as e:
        software_missing = str(e.strerror)
    try:
        hardware = open_group(HARDWARE, _TYPE_HARDWARE, _HARDWARE_CONFIGS)
    except OSError as e:
        hardware_missing = (f"{e.strerror}: no PMU on this host" if e.errno == errno.ENOENT
                            else str(e.strerror))
    counters = ProcessCounters(software, hardware, software_missing, hardware_missing)
    _PROCESS = (os.getpid(), counters)
    return counters
