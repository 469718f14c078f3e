"""Instrumentation overhead: the worker's step with timing and counters on (timed_step plus
recording) versus off (step_bare, nothing recorded), in blocks of steps whose order rotates
(no mode always runs first) in one process, so that every mode sees the same machine state.
One PyTorch worker, gloo world of 1.

On a CUDA device a third mode times every phase by waiting for the device (the host-clock
timer) where the worker itself uses CUDA events (harness/loop/timer.py): what the waits cost
against the events is the GPU part of issue 16.

    python benchmarks/overhead.py [--workload mlp] [--device cuda:0] [--blocks 30]

Prints median per-step times of each mode and each timed mode's overhead over the bare step
(target <= 1%).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from adapters.pytorch import TorchAdapter
from harness import exchange as aggregators
from harness.exchange import comm
from harness.loop.counters import Counters
from harness.loop.timer import StepTimer
from harness.loop.worker import build_trainer
from harness.records.collector import RecordWriter
from harness.run.launcher import free_port
from harness.spec.suite import parse_suite


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workload", default="mlp")
    parser.add_argument("--dataset", default="digits")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--blocks", type=int, default=30, help="blocks of each mode")
    parser.add_argument("--steps-per-block", type=int, default=50)
    args = parser.parse_args()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
                      GLOO_SOCKET_IFNAME="lo")
    comm.init(0, 1, "gloo", 60, args.device)
    suite = parse_suite({"runs": [{"name": "overhead", "workload": args.workload,
                                   "dataset": args.dataset, "global_batch": args.batch,
                                   "steps": 10**7, "workers": [{"device": args.device}]}]})
    run = suite.runs[0]
    aggregators.prepare(run, 0)
    trainer, _ = build_trainer(run, 0, "gloo", TorchAdapter)
    own_timer = trainer.timer
    counters = Counters()
    modes = ["bare", f"timed ({type(own_timer).__name__})"]
    if args.device.startswith("cuda"):
        modes.append("timed (StepTimer, a device wait per phase)")
    waits = StepTimer(trainer.stretch, trainer.adapter.synchronize)
    per_step: dict[str, list[float]] = {m: [] for m in modes}
    step = 0
    with tempfile.TemporaryDirectory() as tmp:
        trainer.aggregator = aggregators.create(aggregators.Context(
            run, 0, trainer.adapter, trainer.buffer, trainer.optimizer, trainer.initial,
            Path(tmp)))
        writer = RecordWriter(Path(tmp) / "rank0.bin")
        rounds = args.blocks + 2  # the first two rounds warm up
        for block in range(rounds * len(modes)):
            # each round runs every mode once, starting one mode later than the last round
            mode = modes[(block + block // len(modes)) % len(modes)]
            trainer.timer = waits if mode.startswith("timed (StepTimer, a") else own_timer
            start = time.perf_counter_ns()
            for _ in range(args.steps_per_block):
                if mode == "bare":
                    trainer.step_bare(step, 0, args.batch)
                else:
                    writer.append(trainer.timed_step(step, 0, args.batch, counters)[0])
                step += 1
            trainer.adapter.synchronize()
            if block >= 2 * len(modes):
                per_step[mode].append((time.perf_counter_ns() - start) / args.steps_per_block)
        writer.close()
        trainer.aggregator.close(False)
    report(args, per_step)
    comm.shutdown()


def report(args: Any, per_step: dict[str, list[float]]) -> None:
    medians = {m: statistics.median(v) for m, v in per_step.items()}
    bare = medians["bare"]
    print(f"{args.workload}/{args.dataset} batch {args.batch} on {args.device}, "
          f"{len(per_step['bare'])} blocks of {args.steps_per_block} steps per mode:")
    for mode, value in medians.items():
        extra = "" if mode == "bare" else f", overhead {value / bare - 1:+.2%} (target <= 1%)"
        print(f"  {mode}: {value / 1e3:.1f} us/step{extra}")


if __name__ == "__main__":
    main()
