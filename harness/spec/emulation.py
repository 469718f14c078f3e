"""Emulated devices, in one place: a worker's slowdown at each step (a constant, a schedule
of (step, factor) points, and jitter on top) and the stretch that applies it to a compute
phase. The training loops, the tensorflow-ps coordinator, the cost models and the simulator
all take a worker's slowdown from here, so a step is slowed alike wherever it is computed or
predicted."""

from __future__ import annotations

import random
import time
from typing import Protocol


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
    Sleeps for the bulk and spins the last stretch, as sleep overshoots by ~50-100 us."""

    SPIN_NS = 100_000

    def __init__(self, factor: float) -> None:
        self.extra = factor - 1.0
        self.total_ns = 0

    def __call__(self, start: int, end: int) -> int:
        if self.extra <= 0.0:
            return end
        target = end + int(self.extra * (end - start))
        remaining = target - time.perf_counter_ns()
        if remaining > self.SPIN_NS:
            time.sleep((remaining - self.SPIN_NS) / 1e9)
        while (now := time.perf_counter_ns()) < target:
            pass
        self.total_ns += now - end
        return now
