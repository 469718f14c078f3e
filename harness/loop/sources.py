"""Where a worker's model, batches and held-out data come from, built in one place for both
kinds of workload, so that each loop trains either the same way: a data-parallel worker's
`Source` (worker.py), a pipeline stage's `StageSource` (stage.py):

- a built-in workload: its framework-neutral spec built in the worker's framework, its
  generated data served by hetbench's prefetcher (harness/training/loader.py);
- a user's job (a workload named by import path): the factory's `Job` through
  `TorchJobAdapter`, its Dataset through torch's DataLoader, the exactness of its slices
  measured before the first step (harness/loop/job.py).
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any

import numpy as np

from hetbench.adapters.base import Adapter
from hetbench.harness import exchange as aggregators
from hetbench.harness.loop.trainer import Trainer, phase_timer
from hetbench.harness.loop.training_source import Source, StageSource
from hetbench.harness.spec.emulation import Stretcher
from hetbench.harness.spec.loaders import worker_loader
from hetbench.harness.spec.suite import RunSpec
from hetbench.harness.training.evaluation import Evaluator
from hetbench.harness.training.loader import Prefetcher
from hetbench.harness.training.optim import Optimizer
from hetbench.workloads import build_spec, get_workload
from hetbench.workloads.data import BatchOrder, Dataset, load_dataset
from hetbench.workloads.models import builder


def build(run: RunSpec, rank: int, backend: str, adapter_cls: type[Adapter]) -> Source:
    """The worker's source: a user's job where the workload names one, else the built-in
    workload in the worker's framework (`adapter_cls`)."""
    if run.is_job:
        return _job_source(run, rank, backend)
    return _builtin_source(run, rank, backend, adapter_cls)


def most_steps(run: RunSpec) -> int:
    """The most steps one worker takes: a worker of an asynchronous scheme may take more
    than the run's count (the others' share), so its input pipeline must not run dry."""
    lockstep = aggregators.kind(run.aggregator.name).lockstep
    return run.steps * (1 if lockstep else run.world_size)


def build_trainer(run: RunSpec, rank: int, backend: str, adapter_cls: type[Adapter]
                  ) -> tuple[Trainer, Dataset]:
    """A built-in workload's trainer: data, model, adapter and optimizer of one worker,
    initial parameters loaded, batches read in line (`trainer.batch`); also the dataset."""
    import torch

    worker = run.workers[rank]
    data = load_dataset(run.dataset, run.workload, run.seed)
    spec = build_spec(run.workload, data.sample_shape, data.num_classes, run.size)
    adapter = adapter_cls(spec, worker.device, worker.threads)
    initial = spec.initial_parameters(run.seed)
    adapter.load_parameters(initial)
    stretch = Stretcher(worker.slowdown_for(0))
    # on the device for nccl, and on a GPU worker whose aggregator sums there itself
    buffer = adapter.comm_buffer(
        backend == "nccl" or (worker.is_cuda and aggregators.kind(run.aggregator.name).needs_gpu))
    flat = torch.from_numpy(np.concatenate([initial[p.name].ravel() for p in spec.params]))
    optimizer = Optimizer(run.optimizer, run.lr, run.steps, run.global_batch, spec.num_elements,
                          flat, buffer.device)
    trainer = Trainer(run, rank, adapter, data.inputs, data.targets,
                      BatchOrder(len(data), run.global_batch, run.seed), stretch,
                      phase_timer(worker, adapter, stretch, run.instrument,
                                  aggregators.kind(run.aggregator.name).overlaps),
                      buffer, optimizer,
                      flat, prepare=get_workload(run.workload).prepare,
                      num_classes=data.num_classes)
    trainer.fetch = trainer.batch
    if run.loader is not None and run.loader.decode:
        from hetbench.workloads.pipeline import encode_png

        trainer.encoded = encode_png(data.inputs)  # once, before any timing
    adapter.zero_grad()
    return trainer, data


def builtin_heldout(run: RunSpec) -> Dataset:
    """A built-in workload's held-out split, prepared as the workload prepares it (BERT's
    windows masked once)."""
    workload = get_workload(run.workload)
    heldout = load_dataset(run.dataset, run.workload, run.seed, "heldout")
    if workload.prepare_heldout is None:
        return heldout
    inputs, targets = workload.prepare_heldout(heldout.inputs, heldout.targets,
                                               heldout.num_classes)
    return dataclasses.replace(heldout, inputs=inputs, targets=targets)


