"""CPU time of all of this process's threads, exact at the moment it is read.

The process CPU clock (``time.process_time_ns``) is not that: Linux folds a thread's running
time into the process total only when the scheduler updates it (a tick, a switch), so while
the intra-op pool's threads are still running on other cores the process clock lags them by
up to a tick each, and one step's difference can come out *smaller* than the main thread's
own CPU time (seen in CI on two cores). A thread's own CPU clock, read from another thread,
makes the kernel bring that thread's runtime up to date first, so summing the per-thread
clocks is exact. Each read is a system call (~2 us inside a step), so a sample reads only
the threads that ran since the look before the last (the busy ones: the main thread, the
intra-op pool, the gloo threads that exchange every step); the others (idle process
groups' threads, a pool that never ran) are read at each look, every REFRESH_EVERY steps,
and keep that reading in between: CPU time such a thread spends between two looks counts
at the next look, up to REFRESH_EVERY steps late. Noticing whether threads came or went is
done at the same looks.

Threads that exit during a step take their CPU time with them (nothing can read it any
more); a thread born during a step counts from its birth once the threads are listed
again (every REFRESH_EVERY refreshing samples). Off Linux, the process clock.
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
    """``sample()`` now, ``sample()`` later, ``elapsed(a, b)``: the CPU time all threads
    spent in between. Made in the process it measures (``/proc/self`` is read lazily)."""

    # Noticing threads that came or went costs a stat of /proc/self/task, ~2.5 us alone but
    # ~10 us inside a step (benchmarks/overhead.py): done at each of the first REFRESH_EVERY
    # refreshing samples (the intra-op pool starts at the first step's first parallel op),
    # then every REFRESH_EVERY. A thread born later counts from the next look; one that
    # exited is noticed as soon as its clock cannot be read.
    REFRESH_EVERY = 16

    def __init__(self) -> None:
        self._exact = os.path.isdir(TASKS)
        self._pid = -1
        self._links = -1
        self._clocks: dict[int, int] = {}
        self._until_refresh = 0
        self._refreshes = 0
        self._own = threading.get_native_id()  # the thread that made the clock (`own`)
        self._looked: dict[int, int] = {}  # every thread's time at the last look
        self._busy: list[tuple[int, int]] = []  # (tid, clock) of the threads read each sample

    def _refresh(self) -> None:
        """Re-list the threads when their number changed (a task directory's link count is
        two plus its threads) or this is a new process."""
        links = os.stat(TASKS).st_nlink
        if links != self._links or self._pid != os.getpid():
            self._pid, self._links = os.getpid(), links
            self._clocks = {int(tid): thread_clock_id(int(tid)) for tid in os.listdir(TASKS)}

    def sample(self, refresh: bool = True) -> dict[int, int]:
        """Each living thread's CPU time in ns (key -1: the process clock, off Linux).
        `refresh=False` reads the threads listed last time, without checking for new ones
        (a window's first sample: a thread born after it counts from its birth anyway).
        A refreshing sample lists the threads again every REFRESH_EVERY calls."""
        if not self._exact:
            return {-1: time.process_time_ns()}
        if refresh:
            self._until_refresh -= 1
        if (refresh and self._until_refresh <= 0) or self._pid != os.getpid():
            self._refresh()
            self._refreshes += 1
            self._until_refresh = 1 if self._refreshes < self.REFRESH_EVERY \
                else self.REFRESH_EVERY
            return self._look()
        read, times = time.clock_gettime_ns, dict(self._looked)
        for tid, clock in self._busy:
            try:
                times[tid] = read(clock)
            except OSError:       # exited since the listing; the next sample re-lists
                del times[tid]
                self._links = -1
                self._until_refresh = 0
        return times

    def _look(self) -> dict[int, int]:
        """Every listed thread read; the busy ones are those whose time moved since the
        last look, new ones and the clock's own thread."""
        read, times = time.clock_gettime_ns, {}
        for tid, clock in self._clocks.items():
            try:
                times[tid] = read(clock)
            except OSError:       # exited since the listing; the next sample re-lists
                self._links = -1
                self._until_refresh = 0
        looked, self._looked = self._looked, times
        self._busy = [(tid, self._clocks[tid]) for tid, t in times.items()
                      if tid == self._own or looked.get(tid) != t]
        return times

    def own(self, sample: dict[int, int]) -> int:
        """The CPU time of the thread that made the clock, from `sample` where it was read
        there (one system call fewer), else read now."""
        mine = sample.get(self._own)
        return time.thread_time_ns() if mine is None else mine

    @staticmethod
    def elapsed(begin: dict[int, int], end: dict[int, int]) -> int:
        return sum(t - begin.get(tid, 0) for tid, t in end.items())
