"""Choi's strategy 2 (`allreduce-device`): the CPU workers' gradients go to a GPU, the GPUs
all-reduce over NCCL, and the sums come back to the CPU workers.

Each CPU worker is attached to one GPU worker (`routes`: round-robin in rank order). In a
step, every CPU worker sends its buffer to its GPU worker (gloo, point to point on the
default group); the GPU worker copies each into device memory and adds it to its own
gradients there; the GPU workers all-reduce their device buffers over an NCCL group of
their own; each then copies the sums to the host once and sends them to its CPU workers.
Every worker ends the exchange holding the global sums, all together: a lockstep
all-reduce as far as the loop and the analysis can tell, so idle and communication are
read off the records as for `torch`.

Strategy 1 (`allreduce-host`) instead copies every GPU worker's gradients to the host and
sums everything there over gloo; the two are timed side by side on the same job by
benchmarks/choi_strategies.toml.

`Relay` is the routing alone, on any pair of backends, so that it is tested without a GPU
(gloo standing in for NCCL); `DeviceAllreduce` is the aggregator, NCCL only.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from hetbench.harness.exchange import Context, Exchange, Holds, next_step


def routes(is_cuda: Sequence[bool]) -> dict[int, list[int]]:
    """GPU rank -> the CPU ranks whose gradients it sums, CPU ranks dealt round-robin in
    rank order (so each GPU carries an equal share, give or take one)."""
    gpus = [rank for rank, cuda in enumerate(is_cuda) if cuda]
    if not gpus:
        raise ValueError("allreduce-device needs at least one worker on a cuda device")
    cpus = [rank for rank, cuda in enumerate(is_cuda) if not cuda]
    out: dict[int, list[int]] = {gpu: [] for gpu in gpus}
    for i, cpu in enumerate(cpus):
        out[gpus[i % len(gpus)]].append(cpu)
    return out


class Relay:
    """The exchange of one rank: CPU ranks send to their GPU rank and receive the sums
    back; GPU ranks gather, all-reduce among themselves over `backend`, and send back.
    Every rank of the default group must build it (creating a group is collective)."""

    def __init__(self, buffer: torch.Tensor, rank: int, routing: dict[int, list[int]],
                 backend: str, timeout_s: float) -> None:
        self.buffer = buffer
        leaders = sorted(routing)
        self.group = dist.new_group(leaders, backend=backend,
                                    timeout=timedelta(seconds=timeout_s))
        self.several = len(leaders) > 1
        self.leader = next((g for g, members in routing.items() if rank in members), None)
        self.members = routing.get(rank, [])
        pinned = buffer.device.type == "cuda"  # a host copy of a GPU buffer moves faster pinned
        self.incoming = [torch.empty(buffer.numel(), pin_memory=pinned) for _ in self.members]
        self.outgoing = torch.empty(buffer.numel(), pin_memory=pinned) if self.members else None
        self.scratch = torch.empty_like(buffer) if self.members else None

    def exchange(self) -> None:
        if self.leader is not None:  # a CPU rank: to its GPU rank, and the sums back
            dist.send(self.buffer, dst=self.leader)
            dist.recv(self.buffer, src=self.leader)
            return
        receives = [dist.P2POp(dist.irecv, host, member)
                    for host, member in zip(self.incoming, self.members, strict=True)]
        pending = dist.batch_isend_irecv(receives) if receives else []
        for work, host in zip(pending, self.incoming, strict=True):
            work.wait()
            assert self.scratch is not None
            self.scratch.copy_(host)  # host -> device, then summed on the device
            self.buffer.add_(self.scratch)
        if self.several:
            dist.all_reduce(self.buffer, op=dist.ReduceOp.SUM, group=self.group)
        if self.outgoing is not None:
            self.outgoing.copy_(self.buffer)  # device -> host once, for every CPU rank
            sends = [dist.P2POp(dist.isend, self.outgoing, member) for member in self.members]
            for work in dist.batch_isend_irecv(sends):
                work.wait()


class DeviceAllreduce:
    def __init__(self, context: Context) -> None:
        run, rank = context.run, context.rank
        if not dist.is_nccl_available():
            raise RuntimeError("allreduce-device needs torch built with NCCL "
                               "(this torch has none); use allreduce-host")
        worker = run.workers[rank]
        if worker.is_cuda:
            torch.cuda.set_device(torch.device(worker.device))
        self.routing = routes([w.is_cuda for w in run.workers])
        self.relay = Relay(context.buffer, rank, self.routing, "nccl", run.timeout_s)
        self.steps, self.global_batch = run.steps, run.global_batch

    def exchange(self, step: int, samples: int) -> Exchange:
        self.relay.exchange()
        return Exchange(Holds.SUMS, self.global_batch, next_step(step, self.steps))

    def describe(self) -> dict[str, Any]:
        """Which CPU workers each GPU worker carried."""
        return {"routes": {str(gpu): cpus for gpu, cpus in self.routing.items()}}

    def close(self, failed: bool = False) -> None:
        pass
