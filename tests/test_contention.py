"""analysis/models/contention.py: processor sharing forward and back, on cases worked by hand."""

from __future__ import annotations

import numpy as np
import pytest

from hetbench.analysis.models.contention import finish_times, uncontended_work


def test_three_threads_on_two_cores_each_take_half_again_as_long() -> None:
    assert finish_times(np.ones(3), np.ones(3), 2) == pytest.approx([1.5, 1.5, 1.5])


def test_the_others_speed_up_once_one_is_done() -> None:
    # one core, work 1 and 2: both at half speed until t = 2, then the second alone
    assert finish_times(np.array([2.0, 1.0]), np.ones(2), 1) == pytest.approx([3.0, 2.0])
    # two cores, three jobs 1, 1, 3: at 2/3 speed until t = 1.5, then 2 jobs on 2 cores
    assert finish_times(np.array([1.0, 1.0, 3.0]), np.ones(3), 2) == pytest.approx(
        [1.5, 1.5, 3.5])


def test_threads_weigh_and_gpu_workers_are_never_slowed() -> None:
    # a 2-thread job and a 1-thread job on 2 cores: 3 threads, 2/3 speed while both run
    assert finish_times(np.array([1.0, 1.0]), np.array([2.0, 1.0]), 2) == pytest.approx(
        [1.5, 1.5])
    # a GPU worker (no threads on the cores) beside three CPU workers on two cores
    assert finish_times(np.array([5.0, 1.0, 1.0, 1.0]), np.array([0.0, 1, 1, 1]), 2
                        ) == pytest.approx([5.0, 1.5, 1.5, 1.5])


def test_within_the_cores_nothing_waits() -> None:
    work = np.array([0.3, 2.0, 1.1])
    assert finish_times(work, np.ones(3), 4) == pytest.approx(work)


@pytest.mark.parametrize("seed", range(5))
def test_uncontended_work_inverts_finish_times(seed: int) -> None:
    rng = np.random.default_rng(seed)
    work = rng.uniform(0.1, 5.0, 6)
    threads = rng.integers(0, 3, 6).astype(float)
    finish = finish_times(work, threads, 2)
    assert uncontended_work(finish, threads, 2) == pytest.approx(work)
    assert np.all(finish >= work - 1e-12)
