"""Choi's strategy 1 against strategy 2 over gradient sizes (issue 32): the exchange alone,
one `cuda:0` rank beside two CPU ranks, on buffers of 1e5 to 1e8 floats.

    python benchmarks/choi_sizes.py [--sizes 1e5,1e6,1e7,1e8] [--out sizes.csv]
    python benchmarks/choi_sizes.py --stand-in      # no GPU: rank 0 on the CPU, gloo for NCCL

- strategy 1 (`allreduce-host`): the GPU rank copies its gradients into pinned host memory,
  the three ranks all-reduce host memory over gloo, and the GPU rank copies the sums back;
- strategy 2 (`allreduce-device`): the CPU ranks send their buffers to the GPU rank, which
  sums them on the device and sends the sums back: `hetbench.harness.exchange.device.Relay`, the
  aggregator's own code.

The suite benchmarks/choi_strategies.toml times both inside training steps on models of
0.04-4.5 MB; this times the exchange alone at sizes no MLP here reaches, to show where the
two cross. Each size: one exchange of each strategy to warm up, then the strategies
alternate for `--repeats` rounds (fewer for the largest), each timed on rank 0 from a
barrier to the device holding the sums. Prints the median per strategy and their ratio.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from hetbench.harness.exchange.device import Relay, routes  # noqa: E402

WORLD = 3  # one GPU rank, two CPU ranks: Choi's setup and benchmarks/choi_strategies.toml


def rounds_for(size: int, repeats: int) -> int:
    """Fewer rounds for the largest buffers (a 1e8-float exchange takes about a second)."""
    return max(3, min(repeats, int(3e8 // size)))


def strategy_one(buffer: torch.Tensor, host: torch.Tensor) -> None:
    """Strategy 1: through host memory (a CPU rank's buffer is its host copy already)."""
    if host is not buffer:
        host.copy_(buffer)
    dist.all_reduce(host)
    if host is not buffer:
        buffer.copy_(host)


def time_size(rank: int, size: int, rounds: int, device: torch.device,
              routing: dict[int, list[int]], stand_in: bool) -> dict[str, float]:
    """Median seconds of each strategy at one size, seen from this rank."""
    buffer = torch.ones(size, device=device)
    cuda = device.type == "cuda"
    host = torch.empty(size, pin_memory=True) if cuda else buffer
    relay = Relay(buffer, rank, routing, "gloo" if stand_in else "nccl", timeout_s=600)
    exchanges = {"host": lambda: strategy_one(buffer, host), "device": relay.exchange}
    times: dict[str, list[float]] = {name: [] for name in exchanges}
    for round_ in range(rounds + 1):  # round 0 warms up
        for name, exchange in exchanges.items():
            buffer.fill_(1.0)
            if cuda:
                torch.cuda.synchronize()
            dist.barrier()
            start = time.perf_counter()
            exchange()
            if cuda:
                torch.cuda.synchronize()
            if round_:
                times[name].append(time.perf_counter() - start)
            # every strategy must have summed 1 + 1 + 1
            assert float(buffer[-1]) == WORLD, f"size {size}, {name}: sums {buffer[-1]}"
    return {name: statistics.median(values) for name, values in times.items()}


def run_rank(rank: int, port: int, sizes: list[int], repeats: int, stand_in: bool,
             out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    device = torch.device("cuda:0" if rank == 0 and not stand_in else "cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    routing = routes([r == 0 for r in range(WORLD)])
    lines = []
    try:
        for size in sizes:
            rounds = rounds_for(size, repeats)
            medians = time_size(rank, size, rounds, device, routing, stand_in)
            lines.append(f"{size},{rounds},{medians['host'] * 1e3:.4f},"
                         f"{medians['device'] * 1e3:.4f}")
    finally:
        dist.destroy_process_group()
    if rank == 0:
        Path(out).write_text("floats,rounds,host_ms,device_ms\n" + "\n".join(lines) + "\n")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1e5,1e6,1e7,1e8",
                        help="buffer sizes in floats, comma-separated")
    parser.add_argument("--repeats", type=int, default=20, help="rounds per size (at most)")
    parser.add_argument("--stand-in", action="store_true",
                        help="no GPU: rank 0 on the CPU, gloo standing in for NCCL")
    parser.add_argument("--out", type=Path, help="also write the table as CSV here")
    args = parser.parse_args(argv)
    try:
        sizes = [int(float(s)) for s in args.sizes.split(",")]
    except ValueError:
        parser.error(f"--sizes: comma-separated numbers of floats, got {args.sizes!r}")
    if not args.stand_in and not torch.cuda.is_available():
        print("choi_sizes: no CUDA device here (--stand-in runs rank 0 on the CPU)",
              file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        table = Path(tmp) / "sizes.csv"
        mp.start_processes(run_rank, args=(free_port(), sizes, args.repeats, args.stand_in,
                                           str(table)), nprocs=WORLD, start_method="spawn")
        text = table.read_text()
    if args.out:
        args.out.write_text(text)
    print("median exchange time (ms), rank 0 from a barrier to the sums on its device;"
          " ratio = strategy 2 / strategy 1")
    print(f"{'floats':>12} {'MB':>8} {'rounds':>6} {'1: host':>10} {'2: device':>10} "
          f"{'ratio':>7}")
    for line in text.splitlines()[1:]:
        floats, rounds, host_ms, device_ms = line.split(",")
        print(f"{int(floats):>12.0e} {int(floats) * 4 / 1e6:>8.1f} {rounds:>6} "
              f"{float(host_ms):>10.3f} {float(device_ms):>10.3f} "
              f"{float(device_ms) / float(host_ms):>7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
