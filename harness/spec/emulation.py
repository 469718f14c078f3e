"""Emulated devices, in one place: a worker's slowdown at each step (a constant, a schedule
of (step, factor) points, and jitter on top) and the stretch that applies it to a compute
phase. The training loops, the tensorflow-ps coordinator, the cost models and the simulator
all take a worker's slowdown from here, so a step is slowed alike wherever it is computed or
predicted."""

from __future__ import annotations

import random
import time
from typing import Protocol

from hetbench.harness.system import timers
from hetbench.harness.system.procfs import ThreadSchedstat


class Emulated(Protocol):
    """The fields of a worker spec (hetbench.harness.spec.suite.WorkerSpec) that say how it is
    slowed."""

    @property
    def slowdown(self) -> float: ...

    @property
    def slowdown_at(self) -> tuple[tuple[int, float], ...] | None: ...

    @property
    def jitter(self) -> tuple[float, float] | None: ...


def scheduled(worker: Emulated, step: int) -> float:
    """The schedule's factor at `step`: linear between points, held before the first and
    after the last; `slowdown` where there is no schedule."""
    points = worker.slowdown_at
    if not points:
        return worker.slowdown
    if step <= points[0][0]:
        return points[0][1]
    for (s0, f0), (s1, f1) in zip(points, points[1:], strict=False):
        if step <= s1:
            return f0 + (f1 - f0) * (step - s0) / (s1 - s0)
    return points[-1][1]


def factor_at(worker: Emulated, step: int, seed: int, rank: int) -> float:
    """The slowdown of step `step` of worker `rank`: the schedule's, times the jitter factor
    on the steps the jitter hits, drawn from (seed, rank, step) so that every repeat and
    every scheme sees the same steps slowed."""
    factor = scheduled(worker, step)
    if worker.jitter is not None:
        probability, extra = worker.jitter
        if random.Random(seed * 1_000_003 + rank * 10_007 + step).random() < probability:
            factor *= extra
    return factor


def least(worker: Emulated) -> float:
    """The least slowdown the worker ever has (jitter only adds to it)."""
    points = worker.slowdown_at
    return min(f for _, f in points) if points else worker.slowdown


class Stretcher:
    """Emulated slowdown: after a compute phase of d ns, wait (factor - 1) * d more.

    The wait sleeps for the bulk (its timer slack cut to 1 ns: harness/system/timers.py)
    and spins the last SPIN_NS (a sleep ends ~50 us late here with a core free), and
    whatever it still overshoots (milliseconds when no core is free to wake it, or the
    spinning thread lost its core) is taken off the next phase's stretch, up to that
    stretch's length: the emulated device's time adds up over the phases and steps to the
    factor's. Before (issue 76) an overshoot stayed in its step, and the emulation was the
    largest source of the slowed worker's variability. `total_ns`: the stretch so far;
    `wait_ns`: of it, the time the thread waited on a run queue for a CPU to wake on
    (harness/system/procfs.py); `cpu_ns`: the thread's CPU time in the stretch (its
    sleeps' calls and reads): neither is the worker's natural compute."""

    SPIN_NS = 100_000

    def __init__(self, factor: float) -> None:
        self.extra = factor - 1.0
        self.total_ns = 0
        self.wait_ns = 0
        self.cpu_ns = 0
        self._owed = 0  # what the last sleep overshot, taken off the next stretch
        self._schedstat: ThreadSchedstat | None = None

    def __call__(self, start: int, end: int) -> int:
        if self.extra <= 0.0:
            return end
        if self._schedstat is None:  # made on the thread that steps, at its first stretch
            self._schedstat = ThreadSchedstat()
            timers.precise_sleeps()
        awake = time.thread_time_ns()
        asked = int(self.extra * (end - start))
        target = end + asked - self._owed
        now = time.perf_counter_ns()
        if target > now:
            schedstat = self._schedstat
            before = schedstat.read()
            if target - now > self.SPIN_NS:
                time.sleep((target - now - self.SPIN_NS) / 1e9)
            while time.perf_counter_ns() < target:
                pass
            if schedstat.available:
                self.wait_ns += schedstat.decode(schedstat.read())[1] \
                    - schedstat.decode(before)[1]
            now = time.perf_counter_ns()  # the reads are the stretch's, owed as its overshoot
            # the overshoot; one of more than was asked is a stop, not a late wake
            self._owed = min(now - target, asked)
        else:  # what was owed beyond this phase's stretch, owed on
            self._owed = now - target
        self.cpu_ns += time.thread_time_ns() - awake
        self.total_ns += now - end
        return now

    def take(self) -> tuple[int, int, int]:
        """The stretch, its wait for a CPU and its own CPU time since the last take (a
        step's record)."""
        out = (self.total_ns, self.wait_ns, self.cpu_ns)
        self.total_ns = self.wait_ns = self.cpu_ns = 0
        return out
