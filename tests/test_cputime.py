"""CPU time of all threads (harness/system/cputime.py): every thread counted, exactly."""

from __future__ import annotations

import os
import threading
import time

import pytest

from harness.system import cputime
from harness.system.cputime import ThreadsCpuClock

pytestmark = pytest.mark.skipif(not os.path.isdir(cputime.TASKS),
                                reason="per-thread CPU clocks are read through Linux's /proc")


def burn(seconds: float) -> None:
    """Spend `seconds` of this thread's own CPU time."""
    start = time.thread_time()
    while time.thread_time() - start < seconds:
        pass


@pytest.mark.parametrize("refresh", [True, False])
def test_a_thread_born_inside_the_window_counts_from_its_birth(refresh: bool) -> None:
    # refresh=False: the window's first sample reads the threads listed before (the
    # worker's first sample of a step), so the new thread is not in it. The clock looks for
    # new threads at every one of its first REFRESH_EVERY refreshing samples (then every
    # REFRESH_EVERY: the next test).
    clock = ThreadsCpuClock()
    clock.sample()
    done, leave = threading.Event(), threading.Event()
    spent: list[int] = []

    def worker() -> None:
        burn(0.03)
        spent.append(time.thread_time_ns())
        done.set()
        leave.wait(10)          # alive when the window closes

    begin = clock.sample(refresh=refresh)
    thread = threading.Thread(target=worker)
    thread.start()
    assert done.wait(10)
    end = clock.sample()
    leave.set()
    thread.join(10)
    assert thread.native_id not in begin and thread.native_id in end
    # the new thread's whole life is in the window: at least what it had spent when it
    # signalled, which is its own clock's reading
    assert clock.elapsed(begin, end) >= spent[0]
    assert spent[0] >= 30_000_000


def test_a_new_thread_is_noticed_within_refresh_every_samples() -> None:
    clock = ThreadsCpuClock()
    for _ in range(clock.REFRESH_EVERY):  # the first looks: every sample (warm-up)
        clock.sample()
    leave = threading.Event()
    thread = threading.Thread(target=leave.wait, args=(10,))
    thread.start()
    try:
        seen = [thread.native_id in clock.sample() for _ in range(clock.REFRESH_EVERY)]
    finally:
        leave.set()
        thread.join(10)
    assert seen[-1] and not seen[0]  # listed again at the 16th look, not at every one


def test_all_threads_cover_the_main_thread_read_inside_them() -> None:
    clock = ThreadsCpuClock()
    for _ in range(50):
        begin = clock.sample()
        main_begin = time.thread_time_ns()
        burn(0.0005)
        main = time.thread_time_ns() - main_begin
        assert clock.elapsed(begin, clock.sample()) >= main


def test_a_thread_that_exited_is_dropped_not_fatal() -> None:
    clock = ThreadsCpuClock()
    listed = threading.Event()
    thread = threading.Thread(target=listed.wait, args=(10,))
    thread.start()
    begin = clock.sample()       # lists the thread
    listed.set()
    assert thread.native_id in begin
    thread.join(10)
    # join returns before the kernel has reaped the thread; wait until it has
    deadline = time.monotonic() + 10
    while str(thread.native_id) in os.listdir(cputime.TASKS) and time.monotonic() < deadline:
        time.sleep(0.001)
    end = clock.sample()         # its clock cannot be read any more
    assert thread.native_id not in end
    assert clock.elapsed(begin, end) >= 0


def test_the_clock_id_is_the_one_the_kernel_gives_for_this_thread() -> None:
    # glibc's pthread_getcpuclockid, through Python, for the main thread
    own = time.pthread_getcpuclockid(threading.main_thread().ident)
    assert cputime.thread_clock_id(threading.get_native_id()) == own



def test_a_thread_idle_at_a_look_is_read_again_at_the_next_and_its_time_counts() -> None:
    """A thread that did not run between two looks is not read in the samples between
    looks; what it spends after waking still counts, by the next look at the latest."""
    clock = ThreadsCpuClock()
    wake, leave = threading.Event(), threading.Event()
    spent: list[int] = []

    def sleeper() -> None:
        wake.wait(10)
        burn(0.03)
        spent.append(time.thread_time_ns())
        leave.wait(10)

    thread = threading.Thread(target=sleeper)
    thread.start()
    try:
        for _ in range(3 * clock.REFRESH_EVERY):  # looks while it sleeps: not busy any more
            clock.sample()
        begin = clock.sample(refresh=False)
        wake.set()
        deadline = time.monotonic() + 10
        while not spent and time.monotonic() < deadline:
            time.sleep(0.001)
        counted = 0
        for _ in range(clock.REFRESH_EVERY):  # one look among these
            end = clock.sample()
            counted += clock.elapsed(begin, end)
            begin = clock.sample(refresh=False)
    finally:
        leave.set()
        thread.join(10)
    assert spent and spent[0] >= 30_000_000
    assert counted >= spent[0]  # its burn, counted once it was looked at
    assert counted < spent[0] + 20_000_000  # and once: the main thread spent little
