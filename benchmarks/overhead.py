"""Instrumentation overhead: the worker's step with timing and counters on (timed_step plus
recording) versus off (step_bare, nothing recorded), alternating blocks in one process so
both see the same machine state. One worker, gloo world of 1.

    python benchmarks/overhead.py [--workload mlp] [--blocks 30] [--steps-per-block 50]

Prints median per-step times of each mode and the overhead (target <= 1%).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from adapters.pytorch import TorchAdapter
from harness import comm
from harness.collector import RecordWriter
from harness.config import parse_suite
from harness.launch import free_port
from harness.worker import Counters, build_trainer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workload", default="mlp")
    parser.add_argument("--dataset", default="digits")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--blocks", type=int, default=30)
    parser.add_argument("--steps-per-block", type=int, default=50)
    args = parser.parse_args()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
                      GLOO_SOCKET_IFNAME="lo")
    comm.init(0, 1, "gloo", 60)
    suite = parse_suite({"runs": [{"name": "overhead", "workload": args.workload,
                                   "dataset": args.dataset, "global_batch": args.batch,
                                   "steps": 10**9}]})
    trainer, _ = build_trainer(suite.runs[0], 0, "gloo", TorchAdapter)
    counters = Counters()
    on, off = [], []
    step = 0
    with tempfile.TemporaryDirectory() as tmp:
        writer = RecordWriter(Path(tmp) / "rank0.bin")
        for block in range(2 * args.blocks):
            timed = block % 4 in (0, 3)  # A B B A: neither mode always runs first
            start = time.perf_counter_ns()
            for _ in range(args.steps_per_block):
                if timed:
                    writer.append(trainer.timed_step(step, 0, args.batch, comm.allreduce_sum,
                                                     counters))
                else:
                    trainer.step_bare(step, 0, args.batch, comm.allreduce_sum)
                step += 1
            per_step = (time.perf_counter_ns() - start) / args.steps_per_block
            if block >= 4:  # the first round warms up
                (on if timed else off).append(per_step)
        writer.close()
    a, b = statistics.median(on), statistics.median(off)
    print(f"{args.workload}/{args.dataset} batch {args.batch}: instrumented {a / 1e3:.1f} us/step, "
          f"bare {b / 1e3:.1f} us/step, overhead {a / b - 1:+.2%} (target <= 1%)")
    comm.shutdown()


if __name__ == "__main__":
    main()
