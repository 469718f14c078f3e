"""Reference: the same training with torch DistributedDataParallel over gloo.

Started by benchmarks/ddp_compare.py through torchrun. The workload's own torch module
(workloads/<name>/pytorch.py) with the same initial weights, the mean loss over the rank's
equal slice (DDP averages gradients, so this is the global mean), torch.optim.SGD.
`--bucket-mb` sets DDP's bucket size: one bucket larger than the model means the all-reduce
starts only after the whole backward (no overlap); small buckets overlap the all-reduce of
late layers with the backward of early ones. Writes per-rank step marks (perf_counter_ns:
begin, forward's end with the loss, backward's end with DDP's all-reduce, the optimizer's
end) and, on rank 0, the final parameters by spec name.
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

from hetbench.adapters.pytorch import loss_sum
from hetbench.harness.system.exits import exit_after
from hetbench.workloads import build_spec, get_workload
from hetbench.workloads.data import BatchOrder, load_dataset
from hetbench.workloads.models import builder


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--workload", default="mlp")
    parser.add_argument("--size", default="small")
    parser.add_argument("--dataset", default=None)
    parser.add_argument("--global-batch", type=int, default=128)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bucket-mb", type=float, default=25.0)
    parser.add_argument("--python-hook", action="store_true",
                        help="torch's own Python allreduce comm hook (default_hooks."
                        "allreduce_hook) instead of DDP's built-in C++ all-reduce")
    parser.add_argument("--pin", action="store_true",
                        help="rank r on core r alone, its threads with it (hetbench's `cores`)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.pin:  # before any thread starts, as hetbench's workers pin (prepare_process)
        os.sched_setaffinity(0, {int(os.environ["RANK"])})
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    workload = get_workload(args.workload)
    data = load_dataset(args.dataset or workload.default_dataset, args.workload, args.seed)
    spec = build_spec(args.workload, data.sample_shape, data.num_classes, args.size)
    module = builder(args.workload, "pytorch")
    model = module.build(spec)
    names = getattr(module, "PARAMETER_NAMES", {})
    init = spec.initial_parameters(args.seed)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for p in spec.params:
            params[names.get(p.name, p.name)].copy_(torch.from_numpy(init[p.name]))
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=args.bucket_mb)
    if args.python_hook:  # what a hook in Python costs, beside hetbench's own (exchange/ddp.py)
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        ddp.register_comm_hook(None, default_hooks.allreduce_hook)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr)
    order = BatchOrder(len(data), args.global_batch, args.seed)
    share = args.global_batch // world
    lo, hi = rank * share, (rank + 1) * share
    times = np.zeros((args.steps, 4), dtype=np.int64)
    for step in range(args.steps):
        times[step, 0] = time.perf_counter_ns()
        idx = order.indices(step)[lo:hi]
        x, y = data.inputs[idx], data.targets[idx]
        if workload.prepare is not None:
            x, y = workload.prepare(x, y, args.seed, step, lo, args.global_batch,
                                    data.num_classes)
        x, y = torch.from_numpy(x), torch.from_numpy(y)
        optimizer.zero_grad()
        loss = loss_sum(spec, ddp(x), y) / len(x)
        times[step, 1] = time.perf_counter_ns()
        loss.backward()
        times[step, 2] = time.perf_counter_ns()
        optimizer.step()
        times[step, 3] = time.perf_counter_ns()
    args.out.mkdir(parents=True, exist_ok=True)
    np.save(args.out / f"times-rank{rank}.npy", times)
    if rank == 0:
        by_torch_name = dict(model.named_parameters())
        np.savez(args.out / "params.npz", **{
            p.name: by_torch_name[names.get(p.name, p.name)].detach().numpy()
            for p in spec.params})
    dist.destroy_process_group()


def _main() -> int:
    main()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    # as hetbench's workers end (harness/system/exits.py): without the interpreter's
    # teardown, where 1 launch in 12-15 of this script (DDP's buckets overlapped) died of
    # "terminate called without an active exception" after its group was destroyed and
    # its files written, a launch torchrun then reports as failed
    exit_after(_main)
