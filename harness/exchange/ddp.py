"""`ddp`: PyTorch's DistributedDataParallel does the exchange, overlapped with the backward.

DDP wraps the worker's model (the adapter's training forward runs through it) and groups
the gradients into buckets of `bucket_mb`. As the backward fills a bucket, DDP starts its
all-reduce, and it waits for every bucket before the backward returns; the sums then reach
the adapter's flat gradient buffer, which the loop's optimizer updates from. The loss
sum's all-reduce starts as the backward begins, so it runs beside the buckets rather than
one more round trip after them; the exchange waits for it and puts the sum in the
buffer's loss slot. hetbench's gradients are sums over each worker's slice, so summed
buckets are the global batch's gradient sums whatever the slices (the weighting by slice is
exact), and the loop's optimizer divides by the global batch as after any all-reduce.

`comm_hook` picks who all-reduces a bucket:
- `builtin` (the default): DDP's own all-reduce in C++, as DDP runs unless given a hook. It
  averages over the workers (divides by their number as it fills a bucket), so the
  backward starts from that number rather than 1 (the adapter's `backward_seed`): each
  worker computes its gradient sums times it, and their average is the sum (exact for 2,
  4, ... workers; a float32 rounding for others). The gradients are set to None before the
  backward, so that autograd hands each one over as computed rather than adding it to a
  zeroed one, and are views of DDP's buckets (`gradient_as_bucket_view`), so that DDP
  copies each into its bucket once and never back; after the backward one
  `_foreach_copy_` moves the sums into the flat buffer. DDP's own training, which sets its
  gradients to None too, moves as many bytes (VGG small's overlapped backward: 1.4 ms
  longer than DDP's with the gradients added into the flat buffer's views, 0.3 ms with
  them handed over). A hook on a bucket's last gradient
  (`register_post_accumulate_grad_hook`, which runs before DDP marks the gradient ready)
  records when it was computed: the bucket's `ready_ns` is that instant, or the bucket
  before it's, as DDP hands buckets over in order. Until DDP has regrouped its buckets by
  the order the backward computes the gradients (after the first step), every gradient is
  watched. When a bucket's all-reduce was done is not seen (`reduced_ns` 0): only a
  callback on the all-reduce's future would see it, Python code run on the communication
  thread: the cost of `timed`.
- `timed`: a communication hook in Python starts each bucket's all-reduce (a SUM, no
  division; the gradients stay views of the flat buffer, DDP copying each bucket in and
  back) and records when it was handed over (`ready_ns`) and when its all-reduce was
  done (`reduced_ns`, the future's callback). A Python comm hook costs DDP itself: DDP with
  torch's own Python all-reduce hook took 3-4% longer per ResNet small step than DDP's
  built-in on 2 CPU workers (benchmarks/ddp_compare.py, variant `ddp-overlap-pyhook`).

Both write buckets.parquet. The step's `ready` is the last bucket's hand-over (the loop
asks `backward_ended`), so idle before the exchange and the straggler keep their meaning
under overlap (DESIGN.md, "Idle under overlap"). A worker's emulated slowdown stretches
its backward bucket by bucket, before DDP sees the bucket's last gradient (builtin) or
before the hook hands the bucket over (timed), as a slower device would hand it over later.

On a GPU the hooks run when the kernels are queued, not done: `ready_ns` is the host's
instant (the device is waited for only to stretch a slowed worker's backward).
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

from hetbench.adapters.base import Loss
from hetbench.harness.exchange import Context, Exchange, Holds, next_step
from hetbench.harness.records import collector
from hetbench.harness.spec.emulation import Stretcher

if TYPE_CHECKING:
    from torch.utils.hooks import RemovableHandle

    from hetbench.adapters.pytorch import TorchAdapter


class DDPAllreduce:
    def __init__(self, context: Context) -> None:
        run, self.rank = context.run, context.rank
        adapter = cast("TorchAdapter", context.adapter)  # the spec allows only PyTorch
        self.adapter = adapter
        self.bucket_mb = run.aggregator.bucket_mb
        self.comm_hook = run.aggregator.comm_hook
        self.parameters = [p for p in adapter.model.parameters() if p.requires_grad]
        # builtin: each gradient's place in the adapter's flat buffer, where the sums go
        # (taken before DDP makes the gradients views of its buckets)
        self._flat_views = [cast("torch.Tensor", p.grad) for p in self.parameters]
        # Buffers (BatchNorm's statistics) stay each worker's own, as in every other
        # hetbench scheme; the parameters start equal on every worker (one seed), which
        # DDP's construction checks and broadcasts once.
        self.ddp = DistributedDataParallel(adapter.model, bucket_cap_mb=self.bucket_mb,
                                           broadcast_buffers=False,
                                           gradient_as_bucket_view=self.comm_hook == "builtin")
        adapter.forward_module = self.ddp
        world = dist.get_world_size()
        # DDP's own all-reduce averages over the workers: a backward that starts from their
        # number computes each gradient sum times it, and the average is the sum
        self.seed = (torch.full((), float(world), device=context.buffer.device)
                     if self.comm_hook == "builtin" and world > 1 else None)
        adapter.backward_seed = self.seed
        if self.comm_hook == "timed":
            # DDP checks a hook's annotations against its own types, which this module's
            # postponed (string) annotations never equal: registered through an unannotated one
            self.ddp.register_comm_hook(None, lambda state, bucket: self._hook(bucket))
        # builtin: per DDP bucket, the gradients watched and its bytes; when each watched
        # gradient was computed (by parameter); the hooks watching them
        self._watched: list[tuple[list[int], int]] = []
        self._computed = [0] * len(self.parameters)
        self._watching: list[RemovableHandle] = []
        self._watched_after_rebuild: bool | None = None  # None: nothing watched yet
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
        self._syncing = True  # False while computed alone: no collective, no stretch here
        self._since: int | None = None  # the end of the backward's last stretched part
        # this step's buckets (timed: as the hook saw them; builtin: as backward_ended
        # found them): index, bytes, ready, reduced
        self._handed: list[list[int]] = []
        self._buckets = 0  # buckets in the last step (DDP rebuilds them after the first)

    def _stretched(self, now: int) -> int:
        """`now`, or later by the worker's emulated slowdown of the backward since the last
        hand-over (or its begin)."""
        if self._since is not None and self.stretch.extra > 0.0:
            if self.synchronize is not None:  # the kernels done, not just queued
                self.synchronize()
                now = time.perf_counter_ns()
            now = self.stretch(self._since, now)
        self._since = now
        return now

    def _watch_buckets(self) -> None:
        """Hooks on the gradients that end DDP's buckets. DDP regroups the gradients once,
        in the order the first backward computed them, so that a bucket's last gradient is
        the last one computed; before that, every gradient is watched."""
        rebuilt = self.ddp._has_rebuilt_buckets
        position = {id(p): k for k, p in enumerate(self.parameters)}
        self._watched = []
        for bucket in self.ddp.reducer._get_zeros_like_grad_buckets():
            members = [position[id(p)] for p in bucket.parameters()]
            size = bucket.buffer().numel() * bucket.buffer().element_size()
            self._watched.append((members[-1:] if rebuilt else members, size))
        for handle in self._watching:
            handle.remove()
        self._watching = [
            self.parameters[k].register_post_accumulate_grad_hook(self._computed_hook(k))
            for watched, _ in self._watched for k in watched]
        self._watched_after_rebuild = rebuilt

    def _computed_hook(self, index: int) -> Callable[[torch.Tensor], None]:
        computed = self._computed

        def gradient_computed(_: torch.Tensor) -> None:
            now = time.perf_counter_ns()
            computed[index] = self._stretched(now) if self._syncing else now
        return gradient_computed

    def _hook(self, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        now = self._stretched(time.perf_counter_ns())
        tensor = bucket.buffer()
        entry = [bucket.index(), tensor.numel() * tensor.element_size(), now, 0]
        self._handed.append(entry)

        def reduced(future: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
            entry[3] = time.perf_counter_ns()
            return future.value()[0]

        work = dist.all_reduce(tensor, op=dist.ReduceOp.SUM, async_op=True)
        assert work is not None
        return work.get_future().then(reduced)

    def backward_begins(self, loss: Loss, instant: int | None) -> None:
        # the forward has run: DDP's buckets are what this backward fills
        if (self.comm_hook == "builtin"
                and self._watched_after_rebuild != self.ddp._has_rebuilt_buckets):
            self._watch_buckets()
        self._since = instant
        self._loss_sum.copy_(cast("torch.Tensor", loss).detach().reshape(1))
        if self.comm_hook == "builtin":
            for parameter in self.parameters:  # the backward hands its gradients over
                parameter.grad = None
        if self._syncing:
            self._loss_work = dist.all_reduce(self._loss_sum, op=dist.ReduceOp.SUM,
                                              async_op=True)

    def backward_ended(self) -> int | None:
        self._since = None
        if not self._syncing:
            return None
        if self.comm_hook == "timed":
            return self._handed[-1][2] if self._handed else None
        # the sums, from DDP's buckets (the gradients are views of them) to the flat
        # buffer, before the loop packs it
        torch._foreach_copy_(self._flat_views,
                             [cast("torch.Tensor", p.grad) for p in self.parameters])
        self._handed = self._builtin_buckets()
        return self._handed[-1][2]

    @contextlib.contextmanager
    def alone(self) -> Iterator[None]:
        self._syncing, self.adapter.backward_seed = False, None  # nothing averages
        try:
            with self.ddp.no_sync():  # no bucket is handed over, so no collective starts
                yield
        finally:
            self._syncing, self.adapter.backward_seed = True, self.seed

    def _builtin_buckets(self) -> list[list[int]]:
        """This step's buckets as DDP handed them over: index, bytes, ready, 0 (unseen)."""
        handed, computed, rows = 0, self._computed, []
        for index, (watched, size) in enumerate(self._watched):
            handed = max([handed, *(computed[k] for k in watched)])
            rows.append([index, size, handed, 0])
        return rows

    def exchange(self, step: int, samples: int) -> Exchange:
        # the buckets were summed during the backward, the loss beside them
        if self._loss_work is None:
            raise RuntimeError("ddp: an exchange without a backward before it")
        self._loss_work.wait()
        self._loss_work = None
        self.loss.copy_(self._loss_sum)
        for entry in self._handed:  # the hook's (timed), backward_ended's (builtin)
            self.writer.append((self.rank, step, *entry))
        self._buckets, self._handed = len(self._handed), []
        return Exchange(Holds.SUMS, self.global_batch, next_step(step, self.steps))

    def bucket_records(self) -> np.ndarray:
        """Every bucket this worker handed over (collector.BUCKET_DTYPE rows)."""
        return self.writer.records()

    def describe(self) -> dict[str, Any]:
        return {"bucket_mb": self.bucket_mb, "comm_hook": self.comm_hook,
                "buckets": self._buckets}

    def close(self, failed: bool = False) -> None:
        self.writer.close()
