"""Held-out evaluation every `eval_every` steps, outside the timed step (DESIGN.md: launches
and evaluation).

Every worker evaluates an equal contiguous shard of the held-out split with its own
framework (so a TensorFlow worker's model is measured by TensorFlow); the sums of loss,
correct and counted predictions meet in one all-gather and rank 0 appends the row to
parts/eval.jsonl (eval.parquet at the end). The all-gather also lines the workers up again,
so an evaluation never shows as idle time in the next step's records.

Under an asynchronous aggregator (workers not in lockstep) no collective can line them
up: worker 0 alone evaluates the whole held-out split on the parameters it has just
pulled, whenever the global steps the servers applied pass a multiple of `eval_every`,
while the others train on (a perturbation of the run that docs/concepts/synchronisation.md names).

Time is kept twice: `wall_s` since the first step began, and `train_s`, the same minus the
time spent evaluating. Time to target is read on `train_s` by default: evaluation costs the
same under every scheme and is not what a remedy changes (MLPerf counts it; `wall_s` is
there for that reading).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Protocol

from hetbench.adapters.base import Adapter
from hetbench.harness.records import collector

EVAL_BATCH = 256  # held-out samples per forward pass (memory, not mathematics)


class Heldout(Protocol):
    """The held-out split as the evaluator reads it: a built-in data set's arrays
    (workloads.data.Dataset) or a job's Dataset (harness/loop/job.py)."""

    def __len__(self) -> int: ...

    def read(self, lo: int, hi: int) -> tuple[Any, Any]:
        """(inputs, targets) of samples [lo, hi)."""
        ...


def shard(count: int, rank: int, world_size: int) -> tuple[int, int]:
    """[lo, hi) of rank's equal contiguous share of `count` held-out samples."""
    return count * rank // world_size, count * (rank + 1) // world_size


class Evaluator:
    def __init__(self, every: int, steps: int, global_batch: int, metric: str, rank: int,
                 world_size: int, adapter: Adapter, heldout: Heldout, gather: Any,
                 run_dir: Path) -> None:
        self.every, self.steps, self.global_batch = every, steps, global_batch
        self.metric, self.rank, self.adapter, self.gather = metric, rank, adapter, gather
        self.run_dir = run_dir
        self.lo, self.hi = shard(len(heldout), rank, world_size)
        self.heldout = heldout
        self.samples = len(heldout)
        self._start_ns = 0
        self._spent_ns = 0
        self._last = -1  # global steps at the last evaluation

    @classmethod
    def alone(cls, every: int, steps: int, global_batch: int, metric: str, adapter: Adapter,
              heldout: Heldout, run_dir: Path) -> Evaluator:
        """Worker 0 evaluating the whole held-out split by itself, no collective: under an
        asynchronous scheme, a pipeline's rank 0, tensorflow-ps's coordinator."""
        return cls(every, steps, global_batch, metric, 0, 1, adapter, heldout,
                   lambda values: [values], run_dir)

    def start_clock(self) -> None:
        """Wall time counts from here (the first step), evaluations before it excluded."""
        self._start_ns = time.perf_counter_ns()
        self._spent_ns = 0

    def due(self, steps_done: int) -> bool:
        """At every multiple of `every` global steps and at the last; under an asynchronous
        scheme progress can jump past a multiple, which still counts once."""
        if steps_done <= self._last:
            return False
        return (steps_done // self.every > self._last // self.every
                or (steps_done >= self.steps > self._last))

    def __call__(self, steps_done: int) -> dict[str, Any]:
        self._last = steps_done
        begin = time.perf_counter_ns()
        totals = [0.0, 0.0, 0.0]  # loss sum, correct, counted
        for lo in range(self.lo, self.hi, EVAL_BATCH):
            hi = min(lo + EVAL_BATCH, self.hi)
            for i, value in enumerate(self.adapter.evaluate(*self.heldout.read(lo, hi))):
                totals[i] += value
        loss_sum, correct, counted = (sum(v[i] for v in self.gather(totals)) for i in range(3))
        end = time.perf_counter_ns()
        wall = begin - self._start_ns if self._start_ns else 0
        row = {"step": steps_done, "samples": steps_done * self.global_batch,
               "wall_s": wall / 1e9, "train_s": (wall - self._spent_ns) / 1e9 if wall else 0.0,
               "eval_s": (end - begin) / 1e9, "loss": loss_sum / self.samples,
               self.metric: correct / counted if counted else float("nan"),
               "heldout_samples": self.samples}
        if self._start_ns:
            self._spent_ns += end - begin
        if self.rank == 0:
            collector.append_eval(self.run_dir, row)
        return row
