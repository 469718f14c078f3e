"""Instrumentation overhead: the worker's step with timing and counters on (timed_step plus
recording) versus off (step_bare, nothing recorded), in blocks of steps whose order rotates
(no mode always runs first) in one process, so that every mode sees the same machine state.
One PyTorch worker, gloo world of 1.

On a CUDA device a third mode times every phase by waiting for the device (the host-clock
timer) where the worker itself uses CUDA events (harness/loop/timer.py): what the waits cost
against the events is the GPU part of issue 16.

    python benchmarks/overhead.py [--workload mlp] [--device cuda:0] [--blocks 30] [--parts]

Prints median per-step times of each mode and each timed mode's overhead over the bare step
of the same round, relative and in microseconds, with 95% intervals (targets: at most 1% of
a step of 5 ms or more, at most 30 us). The modes alternate step by step (a round is one step
of each), so that the machine's drift falls on both sides of every difference; a timed mode
per `--counters-every` value (the run key: getrusage read over one step in k; the kernel's
counts are read at every step, harness/loop/counters.py). `--parts` then times each part of the
instrumentation alone, right after a bare step (so with the caches a step leaves), as the
median over the rounds: where the microseconds go.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from hetbench.adapters.pytorch import TorchAdapter
from hetbench.harness import exchange as aggregators
from hetbench.harness.exchange import comm
from hetbench.harness.loop.counters import Counters
from hetbench.harness.loop.sources import build_trainer
from hetbench.harness.loop.timer import StepTimer
from hetbench.harness.records.collector import RecordWriter
from hetbench.harness.run.launcher import free_port
from hetbench.harness.spec.suite import parse_suite


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workload", default="mlp")
    parser.add_argument("--dataset", default="digits")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--blocks", type=int, default=2000, help="blocks of each mode")
    parser.add_argument("--steps-per-block", type=int, default=1,
                        help="1 (the default): the modes alternate step by step, which "
                        "resolves a few microseconds (blocks of 50 steps drift by +-10%%)")
    parser.add_argument("--counters-every", default="1,8",
                        help="a timed mode for each of these counters_every values")
    parser.add_argument("--parts", action="store_true",
                        help="then time each part of the instrumentation after a bare step")
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
    timed = {f"timed ({type(own_timer).__name__}, counters_every = {k})": Counters(int(k))
             for k in args.counters_every.split(",")}
    modes = ["bare", *timed]
    if args.device.startswith("cuda"):
        modes.append("timed (StepTimer, a device wait per phase)")
        timed[modes[-1]] = Counters(1)
    waits = StepTimer(trainer.stretch, trainer.adapter.synchronize)
    per_step: dict[str, list[float]] = {m: [] for m in modes}
    step = 0
    with tempfile.TemporaryDirectory() as tmp:
        trainer.aggregator = aggregators.create(aggregators.Context(
            run, 0, trainer.adapter, trainer.buffer, trainer.optimizer, trainer.initial,
            Path(tmp)))
        writer = RecordWriter(Path(tmp) / "rank0.bin")
        warm = max(2, 20 // args.steps_per_block)  # the first rounds warm up
        for block in range((args.blocks + warm) * len(modes)):
            # each round runs every mode once, starting one mode later than the last round
            mode = modes[(block + block // len(modes)) % len(modes)]
            trainer.timer = waits if mode.startswith("timed (StepTimer, a") else own_timer
            counters = timed.get(mode)
            start = time.perf_counter_ns()
            for _ in range(args.steps_per_block):
                if counters is None:
                    trainer.step_bare(step, 0, args.batch)
                else:
                    writer.append(trainer.timed_step(step, 0, args.batch, counters)[0])
                step += 1
            trainer.adapter.synchronize()
            if block >= warm * len(modes):
                per_step[mode].append((time.perf_counter_ns() - start) / args.steps_per_block)
        costs = parts(trainer, Counters(1), writer, args, step) if args.parts else {}
        writer.close()
        trainer.aggregator.close(False)
    report(args, per_step)
    for name, values in costs.items():
        low, high = interval(np.array(values))
        print(f"  part {name}: {np.median(values):.1f} us [{low:.1f}, {high:.1f}]")
    comm.shutdown()


def parts(trainer: Any, counters: Counters, writer: RecordWriter, args: Any, step: int
          ) -> dict[str, list[float]]:
    """Each part of a timed step's instrumentation, timed alone right after a bare step, in
    microseconds, one value per round (the parts' order rotates)."""
    from hetbench.harness.exchange import Exchange, Holds
    from hetbench.harness.records.collector import PHASES

    timer = trainer.timer
    exchange = Exchange(Holds.SUMS, args.batch, None)
    counters.start()
    record = (0, 0, args.batch, 0, list(range(len(PHASES) + 1)), (0, 0, 0), counters.compute(),
              0.0, 0.0, counters.take(), exchange)  # a timed step's parts (worker.timed_step)

    now = time.perf_counter_ns

    def phase_timer() -> None:  # as the loop marks a step (harness/loop/trainer.py)
        timer.begin()
        for _ in PHASES:
            timer.end(now())

    def kernel_counts() -> None:  # a sampled step's (harness/loop/counters.py)
        counters.start()
        counters.compute()

    def sampled_counters() -> None:
        counters.start()
        counters.compute()
        counters.take()

    unsampled = Counters(10**9)
    unsampled.start()
    unsampled.take()  # its one sampled step

    def step_parts() -> tuple[Any, ...]:  # a timed step's record: its parts (worker.timed_step)
        unsampled.start()
        return (0, 0, args.batch, 0, timer.marks, (0, 0, 0), unsampled.compute(), 0.0, 0.0,
                unsampled.take(), exchange)

    software = counters.kernel.software
    named = {"nothing (the floor of this measurement)": lambda: None,
             "perf group of all threads, one read": (software.read if software is not None
                                                     else lambda: None),
             "main thread's schedstat, one read": counters.schedstat.read,
             "main thread's CPU clock, one read": time.thread_time_ns,
             "phase timer (begin and 8 marks)": phase_timer,
             "a sampled step's kernel counts (perf group, schedstat, thread clock, twice)":
                 kernel_counts,
             "a sampled step's counters (kernel's, 2 getrusage, rss every 8, gc)":
                 sampled_counters,
             "an unsampled step's counters and record": step_parts,
             "writer append (rows built and written every 16)": lambda: writer.append(record)}
    costs: dict[str, list[float]] = {name: [] for name in named}
    names = list(named)
    for k in range(args.blocks * args.steps_per_block):
        name = names[k % len(names)]
        trainer.step_bare(step, 0, args.batch)
        trainer.adapter.synchronize()  # on a GPU, the part must not wait out the step's work
        step += 1
        start = time.perf_counter_ns()
        named[name]()
        costs[name].append((time.perf_counter_ns() - start) / 1e3)
    return costs


def report(args: Any, per_step: dict[str, list[float]]) -> None:
    """Each timed mode against the bare step of the same round (the rounds interleave the
    modes, so a drift of the machine falls on both): the median ratio and extra
    microseconds per step, each with a bootstrap 95% interval over the rounds."""
    bare = np.array(per_step["bare"])
    print(f"{args.workload}/{args.dataset} batch {args.batch} on {args.device}, "
          f"{len(bare)} rounds of {args.steps_per_block} steps per mode:")
    print(f"  bare: {np.median(bare) / 1e3:.1f} us/step")
    for mode, values in per_step.items():
        if mode == "bare":
            continue
        timed = np.array(values)
        ratio, extra = timed / bare - 1, (timed - bare) / 1e3
        (r_lo, r_hi), (e_lo, e_hi) = interval(ratio), interval(extra)
        (m_lo, m_hi), (mr_lo, mr_hi) = interval(extra, np.mean), interval(ratio, np.mean)
        print(f"  {mode}: {np.median(timed) / 1e3:.1f} us/step, overhead median "
              f"{np.median(ratio):+.2%} [{r_lo:+.2%}, {r_hi:+.2%}], "
              f"{np.median(extra):+.1f} us/step [{e_lo:+.1f}, {e_hi:+.1f}]; mean "
              f"{np.mean(ratio):+.2%} [{mr_lo:+.2%}, {mr_hi:+.2%}], "
              f"{np.mean(extra):+.1f} us/step [{m_lo:+.1f}, {m_hi:+.1f}] "
              "(targets: <= 1% of a step of 5 ms or more, <= 30 us)")


def interval(values: Any, statistic: Any = np.median, n_boot: int = 4000
             ) -> tuple[float, float]:
    """Percentile bootstrap 95% interval of a statistic (the median, or the mean) of
    per-round values."""
    rng = np.random.default_rng(0)
    draws = statistic(values[rng.integers(0, len(values), (n_boot, len(values)))], axis=1)
    low, high = np.quantile(draws, [0.025, 0.975])
    return float(low), float(high)


if __name__ == "__main__":
    main()
