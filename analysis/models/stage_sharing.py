"""Pipelined virtual workers run op by op on a host's shared cores (issue 29).

A pipelined run's average demand for the cores says little about its contention: the
stages of virtual workers in lockstep compute in bursts, together, and wait together. And
hetbench's emulated slow worker sleeps after each op for (factor - 1) x the op's elapsed
time (harness/spec/emulation.py), so a wait for a core inside the op is stretched as well:
contention costs a slow stage `factor` times what it costs a fast one. Measured in the
`pipeline` suite's 1F1B run (2 fast + 2 slow stages, 4 threads on 2 cores): the slow
stage's backward of micro-batch 0, computed while the fast stages waited, took 14 ms;
those of micro-batches 1 and 2, computed beside the fast stages' forwards, 25 ms.

So each op is simulated: its real work (ns alone) progresses at the processor-sharing
rate of the moment, min(1, cores / threads computing), and then the op sleeps its
emulated stretch. An op starts when its stage has done the one before it in the schedule
and its input has arrived (the previous stage's forward of the micro-batch, or the next
stage's backward, plus the link's time), and a wave's first op when the wave may begin
(`WaveGate`). Schedules as torch.distributed.pipelining orders them: GPipe (every
forward, then every backward) and 1F1B (stage s of S first runs min(M, S - s)
forwards, then a backward and a forward in turn, then the backwards left).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

FORWARD, BACKWARD = 0, 1


def schedule(kind: str, stage: int, stages: int, micro_batches: int
             ) -> list[tuple[int, int]]:
    """The (FORWARD or BACKWARD, micro-batch) order of one stage's ops in a wave."""
    if kind == "gpipe":
        return [(FORWARD, m) for m in range(micro_batches)] + \
            [(BACKWARD, m) for m in range(micro_batches)]
    if kind != "1f1b":
        raise ValueError(f"schedule {kind!r}: gpipe or 1f1b")
    warmup = min(micro_batches, stages - stage)
    ops = [(FORWARD, m) for m in range(warmup)]
    for m in range(micro_batches - warmup):
        ops += [(BACKWARD, m), (FORWARD, warmup + m)]
    return ops + [(BACKWARD, m) for m in range(micro_batches - warmup, micro_batches)]


@dataclass(frozen=True)
class Stage:
    group: int  # its virtual worker
    index: int  # its place in the virtual worker's stages
    stages: int  # the virtual worker's stages
    threads: int  # on the host's cores (0: computes elsewhere, never slowed)


# (stage, wave, the stages' wave ends so far: NaN where not yet) -> when the stage may begin
# the wave (NaN: not known yet)
WaveGate = Callable[[int, int, np.ndarray], float]


@dataclass
class _Running:
    left: float  # real work left, ns alone
    began: float
    factor: float


