"""The step engine: the one loop every trainer runs.

A data-parallel worker (harness/loop/worker.py), a pipeline stage (harness/loop/stage.py)
and the tensorflow-ps coordinator (harness/loop/tensorflow_coordinator.py) differ in how a
step is taken: the worker computes its slice and exchanges it, a stage runs one wave of its
schedule, the coordinator collects a step TensorFlow ran on a remote worker. What happens
around the step is the same and lives here, once:

- the emulated slowdown of the step is set before it (hetbench.harness.spec.emulation);
- a profiled step runs inside the profiler's step annotation (harness/loop/profiling.py);
- the step's records are written, in the order taken;
- the held-out evaluation runs when the global steps done reach its next multiple, outside
  any step's timing;
- what the trainer does between steps (repartitioning, keep-alives) runs after the
  evaluation, and the step the trainer names next is taken next, until it names none.

A trainer gives the engine a `Steps`: `take(step)` returns a `Turn`. A turn whose progress
is None took no step of the run's (a left-out worker sitting out while the members step):
its records are written, nothing is evaluated or done between steps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from hetbench.harness.loop.collection import steps_collection
from hetbench.harness.spec.emulation import Stretcher
from hetbench.harness.spec.workers import WorkerSpec

Record = tuple[Any, ...]  # a row in RECORD_DTYPE's field order (hetbench.harness.records.collector)


@dataclass(frozen=True, slots=True)
class Turn:
    """What one turn of the loop did: the step records it leaves (most turns one; a worker
    that sat out one per step it sat out; the coordinator those its remote steps
    completed), the step to take next (None: training is over) and the global steps done
    so far, which evaluation counts (None: no step of the run's was taken)."""

    records: Sequence[Record]
    following: int | None
    progress: int | None


class Steps(Protocol):
    """How a trainer takes a step, and what it does between steps."""

    def take(self, step: int) -> Turn:
        """Take step `step` (timed, recorded): the turn it made."""
        ...

    def between(self, step: int, turn: Turn) -> None:
        """After step `step` was taken, written and evaluated, outside its timing."""
        ...


class Evaluation(Protocol):
    """The held-out evaluation as the engine calls it
    (hetbench.harness.training.evaluation.Evaluator, or a trainer's wrapper that first lines its
    peers up)."""

    def due(self, steps_done: int, /) -> bool: ...

    def __call__(self, steps_done: int, /) -> object: ...


class Profiler(Protocol):
    """What records a window of steps (hetbench.harness.loop.profiling.StepProfiler)."""

    def begin(self, step: int, /) -> None: ...

    def end(self, step: int, /) -> None: ...


def slowdown_schedule(worker: WorkerSpec, stretch: Stretcher, seed: int, rank: int
                      ) -> Callable[[int], None] | None:
    """What sets the stretch to step k's emulated slowdown (a schedule or jitter), or None
    when the worker's slowdown is the same at every step (set once, in the Stretcher)."""
    if not worker.varies:
        return None

    def set_slowdown(step: int) -> None:
        stretch.extra = worker.factor_at(step, seed, rank) - 1.0

    return set_slowdown


def run_steps(steps: Steps, write: Callable[[Record], object],
              evaluation: Evaluation | None = None,
              slowdown: Callable[[int], None] | None = None, first: int = 0,
              profiler: Profiler | None = None, gc_mode: str = "auto") -> int:
    """Take steps from `first` until the trainer names no next one, Python's collector as
    `gc_mode` sets it (RunSpec.gc); returns the turns taken."""
    with steps_collection(gc_mode):
        return _take_steps(steps, write, evaluation, slowdown, first, profiler)


def _take_steps(steps: Steps, write: Callable[[Record], object],
                evaluation: Evaluation | None, slowdown: Callable[[int], None] | None,
                first: int, profiler: Profiler | None) -> int:
    following: int | None = first
    turns = 0
    while following is not None:
        step = following
        if slowdown is not None:
            slowdown(step)
        if profiler is None:
            turn = steps.take(step)
        else:
            profiler.begin(step)
            turn = steps.take(step)
            profiler.end(step)
        turns += 1
        for record in turn.records:
            write(record)
        following = turn.following
        if turn.progress is None:
            continue
        if evaluation is not None and evaluation.due(turn.progress):
            evaluation(turn.progress)
        steps.between(step, turn)
    return turns
