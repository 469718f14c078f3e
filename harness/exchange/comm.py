"""Gradient aggregation over torch.distributed: the one communication engine (principle 3).

gloo reduces host buffers and works for any device mix; nccl is used only when every worker
is a GPU. Every collective has the run's timeout, so a dead peer ends the run, not a hang.

A rendezvous on an address (loopback for a local run, issue 18; the master's across
hosts) gets a store that listens on it alone (harness/exchange/rendezvous.py); gloo's pair
sockets bind the interface GLOO_SOCKET_IFNAME names (the launcher sets it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from hetbench.harness.exchange.rendezvous import agent_store, is_address, tcp_store


@dataclass(frozen=True)
class Rendezvous:
    rank: int
    world_size: int
    backend: str


def init(rank: int, world_size: int, backend: str, timeout_s: float,
         device: str | None = None) -> Rendezvous:
    """Join the env:// rendezvous (MASTER_ADDR, MASTER_PORT; set by hetbench or torchrun).
    With an address as MASTER_ADDR and rank 0 serving the store (hetbench's launcher, on
    one host or several), the store listens on that address only; otherwise (torchrun's
    agent serves the store, or MASTER_ADDR is a name) torch's env:// rendezvous is used
    as it is. `device`: the
    worker's CUDA device, made current (CUDA events and streams are the current device's)
    and bound to the NCCL communicator (`device_id`: no guess from the rank)."""
    timeout = timedelta(seconds=timeout_s)
    host, port = os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", "")
    bound: torch.device | None = None
    if device is not None and device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
        if backend == "nccl":
            bound = torch.device(device)
    if is_address(host) and port and not agent_store():
        dist.init_process_group(
            backend=backend, store=tcp_store(host, int(port), rank, world_size, timeout),
            rank=rank, world_size=world_size, timeout=timeout, device_id=bound,
        )
    else:
        dist.init_process_group(backend=backend, init_method="env://", rank=rank,
                                world_size=world_size, timeout=timeout, device_id=bound)
    return Rendezvous(rank, world_size, backend)


def choose_backend(all_cuda: bool) -> str:
    return "nccl" if all_cuda and dist.is_nccl_available() else "gloo"


def allreduce_sum(buffer: torch.Tensor) -> None:
    dist.all_reduce(buffer, op=dist.ReduceOp.SUM)


def barrier() -> None:
    dist.barrier()


def all_gather_floats(value: float, device: torch.device) -> list[float]:
    return [v[0] for v in all_gather_vectors([value], device)]


def all_gather_vectors(values: list[float], device: torch.device, group: Any = None
                       ) -> list[list[float]]:
    """Every rank's list of float64 values (all lists of the same length), in rank order;
    within `group` when given (its ranks' lists, in their order)."""
    world = dist.get_world_size(group)
    mine = torch.tensor(values, dtype=torch.float64, device=device)
    gathered = [torch.zeros(len(values), dtype=torch.float64, device=device)
                for _ in range(world)]
    dist.all_gather(gathered, mine, group=group)
    return [t.tolist() for t in gathered]


def gather_bytes(payload: bytes, device: torch.device) -> list[bytes] | None:
    """Rank 0 gets every rank's bytes in rank order; the others get None. Bytes travel as
    uint8 tensors (lengths first, then the payloads padded to the longest), so nothing a
    peer sends is ever unpickled: torch's *_object collectives run pickle.loads on it."""
    world = dist.get_world_size()
    lengths = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(world)]
    dist.all_gather(lengths, torch.tensor([len(payload)], dtype=torch.int64, device=device))
    sizes = [int(n.item()) for n in lengths]
    padded = torch.zeros(max(sizes), dtype=torch.uint8)
    padded[:len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8) \
        if payload else padded[:0]
    padded = padded.to(device)
    if dist.get_rank() != 0:
        dist.gather(padded, dst=0)
        return None
    out = [torch.empty_like(padded) for _ in range(world)]
    dist.gather(padded, out, dst=0)
    return [t[:n].cpu().numpy().tobytes() for t, n in zip(out, sizes, strict=True)]


def broadcast_bytes(payload: bytes, device: torch.device) -> bytes:
    """Rank 0's bytes on every rank (what the others pass is ignored), without pickle."""
    length = torch.tensor([len(payload)], dtype=torch.int64, device=device)
    dist.broadcast(length, src=0)
    data = torch.zeros(int(length.item()), dtype=torch.uint8)
    if dist.get_rank() == 0 and payload:
        data[:] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    data = data.to(device)
    dist.broadcast(data, src=0)
    return data.cpu().numpy().tobytes()


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
