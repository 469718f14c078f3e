"""A user's data through torch's own DataLoader, hetbench choosing the samples.

hetbench owns the sampler: step s's global batch is `BatchOrder.indices(s)` (a seeded
permutation per epoch, the same for every partition), and a worker takes the contiguous
slice [lo, hi) of it. The DataLoader (its worker processes, prefetch factor, pinned memory)
is torch's, so the load phase is the wait on its iterator: a starved input pipeline shows in
the records as it would in the user's own loop. When the slice moves (repartitioning,
leave-out) or a step is skipped, the iterator is started again at the step asked for: the
batches made ahead for the old slice are dropped, as the prefetcher of the built-in
workloads drops them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from hetbench.harness.spec.loaders import LoaderSpec
from hetbench.workloads.data import BatchOrder
from hetbench.workloads.job import Job, collate, read_batch


class SliceSampler:
    """A batch sampler: the slice [lo, hi) of each global batch from step `first` on."""

    def __init__(self, order: BatchOrder, first: int, last: int, lo: int, hi: int) -> None:
        self.order, self.first, self.last, self.lo, self.hi = order, first, last, lo, hi

    def __iter__(self) -> Iterator[list[int]]:
        for step in range(self.first, self.last):
            yield self.order.indices(step)[self.lo:self.hi].tolist()

    def __len__(self) -> int:
        return self.last - self.first


class SliceBatches:
    """Step s's slice [lo, hi) of each global batch of a map-style Dataset, collated as
    torch's DataLoader collates (its worker processes, prefetching, pinned memory), started
    again where the slice moves or a step is skipped. `last`: the step the sampler stops
    before (at least the step asked for)."""

    def __init__(self, dataset: Any, collate_fn: Callable[[list[Any]], Any], order: BatchOrder,
                 timeout_s: float, workers: int = 0, prefetch: int | None = None,
                 pin_memory: bool = False, worker_init_fn: Callable[[int], None] | None = None
                 ) -> None:
        self.dataset, self.collate_fn, self.order = dataset, collate_fn, order
        self.timeout_s, self.workers, self.prefetch = timeout_s, workers, prefetch
        self.pin_memory, self.worker_init_fn = pin_memory, worker_init_fn
        self._batches: Iterator[Any] | None = None
        self._next: tuple[int, int, int] | None = None  # the (step, lo, hi) it yields next
        self._end = 0  # the step its sampler stops before

    def get(self, step: int, lo: int, hi: int, last: int) -> Any:
        """The collated batch of step `step`'s slice [lo, hi)."""
        if self._batches is None or self._next != (step, lo, hi) or step >= self._end:
            self.close()
            self._end = max(last, step + 1)
            self._batches = iter(self._loader(step, self._end, lo, hi))
        self._next = (step + 1, lo, hi)
        return next(self._batches)

    def _loader(self, step: int, last: int, lo: int, hi: int) -> Any:
        from torch.utils.data import DataLoader

        workers = self.workers
        return DataLoader(
            self.dataset, batch_sampler=SliceSampler(self.order, step, last, lo, hi),
            collate_fn=self.collate_fn, num_workers=workers,
            prefetch_factor=self.prefetch if workers else None, pin_memory=self.pin_memory,
            worker_init_fn=self.worker_init_fn, persistent_workers=False,
            timeout=self.timeout_s if workers else 0)

    def close(self) -> None:
        """Ends the DataLoader's processes (an iterator's are stopped when it is dropped)."""
        shutdown = getattr(self._batches, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
        self._batches = None


class JobBatches:
    """A job's training batches (hetbench.workloads.job.Job) as (inputs, targets)."""

    def __init__(self, job: Job, order: BatchOrder, steps: int, loader: LoaderSpec | None,
                 timeout_s: float) -> None:
        self.job, self.order, self.steps = job, order, steps
        workers = 0 if loader is None else loader.workers
        self.slices = SliceBatches(
            job.train, lambda samples: collate(job, samples), order, timeout_s, workers,
            loader.prefetch if loader else None, bool(loader and loader.pin_memory))

    def get(self, step: int, lo: int, hi: int) -> tuple[Any, Any]:
        """(inputs, targets) of step `step`'s slice [lo, hi). A step beyond the run's count
        may be asked for (the profiled policy's solo steps start at 0 whatever the run's
        length): the sampler goes at least up to that one."""
        return self.job.batch_parts(self.slices.get(step, lo, hi, self.steps))

    def read(self, step: int, lo: int, hi: int) -> tuple[Any, Any]:
        """The same slice read in this process, outside the DataLoader (the exactness check
        before training)."""
        return read_batch(self.job, self.job.train, self.order.indices(step)[lo:hi])

    def close(self) -> None:
        self.slices.close()
