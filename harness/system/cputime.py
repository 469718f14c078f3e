"""CPU time of all of this process's threads, exact at the moment it is read.

The process CPU clock (``time.process_time_ns``) is not that: Linux folds a thread's running
time into the process total only when the scheduler updates it (a tick, a switch), so while
the intra-op pool's threads are still running on other cores the process clock lags them by
up to a tick each, and one step's difference can come out *smaller* than the main thread's
own CPU time (seen in CI on two cores). A thread's own CPU clock, read from another thread,
makes the kernel bring that thread's runtime up to date first, so summing the per-thread
clocks is exact. Each read is a system call (~1 us alone, several inside a step), so a
window reads only the threads that ran since the look before the last (the busy ones: the
main thread, the intra-op pool, the gloo threads that exchange every step); the others
(idle process groups' threads, a pool that never ran) are read at each look, every
REFRESH_EVERY windows, and keep that reading in between: CPU time such a thread spends
between two looks counts at the next look, up to REFRESH_EVERY windows late. Noticing
whether threads came or went is done at the same looks.

Threads that exit during a step take their CPU time with them (nothing can read it any
more); a thread born during a step counts from its birth once the threads are listed
again (every REFRESH_EVERY windows). Off Linux, the process clock.

A window is `begin = clock.start()` ... `own, every = clock.stop(begin)`: the CPU time of
the thread that made the clock and of all threads in between. Between looks a window is
two reads of each busy thread's clock and a subtraction, nothing more (a step's budget for
all of its instrumentation is 30 us: issue 28).
"""

from __future__ import annotations

import os
import threading
import time

TASKS = "/proc/self/task"
# clockid of thread `tid`'s CPU clock, as glibc's pthread_getcpuclockid builds it:
# ~tid << 3, CPUCLOCK_SCHED (2) | CPUCLOCK_PERTHREAD (4)
_PER_THREAD_SCHED = 6


def thread_clock_id(tid: int) -> int:
    return ((~tid) << 3) | _PER_THREAD_SCHED


class ThreadsCpuClock:
    """`begin = start()`, later `own, every = stop(begin)`: the CPU time the thread that
    made the clock, and all threads, spent in between. Made in the process it measures
    (`/proc/self` is read lazily)."""

    # Noticing threads that came or went costs a stat of /proc/self/task, ~2.5 us alone but
    # ~10 us inside a step (benchmarks/overhead.py): done at each of the first REFRESH_EVERY
    # windows (the intra-op pool starts at the first step's first parallel op), then every
    # REFRESH_EVERY. A thread born later counts from the next look; one that exited is
    # noticed as soon as its clock cannot be read.
    REFRESH_EVERY = 16

    def __init__(self) -> None:
        self._exact = os.path.isdir(TASKS)
        self._pid = -1
        self._links = -1
        self._clocks: dict[int, int] = {}
        self._until_refresh = 0
        self._refreshes = 0
        self._own = threading.get_native_id()  # the thread that made the clock
        self._looked: dict[int, int] = {}  # every thread's time at the last look
        # the threads read in every window, the clock's own thread first: (tid, clock id)
        self._busy: list[tuple[int, int]] = [(self._own, thread_clock_id(self._own))]

    @property
    def threads(self) -> frozenset[int]:
        """The threads listed at the last look."""
        return frozenset(self._clocks)

    def start(self) -> list[int]:
        """The window's first readings: each busy thread's clock (-1: it could not be read).
        A thread born after this counts from its birth once it is listed."""
        if not self._exact:
            return [time.thread_time_ns(), time.process_time_ns()]
        return self._read(self._busy)

    def stop(self, begin: list[int]) -> tuple[int, int]:
        """The CPU time since `start()` gave `begin`: of the clock's own thread, and of all
        threads (every REFRESH_EVERY windows, and at each of the first, the threads are
        listed and read again: what the others spent since the last look counts here)."""
        if not self._exact:
            return time.thread_time_ns() - begin[0], time.process_time_ns() - begin[1]
        busy = self._busy
        self._until_refresh -= 1
        if self._until_refresh > 0:
            end = self._read(busy)
            every = 0
            for b, e in zip(begin, end, strict=True):
                if b >= 0 and e >= 0:
                    every += e - b
            return end[0] - begin[0], every
        # a look: every thread's time since the window began (busy ones) or since the last
        # look (the others), a thread listed for the first time since its birth
        started = {tid: b for (tid, _), b in zip(busy, begin, strict=True) if b >= 0}
        previous = self._look()
        times = self._looked
        every = sum(t - started.get(tid, previous.get(tid, 0)) for tid, t in times.items())
        own = times[self._own] - begin[0]
        return own, every

    def _read(self, threads: list[tuple[int, int]]) -> list[int]:
        read, out = time.clock_gettime_ns, []
        for _, clock in threads:
            try:
                out.append(read(clock))
            except OSError:  # exited since the listing: the next window looks again
                out.append(-1)
                self._links = -1
                self._until_refresh = 0
        return out

    def _look(self) -> dict[int, int]:
        """List the threads again where their number changed (a task directory's link count
        is two plus its threads) or this is a new process, read every one, and keep as busy
        those whose time moved since the last look (and the clock's own thread). Returns
        the readings of the look before."""
        self._refreshes += 1
        self._until_refresh = 1 if self._refreshes < self.REFRESH_EVERY else self.REFRESH_EVERY
        links = os.stat(TASKS).st_nlink
        if links != self._links or self._pid != os.getpid():
            self._pid, self._links = os.getpid(), links
            self._own = threading.get_native_id()  # a forked child's own thread is new
            self._clocks = {int(tid): thread_clock_id(int(tid)) for tid in os.listdir(TASKS)}
        read, times = time.clock_gettime_ns, {}
        for tid, clock in self._clocks.items():
            try:
                times[tid] = read(clock)
            except OSError:       # exited since the listing; the next window lists again
                self._links = -1
                self._until_refresh = 0
        looked, self._looked = self._looked, times
        own = self._own
        self._busy = [(own, thread_clock_id(own))] + [
            (tid, self._clocks[tid]) for tid, t in times.items()
            if tid != own and looked.get(tid) != t]
        return looked
