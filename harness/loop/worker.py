"""A worker process: its setup and the data-parallel step (`Trainer`), run by the step engine.

Started by `hetbench run` (one process per worker on this host) or by torchrun on each node:

    python -m hetbench.harness.loop.worker --run-dir DIR       # prepared by hetbench run
    torchrun ... -m hetbench.harness.loop.worker --suite S --run-name NAME --out DIR
                                                              # env:// rendezvous

Rank and world size come from RANK and WORLD_SIZE. Core affinity and thread counts are set
before any framework is imported, so every framework thread inherits them.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import signal
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from hetbench.adapters.base import Adapter, DeviceEvents, Loss
from hetbench.harness import exchange as aggregators
from hetbench.harness.exchange import Aggregator, Exchange, Holds, LeavesOut, Overlaps, Unattached
from hetbench.harness.loop import engine, lifecycle
from hetbench.harness.loop.counters import UNMEASURED_CPU, Counters
from hetbench.harness.loop.profiling import step_profiler
from hetbench.harness.loop.timer import CudaEventTimer, HostTimer, PhaseTimer, StepTimer
from hetbench.harness.partition.policies import (
    Damping,
    Repartitioner,
    initial_sizes,
    measures,
    probe_sizes,
    slice_bounds,
    solo_line,
)
from hetbench.harness.records import collector, rundir
from hetbench.harness.records.collector import Phase, RecordWriter
from hetbench.harness.spec.emulation import Stretcher
from hetbench.harness.spec.errors import UsageError
from hetbench.harness.spec.loaders import worker_loader
from hetbench.harness.spec.suite import RunSpec, load_suite, run_from_dict
from hetbench.harness.spec.workers import WorkerSpec
from hetbench.harness.system import allocator, interfaces, orphans
from hetbench.harness.system.exits import exit_after
from hetbench.harness.training.loader import Prefetcher
from hetbench.harness.training.optim import Optimizer
from hetbench.workloads import build_spec, get_workload
from hetbench.workloads.data import BatchOrder, load_dataset

# The phases an overlapped backward ends at an instant it measured, as module constants: an
# enum member read through its class costs ~0.15 us (the metaclass's lookup), several times
# that right after the compute (benchmarks/overhead.py). The other phases' ends are the
# loop's clock readings, `timer.end(now())`, in PHASES order (harness/loop/timer.py).
BACKWARD, PACK = Phase.BACKWARD, Phase.PACK
now = time.perf_counter_ns  # a module global: one lookup less per mark than time.X

if TYPE_CHECKING:
    import torch

    from hetbench.workloads.data import BatchOrder

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


class Stopped(BaseException):
    """Raised in the main thread by SIGTERM/SIGINT so records are flushed on the way out."""


def prepare_process(worker: WorkerSpec, keep_freed_memory: bool) -> None:
    """Affinity and thread limits first: threads started later inherit them; the allocator
    before the framework's first allocations."""
    if keep_freed_memory:
        allocator.keep_freed_memory()
    if worker.cores:
        os.sched_setaffinity(0, worker.cores)
    for name in THREAD_VARIABLES:
        os.environ[name] = str(worker.threads)
    orphans.follow_launcher()  # no worker outlives a killed `hetbench run`


