"""Each rank's slice of every global batch in a user's own loop, by the run's partition
policy, decided between steps, every rank the same.

- `equal`, `sizes`, `weights`: fixed from the first step.
- `profiled`: hetbench's own loop times each worker alone at two slices before training;
  a user's loop cannot be stepped apart from the user, so the two slices are measured in
  the job itself: `profile_steps` steps at equal slices, then as many at the slices each
  rank's time per sample from those says (a second point for every rank whose slice
  moved), then each rank's line a + b·n through the two medians (the first step at a size
  left out: it pays once for what the next ones reuse) and the slices at which the lines
  end together, fixed from there on. These steps train as any other.
- `proportional`, `model` (adaptive): hetbench's Repartitioning over the same windows as
  in hetbench's own loop, from `initial` slices (equal, or profiled as above); `model`'s
  `leave_out` may give a rank an empty slice, which then measures nothing (the session
  runs it on a shadow slice weighted 0).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hetbench.harness.exchange import comm
from hetbench.harness.loop.repartitioning import Repartitioning
from hetbench.harness.loop.worker import make_repartitioner
from hetbench.harness.partition.policies import (
    equal_sizes,
    initial_sizes,
    profiled_sizes,
    slice_bounds,
    solo_line,
)
from hetbench.harness.records import collector
from hetbench.harness.records.collector import MARK_READY
from hetbench.harness.spec.suite import RunSpec


@dataclass
class PartitionState:
    """What Repartitioning reads of a trainer: the partition's history, and the waits a
    slice's compute holds that are not its cost (none in a user's loop)."""

    partition_history: list[dict[str, Any]] = field(default_factory=list)
    # (step, lo, hi): the slice from that step on, told to the loop's DataLoader before it
    # makes batches ahead for it (SliceBatches.announce)
    announce: Callable[[int, int, int], None] | None = None

    def waits_in_compute(self) -> int:
        return 0


class Slicing:
    """The sizes of each step's slices (`bounds`): what each step measured kept
    (`measured`), the slices decided as a step begins (`before`, on every rank together)."""

    def __init__(self, run: RunSpec, rank: int, device: Any, run_dir: Path,
                 min_slice: int = 1,
                 announce: Callable[[int, int, int], None] | None = None,
                 made_ahead: int = 0) -> None:
        self.run, self.rank, self.device, self.run_dir = run, rank, device, run_dir
        self.min_slice = min_slice  # the model's: 2 where BatchNorm takes a slice's statistics
        policy = run.partition
        self.state = PartitionState(announce=announce)
        # the most batches any rank's DataLoader makes ahead (the same on every rank): a
        # new partition is in force that many steps after it is decided, as in hetbench's
        # own loop (harness/loop/repartitioning.py); not where a rank may be left out
        self.made_ahead = 0 if policy.leave_out else made_ahead
        self.probing = policy.policy == "profiled" or (policy.adaptive
                                                       and policy.initial == "profiled")
        if self.probing:
            sizes = equal_sizes(run.global_batch, run.world_size)
            reason = (f"policy {policy.policy}: {policy.profile_steps} steps at equal "
                      "slices, then at the slices their time per sample says")
        else:
            sizes = initial_sizes(policy, run.global_batch, run.world_size, None)
            reason = f"policy {policy.policy}"
        self.sizes = sizes
        self.state.partition_history.append({"step": 0, "sizes": list(sizes),
                                             "reason": reason})
        self.probes: list[list[tuple[int, float]]] = [[], []]  # (slice, compute) per phase
        self.first_points: list[tuple[int, float]] = []  # every rank's, at equal slices
        self.adaptive: Repartitioning | None = None
        if policy.adaptive and not self.probing:
            self.adaptive = self._repartitioning(None)
        self._write_log()

    def bounds(self) -> tuple[int, int]:
        return slice_bounds(self.sizes)[self.rank]

    def measured(self, step: int, size: int, parts: tuple[Any, ...]) -> None:
        """Step `step` is recorded (`parts`: collector.timed_record's arguments): what it
        measured is kept for the next decision (no collective)."""
        marks = parts[collector.TIMED_MARKS]
        if size == 0:  # left out: its shadow slice measures nothing of what a slice costs
            return
        if self.probing:
            if step % self.run.partition.profile_steps:  # the first step at a size left out
                self.probes[step // self.run.partition.profile_steps].append(
                    (size, marks[MARK_READY] - marks[0]))
        elif self.adaptive is not None:
            self.adaptive.measure(size, parts)

    def before(self, step: int) -> None:
        """Step `step` is about to begin, on every rank: its slices are decided (collective
        where the policy decides at this step). Decided as a step begins, not as one ends,
        so that the loop's last step decides nothing."""
        every = self.run.partition.profile_steps if self.probing else self.run.partition.every
        if step == 0:
            return
        if self.adaptive is not None and not self.probing:
            if self.adaptive.apply_pending(step - 1):
                self.sizes = self.adaptive.sizes
            if self.adaptive.update_due(step - 1):
                self.adaptive.between_steps(step - 1)
                self.sizes = self.adaptive.sizes
            return
        if self.probing and step % every == 0:
            self._probed(step - 1, step // every - 1)

    def _probed(self, step: int, phase: int) -> None:
        """The probing phase `phase` ended with step `step`: the next slices."""
        points = [(int(n), t) for n, t in comm.all_gather_vectors(
            [float(self.sizes[self.rank]), _median(self.probes[phase])], self.device)]
        if phase == 0:
            self.first_points = points
            self._set(step, profiled_sizes(self.run.global_batch,
                                           [(0.0, t / n) for n, t in points], self.min_slice),
                      "time per sample at equal slices "
                      f"{[round(t / n / 1e6, 4) for n, t in points]} ms")
            return
        lines = [solo_line([first, second])
                 for first, second in zip(self.first_points, points, strict=True)]
        self.probing = False
        self._set(step, profiled_sizes(self.run.global_batch, lines, self.min_slice),
                  "lines a + b*n through two slices' median compute (ms, ms/sample) "
                  f"{[(round(a / 1e6, 3), round(b / 1e6, 4)) for a, b in lines]}")
        if self.run.partition.adaptive:
            self.adaptive = self._repartitioning(lines)

    def _set(self, step: int, sizes: tuple[int, ...], reason: str) -> None:
        self.sizes = sizes
        self.state.partition_history.append({"step": step + 1, "sizes": list(sizes),
                                             "reason": reason})
        self._write_log()

    def _repartitioning(self, lines: list[tuple[float, float]] | None) -> Repartitioning:
        self.state.partition_history[-1]["reason"] += \
            f", then adaptive ({self.run.partition.policy})"
        return Repartitioning(self.run, self.rank, self.device, self.state,
                              make_repartitioner(self.run, lines, self.min_slice), None,
                              self.run_dir, [], lead=self.made_ahead)

    def _write_log(self) -> None:
        if self.rank == 0:  # a run that fails later keeps its partition's changes
            collector.write_partition_log(self.run_dir, self.state.partition_history, [])


def _median(points: list[tuple[int, float]]) -> float:
    return float(statistics.median(t for _, t in points)) if points else float("nan")
