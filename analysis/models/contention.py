"""Workers contending for a host's cores, as processor sharing.

On a host with fewer cores than computing threads, each worker's compute waits for a core,
and the times it records include that wait. hetbench's emulated slow CPU workers compute
their real part and then sleep (harness/spec/emulation.py), and in a lockstep step every
worker starts computing together, after the exchange: so every worker's real compute
starts at once and the threads share the cores until each is done.

The model: jobs that all start at 0, job i needing work[i] of time at full speed on its
threads[i] threads; while the active jobs' threads T exceed the cores C, every active job
progresses at C / T of full speed (the kernel's fair share), else at full speed. All
active jobs progress at the same rate, so they finish in the order of their work.
`finish_times` runs it forward (uncontended work -> the times recorded);
`uncontended_work` inverts it (the times recorded -> the work alone). A worker with no
threads on the host's cores (a GPU worker's compute) counts for none and is never slowed.

Measured on the 2-core machine class (docs/howto/advise.md): the `sync` job's fast worker
took 7.20 ms for 32 samples beside two others and 7.25 ms for 48 samples beside one, a
factor of 1.49 for three computing threads on two cores, where the model says 1.5.
"""

from __future__ import annotations

import numpy as np


def _rate(threads: float, cores: float) -> float:
    return 1.0 if threads <= cores else cores / threads


def finish_times(work: np.ndarray, threads: np.ndarray, cores: float) -> np.ndarray:
    """When each job is done, all starting at 0 and sharing `cores` (module docstring)."""
    work, threads = np.asarray(work, float), np.asarray(threads, float)
    finish = work.copy()  # jobs without threads on the cores run at full speed
    sharing = np.flatnonzero(threads > 0)
    active = float(threads[sharing].sum())
    now = progress = 0.0
    for i in sharing[np.argsort(work[sharing], kind="stable")]:
        now += (work[i] - progress) / _rate(active, cores)
        progress = work[i]
        finish[i] = now
        active -= threads[i]
    return finish


def uncontended_work(finish: np.ndarray, threads: np.ndarray, cores: float) -> np.ndarray:
    """The work alone that makes the jobs finish at `finish` when they share `cores`: the
    inverse of finish_times."""
    finish, threads = np.asarray(finish, float), np.asarray(threads, float)
    work = finish.copy()
    sharing = np.flatnonzero(threads > 0)
    active = float(threads[sharing].sum())
    then = progress = 0.0
    for i in sharing[np.argsort(finish[sharing], kind="stable")]:
        progress += (finish[i] - then) * _rate(active, cores)
        then = finish[i]
        work[i] = progress
        active -= threads[i]
    return work