def run_waves(stages: Sequence[Stage], work: np.ndarray, factor: np.ndarray,
              link_ns: Sequence[float], kind: str, micro_batches: int, cores: float | None,
              gate: WaveGate) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Simulate `waves` waves of every stage. `work[k, p, d]`: stage p's real work for one
    micro-batch's op d (FORWARD, BACKWARD) in wave k, ns alone; `factor[k, p]` its emulated
    slowdown; `link_ns[p]` the time to send stage p's output to the next stage (and its
    gradient back). Returns each stage's wave begin, end and busy time (its ops, emulated
    stretch included), each (waves, stages), ns."""
    waves = _Waves(stages, work, factor, link_ns, kind, micro_batches, cores, gate)
    while waves.waiting or waves.running or waves.sleeping:
        waves.advance()
    return waves.begin, waves.end, waves.busy


class _Waves:
    """The state of run_waves' event loop: each stage's wave and next op, the ops running
    (sharing the cores), stretched (sleeping out their emulated slowdown) or done."""

    def __init__(self, stages: Sequence[Stage], work: np.ndarray, factor: np.ndarray,
                 link_ns: Sequence[float], kind: str, micro_batches: int,
                 cores: float | None, gate: WaveGate) -> None:
        self.stages, self.work, self.factor, self.link_ns = stages, work, factor, link_ns
        self.cores, self.gate = cores, gate
        self.waves, count = work.shape[0], len(stages)
        self.orders = [schedule(kind, s.index, s.stages, micro_batches) for s in stages]
        self.position = {(s.group, s.index): p for p, s in enumerate(stages)}
        self.begin = np.full((self.waves, count), np.nan)
        self.end = np.full((self.waves, count), np.nan)
        self.busy = np.zeros((self.waves, count))
        self.done: dict[tuple[int, int, int, int], float] = {}  # (stage, wave, op, mb) -> when
        self.wave = [0] * count
        self.step = [0] * count  # the next op's index in the stage's order
        self.waiting: set[int] = set(range(count))
        self.running: dict[int, _Running] = {}
        self.sleeping: list[tuple[float, int, float]] = []  # (wakes at, stage, op began): heap
        self.now = 0.0

    def ready_at(self, p: int) -> float | None:
        """When stage p's next op may start (None: its input is not computed yet)."""
        s, k = self.stages[p], self.wave[p]
        if self.step[p] == 0:
            at = self.gate(p, k, self.end)
            if np.isnan(at):
                return None
        else:
            at = self.now
        op, mb = self.orders[p][self.step[p]]
        if op == FORWARD and s.index > 0:
            source = self.position[(s.group, s.index - 1)]
            sent = self.done.get((source, k, FORWARD, mb))
            if sent is None:
                return None
            at = max(at, sent + self.link_ns[source])
        elif op == BACKWARD and s.index < s.stages - 1:
            sent = self.done.get((self.position[(s.group, s.index + 1)], k, BACKWARD, mb))
            if sent is None:
                return None
            at = max(at, sent + self.link_ns[p])
        return at

    def advance(self) -> None:
        """Start every op that may start now, then move time to the next event: an op's
        real work done, its stretch slept out, or an op able to start."""
        starts = {p: self.ready_at(p) for p in self.waiting}
        for p, at in starts.items():
            if at is not None and at <= self.now:
                self.waiting.discard(p)
                if self.step[p] == 0:
                    self.begin[self.wave[p], p] = self.now
                op = self.orders[p][self.step[p]][0]
                self.running[p] = _Running(float(self.work[self.wave[p], p, op]), self.now,
                                           float(self.factor[self.wave[p], p]))
        threads = sum(self.stages[p].threads for p in self.running)
        cores = self.cores
        rate = 1.0 if cores is None or threads <= cores else cores / threads
        speed = {p: rate if self.stages[p].threads else 1.0 for p in self.running}
        finish = {p: self.now + r.left / speed[p] for p, r in self.running.items()}
        times = [*finish.values(), *(t for t, _, _ in self.sleeping[:1])]
        times += [at for p, at in starts.items() if p in self.waiting and at is not None]
        if not times:
            raise RuntimeError("pipeline stages wait on each other: no op can start")
        then = min(times)
        for p, r in self.running.items():
            r.left -= (then - self.now) * speed[p]
        self.now = then
        # done: the ops whose end is now (compared as instants: the work left after the
        # subtraction can be a rounding error above 0)
        for p in [p for p, at in finish.items() if at <= self.now]:
            r = self.running.pop(p)
            heapq.heappush(self.sleeping,
                           (self.now + (r.factor - 1.0) * (self.now - r.began), p, r.began))
        self.wake()

    def wake(self) -> None:
        """Ops whose stretch has been slept out are done: each stage's next op, or wave."""
        while self.sleeping and self.sleeping[0][0] <= self.now:
            _, p, began = heapq.heappop(self.sleeping)
            op, mb = self.orders[p][self.step[p]]
            self.done[(p, self.wave[p], op, mb)] = self.now
            self.busy[self.wave[p], p] += self.now - began
            self.step[p] += 1
            if self.step[p] == len(self.orders[p]):
                self.end[self.wave[p], p] = self.now
                self.step[p] = 0
                self.wave[p] += 1
                if self.wave[p] == self.waves:
                    continue
            self.waiting.add(p)
