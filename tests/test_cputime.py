"""CPU time of all threads (harness/system/cputime.py): every thread counted, exactly."""

from __future__ import annotations

import os
import threading
import time

import pytest

from hetbench.harness.system import cputime
from hetbench.harness.system.cputime import ThreadsCpuClock

pytestmark = pytest.mark.skipif(not os.path.isdir(cputime.TASKS),
                                reason="per-thread CPU clocks are read through Linux's /proc")


def burn(seconds: float) -> None:
    """Spend `seconds` of this thread's own CPU time."""
    start = time.thread_time()
    while time.thread_time() - start < seconds:
        pass


def windows(clock: ThreadsCpuClock, n: int) -> list[tuple[int, int]]:
    return [clock.stop(clock.start()) for _ in range(n)]


def test_a_thread_born_inside_the_window_counts_from_its_birth() -> None:
    # the window's start reads the threads listed before, so the new thread is not in it;
    # the clock looks for new threads at the stop of each of its first REFRESH_EVERY
    # windows (then every REFRESH_EVERY: the next test)
    clock = ThreadsCpuClock()
    windows(clock, 1)
    done, leave = threading.Event(), threading.Event()
    spent: list[int] = []

    def worker() -> None:
        burn(0.03)
        spent.append(time.thread_time_ns())
        done.set()
        leave.wait(10)          # alive when the window closes

    begin = clock.start()
    thread = threading.Thread(target=worker)
    thread.start()
    assert done.wait(10)
    assert thread.native_id not in clock.threads
    _, every = clock.stop(begin)
    leave.set()
    thread.join(10)
    assert thread.native_id in clock.threads
    # the new thread's whole life is in the window: at least what it had spent when it
    # signalled, which is its own clock's reading
    assert every >= spent[0]
    assert spent[0] >= 30_000_000


def test_a_new_thread_is_noticed_within_refresh_every_windows() -> None:
    clock = ThreadsCpuClock()
    windows(clock, clock.REFRESH_EVERY)  # the first looks: every window (warm-up)
    leave = threading.Event()
    thread = threading.Thread(target=leave.wait, args=(10,))
    thread.start()
    try:
        seen = []
        for _ in range(clock.REFRESH_EVERY):
            windows(clock, 1)
            seen.append(thread.native_id in clock.threads)
    finally:
        leave.set()
        thread.join(10)
    assert seen[-1] and not seen[0]  # listed again at the 16th look, not at every one


def test_between_looks_a_window_reads_only_clocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The threads are listed (a stat of /proc/self/task) at looks alone: a window between
    them is its busy threads' clocks and nothing else."""
    clock = ThreadsCpuClock()
    windows(clock, 2 * clock.REFRESH_EVERY)
    stats: list[str] = []
    real_stat = os.stat
    monkeypatch.setattr(cputime.os, "stat", lambda path: stats.append(path) or real_stat(path))
    windows(clock, clock.REFRESH_EVERY)
    assert stats == [cputime.TASKS]  # one look in REFRESH_EVERY windows


def test_all_threads_cover_the_main_thread_read_inside_them() -> None:
    clock = ThreadsCpuClock()
    for _ in range(50):
        begin = clock.start()
        main_begin = time.thread_time_ns()
        burn(0.0005)
        main = time.thread_time_ns() - main_begin
        own, every = clock.stop(begin)
        assert every >= own >= main


def test_another_threads_work_counts_in_every_window_not_in_its_own() -> None:
    clock = ThreadsCpuClock()
    go, leave = threading.Event(), threading.Event()
    spent: list[int] = []

    def helper() -> None:
        while not leave.is_set():
            if go.wait(0.001):
                go.clear()
                start = time.thread_time_ns()
                burn(0.002)
                spent.append(time.thread_time_ns() - start)
    thread = threading.Thread(target=helper)
    thread.start()
    try:
        for _ in range(3 * clock.REFRESH_EVERY):  # the helper busy in every window
            begin = clock.start()
            count = len(spent)
            go.set()
            deadline = time.monotonic() + 10
            while len(spent) == count and time.monotonic() < deadline:
                time.sleep(0.0002)
            own, every = clock.stop(begin)
            assert every - own >= spent[-1]
    finally:
        leave.set()
        thread.join(10)


def test_a_thread_that_exited_is_dropped_not_fatal() -> None:
    clock = ThreadsCpuClock()
    go = threading.Event()

    def busy_then_exit() -> None:
        burn(0.002)
        go.wait(10)
    thread = threading.Thread(target=busy_then_exit)
    thread.start()
    windows(clock, 1)  # lists the thread
    time.sleep(0.01)
    windows(clock, 1)  # it ran since the last look: read in every window now
    begin = clock.start()
    assert thread.native_id in clock.threads
    go.set()
    thread.join(10)
    # join returns before the kernel has reaped the thread; wait until it has
    deadline = time.monotonic() + 10
    while str(thread.native_id) in os.listdir(cputime.TASKS) and time.monotonic() < deadline:
        time.sleep(0.001)
    own, every = clock.stop(begin)  # its clock cannot be read any more
    assert every >= own >= 0
    windows(clock, 1)  # the next window looks again and forgets it
    assert thread.native_id not in clock.threads


def test_the_clock_id_is_the_one_the_kernel_gives_for_this_thread() -> None:
    # glibc's pthread_getcpuclockid, through Python, for the main thread
    own = time.pthread_getcpuclockid(threading.main_thread().ident)
    assert cputime.thread_clock_id(threading.get_native_id()) == own


def test_a_thread_idle_at_a_look_is_read_again_at_the_next_and_its_time_counts() -> None:
    """A thread that did not run between two looks is not read in the windows between
    looks; what it spends after waking still counts, by the next look at the latest."""
    clock = ThreadsCpuClock()
    wake, leave = threading.Event(), threading.Event()
    spent: list[int] = []

    def sleeper() -> None:
        wake.wait(10)
        # from the wake on: its start before it (up to 0.1 ms on a loaded host) fell in
        # the windows before `begin`
        woke = time.thread_time_ns()
        burn(0.03)
        spent.append(time.thread_time_ns() - woke)
        leave.wait(10)

    thread = threading.Thread(target=sleeper)
    thread.start()
    try:
        windows(clock, 3 * clock.REFRESH_EVERY)  # looks while it sleeps: not busy any more
        begin = clock.start()
        wake.set()
        deadline = time.monotonic() + 10
        while not spent and time.monotonic() < deadline:
            time.sleep(0.001)
        counted = 0
        for _ in range(clock.REFRESH_EVERY):  # one look among these
            counted += clock.stop(begin)[1]
            begin = clock.start()
    finally:
        leave.set()
        thread.join(10)
    assert spent and spent[0] >= 30_000_000
    assert counted >= spent[0]  # its burn, counted once it was looked at
    assert counted < spent[0] + 20_000_000  # and once: the main thread spent little
