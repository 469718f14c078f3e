"""All-reduce aggregators over torch.distributed (principle 3: one communication engine).

`torch` and `allreduce-host` sum the gradient buffer over every worker. They differ only in
the backend the worker chose at start (harness/loop/worker.py): `torch` uses nccl when every
worker is a GPU, `allreduce-host` always reduces host memory over gloo (Choi's strategy 1:
a GPU worker's gradients cross to the host in pack).

`local-sgd` takes H local steps on each worker's own samples, then averages the
parameters, weighted by the samples each worker computed on in the last step (its slice),
so that H = 1 with plain SGD is the all-reduce step: sum_i n_i (p - lr g_i / n_i) / N =
p - lr sum_i g_i / N.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from hetbench.harness.exchange import Context, Exchange, Holds, next_step


class Allreduce:
    def __init__(self, context: Context) -> None:
        self.buffer = context.buffer
        self.steps = context.run.steps
        self.global_batch = context.run.global_batch
        self.group: ProcessGroup | None = None  # the whole job's
        self.alone = context.run.world_size == 1  # a job of one worker has nothing to sum

    def set_members(self, group: ProcessGroup | None, count: int) -> None:
        """Only these workers compute (harness/loop/membership.py): the all-reduce runs in their
        group, and not at all for a lone worker, whose sums are already the batch's."""
        self.group, self.alone = group, count == 1

    def exchange(self, step: int, samples: int) -> Exchange:
        if not self.alone:
            dist.all_reduce(self.buffer, op=dist.ReduceOp.SUM, group=self.group)
        return Exchange(Holds.SUMS, self.global_batch, next_step(step, self.steps))

    def describe(self) -> dict[str, Any]:
        return {}

    def close(self, failed: bool = False) -> None:
        pass


class LocalSGD:
    """The worker keeps its own parameters as a flat torch copy beside the framework's
    (updated with the same direction and scale the adapter applies), so an average needs
    nothing read back from the framework."""

    def __init__(self, context: Context) -> None:
        run = context.run
        self.buffer, self.grads = context.buffer, context.buffer[:-1]
        self.optimizer = context.optimizer
        self.every = run.aggregator.local_steps
        self.steps, self.global_batch = run.steps, run.global_batch
        self.params = context.initial.to(device=self.buffer.device, dtype=torch.float32).clone()

    def exchange(self, step: int, samples: int) -> Exchange:
        # the local step, on this worker's own mean gradient
        scale = self.optimizer.update(step, self.grads, samples)
        self.params.add_(self.grads, alpha=-scale)
        following = next_step(step, self.steps)
        if (step + 1) % self.every and following is not None:
            return Exchange(Holds.UPDATE, samples, following, scale=scale,
                            asynchronous=True)
        # the average, weighted by samples; the loss sums add up as in an all-reduce
        self.grads.copy_(self.params).mul_(samples)
        dist.all_reduce(self.buffer, op=dist.ReduceOp.SUM)
        self.grads.div_(self.global_batch)
        self.params.copy_(self.grads)
        return Exchange(Holds.PARAMETERS, self.global_batch, following)

    def describe(self) -> dict[str, Any]:
        return {}

    def close(self, failed: bool = False) -> None:
        pass
