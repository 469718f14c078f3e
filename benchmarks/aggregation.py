"""hetbench's gradient aggregation (adapter pack + all-reduce + unpack) of a ~10M-float
gradient versus a raw dist.all_reduce of a buffer of the same size, alternating, 2 workers.

    python -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/aggregation.py

Rank 0 prints median times and their ratio (target <= 1.1).
"""

from __future__ import annotations

import os
import statistics
import time

import torch
import torch.distributed as dist

from hetbench.adapters.pytorch import TorchAdapter
from hetbench.harness.exchange import comm
from hetbench.workloads import build_spec

ROUNDS = 25


def main() -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    spec = build_spec("mlp", (1, 196, 196), 10)  # fc1 alone is 38416 x 256: 9.9M floats in all
    adapter = TorchAdapter(spec, "cpu", 1)
    buffer = adapter.comm_buffer(False)
    raw = torch.ones(buffer.numel())
    loss = torch.tensor(1.0)
    ours, theirs = [], []
    for _ in range(ROUNDS):
        dist.barrier()
        start = time.perf_counter_ns()
        adapter.pack(loss)
        comm.allreduce_sum(buffer)
        adapter.unpack()
        ours.append(time.perf_counter_ns() - start)
        dist.barrier()
        start = time.perf_counter_ns()
        dist.all_reduce(raw)
        theirs.append(time.perf_counter_ns() - start)
    if dist.get_rank() == 0:
        a, b = statistics.median(ours[3:]), statistics.median(theirs[3:])
        print(f"{buffer.numel():,} floats: hetbench aggregation {a / 1e6:.1f} ms, raw all_reduce "
              f"{b / 1e6:.1f} ms, ratio {a / b:.3f} (target <= 1.1)")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
