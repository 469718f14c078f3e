"""`ddp`: PyTorch's DistributedDataParallel does the exchange, overlapped with the backward.

DDP wraps the worker's model (the adapter's training forward runs through it) and groups
the gradients into buckets of `bucket_mb`. As the backward fills a bucket, DDP calls the
communication hook below, which starts the bucket's all-reduce and returns its future.
The all-reduce is a SUM, with no division: hetbench's gradients are sums over each
worker's slice, so the summed buckets are the global batch's gradient sums whatever the
slices (the weighting by slice is exact), and the loop's optimizer divides by the global
batch as it does after any all-reduce. DDP waits for every bucket before the backward
returns and copies the sums into the parameters' gradients, which are views of the
adapter's flat gradient buffer: after the backward, the buffer holds the sums. The loss
sum's all-reduce starts right after the last bucket's, so the two run together rather
than one more round trip after the backward; the exchange waits for it and puts the sum
in the buffer's loss slot.

The hook records, per bucket, when the backward handed it over (`ready_ns`) and when its
all-reduce was done (`reduced_ns`): buckets.parquet. The step's `ready` is the last
bucket's hand-over (the loop asks `backward_ended`), so idle before the exchange and the
straggler keep their meaning under overlap (DESIGN.md, "Idle under overlap"). A worker's
emulated slowdown stretches each bucket's computation in the hook, before the bucket is
handed over, as a slower device would hand it over later.

On a GPU the hook runs when the bucket's kernels are queued, not done: its `ready_ns` is
the host's instant (the device is waited for only to stretch a slowed worker's bucket).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from adapters.base import Loss
from harness.exchange import Context, Exchange, Holds, next_step
from harness.records import collector
from harness.spec.emulation import Stretcher

if TYPE_CHECKING:
    from adapters.pytorch import TorchAdapter


class DDPAllreduce:
    def __init__(self, context: Context) -> None:
        run, self.rank = context.run, context.rank
        adapter = cast("TorchAdapter", context.adapter)  # the spec allows only PyTorch
        self.bucket_mb = run.aggregator.bucket_mb
        # Buffers (BatchNorm's statistics) stay each worker's own, as in every other
        # hetbench scheme; the parameters start equal on every worker (one seed), which
        # DDP's construction checks and broadcasts once.
        self.ddp = DistributedDataParallel(adapter.model, bucket_cap_mb=self.bucket_mb,
                                           broadcast_buffers=False)
        # DDP checks a hook's annotations against its own types, which this module's
        # postponed (string) annotations never equal: registered through an unannotated one
        self.ddp.register_comm_hook(None, lambda state, bucket: self._hook(bucket))
        adapter.forward_module = self.ddp
        self.loss = context.buffer[-1:]  # the loop reads the summed loss here
        self._loss_sum = torch.zeros(1, device=context.buffer.device)
        self._loss_work: dist.Work | None = None
        self.steps, self.global_batch = run.steps, run.global_batch
        self.stretch = context.stretch or Stretcher(1.0)
        worker = run.workers[context.rank]
        self.synchronize: Callable[[], None] | None = (
            adapter.synchronize if worker.is_cuda else None)
        self.writer = collector.RecordWriter(collector.BUCKETS.part_path(context.run_dir,
                                                                         context.rank),
                                             dtype=collector.BUCKET_DTYPE)
        self._since: int | None = None  # the end of the last bucket's computation
        self._handed: list[list[int]] = []  # this step's buckets: index, bytes, ready, reduced
        self._buckets = 0  # buckets in the last step (DDP rebuilds them after the first)

    def _hook(self, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        now = time.perf_counter_ns()
        if self._since is not None and self.stretch.extra > 0.0:
            if self.synchronize is not None:  # the bucket's kernels done, not just queued
                self.synchronize()
                now = time.perf_counter_ns()
            now = self.stretch(self._since, now)
        self._since = now
        tensor = bucket.buffer()
        entry = [bucket.index(), tensor.numel() * tensor.element_size(), now, 0]
        self._handed.append(entry)

        def reduced(future: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
            entry[3] = time.perf_counter_ns()
            return future.value()[0]

        work = dist.all_reduce(tensor, op=dist.ReduceOp.SUM, async_op=True)
        assert work is not None
        if bucket.is_last():
            self._loss_work = dist.all_reduce(self._loss_sum, op=dist.ReduceOp.SUM,
                                              async_op=True)
        return work.get_future().then(reduced)

    def backward_begins(self, loss: Loss, instant: int | None) -> None:
        self._since = instant
        self._loss_sum.copy_(cast("torch.Tensor", loss).detach().reshape(1))

    def backward_ended(self) -> int | None:
        handed = self._handed[-1][2] if self._handed else None
        self._since = None
        return handed

    @contextlib.contextmanager
    def alone(self) -> Iterator[None]:
        with self.ddp.no_sync():  # no hook runs, so no collective starts
            yield

    def exchange(self, step: int, samples: int) -> Exchange:
        # the buckets were summed during the backward, the loss beside them
        if self._loss_work is None:
            raise RuntimeError("ddp: an exchange without a backward before it")
        self._loss_work.wait()
        self._loss_work = None
        self.loss.copy_(self._loss_sum)
        for entry in self._handed:
            self.writer.append((self.rank, step, *entry))
        self._buckets, self._handed = len(self._handed), []
        return Exchange(Holds.SUMS, self.global_batch, next_step(step, self.steps))

    def bucket_records(self) -> np.ndarray:
        """Every bucket this worker handed over (collector.BUCKET_DTYPE rows)."""
        return self.writer.records()

    def describe(self) -> dict[str, Any]:
        return {"bucket_mb": self.bucket_mb, "buckets": self._buckets}

    def close(self, failed: bool = False) -> None:
        self.writer.close()
