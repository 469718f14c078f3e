"""The process counters a step records beside its phases.

Every step, over its compute (begin to ready), what the kernel counted of the main thread,
which drives the step (its time is the step's): the CPU time it ran (its thread CPU clock)
and the time it waited on a run queue for a CPU, and how many times it got one (its
schedstat, harness/system/procfs.py): two system calls as the step begins and two as its
compute ends, decoded when the writer builds the row (`Readings`).

Over one step in every `counters_every` (a run's key, default 8), more: over the compute,
all of the worker's threads and the processes they started (the intra-op pool, a job's
DataLoader processes; harness/system/perf.py): their CPU time, minor and major page
faults, context switches and migrations, and where the host has a PMU instructions, cycles
and cache misses (UNMEASURED where not: the manifest's workers[].counters say why); over
the whole step, context switches and user and system CPU time (getrusage). The steps
between hold UNMEASURED (-1) in those fields. Right after a step's compute a system call
costs 10-40 us on this machine class, several times its cost in a loop of its own
(benchmarks/overhead.py --parts: the perf group's read ~40, the schedstat's ~30, the thread
clock's ~10): reading everything at every step cost ~90 us a step, where the budget is 50.
`counters_every = 1` reads everything at every step.

Where the kernel refuses perf events (perf_event_paranoid 3, a seccomp filter), the CPU
time of all threads is read by their CPU clocks (harness/system/cputime.py) on the sampled
steps, and the faults, switches and migrations are UNMEASURED.

The garbage collector's time is counted by a callback at no cost in the step and recorded
at every step; RSS moves slowly and is read at a sampled step at most every RSS_EVERY
steps and held in between.
"""

from __future__ import annotations

import gc
import os
import resource
import time
from typing import Any

from hetbench.harness.records.collector import UNMEASURED
from hetbench.harness.system import perf
from hetbench.harness.system.cputime import ThreadsCpuClock
from hetbench.harness.system.procfs import ThreadSchedstat

# the compute's counters in the record's order (harness/records/fields.py: the `cpu` writer)
COMPUTE_FIELDS = ("compute_cpu_ns", "compute_cpu_all_ns", "compute_wait_ns", "compute_slices",
                  "compute_faults", "compute_major_faults", "compute_switches",
                  "compute_migrations", "compute_instructions", "compute_cycles",
                  "compute_cache_misses")
UNMEASURED_COMPUTE = (UNMEASURED,) * len(COMPUTE_FIELDS)  # a step whose counters were not read
_UNMEASURED_USAGE = (UNMEASURED,) * 4
_NO_HARDWARE = (UNMEASURED,) * len(perf.HARDWARE)


def describe() -> dict[str, str]:
    """What the manifest says of the counters this worker's records hold (workers[].counters):
    each source counted, or why not."""
    out = perf.open_process_counters().describe()
    schedstat = ThreadSchedstat()
    out["run_queue"] = ("counted" if schedstat.available
                        else "not available here: no /proc/thread-self/schedstat")
    schedstat.close()
    return out


class GcTimer:
    """Time spent in the cyclic garbage collector, via gc.callbacks."""

    def __init__(self) -> None:
        self.total_ns = 0
        self.collections = 0
        self._start = 0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._start = time.perf_counter_ns()
        else:
            self.total_ns += time.perf_counter_ns() - self._start
            self.collections += 1

    def take(self) -> tuple[int, int]:
        out = (self.total_ns, self.collections)
        self.total_ns = self.collections = 0
        return out


class Readings:
    """A step's raw readings at its begin and at the end of its compute, decoded into the
    record's COMPUTE_FIELDS by `values()` (when the writer builds the row)."""

    __slots__ = ("counters", "begin", "end")

    def __init__(self, counters: Counters, begin: tuple[Any, ...], end: tuple[Any, ...]
                 ) -> None:
        self.counters, self.begin, self.end = counters, begin, end

    def values(self) -> tuple[int, ...]:
        return self.counters.decode(self.begin, self.end)


