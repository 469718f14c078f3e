"""A user's job (a workload named by import path) in a data-parallel worker: its trainer,
data, held-out split and exactness check, which the job's source (harness/loop/sources.py)
puts together. The step is the built-in workloads' own (`Trainer.timed_step`); what differs
is where the model and the batches come from: the factory's Job (hetbench.workloads.job)
through TorchJobAdapter, and torch's DataLoader with hetbench's sampler
(harness/training/job_loader.py).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hetbench.adapters.pytorch_job import TorchJobAdapter, leading_size
from hetbench.harness import exchange as aggregators
from hetbench.harness.loop import exactness
from hetbench.harness.loop.trainer import Trainer, phase_timer
from hetbench.harness.loop.training_source import StageSource
from hetbench.harness.partition.policies import (
    equal_sizes,
    initial_sizes,
    measures,
    slice_bounds,
)
from hetbench.harness.spec.emulation import Stretcher
from hetbench.harness.spec.loaders import worker_loader
from hetbench.harness.spec.partitions import PartitionSpec
from hetbench.harness.spec.suite import RunSpec
from hetbench.harness.system.environment import git_commit
from hetbench.harness.training.job_loader import JobBatches
from hetbench.harness.training.optim import Optimizer, OwnOptimizer
from hetbench.workloads import job as jobs
from hetbench.workloads.data import BatchOrder
from hetbench.workloads.torch_layers import parameter_range

METRIC = "accuracy"  # the held-out metric's name: Job.metric's correct / counted


@dataclass(frozen=True)
class JobData:
    """What the manifest says of a job's training data (lifecycle.describe reads it)."""

    source: str
    fingerprint: str


@dataclass
class GlobalStatistics:
    """A job's BatchNorm layers made GlobalBatchNorm over a group of every worker (apart
    from the exchange's, so that their collectives never interleave with its buckets), and
    the group of rank 0 alone that its pass over the whole batch uses (exactness.py)."""

    layers: list[Any] = field(default_factory=list)
    every: Any = None
    first_alone: Any = None
    clock: Any = None  # batchnorm.CollectiveClock: their collectives' time

    @contextlib.contextmanager
    def alone(self) -> Iterator[None]:
        for layer in self.layers:
            layer.process_group = self.first_alone
        try:
            yield
        finally:
            for layer in self.layers:
                layer.process_group = self.every


class JobHeldout:
    """A job's held-out Dataset as the evaluator reads it (harness/training/evaluation.py)."""

    def __init__(self, job: jobs.Job) -> None:
        assert job.heldout is not None
        self.job, self.dataset = job, job.heldout

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def read(self, lo: int, hi: int) -> tuple[Any, Any]:
        return jobs.read_batch(self.job, self.dataset, range(lo, hi))


