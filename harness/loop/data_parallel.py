"""A data-parallel worker's steps as the step engine takes them (harness/loop/engine.py).

A computing worker takes its timed step on its slice (hetbench.harness.loop.trainer.Trainer); a
left-out worker takes turns sitting out (hetbench.harness.loop.repartitioning.sit_out). Between
steps, outside any step's timing: the keep-alive to the left-out workers and the adaptive
repartitioning, whose new slice the next step takes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hetbench.adapters.base import Adapter
from hetbench.harness.exchange import Exchange
from hetbench.harness.loop.counters import Counters
from hetbench.harness.loop.engine import Evaluation, Record, Turn
from hetbench.harness.loop.membership import Membership
from hetbench.harness.loop.repartitioning import Repartitioning, sit_out
from hetbench.harness.spec.suite import RunSpec
from hetbench.harness.training.evaluation import Evaluator

# (step, lo, hi, counters) -> the step's record and what its exchange did
StepFunction = Callable[[int, int, int, Counters], tuple[Record, Exchange]]


class WorkerSteps:
    """The steps of one data-parallel worker (`take`, `between`: engine.Steps)."""

    def __init__(self, run: RunSpec, step_fn: StepFunction, counters: Counters,
                 bounds: tuple[int, int], membership: Membership | None,
                 repartition: Repartitioning, evaluator: Evaluator | None) -> None:
        self.run, self.step_fn, self.counters = run, step_fn, counters
        self.membership, self.repartition, self.evaluator = membership, repartition, evaluator
        self.lo, self.hi = bounds
        self.last_step = 0  # the last step this worker computed

    def take(self, step: int) -> Turn:
        membership = self.membership
        if membership is not None and not membership.computing:
            turn = sit_out(membership, step, self.evaluator, self.repartition)
            self.lo, self.hi = self.repartition.bounds()
            return turn
        self.last_step = step
        record, exchange = self.step_fn(step, self.lo, self.hi, self.counters)
        progress = step + 1 if exchange.progress is None else exchange.progress
        return Turn((record,), exchange.next_step, progress)

    def between(self, step: int, turn: Turn) -> None:
        if self.membership is not None:
            self.membership.keep_alive(step)
        repartition = self.repartition
        if repartition.repartitioner is None:
            return
        repartition.measure(self.hi - self.lo, turn.records[0])
        if repartition.apply_pending(step):
            self.lo, self.hi = repartition.bounds()
        if repartition.update_due(step) and step + 1 < self.run.steps:
            repartition.between_steps(step)
            self.lo, self.hi = repartition.bounds()

    def evaluation(self, adapter: Adapter) -> Evaluation | None:
        """The run's evaluation as the computing workers call it; where workers may be
        left out, the members' first worker sends them its parameters first (they evaluate
        in sit_out)."""
        if self.evaluator is None or self.membership is None:
            return self.evaluator
        return MembersEvaluation(self.evaluator, self.membership, self, adapter)


@dataclass
class MembersEvaluation:
    """The evaluation of a run that may leave workers out: announced to them first."""

    evaluator: Evaluator
    membership: Membership
    steps: WorkerSteps
    adapter: Adapter

    def due(self, steps_done: int) -> bool:
        return self.evaluator.due(steps_done)

    def __call__(self, steps_done: int) -> Any:
        self.membership.announce_evaluation(self.steps.last_step, steps_done, self.adapter)
        return self.evaluator(steps_done)
