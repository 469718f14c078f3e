"""The process counters each step records beside its phases: context switches, CPU time and
RSS (getrusage, /proc/self/statm) and the cyclic garbage collector's time."""

from __future__ import annotations

import gc
import os
import resource
import time
from typing import Any


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
    """Per-step process counters: context switches and CPU time from getrusage (~2 us in
    the loop; psutil's equivalents cost 30-150 us, docs/frameworks.md). RSS moves slowly
    and reading /proc/self/statm costs ~7 us in the loop, so it is sampled every
    RSS_EVERY steps and held in between."""

    RSS_EVERY = 8

    def __init__(self) -> None:
        self._statm = os.open("/proc/self/statm", os.O_RDONLY)
        self._page = os.sysconf("SC_PAGE_SIZE")
        self._last = resource.getrusage(resource.RUSAGE_SELF)
        self._calls = 0
        self._rss = 0
        self.gc = GcTimer()

    def take(self) -> tuple[int, int, int, int, int, int, int]:
        now = resource.getrusage(resource.RUSAGE_SELF)
        last, self._last = self._last, now
        if self._calls % self.RSS_EVERY == 0:
            self._rss = int(os.pread(self._statm, 64, 0).split()[1]) * self._page
        self._calls += 1
        rss = self._rss
        gc_ns, gc_count = self.gc.take()
        return (now.ru_nvcsw - last.ru_nvcsw, now.ru_nivcsw - last.ru_nivcsw,
                int((now.ru_utime - last.ru_utime) * 1e9),
                int((now.ru_stime - last.ru_stime) * 1e9), rss, gc_ns, gc_count)