def build(run: RunSpec, rank: int, backend: str
          ) -> tuple[Trainer, JobData, dict[str, Any], GlobalStatistics]:
    """The worker's Trainer over the job (its batches from a DataLoader, attached as
    `trainer.fetch` by the caller), what the manifest says of the data, the job's
    description, and its BatchNorm layers made global where the run asks. Every worker
    starts from rank 0's parameters."""
    import torch

    assert run.project is not None
    worker = run.workers[rank]
    job = jobs.make_job(run.workload, Path(run.project), run.seed)
    jobs.check_batches(job, run.global_batch)
    statistics = GlobalStatistics()
    if run.batchnorm == "global":
        from hetbench.harness.training.batchnorm import (
            CollectiveClock,
            GlobalBatchNorm,
            convert_to_global,
        )

        # every rank creates every group, member or not (torch.distributed's rule)
        statistics.every = torch.distributed.new_group(list(range(run.world_size)))
        statistics.first_alone = torch.distributed.new_group([0])
        job = jobs.replace(job, model=convert_to_global(job.model, statistics.every))
        statistics.layers = [m for m in job.model.modules() if isinstance(m, GlobalBatchNorm)]
        statistics.clock = CollectiveClock()
        for layer in statistics.layers:  # a GlobalBatchNorm of the user's own too
            layer.clock = statistics.clock
    adapter = TorchJobAdapter(job, run.workload, worker.device, worker.threads)
    on_device = backend == "nccl"
    share_first_ranks(adapter, on_device)
    stretch = Stretcher(worker.slowdown_for(0))
    buffer = adapter.comm_buffer(
        on_device or (worker.is_cuda and aggregators.kind(run.aggregator.name).needs_gpu))
    flat = adapter.flat_params.detach().cpu().clone()
    optimizer: Optimizer | OwnOptimizer
    if job.optimizer is not None:  # the job check refused the schemes it cannot run under
        adapter.use_own_optimizer()
        optimizer = OwnOptimizer(run.global_batch, adapter.own_optimizer)
    else:
        optimizer = Optimizer(run.optimizer, run.lr, run.steps, run.global_batch,
                              adapter.spec.num_elements, flat, buffer.device)
    order = BatchOrder(len(job.train), run.global_batch, run.seed)  # type: ignore[arg-type]
    overlaps = aggregators.kind(run.aggregator.name).overlaps
    # a slower device computes slower, it does not wait longer: the emulated slowdown
    # leaves the global BatchNorm's collectives out, as the adaptive policy's fits do
    clock = statistics.clock
    timed_stretch = stretch if clock is None else clock.outside(stretch)
    trainer = Trainer(run, rank, adapter, np.empty(0), np.empty(0), order, stretch,
                      # accumulated micro-batches fold their marks on the host clock
                      phase_timer(worker, adapter, timed_stretch, run.instrument,
                                  overlaps or run.accumulate > 1),
                      buffer, optimizer, flat)
    if clock is not None:
        trainer.waits_in_compute = clock.reader()
    data, described = described_data(run, job)
    if described.get("batchnorm") and run.batchnorm != "global":
        trainer.min_slice = 2  # a slice's statistics need two samples
    adapter.zero_grad()
    return trainer, data, described, statistics


def share_first_ranks(adapter: TorchJobAdapter, on_device: bool) -> None:
    """Rank 0's parameters and buffers (BatchNorm's running statistics, ...) on every
    worker: a factory need not be deterministic. Every rank calls it."""
    import torch

    params = adapter.flat_params if on_device else adapter.flat_params.cpu()
    torch.distributed.broadcast(params, src=0)
    if params is not adapter.flat_params:
        adapter.flat_params.copy_(params)
    for buffer in adapter.model.buffers():
        shared = buffer if on_device or buffer.device.type == "cpu" else buffer.cpu()
        torch.distributed.broadcast(shared, src=0)
        if shared is not buffer:
            buffer.copy_(shared)


def described_data(run: RunSpec, job: jobs.Job) -> tuple[JobData, dict[str, Any]]:
    """What the manifest says of the job's data (JobData) and of the job."""
    assert run.project is not None
    described = jobs.describe(job, run.workload)
    described["batchnorm_statistics"] = run.batchnorm
    described["project"] = project_identity(Path(run.project), run.workload)
    train = described["train"]
    return JobData(train["source"] or train["type"], train["fingerprint"]), described


def batches(run: RunSpec, trainer: Trainer, most: int) -> JobBatches:
    """The job's training batches, `most` steps of them at most."""
    adapter = job_adapter(trainer)
    loader = worker_loader(run.loader, run.workers[trainer.rank].loader_workers)
    return JobBatches(adapter.job, trainer.order, most, loader, run.timeout_s)


def measured_exactness(run: RunSpec, rank: int, trainer: Trainer, loader: JobBatches,
                       described: dict[str, Any], statistics: GlobalStatistics,
                       backend: str, sizes: tuple[int, ...] | None = None
                       ) -> dict[str, Any] | None:
    """The slices' gradient summed over the workers against the whole batch's on rank 0
    (exactness.py), on `sizes` (default: the slices the run starts with, equal ones where
    the policy measures the workers first); rank 0 returns it, the others None."""
    import torch

    device = torch.device(run.workers[rank].device if backend == "nccl" else "cpu")
    return exactness.measure(job_adapter(trainer), loader.read,
                             slice_bounds(sizes or starting_sizes(run.partition, run)), rank,
                             described, statistics.alone, device)


