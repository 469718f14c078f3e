"""What a worker trains, as its loop takes it: a data-parallel worker's `Source`
(harness/loop/worker.py) and a pipeline stage's `StageSource` (harness/loop/stage.py). Built
for a built-in workload or a user's job by harness/loop/sources.py (and job.py): the loops
never ask which.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from hetbench.adapters.base import TorchLayersAdapter
from hetbench.harness.loop.trainer import Trainer
from hetbench.harness.training.evaluation import Heldout
from hetbench.workloads.data import BatchOrder


def _nothing_to_stop() -> None:
    return None


@dataclass
class Source:
    """A worker's trainer, its batch source attached (`trainer.fetch`), and what goes with
    it: what the manifest says of the training data (lifecycle.describe), the held-out
    metric's name and split (read only where the run evaluates), what rank 0's manifest
    adds at the end (a job's description and measured exactness), and how to stop the input
    pipeline."""

    trainer: Trainer
    data: Any
    metric: str
    heldout: Callable[[], Heldout] | None
    closing: dict[str, Any] = field(default_factory=dict)
    close: Callable[[], None] = _nothing_to_stop
    # a job's exactness measure on given slices (rank 0's result, the others' None; every
    # rank calls it, with the same slices): at the start where it waits for the slices the
    # workers' solo timings choose (job.exactness_after_measuring), and at the end where an
    # adaptive policy moved them
    exactness: Callable[[tuple[int, ...]], dict[str, Any] | None] | None = None
    exactness_waits: bool = False



@dataclass
class StageSource:
    """What a pipeline stage (harness/loop/stage.py) trains: the whole model's adapter,
    cut into `layers` that share its flat buffers; the training samples' order; `read`,
    (sample indices, inputs wanted, targets wanted) -> (inputs, targets) on the host, each
    None where not wanted; a micro-batch's loss summed over its samples; the flat
    buffer's [lo, hi) of a run of layers' parameters; the held-out metric and split; what
    the manifest says of the data and, at the end, of the job; a job's exactness measure
    over a global batch's micro-batches ([lo, hi) each; harness/loop/exactness.py), None
    for a built-in workload; where a wave's batches come from (`batch`), and how to stop
    their input pipeline."""

    adapter: TorchLayersAdapter
    layers: list[Any]
    data: Any
    order: BatchOrder
    read: Callable[[Any, bool, bool], tuple[Any, Any]]
    loss_sum: Callable[[Any, Any], Any]
    parameter_range: Callable[[list[Any]], tuple[int, int]]
    metric: str
    heldout: Callable[[], Heldout] | None
    closing: dict[str, Any] = field(default_factory=dict)
    exactness: Callable[[Sequence[tuple[int, int]]], dict[str, Any]] | None = None
    # (wave, lo, hi, inputs wanted, targets wanted) -> the wave's slice [lo, hi), from an
    # input pipeline (a job's DataLoader); None: `read` in line
    batches: Callable[[int, int, int, bool, bool], tuple[Any, Any]] | None = None
    close: Callable[[], None] = _nothing_to_stop

    def batch(self, wave: int, lo: int, hi: int, inputs: bool, targets: bool
              ) -> tuple[Any, Any]:
        """The slice [lo, hi) of wave `wave`'s global batch, its parts wanted (a stage
        that wants neither reads nothing)."""
        if not (inputs or targets):
            return None, None
        if self.batches is None:
            return self.read(self.order.indices(wave)[lo:hi], inputs, targets)
        return self.batches(wave, lo, hi, inputs, targets)
