"""Virtual workers (HetPipe, issue 14): what a suite says and where each rank stands.

A virtual worker is a group of ranks that pipelines the model: its i-th rank runs stage i
(consecutive layers). Virtual workers are data parallel with each other: each takes a slice
of the global batch as the workers of a plain run do, in waves of `micro_batches` micro-
batches. No framework is imported here (config reads it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def bounds_of(counts: tuple[int, ...]) -> tuple[int, ...]:
    """Layer counts per stage -> stage bounds (0, c0, c0 + c1, ...)."""
    out = [0]
    for c in counts:
        out.append(out[-1] + c)
    return tuple(out)


def micro_batch_bounds(slices: Sequence[tuple[int, int]], micro_batches: int
                       ) -> list[tuple[int, int]]:
    """Every micro-batch of the global batch, [lo, hi) each: each virtual worker's slice
    cut as torch.distributed.pipelining cuts a batch (torch.tensor_split: the first
    `size % micro_batches` micro-batches one sample larger)."""
    out = []
    for lo, hi in slices:
        quotient, remainder = divmod(hi - lo, micro_batches)
        for i in range(micro_batches):
            size = quotient + (1 if i < remainder else 0)
            out.append((lo, lo + size))
            lo += size
    return out


def kind_of(worker: Any) -> tuple[Any, ...]:
    """What makes two workers (config.WorkerSpec) the same kind of device."""
    return (worker.device, worker.threads, worker.slowdown, worker.slowdown_at, worker.jitter,
            len(worker.cores or ()))


def fastest_first(workers: Sequence[Any]) -> list[int]:
    """Ranks from the nominally fastest device: GPUs first, then more threads over a larger
    emulated slowdown; kinds stay together; ties by rank."""
    def key(rank: int) -> tuple[Any, ...]:
        w = workers[rank]
        return (not w.is_cuda, -w.threads / w.slowdown_for(0), str(kind_of(w)), rank)

    return sorted(range(len(workers)), key=key)


def allocate(workers: Sequence[Any], policy: str, size: int) -> tuple[tuple[int, ...], ...]:
    """Virtual workers of `size` devices each (len(workers) divisible by size; hybrid:
    size even), each listed fastest first."""
    order = fastest_first(workers)
    count = len(order) // size
    if policy == "same-kind":
        groups = [order[i * size:(i + 1) * size] for i in range(count)]
    elif policy == "spread":
        groups = [order[i::count] for i in range(count)]
    elif policy == "hybrid":
        half = size // 2
        groups = [order[i * half:(i + 1) * half]
                  + order[len(order) - (i + 1) * half:len(order) - i * half][::-1]
                  for i in range(count)]
    else:
        raise ValueError(f"unknown allocation {policy!r}")
    rank_order = {r: i for i, r in enumerate(order)}
    return tuple(tuple(sorted(g, key=rank_order.__getitem__)) for g in groups)