def _builtin_source(run: RunSpec, rank: int, backend: str, adapter_cls: type[Adapter]
                    ) -> Source:
    trainer, data = build_trainer(run, rank, backend, adapter_cls)
    source = Source(trainer, data, get_workload(run.workload).metric,
                    functools.partial(builtin_heldout, run))
    loader = worker_loader(run.loader, run.workers[rank].loader_workers)
    if loader is not None and loader.workers > 0:
        prefetcher = Prefetcher(trainer.batch, loader, most_steps(run), run.timeout_s)
        trainer.fetch = prefetcher.get
        source.close = prefetcher.close
    return source


def _job_source(run: RunSpec, rank: int, backend: str) -> Source:
    from hetbench.harness.loop import job

    trainer, data, described, statistics = job.build(run, rank, backend)
    batches = job.batches(run, trainer, most_steps(run))
    trainer.fetch, trainer.announce = batches.get, batches.announce
    measure = functools.partial(job.measured_exactness, run, rank, trainer, batches,
                                described, statistics, backend)
    if job.exactness_after_measuring(run):  # on the slices the timings choose
        return Source(trainer, data, job.METRIC, job.heldout_of(trainer), {"job": described},
                      batches.close, exactness=measure, exactness_waits=True)
    try:
        exactness = measure()
    except BaseException:
        batches.close()
        raise
    closing = {"job": described} | ({} if exactness is None else {"exactness": exactness})
    return Source(trainer, data, job.METRIC, job.heldout_of(trainer), closing, batches.close,
                  exactness=measure if job.exactness_after_attaching(run) else None)


def make_evaluator(run: RunSpec, rank: int, source: Source, run_dir: Path, device: Any
                   ) -> Evaluator | None:
    """The held-out evaluation of a run with `eval_every` and a held-out split, or None.
    Under a lockstep scheme every worker evaluates its shard; otherwise worker 0 alone
    evaluates the whole split (harness/training/evaluation.py)."""
    if not run.eval_every or source.heldout is None:
        return None
    from hetbench.harness.exchange import comm

    adapter = source.trainer.adapter
    if not aggregators.kind(run.aggregator.name).lockstep:
        if rank != 0:
            return None
        return Evaluator.alone(run.eval_every, run.steps, run.global_batch, source.metric,
                               adapter, source.heldout(), run_dir)
    return Evaluator(run.eval_every, run.steps, run.global_batch, source.metric, rank,
                     run.world_size, adapter, source.heldout(),
                     lambda values: comm.all_gather_vectors(values, device), run_dir)


def build_stage(run: RunSpec, rank: int, backend: str) -> StageSource:
    """A pipeline stage's source: the job's layers (Job.layers) where the workload names a
    job, else the built-in workload's PyTorch layers."""
    if run.is_job:
        from hetbench.harness.loop import job

        return job.stage_source(run, rank, backend)
    return _builtin_stage(run, rank)


def _builtin_stage(run: RunSpec, rank: int) -> StageSource:
    import torch

    from hetbench.adapters.pytorch import TorchAdapter, loss_sum
    from hetbench.workloads.torch_layers import parameter_range

    worker = run.workers[rank]
    data = load_dataset(run.dataset, run.workload, run.seed)
    spec = build_spec(run.workload, data.sample_shape, data.num_classes, run.size)
    adapter = TorchAdapter(spec, worker.device, worker.threads)
    adapter.load_parameters(spec.initial_parameters(run.seed))
    module = builder(run.workload, "pytorch")
    names = getattr(module, "PARAMETER_NAMES", {})

    def read(indices: Any, inputs: bool, targets: bool) -> tuple[Any, Any]:
        return (torch.from_numpy(data.inputs[indices]) if inputs else None,
                torch.from_numpy(data.targets[indices]) if targets else None)

    return StageSource(
        adapter, module.layers(adapter.model), data,
        BatchOrder(len(data), run.global_batch, run.seed), read,
        functools.partial(loss_sum, spec),
        functools.partial(parameter_range, spec, adapter.model, torch_names=names),
        get_workload(run.workload).metric, functools.partial(builtin_heldout, run))
