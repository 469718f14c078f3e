"""A step's counters (harness/loop/counters.py): the system's read over one step in
`every`, the garbage collector's time at every step."""

from __future__ import annotations

import gc
import time

from hetbench.harness.loop.counters import UNMEASURED, Counters


def burn(seconds: float) -> None:
    start = time.thread_time()
    while time.thread_time() - start < seconds:
        pass


def test_one_step_in_every_reads_the_clocks_and_getrusage_the_others_hold_unmeasured() -> None:
    counters = Counters(every=4)
    rows, said = [], []
    for step in range(9):
        if counters.start():
            said.append(step)
        burn(0.002)
        cpu = counters.compute_cpu()
        rows.append((cpu, counters.take()))
    sampled = [i for i, (cpu, _) in enumerate(rows) if cpu != (UNMEASURED, UNMEASURED)]
    assert sampled == said == [0, 4, 8]
    for i, ((main, every), usage) in enumerate(rows):
        if i in sampled:
            assert every >= main >= 2_000_000  # the burn, on this thread's own clock
            assert min(usage[:4]) >= 0 and usage[4] > 0  # switches, CPU, RSS
        else:
            assert usage[:4] == (UNMEASURED,) * 4
            assert usage[4] == rows[0][1][4]  # RSS held from the last read


def test_the_collectors_time_counts_at_every_step_sampled_or_not() -> None:
    counters = Counters(every=1000)
    counters.start()
    counters.take()  # step 0: sampled
    counters.start()
    gc.collect()
    _, _, _, _, _, gc_ns, collections = counters.take()
    assert collections >= 1 and gc_ns > 0
    counters.start()
    assert counters.take()[5:] == (0, 0)  # taken once
