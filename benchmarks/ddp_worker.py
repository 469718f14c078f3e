"""Reference: the same training with torch DistributedDataParallel over gloo.

Started by benchmarks/ddp_compare.py through torchrun. Plain nn.Sequential, mean loss over
the rank's equal slice (DDP averages gradients, so this is the global mean), torch.optim.SGD.
Writes per-rank step begin/end (perf_counter_ns) and, on rank 0, the final parameters.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from workloads.data import BatchOrder, load_dataset
from workloads.models import build_spec


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--global-batch", type=int, default=128)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    data = load_dataset("digits", "mlp", args.seed)
    spec = build_spec("mlp", data.sample_shape, data.num_classes)
    init = spec.initial_parameters(args.seed)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256),
                          nn.ReLU(), nn.Linear(256, 10))
    names = {"1": "fc1", "3": "fc2", "5": "fc3"}
    with torch.no_grad():
        for name, param in model.named_parameters():
            index, kind = name.split(".")
            param.copy_(torch.from_numpy(init[f"{names[index]}.{kind}"]))
    ddp = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr)
    order = BatchOrder(len(data), args.global_batch, args.seed)
    share = args.global_batch // world
    lo, hi = rank * share, (rank + 1) * share
    times = np.zeros((args.steps, 2), dtype=np.int64)
    for step in range(args.steps):
        times[step, 0] = time.perf_counter_ns()
        idx = order.indices(step)[lo:hi]
        x, y = torch.from_numpy(data.inputs[idx]), torch.from_numpy(data.targets[idx])
        optimizer.zero_grad()
        nn.functional.cross_entropy(ddp(x), y).backward()
        optimizer.step()
        times[step, 1] = time.perf_counter_ns()
    args.out.mkdir(parents=True, exist_ok=True)
    np.save(args.out / f"times-rank{rank}.npy", times)
    if rank == 0:
        params = {f"{names[n.split('.')[0]]}.{n.split('.')[1]}": p.detach().numpy()
                  for n, p in model.named_parameters()}
        np.savez(args.out / "params.npz", **params)
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    main()
