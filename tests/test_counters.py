"""A step's counters (harness/loop/counters.py): the kernel's counts over every step's
compute (the main thread's CPU time and wait for a CPU, all threads' and child processes'
CPU time, faults, switches, migrations), getrusage over one step in `every`, the garbage
collector's time at every step."""

from __future__ import annotations

import gc
import mmap
import os
import sys
import threading
import time

import pytest

from hetbench.harness.loop import counters as counters_module
from hetbench.harness.loop.counters import COMPUTE_FIELDS, UNMEASURED, Counters
from hetbench.harness.system import perf
from tests.conftest import Spawn


def burn(seconds: float) -> None:
    start = time.thread_time()
    while time.thread_time() - start < seconds:
        pass


def window(counters: Counters, work: object) -> dict[str, int]:
    """One step's compute counters around `work()`, by field name."""
    counters.start()
    work()  # type: ignore[operator]
    values = counters.compute().values()
    counters.take()
    return dict(zip(COMPUTE_FIELDS, values, strict=True))


needs_perf = pytest.mark.skipif(perf.open_process_counters().software is None,
                                reason="the kernel refuses perf events here")


def test_one_step_in_every_reads_all_threads_and_getrusage_the_others_hold_unmeasured(
        ) -> None:
    counters = Counters(every=4)
    rows, said = [], []
    for step in range(9):
        if counters.start():
            said.append(step)
        burn(0.002)
        compute = dict(zip(COMPUTE_FIELDS, counters.compute().values(), strict=True))
        rows.append((compute, counters.take()))
    assert said == [0, 4, 8]
    for i, (compute, usage) in enumerate(rows):
        # every step: the burn on this thread's clock, its wait for a CPU
        assert compute["compute_cpu_ns"] >= 2_000_000 and compute["compute_wait_ns"] >= 0
        if i in said:
            assert min(usage[:4]) >= 0 and usage[4] > 0  # switches, CPU, RSS
            assert compute["compute_cpu_all_ns"] >= 1_900_000  # every thread's
        else:
            assert usage[:4] == (UNMEASURED,) * 4
            assert compute["compute_cpu_all_ns"] == compute["compute_faults"] == UNMEASURED
            assert usage[4] == rows[0][1][4]  # RSS held from the last read


@needs_perf
def test_every_step_counts_the_cpu_time_of_threads_started_after_the_counters() -> None:
    counters = Counters(every=1)

    def with_a_helper() -> None:
        helper = threading.Thread(target=burn, args=(0.03,))
        helper.start()
        burn(0.01)
        helper.join()

    counted = window(counters, with_a_helper)
    assert counted["compute_cpu_ns"] >= 10_000_000
    # the helper's 30 ms beside the main thread's own 10
    assert counted["compute_cpu_all_ns"] >= counted["compute_cpu_ns"] + 25_000_000


@needs_perf
def test_a_child_process_counts_with_the_worker(spawn: Spawn) -> None:
    """As a DataLoader's worker processes do: started after the counters were opened."""
    counters = Counters(every=1)

    def start_a_burner() -> None:
        child = spawn([sys.executable, "-c", "import time\nstart = time.process_time()\n"
                       "while time.process_time() - start < 0.05: pass"])
        child.wait(30)

    counted = window(counters, start_a_burner)
    assert counted["compute_cpu_all_ns"] >= counted["compute_cpu_ns"] + 45_000_000


@needs_perf
def test_fresh_pages_are_counted_as_minor_faults() -> None:
    counters = Counters(every=1)
    pages = 2000
    page = mmap.PAGESIZE

    def touch_fresh_pages() -> None:
        region = mmap.mmap(-1, pages * page)
        for i in range(pages):
            region[i * page] = 1
        region.close()

    quiet = window(counters, lambda: burn(0.001))
    faulted = window(counters, touch_fresh_pages)
    assert faulted["compute_faults"] >= pages and quiet["compute_faults"] < pages / 10
    assert faulted["compute_major_faults"] >= 0 and faulted["compute_migrations"] >= 0


def test_the_wait_for_a_cpu_is_the_time_a_busy_core_kept_the_thread_off_it(spawn: Spawn
                                                                            ) -> None:
    """This thread and a process spinning on the same core: the kernel's run-queue wait is
    what the wall clock and the thread's CPU clock say it was off the CPU."""
    if not counters_module.ThreadSchedstat().available:
        pytest.skip("no /proc/thread-self/schedstat here")
    core = min(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)
    spin = f"import os\nos.sched_setaffinity(0, {{{core}}})\nwhile True: pass"
    hog = spawn([sys.executable, "-c", spin])
    try:
        os.sched_setaffinity(0, {core})
        counters = Counters(every=1000)
        time.sleep(0.05)  # the hog on its core
        started = time.perf_counter_ns()
        counted = window(counters, lambda: burn(0.1))
        wall = time.perf_counter_ns() - started
    finally:
        os.sched_setaffinity(0, before)
        hog.kill()
        hog.wait(10)
    off_cpu = wall - counted["compute_cpu_ns"]
    assert off_cpu > 0.3 * wall  # the premise: the hog took the core about half the time
    assert counted["compute_wait_ns"] == pytest.approx(off_cpu, rel=0.15)
    assert counted["compute_slices"] >= 2


def test_without_a_pmu_the_hardware_counts_are_unmeasured_and_the_manifest_says_why() -> None:
    kernel = perf.open_process_counters()
    described = counters_module.describe()
    counted = window(Counters(every=1), lambda: burn(0.001))
    hardware = [counted[f"compute_{name}"] for name in perf.HARDWARE]
    if kernel.hardware is None:
        assert hardware == [UNMEASURED] * 3
        assert described["hardware"].startswith("not available here: ")
    else:  # a host with a PMU: the burn ran instructions in cycles
        assert min(hardware[:2]) > 0 and described["hardware"] == "counted"


def test_where_the_kernel_refuses_perf_events_the_threads_clocks_are_sampled(monkeypatch
                                                                             ) -> None:
    refused = perf.ProcessCounters(None, None, "EACCES (Permission denied)", "EACCES")
    monkeypatch.setattr(perf, "open_process_counters", lambda: refused)
    counters = Counters(every=2)
    steps = [window(counters, lambda: burn(0.002)) for _ in range(4)]
    assert [s["compute_cpu_all_ns"] >= 2_000_000 for s in steps] == [True, False, True, False]
    assert all(s["compute_cpu_all_ns"] == UNMEASURED for s in steps[1::2])
    assert all(s["compute_cpu_ns"] >= 2_000_000 for s in steps)  # the main thread's clock
    assert all(s["compute_faults"] == UNMEASURED for s in steps)
    assert counters_module.describe()["software"] == "not available here: EACCES " \
        "(Permission denied)"


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
