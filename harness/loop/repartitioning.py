"""Adaptive repartitioning between the steps of the training loop (harness/loop/worker.py), and
what a left-out worker does meanwhile (harness/loop/membership.py).

Every computing worker adds each step's (slice, compute) pair to its window, and the time
from the step's begin to the reduced sums (compute, idle and exchange: what leaving a
worker out is weighed against); every `every` steps the members gather their windows among
themselves (a lone member needs no gather), every rank computes the same new partition
(hetbench.harness.partition.policies.Repartitioner), and the first member tells the left-out
workers.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from hetbench.harness.exchange import comm
from hetbench.harness.loop.engine import Turn
from hetbench.harness.loop.membership import CHANGE, END, EVAL, Membership, members_of
from hetbench.harness.partition.policies import Repartitioner, Window, WindowStats, slice_bounds
from hetbench.harness.records import collector
from hetbench.harness.records.collector import MARK_READY, MARK_REDUCED
from hetbench.harness.spec.loaders import worker_loader
from hetbench.harness.spec.suite import RunSpec


class Repartitioning:
    """The adaptive policies between steps: each computing worker's window of (slice,
    compute) pairs and its mean time from begin to the reduced sums, gathered among the
    members every `every` steps (a lone member needs no gather), the same new partition
    on every rank, and the left-out workers told of it (harness/loop/membership.py)."""

    def __init__(self, run: RunSpec, rank: int, device: Any, trainer: Any,
                 repartitioner: Repartitioner | None, membership: Membership | None,
                 run_dir: Path,
                 standalone: list[dict[str, Any]], lead: int | None = None) -> None:
        self.run, self.rank, self.device, self.trainer = run, rank, device, trainer
        self.repartitioner, self.membership = repartitioner, membership
        self.run_dir, self.standalone = run_dir, standalone
        self.sizes = tuple(trainer.partition_history[-1]["sizes"])
        self.window, self.synchronized_sum = Window(), 0.0
        # The first step at a new slice size pays once for what the next ones reuse
        # (allocations, the framework's kernel choice for the new shapes: measured up to
        # 1.4x a typical step): it is not what the size costs, and stays out of the window.
        self.first_at_size = True
        # A job's DataLoader has batches made ahead for the slices in force when torch
        # asked for them: a new partition is decided, told to the loader at once, and put
        # in force that many steps later, so that no batch made ahead is for another
        # slice (completing one read its missing samples in the training process: moved
        # steps loaded 2-4x the median step). `pending`: (the step after which the new
        # sizes hold, sizes, reason). `lead`: that many steps (default: made_ahead(run),
        # for a job).
        if getattr(trainer, "announce", None) is None or membership is not None:
            lead = 0
        self.lead = made_ahead(run) if lead is None else lead
        self.pending: tuple[int, tuple[int, ...], str] | None = None
        self.first_update_done = False  # the first update may come early (update_due)

    def bounds(self) -> tuple[int, int]:
        return slice_bounds(self.sizes)[self.rank]

    def measure(self, size: int, record: tuple[Any, ...]) -> None:
        # what the worker waited for the others inside its compute is not what its slice
        # costs it (a job's global BatchNorm), read every step so none carries over
        waited = self.trainer.waits_in_compute()
        if self.first_at_size:
            self.first_at_size = False
            return
        marks = record[collector.TIMED_MARKS]  # a timed step's parts (worker.timed_step)
        self.window.add(size, marks[MARK_READY] - marks[0] - waited)
        self.synchronized_sum += marks[MARK_REDUCED] - marks[0]

    def update_due(self, step: int) -> bool:
        """After step `step` the policy updates: at the end of every window, and the first
        time half a window early (Repartitioner.early_update_step); not while a partition
        it decided waits for the batches made ahead (`pending`)."""
        assert self.repartitioner is not None
        if self.pending is not None:
            return False
        if (step + 1) % self.run.partition.every == 0:
            return True
        return not self.first_update_done and step == self.repartitioner.early_update_step()

    def between_steps(self, step: int) -> None:
        assert self.repartitioner is not None
        self.first_update_done = True
        stats = self.window.take()
        synchronized = self.synchronized_sum / stats.count if stats.count else math.nan
        self.synchronized_sum = 0.0
        mine = [*stats.as_list(), synchronized]
        membership = self.membership
        members = membership.members if membership is not None else range(self.run.world_size)
        if membership is not None and membership.lone:
            gathered = [mine]
        else:
            gathered = comm.all_gather_vectors(
                mine, self.device, membership.group() if membership is not None else None)
        # a left-out worker measured nothing: an empty window
        vectors = [[0.0] * len(mine[:-1]) + [math.nan]] * self.run.world_size
        for member, vector in zip(members, gathered, strict=True):
            vectors[member] = vector
        change = self.repartitioner.update(self.sizes, [WindowStats.of(v[:-1]) for v in vectors],
                                           [v[-1] for v in vectors])
        if change is None:
            return
        sizes, reason = change
        if membership is not None:
            membership.announce_change(step, sizes, reason, self.trainer.adapter,
                                       self.trainer.optimizer, self.repartitioner)
        if self.lead:
            after = step + self.lead
            self.pending = (after, sizes, f"{reason} (decided after step {step}, in force "
                                          f"after the {self.lead} batches made ahead)")
            self.trainer.announce(after + 1, *slice_bounds(sizes)[self.rank])
            return
        self.apply(step, sizes, reason)

    def apply_pending(self, step: int) -> bool:
        """After step `step`: the partition decided `lead` steps before, where it is due
        (or overdue: a scheme whose turns skip steps; the loader completes what it made
        ahead for the announced slice). True where it applied one."""
        if self.pending is None or self.pending[0] > step:
            return False
        _, sizes, reason = self.pending
        self.pending = None
        self.apply(step, sizes, reason)
        return True

    def apply(self, step: int, sizes: tuple[int, ...], reason: str) -> None:
        """Every rank, members and left-out alike: the partition from step + 1 on."""
        membership = self.membership
        if membership is not None and members_of(sizes) != members_of(self.sizes):
            # the members' group: created by every rank together
            self.trainer.aggregator.set_members(membership.group(), len(membership.members))
        self.first_at_size = sizes[self.rank] != self.sizes[self.rank]
        self.sizes = tuple(sizes)
        self.trainer.partition_history.append(
            {"step": step + 1, "sizes": list(sizes), "reason": reason})
        if self.rank == 0:  # a run that fails later keeps its partition changes
            collector.write_partition_log(self.run_dir, self.trainer.partition_history,
                                          self.standalone)


def made_ahead(run: RunSpec) -> int:
    """The most batches a worker's DataLoader makes ahead in this run (its processes times
    their prefetch factor, as torch keeps them outstanding), over the workers: every rank
    computes the same. 0 for a run with no DataLoader processes, or not a job's."""
    if not run.is_job:
        return 0
    loaders = [worker_loader(run.loader, worker.loader_workers) for worker in run.workers]
    return max((spec.workers * spec.prefetch for spec in loaders
                if spec is not None and spec.workers > 0), default=0)


def sit_out(membership: Membership, step: int, evaluator: Any, repartition: Repartitioning
            ) -> Turn:
    """One turn of a left-out worker at `step`: the source's next word, a record of batch
    size 0 for every step the members took up to it, and the evaluation or partition change
    it announces. The turn names the step to take next (None: the run is over); the worker
    computes it if the change took it back, else it waits again. No step of the run's was
    taken here: the turn's progress is None (harness/loop/engine.py)."""
    trainer = repartition.trainer
    event = membership.wait(step)
    records = [collector.left_out_record(repartition.rank, sat_out)
               for sat_out in range(step, event.step + 1)]
    following: int | None = event.step + 1
    if event.kind == EVAL:
        membership.receive_parameters(trainer.adapter)
        evaluator(event.progress)
    elif event.kind == END:
        membership.receive_parameters(trainer.adapter)
        following = None
    elif event.kind == CHANGE:
        sizes, reason = membership.receive_change(trainer.adapter, trainer.optimizer,
                                                  repartition.repartitioner)
        repartition.apply(event.step, sizes, reason)
    return Turn(records, following, None)
