"""The process counters a step records beside its phases: the CPU time of the main thread
and of all threads during compute (harness/system/cputime.py), context switches and user
and system CPU time over the step (getrusage), RSS (/proc/self/statm) and the cyclic
garbage collector's time.

Each of the CPU clocks and getrusage is a system call: ~1 us alone, but 7-20 us right
after a step's compute on this machine class (benchmarks/overhead.py), so reading them at
every step cost 40-130 us a step. They are read over one step in every `counters_every`
(a run's key, default COUNTERS_EVERY); the steps between hold UNMEASURED (-1) in those
fields. The garbage collector's time is counted by a callback at no cost in the step and
recorded at every step; RSS moves slowly and is read at a sampled step at most every
RSS_EVERY steps and held in between.
"""

from __future__ import annotations

import gc
import os
import resource
import time
from typing import Any

from hetbench.harness.records.collector import UNMEASURED
from hetbench.harness.system.cputime import ThreadsCpuClock

UNMEASURED_CPU = (UNMEASURED, UNMEASURED)  # compute_cpu() of a step not sampled
_UNMEASURED_USAGE = (UNMEASURED,) * 4


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


class Counters:
    """A step's counters: `start()` as the step begins, `compute_cpu()` when its compute is
    done, `take()` once it has ended; one step in `every` reads the system's counters
    (psutil's equivalents cost 30-150 us: docs/frameworks.md)."""

    RSS_EVERY = 8

    def __init__(self, every: int = 1) -> None:
        self.every = every
        self.clock = ThreadsCpuClock()
        self._statm = os.open("/proc/self/statm", os.O_RDONLY)
        self._page = os.sysconf("SC_PAGE_SIZE")
        self._steps = 0
        self._sampled = False
        self._cpu: list[int] = []
        self._usage: Any = None
        self._rss = 0
        self._rss_at = -self.RSS_EVERY
        # an unsampled step's counters when the collector did not run: built once per RSS
        # read, not at every step (each Python operation right after a step costs several
        # times its cost in a loop of its own: benchmarks/overhead.py)
        self._quiet = (*_UNMEASURED_USAGE, 0, 0, 0)
        self.gc = GcTimer()

    def start(self) -> bool:
        """A step begins: on a sampled step, the CPU clocks and getrusage are read. Returns
        whether it is sampled (if not, compute_cpu() is UNMEASURED_CPU: a caller may skip
        the call, ~1 us right after a step's compute)."""
        steps = self._steps
        self._steps = steps + 1
        self._sampled = sampled = not steps % self.every
        if sampled:
            self._usage = resource.getrusage(resource.RUSAGE_SELF)
            self._cpu = self.clock.start()
        return sampled

    def compute_cpu(self) -> tuple[int, int]:
        """The CPU time of the main thread and of all threads since start(), or UNMEASURED."""
        return self.clock.stop(self._cpu) if self._sampled else UNMEASURED_CPU

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
