"""Reference: a user's job (hetbench.Job) trained by a plain DDP loop, as its owner would.

Started by benchmarks/ddp_compare.py through torchrun (`--job`). The factory called after
`torch.manual_seed(seed)`, as hetbench's workers call it; DDP gives every rank rank 0's
parameters and buffers. Each rank reads its equal half of each global batch through
torch's DataLoader with the loader settings hetbench's run has (processes, prefetch
factor) and hetbench's global batches (the same seeded order), so both sides load, decode
and compute the same samples. The job's loss as it reduces (a sum divided by the slice's
samples: DDP averages the ranks' gradients, so the update is the global batch's mean),
torch.optim.SGD. Writes the same step marks as ddp_worker.py (begin, the forward's end
with the loss, the backward's end with DDP's all-reduce, the optimizer's end) and, on rank
0, the final parameters by name.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader

from hetbench.harness.system.exits import exit_after
from hetbench.harness.training.job_loader import SliceSampler
from hetbench.workloads.data import BatchOrder
from hetbench.workloads.job import collate, make_job


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--job", required=True, help="the factory, 'module:name' or 'file.py:name'")
    parser.add_argument("--project", type=Path, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--global-batch", type=int, required=True)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--loader-workers", type=int, default=0)
    parser.add_argument("--prefetch", type=int, default=2)
    parser.add_argument("--bucket-mb", type=float, default=25.0)
    parser.add_argument("--pin", action="store_true",
                        help="rank r on core r alone, its threads with it (hetbench's `cores`)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.pin:
        os.sched_setaffinity(0, {int(os.environ["RANK"])})
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    job = make_job(args.job, args.project.resolve(), args.seed)
    ddp = nn.parallel.DistributedDataParallel(job.model, bucket_cap_mb=args.bucket_mb)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr)
    share = args.global_batch // world
    order = BatchOrder(len(job.train), args.global_batch, args.seed)  # type: ignore[arg-type]
    workers = args.loader_workers
    loader = DataLoader(
        job.train, batch_sampler=SliceSampler(order, 0, args.steps, rank * share,
                                              (rank + 1) * share),
        collate_fn=lambda samples: collate(job, samples), num_workers=workers,
        prefetch_factor=args.prefetch if workers else None)
    times = np.zeros((args.steps, 4), dtype=np.int64)
    batches = iter(loader)
    for step in range(args.steps):
        times[step, 0] = time.perf_counter_ns()
        inputs, targets = job.batch_parts(next(batches))
        optimizer.zero_grad()
        outputs = ddp(**inputs) if isinstance(inputs, Mapping) else ddp(inputs)
        loss = job.loss(outputs, targets)
        if job.reduction == "sum":
            loss = loss / share
        times[step, 1] = time.perf_counter_ns()
        loss.backward()
        times[step, 2] = time.perf_counter_ns()
        optimizer.step()
        times[step, 3] = time.perf_counter_ns()
    args.out.mkdir(parents=True, exist_ok=True)
    np.save(args.out / f"times-rank{rank}.npy", times)
    if rank == 0:
        np.savez(args.out / "params.npz", **{
            name: p.detach().numpy() for name, p in job.model.named_parameters()})
    del batches  # its DataLoader processes end before the group does
    dist.destroy_process_group()


def _main() -> int:
    main()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    exit_after(_main)  # as ddp_worker.py ends, without the interpreter's teardown
