"""Phase timing of one training step: a mark at the end of each phase (collector.PHASES, in
order), on the host's monotonic clock, so that the workers' marks line up across processes.

What each phase needs is data (RULES): whether the device may still be working when the host
has issued the phase (a CUDA stream, MXNet's engine: wait for it before the mark, or the
mark says when the work was queued, not done) and whether the emulated slowdown stretches it
(the compute phases).

The loop reads the host clock at the end of each phase and hands the instant to the timer
(`end(now)`, the phases in PHASES order): for the common CPU worker that instant is the
mark, and `end` is the marks list's own append, so a mark runs no Python function. Right
after a phase's compute, with the caches cold, a mark through a Python method cost ~1 us
(9 a step: ~9 us), the append ~0.4 (benchmarks/overhead.py --parts; issue 28's budget for
all of a step's instrumentation is 30 us).

Three timers:
- `HostTimer` (a worker whose device is the host and whose phases nothing stretches: the
  common CPU worker) keeps the loop's instants: no wait, no stretch, no check of the
  phase's rules (the record checks that every phase was marked).
- `StepTimer` waits for the device before each such mark (`synchronize`, the adapter's).
  Simple and exact on the host clock, but on a GPU each wait drains the queue: a short
  phase is inflated by the launch latency and the next phase cannot overlap it.
- `CudaEventTimer` (a CUDA worker with no emulated slowdown) records a CUDA event on the
  current stream at the end of each compute phase instead, and waits once, for the pack,
  where the host must have the gradients before the exchange reads them; the compute marks
  are then the step's host begin plus each event's time since the begin event. The
  exchange, unpack and apply are timed as StepTimer times them (the host takes part).
  A slowed worker keeps StepTimer: stretching a phase needs its duration as it ends.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from time import perf_counter_ns  # a module global: one lookup less per mark than time.X
from typing import Protocol

from hetbench.adapters.base import TimingEvent
from hetbench.harness.records.collector import PHASES, Phase


@dataclass(frozen=True)
class PhaseRule:
    device: bool  # the device may still be working when the host is done with the phase
    stretched: bool  # a compute phase: the emulated slowdown stretches it


RULES: dict[Phase, PhaseRule] = {
    Phase.LOAD: PhaseRule(device=False, stretched=True),  # the host reads and prepares
    Phase.TO_DEVICE: PhaseRule(device=True, stretched=True),
    Phase.FORWARD: PhaseRule(device=True, stretched=True),
    Phase.BACKWARD: PhaseRule(device=True, stretched=True),
    Phase.PACK: PhaseRule(device=True, stretched=True),
    Phase.ALLREDUCE: PhaseRule(device=True, stretched=False),
    Phase.UNPACK: PhaseRule(device=True, stretched=False),
    Phase.APPLY: PhaseRule(device=True, stretched=False),
}
_ORDERED = tuple((phase, RULES[phase]) for phase in PHASES)


class PhaseTimer(Protocol):
    """What the loop asks of a phase timer: a begin, then each phase's end in PHASES order,
    `end(now)` with `now` the host clock (perf_counter_ns) as the loop read it; `marks`
    are then the record's instants (begin, each phase's end) on the host clock."""

    marks: list[int]

    def begin(self) -> None: ...

    @property
    def end(self) -> Callable[[int], object]: ...

    def end_at(self, phase: Phase, instant: int) -> None: ...

    def durations(self) -> list[int]: ...


class StepTimer:
    """Host-clock marks, waiting for the device first where RULES say it may be busy.
    `synchronize`: the adapter's wait for its device, or None where the host's return means
    the work is done (PyTorch on CPU)."""

    def __init__(self, stretch: Callable[[int, int], int],
                 synchronize: Callable[[], None] | None = None) -> None:
        self.stretch = stretch
        self.synchronize = synchronize
        self.marks: list[int] = []

    def begin(self) -> None:
        self.marks = [perf_counter_ns()]

    def end(self, now: int) -> None:
        """The end of the next phase in PHASES order, the loop's clock reading `now`; where
        the device may be busy, read again once it is done."""
        marks = self.marks
        if len(marks) > len(_ORDERED):
            raise RuntimeError(f"a step marked more than its {len(PHASES)} phases")
        rule = _ORDERED[len(marks) - 1][1]
        if rule.device and self.synchronize is not None:
            self.synchronize()
            now = perf_counter_ns()
        marks.append(self.stretch(marks[-1], now) if rule.stretched else now)

    def end_at(self, phase: Phase, instant: int) -> None:
        """The end of `phase` at an `instant` (host clock, no earlier than the last mark)
        measured by whoever knew it, stretched there if at all: an overlapped backward
        ends when its last gradient bucket was handed over (harness/exchange/ddp.py)."""
        marks = self.marks
        expected = _ORDERED[len(marks) - 1][0]
        if phase is not expected:
            raise RuntimeError(f"phase {phase.value} ended where {expected.value} was due")
        marks.append(max(instant, marks[-1]))

    def durations(self) -> list[int]:
        """Each phase's duration, in PHASES order (after the last phase has ended)."""
        marks = self.marks
        return [b - a for a, b in zip(marks, marks[1:], strict=False)]


class HostTimer:
    """Host-clock marks and nothing else: for a worker whose device needs no wait (PyTorch
    and TensorFlow on the CPU) and whose phases no emulated slowdown stretches. The order of
    the phases is the caller's to keep (StepTimer checks it: the same trainer runs under
    both in the tests); the record checks that every phase was marked."""

    def __init__(self) -> None:
        self.marks: list[int] = []
        self.end: Callable[[int], object] = self.marks.append

    def begin(self) -> None:
        # a new list each step: a record keeps its marks until the writer builds its row
        self.marks = marks = [perf_counter_ns()]
        self.end = marks.append

    def end_at(self, phase: Phase, instant: int) -> None:
        marks = self.marks
        marks.append(max(instant, marks[-1]))

    def durations(self) -> list[int]:
        marks = self.marks
        return [b - a for a, b in zip(marks, marks[1:], strict=False)]


class CudaEventTimer(StepTimer):
    """Compute phases timed by CUDA events on the current stream (module docstring).
    `events`: how to make a timing event (torch.cuda.Event(enable_timing=True)); the
    stream is the one the adapter's work is queued on."""

    def __init__(self, synchronize: Callable[[], None], new_event: Callable[[], TimingEvent]
                 ) -> None:
        super().__init__(lambda start, end: end, synchronize)
        self.events = [new_event() for _ in range(PHASES.index(Phase.PACK) + 2)]

    def begin(self) -> None:
        # the previous step ended with the device idle (its apply waited for it), so the
        # begin event runs as soon as it is queued: its instant is the host's
        self.marks = [perf_counter_ns()]
        self.events[0].record()

    def end_at(self, phase: Phase, instant: int) -> None:
        raise RuntimeError("CUDA-event timing marks its own phases (an overlapped exchange "
                           "is timed by StepTimer: hetbench.harness.loop.trainer.phase_timer)")

    def end(self, now: int) -> None:
        index = len(self.marks)
        if index >= len(self.events):  # exchange, unpack, apply: on the host clock
            super().end(now)
            return
        self.events[index].record()
        self.marks.append(-1)  # resolved once the pack is done
        if index == len(self.events) - 1:  # the pack
            self.events[index].synchronize()  # the host needs the gradients now
            first, begin = self.events[0], self.marks[0]
            for i in range(1, index + 1):
                self.marks[i] = begin + int(first.elapsed_time(self.events[i]) * 1e6)