@dataclass
class Trainer:
    """Holds what one worker needs for a step; `timed_step()` is the timed loop body."""

    run: RunSpec
    rank: int
    adapter: Adapter
    inputs: np.ndarray  # the training set, host arrays
    targets: np.ndarray
    order: BatchOrder
    stretch: Stretcher
    timer: PhaseTimer  # marks each phase's end (harness/loop/timer.py)
    # the communication buffer: gradient sums, the loss sum last (the adapter's comm_buffer)
    buffer: torch.Tensor
    optimizer: Optimizer
    initial: torch.Tensor  # the initial parameters, flat float32 in spec order
    # how this worker's gradients meet the others' (attached once built from the trainer)
    aggregator: Aggregator = field(default_factory=lambda: Unattached())
    # the aggregator again where it exchanges during the backward (DDP), else None
    overlap: Overlaps | None = None
    # the workload's per-batch transform (BERT's masking), or None
    prepare: Callable[..., tuple[np.ndarray, np.ndarray]] | None = None
    num_classes: int = 0
    encoded: list[bytes] | None = None  # training images as PNG (loader decode), or None
    # (step, lo, hi) -> batch: the loader's, or batch() in line (set once built)
    fetch: Callable[[int, int, int], tuple[np.ndarray, np.ndarray]] = field(
        default=lambda step, lo, hi: _no_batch_source())
    # the buffer's loss slot as the step reads it, `loss_slot[0]` (made from the buffer)
    loss_slot: memoryview | DeviceSlot = field(init=False)
    partition_history: list[dict[str, Any]] = field(default_factory=list)
    # each worker's solo compute a + b*n (ns) where the first partition timed them, else None
    solo_lines: list[tuple[float, float]] | None = None
    # the smallest slice the model trains on: 2 where a job's BatchNorm takes a slice's
    # statistics (one sample has none: torch refuses), the measured and adaptive policies
    # keep to it
    min_slice: int = 1

    def __post_init__(self) -> None:
        buffer = self.buffer
        self.grads = buffer[:-1]
        # A memoryview of a host buffer reads the loss slot as a float in ~0.05 us, numpy's
        # scalar path in ~0.1 us, indexing the tensor ~5 us; right after the step's compute,
        # with caches cold, the memoryview read in line costs ~0.5 us, through a function
        # (a lambda) ~1.2, numpy's ~3 (benchmarks/overhead.py)
        self.loss_slot = (buffer.numpy().data[-1:] if buffer.device.type == "cpu"
                          else DeviceSlot(buffer))

    def batch(self, step: int, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        """The slice [lo, hi) of step `step`'s global batch, as the workload prepares it."""
        idx = self.order.indices(step)[lo:hi]
        loader = self.run.loader
        if self.encoded is not None:
            from hetbench.workloads.pipeline import decode_png

            x = decode_png([self.encoded[i] for i in idx], self.inputs.shape[1])
        else:
            x = self.inputs[idx]
        y = self.targets[idx]
        if loader is not None and loader.augment:
            from hetbench.workloads.pipeline import augment

            x = augment(x, self.run.seed, step, lo, self.run.global_batch)
        if self.prepare is not None:
            x, y = self.prepare(x, y, self.run.seed, step, lo, self.run.global_batch,
                                self.num_classes)
        return x, y

    def compute(self, step: int, lo: int, hi: int) -> Loss:
        """load -> to_device -> forward -> backward -> pack, each phase's end marked by the
        timer (begun by the caller)."""
        adapter, timer = self.adapter, self.timer
        x, y = self.fetch(step, lo, hi)
        timer.end(now())  # load
        batch = adapter.to_device(x, y)
        timer.end(now())  # to_device
        loss = adapter.forward(batch)
        timer.end(now())  # forward
        overlap = self.overlap
        if overlap is not None:
            overlap.backward_begins(loss, timer.marks[-1])
        adapter.backward(loss)  # an overlapped exchange's buckets are summed when it returns
        handed = None if overlap is None else overlap.backward_ended()
        if handed is None:  # no exchange during the backward (or computed alone)
            timer.end(now())  # backward
            adapter.pack(loss)
            timer.end(now())  # pack
            return loss
        # ready: the last bucket handed over; the wait for the all-reduces after it is the
        # exchange's (exposed communication)
        adapter.pack(loss)
        timer.end_at(BACKWARD, handed)
        timer.end_at(PACK, handed)
        return loss

    def timed_step(self, step: int, lo: int, hi: int, counters: Counters
                   ) -> tuple[tuple[Any, ...], Exchange]:
        """One step, its phases marked by the timer, and its record (a timed step's parts,
        collector.TIMED_STEP_PARTS: the writer builds the row): the loss of the update and
        the local loss, the CPU time during compute of the main thread (wall minus this is
        time the worker was off the CPU: preempted, blocked, or stretched by slowdown) and
        of all its threads (on the steps `counters` samples), the counters, and what the
        aggregator's exchange did. One function: each call costs ~1 us right after a step."""
        timer = self.timer
        sampled = counters.start()
        timer.begin()
        self.compute(step, lo, hi)
        compute_cpu = counters.compute_cpu() if sampled else UNMEASURED_CPU
        local_loss = self.loss_slot[0] / (hi - lo)
        exchange = self.aggregator.exchange(step, hi - lo)
        timer.end(now())  # allreduce
        loss = self.loss_slot[0] / exchange.samples
        scale = self.take(step, exchange)
        timer.end(now())  # unpack
        if scale is not None:
            self.adapter.apply(scale)
        self.adapter.zero_grad()
        timer.end(now())  # apply
        stretch = self.stretch
        stretched, stretch.total_ns = stretch.total_ns, 0
        return (self.rank, step, hi - lo, lo, timer.marks, stretched, compute_cpu, loss,
                local_loss, counters.take(), exchange), exchange

    def take(self, step: int, exchange: Exchange) -> float | None:
        """The unpack phase: what the exchange left in the buffer goes into the framework.
        Gradient sums become the update here (the optimizer, in place); parameters are
        loaded as they are (nothing to apply: None)."""
        if exchange.holds is Holds.PARAMETERS:
            self.adapter.load_buffer()
            return None
        if exchange.holds is Holds.SUMS:
            scale = self.optimizer.update(step, self.grads, exchange.samples)
        else:
            scale = exchange.scale
        self.adapter.unpack()
        return scale

    def step_bare(self, step: int, lo: int, hi: int) -> Exchange:
        """The same step with no timing, counters or phase synchronisation: the baseline
        that instrumentation overhead is measured against (instrument = false)."""
        adapter = self.adapter
        loss = adapter.forward(adapter.to_device(*self.fetch(step, lo, hi)))
        if self.overlap is not None:
            self.overlap.backward_begins(loss, None)
        adapter.backward(loss)
        if self.overlap is not None:
            self.overlap.backward_ended()
        adapter.pack(loss)
        exchange = self.aggregator.exchange(step, hi - lo)
        scale = self.take(step, exchange)
        if scale is not None:
            adapter.apply(scale)
        adapter.zero_grad()
        return exchange

    def untimed_step(self, step: int, lo: int, hi: int, counters: Counters
                     ) -> tuple[tuple[Any, ...], Exchange]:
        """step_bare() with only its begin and end recorded (instrument = false)."""
        begin = time.perf_counter_ns()
        ex = self.step_bare(step, lo, hi)
        end = time.perf_counter_ns()
        return collector.untimed_record(self.rank, step, hi - lo, lo, begin, end, ex), ex

    def solo_throughput(self, size: int, steps: int) -> float:
        """Samples/s of this worker computing `size` samples alone (no update applied)."""
        if size == 0:  # left out: nothing to time
            return 0.0
        durations = []
        alone = self.overlap.alone() if self.overlap is not None else contextlib.nullcontext()
        # a job's buffers (BatchNorm's statistics) and random draws as they were before
        kept = getattr(self.adapter, "state_kept", contextlib.nullcontext)()
        with alone, kept:  # the others wait in a barrier: nothing to exchange with
            for s in range(steps + 1):  # the first step warms caches and allocators
                self.timer.begin()
                self.compute(s, 0, size)
                self.adapter.zero_grad()
                durations.append(self.timer.marks[-1] - self.timer.marks[0])
        return size / (statistics.median(durations[1:]) / 1e9)


class DeviceSlot:
    """A device buffer's loss slot read as a host buffer's memoryview is, `slot[0]`: the
    value copied to the host (after the device's work that wrote it)."""

    def __init__(self, buffer: torch.Tensor) -> None:
        self.buffer = buffer

    def __getitem__(self, index: int) -> float:
        return float(self.buffer[-1].item())


def _no_batch_source() -> tuple[np.ndarray, np.ndarray]:
    raise RuntimeError("no batch source attached to this trainer (build_trainer sets one)")


def initial_partition(trainer: Trainer, comm: Any, device: Any) -> tuple[int, ...]:
    run, policy = trainer.run, trainer.run.partition
    n, total = run.world_size, run.global_batch
    reason = f"policy {policy.policy}"
    lines = None
    if measures(policy):
        # each worker timed alone at two slices, one at a time, the others in the barrier
        probes = probe_sizes(total, n)
        mine = [0.0, 0.0]
        for turn in range(n):
            if turn == trainer.rank:
                mine = [probe / trainer.solo_throughput(probe, policy.profile_steps) * 1e9
                        for probe in probes]
            comm.barrier()
        lines = [solo_line(list(zip(probes, times, strict=True)))
                 for times in comm.all_gather_vectors(mine, device)]
        trainer.solo_lines = lines
        reason += (f": solo compute at {probes[0]} and {probes[1]} samples, fitted "
                   f"a + b*n (ms, ms/sample) "
                   f"{[(round(a / 1e6, 3), round(b / 1e6, 4)) for a, b in lines]}")
    sizes = initial_sizes(policy, total, n, lines, trainer.min_slice)
    if policy.adaptive:
        reason += f", then adaptive ({policy.policy})"
    trainer.partition_history.append({"step": 0, "sizes": list(sizes), "reason": reason})
    return sizes


def make_repartitioner(run: RunSpec, solo_lines: Sequence[tuple[float, float]] | None = None,
                       min_slice: int = 1) -> Repartitioner | None:
    """The adaptive policy's repartitioner; started from profiled lines, their intercepts
    are its prior (what a fit over slices too alike to tell them apart falls back to). Its
    smallest slice is the suite's `min_slice`, at least the model's `min_slice`."""
    p = run.partition
    if not p.adaptive:
        return None
    prior = [a for a, _ in solo_lines] if solo_lines else None
    damping = dataclasses.replace(Damping.of(p), min_slice=max(p.min_slice, min_slice))
    return Repartitioner(p.policy, run.global_batch, run.world_size, damping,
                         prior_intercepts_ns=prior, leave_out=p.leave_out)


def calibrate(trainer: Trainer, comm: Any, device: Any, sizes: tuple[int, ...]
              ) -> list[dict[str, Any]]:
    """Each worker's standalone samples/s on its own slice, one worker at a time: the
    denominator of heterogeneous efficiency (DESIGN.md)."""
    steps = trainer.run.calibrate_steps
    rate = 0.0
    for turn in range(trainer.run.world_size):
        if turn == trainer.rank:
            rate = trainer.solo_throughput(sizes[trainer.rank], steps)
        comm.barrier()
    rates = comm.all_gather_floats(rate, device)
    return [{"rank": r, "batch_size": sizes[r], "samples_per_s": rates[r], "steps": steps}
            for r in range(len(rates))]


def make_evaluator(run: RunSpec, rank: int, adapter: Adapter, run_dir: Path, device: Any
                   ) -> Any:
    """The held-out evaluation of a run with eval_every, or None."""
    if not run.eval_every:
        return None
    from hetbench.harness.exchange import comm
    from hetbench.harness.training.evaluation import Evaluator

    lockstep = aggregators.kind(run.aggregator.name).lockstep
    if not lockstep and rank != 0:
        return None  # worker 0 evaluates alone (harness/training/evaluation.py)
    workload = get_workload(run.workload)
    heldout = load_dataset(run.dataset, run.workload, run.seed, "heldout")
    if workload.prepare_heldout is not None:  # BERT: the held-out windows masked once
        inputs, targets = workload.prepare_heldout(heldout.inputs, heldout.targets,
                                                   heldout.num_classes)
        heldout = dataclasses.replace(heldout, inputs=inputs, targets=targets)
    if not lockstep:
        return Evaluator(run.eval_every, run.steps, run.global_batch, workload.metric, 0, 1,
                         adapter, heldout, lambda values: [values], run_dir)
    return Evaluator(run.eval_every, run.steps, run.global_batch, workload.metric, rank,
                     run.world_size, adapter, heldout,
                     lambda values: comm.all_gather_vectors(values, device), run_dir)


def phase_timer(worker: WorkerSpec, adapter: Adapter, stretch: Stretcher, instrument: bool,
                overlaps: bool = False) -> PhaseTimer:
    """CUDA events for a PyTorch CUDA worker that no slowdown stretches and whose exchange
    does not overlap its backward (that one ends where the exchange says); else the host
    clock, waiting for the device where its work is asynchronous (a GPU, MXNet's engine),
    and only the host clock where there is neither a wait nor a stretch."""
    if worker.is_cuda and instrument and not worker.emulated and not overlaps \
            and isinstance(adapter, DeviceEvents):
        return CudaEventTimer(adapter.synchronize, adapter.cuda_event)
    waits = (worker.is_cuda or adapter.synchronize_on_host) and instrument
    if not waits and not worker.emulated:
        return HostTimer()
    return StepTimer(stretch, adapter.synchronize if waits else None)


def build_trainer(run: RunSpec, rank: int, backend: str, adapter_cls: type[Adapter]
                  ) -> tuple[Trainer, Any]:
    """Data, model, adapter and optimizer of one worker, initial parameters loaded; also the
    dataset."""
    import numpy as np
    import torch

    from hetbench.harness.training.optim import Optimizer

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


def train(run: RunSpec, run_dir: Path, rank: int, backend: str, adapter_cls: type[Adapter]) -> None:
    """Build the worker's trainer (and input pipeline), run it, stop the pipeline."""
    if run.pipeline is not None:  # a stage of a virtual worker: its own loop
        from hetbench.harness.loop.stage import train_stage

        train_stage(run, run_dir, rank, backend)
        return
    aggregators.prepare(run, rank)
    if run.is_job:  # a user's job named by import path
        from hetbench.harness.loop import job

        trainer, data, described, statistics = job.build(run, rank, backend, Trainer,
                                                         phase_timer)
        batches = job.batches(run, trainer)
        trainer.fetch = batches.get
        try:
            exactness = job.measured_exactness(run, rank, trainer, batches, described,
                                               statistics, backend)
            _attach_and_train(run, run_dir, rank, backend, adapter_cls, trainer, data,
                              {"job": described, "exactness": exactness})
        finally:
            batches.close()
        return
    trainer, data = build_trainer(run, rank, backend, adapter_cls)
    prefetcher = None
    loader = worker_loader(run.loader, run.workers[rank].loader_workers)
    if loader is not None and loader.workers > 0:
        # a worker of an asynchronous scheme may take more steps than the run's count
        most = run.steps * (1 if aggregators.kind(run.aggregator.name).lockstep
                            else run.world_size)
        prefetcher = Prefetcher(trainer.batch, loader, most, run.timeout_s)
        trainer.fetch = prefetcher.get
    try:
        _attach_and_train(run, run_dir, rank, backend, adapter_cls, trainer, data, {})
    finally:
        if prefetcher is not None:
            prefetcher.close()


def _attach_and_train(run: RunSpec, run_dir: Path, rank: int, backend: str,
                      adapter_cls: type[Adapter], trainer: Trainer, data: Any,
                      job: dict[str, Any]) -> None:
    """The aggregator attached to the trainer, then the training; `job`: what the manifest
    says of a user's job (its description, the exactness measured), or {}."""
    trainer.aggregator = aggregators.create(aggregators.Context(
        run, rank, trainer.adapter, trainer.buffer, trainer.optimizer, trainer.initial,
        run_dir, trainer.stretch))
    if aggregators.kind(run.aggregator.name).overlaps:
        assert isinstance(trainer.aggregator, Overlaps)
        trainer.overlap = trainer.aggregator
    failed = True
    try:
        _train(run, run_dir, rank, backend, adapter_cls, trainer, data, job)
        failed = False
    finally:
        trainer.aggregator.close(failed)


def _train(run: RunSpec, run_dir: Path, rank: int, backend: str, adapter_cls: type[Adapter],
           trainer: Trainer, data: Any, job: dict[str, Any]) -> None:
    import torch

    from hetbench.harness.exchange import comm
    from hetbench.harness.loop.data_parallel import WorkerSteps
    from hetbench.harness.loop.membership import Membership
    from hetbench.harness.loop.repartitioning import Repartitioning

    worker = run.workers[rank]
    adapter = trainer.adapter
    device = torch.device(worker.device if backend == "nccl" else "cpu")

    info = lifecycle.describe(run, rank, worker, adapter_cls.versions(), data,
                              adapter.spec.num_elements)
    job_closing = {k: v for k, v in job.items() if v is not None}  # rank 0's exactness
    clock_start = lifecycle.start(run_dir, info, device)
    sizes = initial_partition(trainer, comm, device)
    lo, hi = slice_bounds(sizes)[rank]
    standalone = calibrate(trainer, comm, device, sizes) if run.calibrate else []
    if rank == 0:
        collector.write_partition_log(run_dir, trainer.partition_history, standalone)
    trainer.stretch.total_ns = 0
    membership = None
    if run.partition.may_leave_out:
        membership = Membership(rank, run.world_size, sizes, run.timeout_s, device)
        assert isinstance(trainer.aggregator, LeavesOut)  # the spec allowed no other
        trainer.aggregator.set_members(membership.group(), len(membership.members))
    if run.is_job:
        from hetbench.harness.loop.job import evaluator as job_evaluator

        evaluator = job_evaluator(run, rank, trainer.adapter, run_dir, device)  # type: ignore[arg-type]
    else:
        evaluator = make_evaluator(run, rank, adapter, run_dir, device)
    if evaluator:
        evaluator(0)
    profiler = step_profiler(run.profile, rank, device.type == "cuda")
    comm.barrier()  # every worker starts training together, whoever evaluated
    writer = RecordWriter(collector.part_path(run_dir, rank))
    step_fn = trainer.timed_step if run.instrument else trainer.untimed_step
    repartitioner = make_repartitioner(run, trainer.solo_lines, trainer.min_slice)
    steps = WorkerSteps(run, step_fn, Counters(run.counters_every), (lo, hi), membership,
                        Repartitioning(run, rank, device, trainer, repartitioner,
                                       membership, run_dir, standalone), evaluator)
    try:
        if evaluator:
            evaluator.start_clock()
        engine.run_steps(steps, writer.append, steps.evaluation(adapter),
                         engine.slowdown_schedule(worker, trainer.stretch, run.seed, rank),
                         profiler=profiler)
    finally:
        writer.close()
    if profiler is not None:  # after the last step: writing the trace delays none
        profiler.write(run_dir, rank)
    if membership is not None and membership.computing:
        membership.announce_end(run.steps - 1, adapter)  # rank 0 writes the members' model
    if run.on_worker_failure == "continue":
        # A peer may be gone: no collective after training. Each worker leaves what rank 0
        # would have written, and the launcher finishes the run directory from the parts.
        collector.write_survivor(run_dir, rank, adapter.parameters(),
                                 {"aggregator": trainer.aggregator.describe(),
                                  "partition_history": trainer.partition_history})
        return
    if (traffic := getattr(trainer.aggregator, "traffic", None)) is not None:
        info["traffic"] = traffic()  # bytes to and from each server (analysis/traffic.py)
    if (server_clocks := getattr(trainer.aggregator, "server_clocks", None)) is not None \
            and (applied := server_clocks()):
        info["server_clocks"] = applied  # the offsets applied to other hosts' servers' stamps
    side = ({} if (records := getattr(trainer.aggregator, "bucket_records", None)) is None
            else {collector.BUCKETS: records()})
    lifecycle.finish(run, run_dir, device, info, clock_start, writer.records(),
                     adapter.parameters(), backend,
                     {"partition_history": trainer.partition_history, "standalone": standalone,
                      "aggregator": trainer.aggregator.describe(), **job_closing}, side)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hetbench.harness.loop.worker",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", type=Path, help="run directory prepared by hetbench run")
    parser.add_argument("--suite", help="suite file or built-in name (torchrun mode)")
    parser.add_argument("--run-name", help="run name within the suite (torchrun mode)")
    parser.add_argument("--repeat", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("results"))
    args = parser.parse_args(argv)

    rank = int(os.environ.get("RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _raise_stopped)
    try:
        run, suite_name = _load_run(args)
    except UsageError as exc:
        print(f"hetbench worker: error: {exc}", file=sys.stderr)
        return 2
    if world_size != run.world_size:
        print(f"hetbench worker: error: WORLD_SIZE={world_size} but run {run.name!r} has "
              f"{run.world_size} workers", file=sys.stderr)
        return 2
    if args.run_dir is None and (problem := _torchrun_problem(run)):
        print(f"hetbench worker: error: {problem}", file=sys.stderr)
        return 2
    if args.run_dir is None and run.interface is not None:
        if (missing := bind_interface(run.interface)) is not None:
            print(f"hetbench worker: error: interface: {missing}", file=sys.stderr)
            return 2
    worker = run.workers[rank]
    prepare_process(worker, run.keep_freed_memory)
    if aggregators.kind(run.aggregator.name).serves is not None:
        # the framework's server: a coordinator (one of the run's services) trains and
        # records (torchrun mode refuses such aggregators: _torchrun_problem)
        return _guarded(args.run_dir, run, rank, False,
                        lambda: aggregators.serve(run, args.run_dir, rank))

    from hetbench.adapters import load_adapter
    from hetbench.harness.exchange import comm as comm_module

    adapter_cls = load_adapter(worker.framework)
    backend = comm_module.choose_backend(
        all(w.is_cuda for w in run.workers)
        and aggregators.kind(run.aggregator.name).device_buffer)
    comm_module.init(rank, world_size, backend, run.timeout_s, worker.device)
    run_dir = args.run_dir or _torchrun_run_dir(run, suite_name, args, rank, backend)
    (run_dir / collector.PARTS_DIR).mkdir(parents=True, exist_ok=True)
    try:
        return _guarded(run_dir, run, rank, args.run_dir is None,
                        lambda: train(run, run_dir, rank, backend, adapter_cls))
    finally:
        _quiet_shutdown(comm_module)


def _guarded(run_dir: Path, run: RunSpec, rank: int, torchrun: bool,
             body: Callable[[], None]) -> int:
    """Run the worker's `body`; its exit status, with the reason it stopped recorded for
    whoever closes the run (under torchrun, rank 0 closes it)."""
    try:
        body()
        return 0
    except Stopped:
        _record_error(run_dir, rank, "interrupted")
        if torchrun:
            _close_torchrun_run(run_dir, run, rank, "interrupted", "interrupted by a signal")
        return 130
    except Exception as exc:  # noqa: BLE001 - reported to the launcher, then exit non-zero
        reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        _record_error(run_dir, rank, reason)
        traceback.print_exc()
        if torchrun:
            _close_torchrun_run(run_dir, run, rank, "failed", f"worker {rank}: {reason}")
        return 1


def bind_interface(name: str) -> str | None:
    """Make every library that listens bind interface `name` (torchrun mode, across hosts:
    the suite's `interface`); why not, when this host has no such interface."""
    if (why := interfaces.missing(name)) is not None:
        return why
    os.environ.update(interfaces.binding(name))
    return None


def _torchrun_problem(run: RunSpec) -> str | None:
    """What torchrun mode cannot do for this run: it has no launcher to start an
    aggregator's processes or to finish a run that went on without a dead worker."""
    if aggregators.kind(run.aggregator.name).services is not None:
        return (f"aggregator {run.aggregator.name!r} needs processes `hetbench run` starts "
                "(servers); under torchrun use 'torch', 'allreduce-host', 'local-sgd' or "
                "'ddp'")
    if run.on_worker_failure == "continue":
        return ("on_worker_failure = 'continue' needs `hetbench run` to finish the run "
                "directory; under torchrun use 'fail'")
    return None


def _raise_stopped(signum: int, frame: Any) -> None:
    raise Stopped(signal.Signals(signum).name)


def _record_error(run_dir: Path, rank: int, reason: str) -> None:
    try:
        collector.error_path(run_dir, rank).write_text(reason + "\n")
    except OSError:
        pass


def _close_torchrun_run(run_dir: Path, run: RunSpec, rank: int, status: str,
                        reason: str) -> None:
    """Under torchrun no hetbench launcher watches the workers: rank 0 marks a run that ends
    badly itself, with every record flushed on its node, as the launcher would."""
    if rank != 0:
        return

    # torchrun signals the surviving workers when one fails: finish the directory first.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    if status == "interrupted":  # stopped because another worker failed, if one says so
        for peer in range(1, run.world_size):
            text = collector.read_error(run_dir, peer)
            if text and text != "interrupted":
                status, reason = "failed", f"worker {peer}: {text}"
                break
    try:
        rundir.close_run(run_dir, run, status, reason)
    except Exception:  # noqa: BLE001 - the worker's own error is the one to report
        traceback.print_exc()


def _quiet_shutdown(comm_module: Any) -> None:
    try:
        comm_module.shutdown()
    except Exception:  # noqa: BLE001 - a broken group at exit must not mask the real error
        pass


def _load_run(args: argparse.Namespace) -> tuple[RunSpec, str]:
    if args.run_dir is not None:
        data = json.loads((args.run_dir / rundir.RUN_FILE).read_text())
        return run_from_dict(data["run"]), data["suite"]
    if not args.suite or not args.run_name:
        raise UsageError("arguments", "give --run-dir, or --suite and --run-name (torchrun mode)")

    suite = load_suite(args.suite)
    for run in suite.runs:
        if run.name == args.run_name:
            return run, suite.name
    names = ", ".join(r.name for r in suite.runs)
    raise UsageError("--run-name", f"no run {args.run_name!r} in suite {suite.name} ({names})")


def _torchrun_run_dir(run: RunSpec, suite_name: str, args: argparse.Namespace, rank: int,
                      backend: str) -> Path:
    """Rank 0 creates the run directory and manifest; every rank learns its name."""
    import torch

    from hetbench.harness.exchange import comm

    name = ""
    if rank == 0:
        name = str(rundir.prepare_run_dir(args.out, suite_name, run, args.repeat))
    device = torch.device(run.workers[rank].device if backend == "nccl" else "cpu")
    return Path(comm.broadcast_bytes(name.encode(), device).decode())


if __name__ == "__main__":
    exit_after(main)
