"""How the stages of virtual workers exchange a wave's gradients (HetPipe's WSP, issue 14).

After a wave every stage holds the gradient sums of its layers over its virtual worker's
slice (and the last stage the loss sum after them, in the buffer's loss slot). Then:

- `AllreduceWaves` (wave bound D = 0): the sums are all-reduced among the stages that hold
  the same layers (or, when virtual workers cut the model differently, the whole buffer
  among all ranks), and every stage's optimizer takes the update of its own layers: the
  all-reduce path's mathematics, whatever the schedule or the micro-batches.
- `ServerWaves` (D > 0): stage s pushes its sums to parameter server s (one server per
  stage, holding that stage's layers; harness/exchange/parameter_server.py, scheme
  'wsp') and loads the parameters it answers with. A server applies each push when it
  arrives, as its virtual worker's share of a global step, and answers a virtual worker
  that pushed wave w only when every virtual worker has pushed wave w - D: the global
  staleness bound. The run ends when the servers have applied `steps` global batches, so
  a faster virtual worker runs more waves than a slower one, as in HetPipe. Inside a
  wave all micro-batches compute on the same parameters (the pipeline flushes), so the
  local staleness is Nm - 1.

`exchange` is timed by the loop as the wave's exchange phase; `take` as unpack (the update
computed, or the pulled parameters loaded) and `apply` as apply.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from hetbench.harness.exchange import server_clocks
from hetbench.harness.training.optim import Optimizer


@dataclass(frozen=True)
class WaveExchange:
    staleness: int = 0  # the server's version at apply minus the version computed on
    push_ns: int = 0
    wait_ns: int = 0
    pull_ns: int = 0
    asynchronous: bool = False
    loss_samples: int = 0  # the samples the loss slot's sum now covers
    dropped: bool = False  # pushed after the budget was spent: not applied
    done: bool = False  # the servers applied the run's budget: the virtual worker stops
    progress: int = 0  # global batches the servers applied (wsp)


@dataclass
class StageBuffers:
    """One stage's view of its adapter's flat buffers: parameters [lo, hi), their gradient
    sums, and whether it is the last stage (the loss slot at index n)."""

    params: Any  # the whole flat parameter tensor
    grads: Any  # the whole flat gradient tensor, loss slot last
    lo: int
    hi: int
    last: bool

    @property
    def n(self) -> int:
        return int(self.params.numel())

    def exchanged(self) -> Any:
        """The stage's sums, with the loss slot when it is the last stage and its
        parameters end where the buffer's do."""
        extra = 1 if self.last and self.hi == self.n else 0
        return self.grads[self.lo:self.hi + extra]


class AllreduceWaves:
    def __init__(self, buffers: StageBuffers, group: Any, optimizer: Optimizer, global_batch: int,
                 whole: bool) -> None:
        """`group`: the ranks holding the same layers (None: all ranks, with `whole`: the
        whole buffer reduced, as when virtual workers cut the model differently)."""
        self.b, self.group, self.optimizer = buffers, group, optimizer
        self.global_batch, self.whole = global_batch, whole
        self.scale = 0.0

    def exchange(self, wave: int) -> WaveExchange:
        import torch.distributed as dist

        b = self.b
        dist.all_reduce(b.grads if self.whole else b.exchanged(), group=self.group)
        if b.last and not self.whole and b.hi != b.n:
            dist.all_reduce(b.grads[b.n:], group=self.group)
        return WaveExchange(loss_samples=self.global_batch)

    def take(self, wave: int) -> None:
        b = self.b
        self.scale = (self.optimizer.update(wave, b.grads[b.lo:b.hi], self.global_batch)
                      if b.hi > b.lo else 0.0)

    def apply(self) -> None:
        import torch

        with torch.no_grad():
            self.b.params[self.b.lo:self.b.hi].add_(self.b.grads[self.b.lo:self.b.hi],
                                                    alpha=-self.scale)


class ServerWaves:
    """A virtual worker stops when its servers have applied the run's budget (`steps`
    global batches, from every virtual worker's pushes), so a faster one runs more waves.
    Its stages hear that from different servers, perhaps a wave apart: they agree through
    their pipeline's group (stop when any has heard), so all stop after the same wave."""

    def __init__(self, buffers: StageBuffers, server: str, virtual_worker: int,
                 samples: int, pipeline_group: Any) -> None:
        self.b, self.server, self.virtual_worker, self.samples = buffers, server, \
            virtual_worker, samples
        self.group = pipeline_group
        self.version = 0
        self.values: Any = None
        self.clock = server_clocks.measure(server)  # its stamps on this worker's clock

    def exchange(self, wave: int) -> WaveExchange:
        import torch.distributed.rpc as rpc

        from hetbench.harness.exchange.parameter_server import push

        start = time.perf_counter_ns()
        sums = self.b.grads[self.b.lo:self.b.hi]
        if self.b.last:
            import torch

            sums = torch.cat([sums, self.b.grads[self.b.n:]])  # the loss sum rides along
        import torch
        import torch.distributed as dist

        self.values, reply = rpc.rpc_sync(self.server, push, args=(
            self.version, wave, self.virtual_worker, sums.clone(), self.samples))
        done = torch.tensor([int(reply.done)])
        dist.all_reduce(done, op=dist.ReduceOp.MAX, group=self.group)
        end = time.perf_counter_ns()
        self.version = reply.version
        received = max(self.clock.local(reply.received_ns), start)
        released = max(self.clock.local(reply.released_ns), received)
        push_ns, wait_ns = received - start, released - received
        return WaveExchange(reply.staleness, push_ns, wait_ns,
                            max(end - start - push_ns - wait_ns, 0), True, reply.samples,
                            reply.dropped, bool(done.item()), reply.progress)

    def take(self, wave: int) -> None:
        b, values = self.b, self.values
        b.params[b.lo:b.hi].copy_(values[:b.hi - b.lo])
        if b.last:
            b.grads[b.n:].copy_(values[b.hi - b.lo:])

    def apply(self) -> None:
        pass