class Counters:
    """A step's counters: `start()` as the step begins, `compute()` when its compute is
    done (its Readings), `take()` once it has ended; one step in `every` reads getrusage
    (psutil's equivalents cost 30-150 us: docs/frameworks.md)."""

    RSS_EVERY = 8

    def __init__(self, every: int = 1) -> None:
        self.every = every
        self.kernel = perf.open_process_counters()  # opened before the framework, or now
        self.schedstat = ThreadSchedstat()
        software, hardware = self.kernel.software, self.kernel.hardware
        self.clock = None if software is not None else ThreadsCpuClock()
        # what a reading is, bound once: each lookup costs right after a step's compute
        self._fds = (software.fds[0] if software else -1, software.size if software else 0,
                     hardware.fds[0] if hardware else -1, hardware.size if hardware else 0)
        self._statm = os.open("/proc/self/statm", os.O_RDONLY)
        self._page = os.sysconf("SC_PAGE_SIZE")
        self._steps = 0
        self._sampled = False
        self._begin: tuple[Any, ...] = ()
        self._usage: Any = None
        self._rss = 0
        self._rss_at = -self.RSS_EVERY
        # an unsampled step's counters when the collector did not run: built once per RSS
        # read, not at every step (each Python operation right after a step costs several
        # times its cost in a loop of its own: benchmarks/overhead.py)
        self._quiet = (*_UNMEASURED_USAGE, 0, 0, 0)
        self.gc = GcTimer()

    def start(self) -> bool:
        """A step begins: its first readings (on a sampled step the kernel's counts of all
        threads, or their CPU clocks, and getrusage too). Returns whether it is sampled."""
        steps = self._steps
        self._steps = steps + 1
        self._sampled = sampled = not steps % self.every
        every_thread = None
        if sampled:
            self._usage = resource.getrusage(resource.RUSAGE_SELF)
            every_thread = self._every_thread()
        self._begin = (self.schedstat.read(), time.thread_time_ns(), every_thread)
        return sampled

    def compute(self) -> Readings:
        """The step's compute is done: its readings since start()."""
        main = (time.thread_time_ns(), self.schedstat.read())
        begin = self._begin
        threads = begin[2]
        if threads is None:
            return Readings(self, begin, (*main, None))
        clock = self.clock
        if clock is not None:  # no kernel counts: the threads' CPU clocks
            return Readings(self, begin, (*main, clock.stop(threads)))
        return Readings(self, begin, (*main, self._every_thread()))

    def _every_thread(self) -> Any:
        """The kernel's counts of every thread (raw), or the start of their CPU clocks'."""
        sw, sw_size, hw, hw_size = self._fds
        if sw < 0:
            return self.clock.start() if self.clock is not None else None
        return os.read(sw, sw_size), os.read(hw, hw_size) if hw >= 0 else None

    def decode(self, begin: tuple[Any, ...], end: tuple[Any, ...]) -> tuple[int, ...]:
        """COMPUTE_FIELDS from a step's raw readings."""
        (sched0, cpu0, every0), (cpu1, sched1, every1) = begin, end
        if self.schedstat.available:
            _, wait0, slices0 = ThreadSchedstat.decode(sched0)
            _, wait1, slices1 = ThreadSchedstat.decode(sched1)
            queue = (wait1 - wait0, slices1 - slices0)
        else:
            queue = (UNMEASURED, UNMEASURED)
        counted: tuple[int, ...] = (UNMEASURED,) * len(perf.SOFTWARE)
        pmu = _NO_HARDWARE
        software, hardware = self.kernel.software, self.kernel.hardware
        if every1 is None:  # a step between the sampled ones
            pass
        elif software is None:  # the threads' CPU clocks: (own, every)
            counted = (every1[1], *counted[1:])
        else:
            (sw0, hw0), (sw1, hw1) = every0, every1
            counted = tuple(b - a for a, b in zip(software.decode(sw0), software.decode(sw1),
                                                  strict=True))
            if hardware is not None and hw0 is not None:
                pmu = tuple(b - a for a, b in zip(hardware.decode(hw0), hardware.decode(hw1),
                                                  strict=True))
        cpu_all, faults, major, switches, migrations = counted
        return (cpu1 - cpu0, cpu_all, *queue, faults, major, switches, migrations, *pmu)

    def take(self) -> tuple[int, int, int, int, int, int, int]:
        """Context switches (voluntary, involuntary), user and system CPU since start() (or
        UNMEASURED), RSS, the garbage collector's time and collections since the last
        take()."""
        if not self._sampled:
            if not self.gc.collections:  # most steps: nothing new, the row made before
                return self._quiet
            gc_ns, gc_count = self.gc.take()
            return (*_UNMEASURED_USAGE, self._rss, gc_ns, gc_count)
        gc_ns, gc_count = self.gc.take()
        now, last = resource.getrusage(resource.RUSAGE_SELF), self._usage
        if self._steps - self._rss_at >= self.RSS_EVERY:
            self._rss_at = self._steps
            self._rss = int(os.pread(self._statm, 64, 0).split()[1]) * self._page
            self._quiet = (*_UNMEASURED_USAGE, self._rss, 0, 0)
        return (now.ru_nvcsw - last.ru_nvcsw, now.ru_nivcsw - last.ru_nivcsw,
                int((now.ru_utime - last.ru_utime) * 1e9),
                int((now.ru_stime - last.ru_stime) * 1e9), self._rss, gc_ns, gc_count)
