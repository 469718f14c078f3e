"""Gradient aggregation over torch.distributed: the one communication engine (principle 3).

gloo reduces host buffers and works for any device mix; nccl is used only when every worker
is a GPU. Every collective has the run's timeout, so a dead peer ends the run, not a hang.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Rendezvous:
    rank: int
    world_size: int
    backend: str


def init(rank: int, world_size: int, backend: str, timeout_s: float) -> Rendezvous:
    """Join the env:// rendezvous (MASTER_ADDR, MASTER_PORT; set by hetbench or torchrun)."""
    dist.init_process_group(
        backend=backend, init_method="env://", rank=rank, world_size=world_size,
        timeout=timedelta(seconds=timeout_s),
    )
    return Rendezvous(rank, world_size, backend)


def choose_backend(all_cuda: bool) -> str:
    return "nccl" if all_cuda and dist.is_nccl_available() else "gloo"


def allreduce_sum(buffer: torch.Tensor) -> None:
    dist.all_reduce(buffer, op=dist.ReduceOp.SUM)


def barrier() -> None:
    dist.barrier()


def all_gather_floats(value: float, device: torch.device) -> list[float]:
    return [v[0] for v in all_gather_vectors([value], device)]


def all_gather_vectors(values: list[float], device: torch.device) -> list[list[float]]:
    """Every rank's list of float64 values (all lists of the same length), in rank order."""
    world = dist.get_world_size()
    mine = torch.tensor(values, dtype=torch.float64, device=device)
    gathered = [torch.zeros(len(values), dtype=torch.float64, device=device)
                for _ in range(world)]
    dist.all_gather(gathered, mine)
    return [t.tolist() for t in gathered]


def clock_offsets(device: torch.device, rounds: int = 7) -> list[int]:
    """Each rank's perf_counter_ns minus rank 0's, estimated as the median over rounds of
    timestamps taken right after a barrier. On one host the clock is shared and this only
    measures barrier exit skew; across hosts it is the offset used to align records."""
    samples: list[list[float]] = []
    for _ in range(rounds):
        dist.barrier()
        samples.append(all_gather_floats(float(time.perf_counter_ns()), device))
    world = len(samples[0])
    return [int(statistics.median(s[r] - s[0] for s in samples)) for r in range(world)]


def gather_objects(obj: object) -> list[object] | None:
    """Rank 0 gets every rank's object (records at the end of a run); others get None."""
    out: list[object] | None = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(obj, out, dst=0)
    return out


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
