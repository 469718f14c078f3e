"""The step engine's contract (harness/loop/engine.py): what every trainer's loop does around
its steps. The trainers themselves run in the suites' tests (test_worker, test_pipeline,
test_tensorflow_ps, test_membership); here a scripted trainer shows the order."""

from __future__ import annotations

from dataclasses import dataclass, field

from hetbench.harness.loop import engine
from hetbench.harness.loop.engine import Turn
from hetbench.harness.spec.emulation import Stretcher
from hetbench.harness.spec.workers import WorkerSpec


@dataclass
class Scripted:
    """Turns given in advance; logs what the engine did and when."""

    turns: dict[int, Turn]
    log: list[tuple[str, int]] = field(default_factory=list)

    def take(self, step: int) -> Turn:
        self.log.append(("take", step))
        return self.turns[step]

    def between(self, step: int, turn: Turn) -> None:
        self.log.append(("between", step))


@dataclass
class EveryTwo:
    log: list[tuple[str, int]]

    def due(self, steps_done: int) -> bool:
        return steps_done % 2 == 0

    def __call__(self, steps_done: int) -> None:
        self.log.append(("evaluate", steps_done))


def test_the_engine_writes_evaluates_then_goes_between_steps_in_order() -> None:
    steps = Scripted({0: Turn((("r", 0),), 1, 1), 1: Turn((("r", 1),), 2, 2),
                      2: Turn((("r", 2),), None, 3)})
    written: list[object] = []

    def write(record: object) -> None:
        written.append(record)
        steps.log.append(("write", len(written) - 1))

    assert engine.run_steps(steps, write, EveryTwo(steps.log)) == 3
    assert written == [("r", 0), ("r", 1), ("r", 2)]
    assert steps.log == [("take", 0), ("write", 0), ("between", 0),
                         ("take", 1), ("write", 1), ("evaluate", 2), ("between", 1),
                         ("take", 2), ("write", 2), ("between", 2)]


def test_a_turn_that_took_no_step_is_written_but_not_evaluated_nor_followed_up() -> None:
    """A left-out worker's turn: the steps it sat out recorded, the trainer's next step
    named, and nothing the engine does after a step of the run's."""
    steps = Scripted({0: Turn((("out", 0), ("out", 1), ("out", 2)), 3, None),
                      3: Turn((("r", 3),), 7, 4), 7: Turn((), None, 8)})
    written: list[object] = []
    assert engine.run_steps(steps, written.append, EveryTwo(steps.log)) == 3
    assert written == [("out", 0), ("out", 1), ("out", 2), ("r", 3)]
    assert steps.log == [("take", 0), ("take", 3), ("evaluate", 4), ("between", 3),
                         ("take", 7), ("evaluate", 8), ("between", 7)]


def test_a_varying_slowdown_is_set_before_each_step_and_a_fixed_one_is_left_alone() -> None:
    schedule = WorkerSpec(slowdown_at=((0, 1.0), (2, 3.0)))
    stretch = Stretcher(1.0)
    seen: dict[int, float] = {}

    @dataclass
    class Watching:
        def take(self, step: int) -> Turn:
            seen[step] = stretch.extra
            return Turn((), step + 1 if step < 3 else None, step + 1)

        def between(self, step: int, turn: Turn) -> None:
            pass

    slowdown = engine.slowdown_schedule(schedule, stretch, seed=0, rank=0)
    assert slowdown is not None
    engine.run_steps(Watching(), lambda record: None, slowdown=slowdown)
    # linear from 1x at step 0 to 3x at step 2, held after: the extra is factor - 1
    assert seen == {0: 0.0, 1: 1.0, 2: 2.0, 3: 2.0}
    assert engine.slowdown_schedule(WorkerSpec(slowdown=2.0), stretch, 0, 0) is None
