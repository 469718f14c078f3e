"""A data-parallel worker's step (`Trainer`) and the clock that times its phases.

`Trainer.timed_step` is the one place a data-parallel step is timed, for the built-in
workloads and a user's job alike: where its model and batches come from is the source's
business (harness/loop/sources.py), how its gradients meet the others' the aggregator's.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from hetbench.adapters.base import Adapter, Batch, DeviceEvents, Loss
from hetbench.harness.exchange import Aggregator, Exchange, Holds, Overlaps, Unattached
from hetbench.harness.loop.counters import Counters
from hetbench.harness.loop.timer import CudaEventTimer, HostTimer, PhaseTimer, StepTimer
from hetbench.harness.records import collector
from hetbench.harness.records.collector import Phase
from hetbench.harness.spec.emulation import Stretcher
from hetbench.harness.spec.suite import RunSpec
from hetbench.harness.spec.workers import WorkerSpec
from hetbench.harness.training.optim import Optimizer, OwnOptimizer

if TYPE_CHECKING:
    import torch

    from hetbench.adapters.pytorch_job import TorchJobAdapter
    from hetbench.workloads.data import BatchOrder

# The phases an overlapped backward ends at an instant it measured, as module constants: an
# enum member read through its class costs ~0.15 us (the metaclass's lookup), several times
# that right after the compute (benchmarks/overhead.py). The other phases' ends are the
# loop's clock readings, `timer.end(now())`, in PHASES order (harness/loop/timer.py).
BACKWARD, PACK = Phase.BACKWARD, Phase.PACK
now = time.perf_counter_ns  # a module global: one lookup less per mark than time.X


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
    optimizer: Optimizer | OwnOptimizer  # OwnOptimizer: a job's own torch optimizer steps
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
    # (step, lo, hi): the slice from that step on, told to a job's DataLoader before its
    # batches are made ahead for it (harness/training/job_loader.py); None elsewhere
    announce: Callable[[int, int, int], None] | None = None
    # the buffer's loss slot as the step reads it, `loss_slot[0]` (made from the buffer)
    loss_slot: memoryview | DeviceSlot = field(init=False)
    partition_history: list[dict[str, Any]] = field(default_factory=list)
    # each worker's solo compute a + b*n (ns) where the first partition timed them, else None
    solo_lines: list[tuple[float, float]] | None = None
    # the smallest slice the model trains on: 2 where a job's BatchNorm takes a slice's
    # statistics (one sample has none: torch refuses), the measured and adaptive policies
    # keep to it
    min_slice: int = 1
    # the ns this worker waited for the others inside its forward and backward since the
    # last call (a job's global BatchNorm: harness/training/batchnorm.py), which is not
    # its compute; 0 where nothing waits there
    waits_in_compute: Callable[[], int] = field(default=lambda: 0)

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
        if self.run.accumulate > 1:
            return self._accumulated(batch)
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

    def _accumulated(self, batch: Batch, timed: bool = True) -> Loss:
        """forward -> backward over each of the run's micro-batches of the slice (a job's
        `accumulate`), the gradients summed in the buffer, then pack with the summed loss.
        `timed`: forward is marked as the sum of the forwards, backward as that of the
        backwards (step_bare marks nothing)."""
        adapter, timer = self.adapter, self.timer
        micro = cast("TorchJobAdapter", adapter).micro_batches(batch, self.run.accumulate)
        marks = timer.marks
        total: Any = None
        for i, part in enumerate(micro):
            loss = adapter.forward(part)
            if timed and i == 0:
                timer.end(now())  # forward
            elif timed:  # this forward joins forward's length; backward keeps its own
                end = self._compute_ended()
                marks[-2] += end - marks[-1]
                marks[-1] = end
            adapter.backward(loss)
            if timed and i == 0:
                timer.end(now())  # backward
            elif timed:
                marks[-1] = self._compute_ended()
            summed = cast("torch.Tensor", loss).detach()
            total = summed if total is None else total + summed
        adapter.pack(Loss(total))
        if timed:
            timer.end(now())  # pack
        return Loss(total)

    def _compute_ended(self) -> int:
        """The instant the compute since the last mark ends: done on the device, stretched
        by the emulated slowdown (StepTimer's rules for forward and backward)."""
        timer = self.timer
        if isinstance(timer, StepTimer):
            if timer.synchronize is not None:
                timer.synchronize()
            return timer.stretch(timer.marks[-1], now())
        return now()  # the host clock's marks: nothing to wait for nor stretch

    def timed_step(self, step: int, lo: int, hi: int, counters: Counters
                   ) -> tuple[tuple[Any, ...], Exchange]:
        """One step, its phases marked by the timer, and its record (a timed step's parts,
        collector.TIMED_STEP_PARTS: the writer builds the row): the loss of the update and
        the local loss, the kernel's counts over the compute (the main thread's CPU time and
        wait for a CPU: wall minus both is time it was blocked or stretched by slowdown; all
        its threads' CPU time, faults, switches, migrations), the counters, and what the
        aggregator's exchange did. One function: each call costs ~1 us right after a step."""
        timer = self.timer
        counters.start()
        timer.begin()
        self.compute(step, lo, hi)
        compute = counters.compute()
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
        stretched = self.stretch.take()
        return (self.rank, step, hi - lo, lo, timer.marks, stretched, compute, loss,
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
        batch = adapter.to_device(*self.fetch(step, lo, hi))
        if self.run.accumulate > 1:
            self._accumulated(batch, timed=False)
            return self._exchange_bare(step, lo, hi)
        loss = adapter.forward(batch)
        if self.overlap is not None:
            self.overlap.backward_begins(loss, None)
        adapter.backward(loss)
        if self.overlap is not None:
            self.overlap.backward_ended()
        adapter.pack(loss)
        return self._exchange_bare(step, lo, hi)

    def _exchange_bare(self, step: int, lo: int, hi: int) -> Exchange:
        adapter = self.adapter
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



def phase_timer(worker: WorkerSpec, adapter: Adapter, stretch: Callable[[int, int], int],
                instrument: bool, overlaps: bool = False) -> PhaseTimer:
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