def exactness_after_attaching(run: RunSpec) -> bool:
    """The exactness can be measured once the aggregator is attached: not where the
    parameter servers compute the last layer (fc-on-server: attached, the aggregator
    changes what the worker's model computes; measured before it)."""
    return run.placement != "fc-on-server"


def exactness_after_measuring(run: RunSpec) -> bool:
    """The run's exactness is measured on the slices its policy chose from the workers'
    solo timings (`profiled`, or an adaptive policy started from it), after they were
    timed: the slices it trains on, not the equal ones it timed at (where it can be
    measured after attaching; else on the equal slices before, as every run was)."""
    return measures(run.partition) and exactness_after_attaching(run)


def starting_sizes(policy: PartitionSpec, run: RunSpec) -> tuple[int, ...]:
    if measures(policy):
        return equal_sizes(run.global_batch, run.world_size)
    return initial_sizes(policy, run.global_batch, run.world_size, None)


def job_adapter(trainer: Trainer) -> TorchJobAdapter:
    assert isinstance(trainer.adapter, TorchJobAdapter)
    return trainer.adapter


def heldout_of(trainer: Trainer) -> Callable[[], JobHeldout] | None:
    """The job's held-out split as the evaluator reads it, None where the job has none."""
    job = job_adapter(trainer).job
    return None if job.heldout is None else functools.partial(JobHeldout, job)


def project_identity(project: Path, workload: str) -> dict[str, Any]:
    """The user's code as the manifest records it: the folder, the top-level package the
    factory lives in, its installed version where it has one, and the folder's git commit
    and whether its tree was dirty."""
    from importlib import metadata

    module = jobs.parse_reference(workload)[0]
    package = Path(module).stem if module.endswith(".py") else module.split(".")[0]
    try:
        version: str | None = metadata.version(package)
    except metadata.PackageNotFoundError:
        version = None
    return {"folder": str(project), "package": package, "version": version,
            "git": git_commit(project)}


def stage_source(run: RunSpec, rank: int, backend: str) -> StageSource:
    """A pipeline stage's source over the job: the model cut where Job.layers cuts it (the
    job check refused a job without layers), every rank starting from rank 0's
    parameters, a wave's slice through torch's DataLoader as a data-parallel worker's (on
    the stages that read it: the first its inputs, the last its targets)."""

    assert run.project is not None and run.pipeline is not None
    worker = run.workers[rank]
    job = jobs.make_job(run.workload, Path(run.project), run.seed)
    jobs.check_batches(job, run.global_batch)
    adapter = TorchJobAdapter(job, run.workload, worker.device, worker.threads)
    share_first_ranks(adapter, backend == "nccl")
    data, described = described_data(run, job)

    def read(indices: Any, inputs: bool, targets: bool) -> tuple[Any, Any]:
        x, y = jobs.read_batch(job, job.train, indices)
        return (x if inputs else None, y if targets else None)

    def loss_sum(outputs: Any, targets: Any) -> Any:
        loss = job.loss(outputs, targets)
        return loss * leading_size(targets) if job.reduction == "mean" else loss

    heldout = None if job.heldout is None else functools.partial(JobHeldout, job)
    order = BatchOrder(len(job.train), run.global_batch, run.seed)  # type: ignore[arg-type]

    def measured_exactness(micro_batches: Sequence[tuple[int, int]]) -> dict[str, Any]:
        return exactness.measure_micro_batches(
            adapter, lambda step, lo, hi: read(order.indices(step)[lo:hi], True, True),
            micro_batches, described)

    loader = JobBatches(job, order, run.pipeline.most_waves(run.steps),
                        worker_loader(run.loader, worker.loader_workers), run.timeout_s)

    def batch(wave: int, lo: int, hi: int, inputs: bool, targets: bool) -> tuple[Any, Any]:
        x, y = loader.get(wave, lo, hi)
        return (x if inputs else None, y if targets else None)

    return StageSource(
        adapter, jobs.job_layers(job, adapter.model), data, order, read, loss_sum,
        functools.partial(parameter_range, adapter.spec, adapter.model, torch_names={}),
        METRIC, heldout, {"job": described}, measured_exactness, batch, loader.close)
