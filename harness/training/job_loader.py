"""A user's data through torch's own DataLoader, hetbench choosing the samples.

hetbench owns the sampler: step s's global batch is `BatchOrder.indices(s)` (a seeded
permutation per epoch, the same for every partition), and a worker takes the contiguous
slice [lo, hi) of it. The DataLoader (its worker processes, prefetch factor, pinned memory)
is torch's, so the load phase is the wait on its iterator: a starved input pipeline shows in
the records as it would in the user's own loop. One DataLoader iterator serves the run: its
batch sampler runs in the training process and reads the slice in force when torch asks
for the next batch, so a repartition costs no new worker processes. A batch made ahead for
the old slice is completed to the new one (the rows both slices share taken from it, the
others read in this process) or, where the collate function is not torch's default, read
again whole: no step trains on another slice's samples. Only a step asked for before the
ones made ahead (going back) or past the sampler's end starts the iterator again.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Mapping
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


class FollowingSampler:
    """A batch sampler from step `first` on whose every batch is the slice its owner
    (SliceBatches) has in force when torch asks for it, until the owner's end. Each batch
    it hands out is noted in the owner's `planned` as (step, lo, hi), in order."""

    def __init__(self, owner: SliceBatches, first: int) -> None:
        self.owner, self.step = owner, first
        self.ran_out = False

    def __iter__(self) -> Iterator[list[int]]:
        owner = self.owner
        while self.step < owner.end:
            step, (lo, hi) = self.step, owner.slice_at(self.step)
            self.step += 1
            owner.planned.append((step, lo, hi))
            yield owner.order.indices(step)[lo:hi].tolist()
        self.ran_out = True


class SliceBatches:
    """Step s's slice [lo, hi) of each global batch of a map-style Dataset, collated as
    torch's DataLoader collates (its worker processes, prefetching, pinned memory), from one
    DataLoader iterator whose sampler follows the slice (the module docstring). `starts`:
    the times an iterator was started; `completed`: the batches made ahead for another
    slice and completed (or read again) for the one asked."""

    def __init__(self, dataset: Any, collate_fn: Callable[[list[Any]], Any], order: BatchOrder,
                 timeout_s: float, workers: int = 0, prefetch: int | None = None,
                 pin_memory: bool = False, worker_init_fn: Callable[[int], None] | None = None
                 ) -> None:
        self.dataset, self.collate_fn, self.order = dataset, collate_fn, order
        self.timeout_s, self.workers, self.prefetch = timeout_s, workers, prefetch
        self.pin_memory, self.worker_init_fn = pin_memory, worker_init_fn
        self.slice = (0, 0)  # what the sampler hands out next
        # (step, lo, hi): the slice from that step on, announced before it is asked for
        # (announce), so that batches made ahead for those steps are made for it
        self.announced: tuple[int, int, int] | None = None
        self.end = 0  # the step the sampler stops before
        self.planned: deque[tuple[int, int, int]] = deque()  # handed out, not yet taken
        self.starts = self.completed = 0
        self._sampler: FollowingSampler | None = None
        self._batches: Iterator[Any] | None = None

    def get(self, step: int, lo: int, hi: int, last: int) -> Any:
        """The collated batch of step `step`'s slice [lo, hi); `last`: the step the sampler
        may stop before (at least the step asked for)."""
        self.slice, self.end = (lo, hi), max(last, step + 1, self.end)
        if self.announced is not None and step >= self.announced[0]:
            self.announced = None  # in force now: `slice`
        if self._sampler is None or self._upcoming() > step:
            self._start(step)
        elif self._upcoming() < step:  # steps skipped: those made ahead are dropped
            sampler = self._sampler
            sampler.step = max(sampler.step, step)
            while self.planned and self.planned[0][0] < step:
                self._next()
        if self._upcoming() != step or self._ran_out():  # ended before this step
            self._start(step)
        batch, (made_step, made_lo, made_hi) = self._next()
        assert made_step == step, (made_step, step)
        if (made_lo, made_hi) != (lo, hi):
            self.completed += 1
            batch = self._complete(batch, step, (made_lo, made_hi), (lo, hi))
        return batch

    def announce(self, step: int, lo: int, hi: int) -> None:
        """From step `step` on the slice is [lo, hi): the sampler hands those steps out for
        it, so a batch made ahead for them needs no completing (the adaptive policies
        announce a new partition as many steps ahead as batches are made ahead, one at a
        time: harness/loop/repartitioning.py; a later announcement replaces this one)."""
        self.announced = (step, lo, hi)

    def slice_at(self, step: int) -> tuple[int, int]:
        """The slice the sampler hands out for step `step`."""
        ahead = self.announced
        return (ahead[1], ahead[2]) if ahead is not None and step >= ahead[0] else self.slice

    def _upcoming(self) -> int:
        """The step of the batch the iterator yields next."""
        assert self._sampler is not None
        return self.planned[0][0] if self.planned else self._sampler.step

    def _ran_out(self) -> bool:
        """Nothing made ahead, and the sampler has ended."""
        return not self.planned and self._sampler is not None and self._sampler.ran_out

    def _next(self) -> tuple[Any, tuple[int, int, int]]:
        assert self._batches is not None
        batch = next(self._batches)  # without worker processes, the sampler runs in it
        return batch, self.planned.popleft()

    def _start(self, step: int) -> None:
        from torch.utils.data import DataLoader

        self.close()
        self._sampler = FollowingSampler(self, step)
        workers = self.workers
        self._batches = iter(DataLoader(
            self.dataset, batch_sampler=self._sampler, collate_fn=self.collate_fn,
            num_workers=workers, prefetch_factor=self.prefetch if workers else None,
            pin_memory=self.pin_memory, worker_init_fn=self.worker_init_fn,
            persistent_workers=False, timeout=self.timeout_s if workers else 0))
        self.starts += 1

    def _complete(self, batch: Any, step: int, made: tuple[int, int],
                  asked: tuple[int, int]) -> Any:
        """A batch made for slice `made` as the batch of slice `asked`: with torch's default
        collate, the rows both share kept and the rest read here; otherwise read again."""
        from torch.utils.data import default_collate

        indices = self.order.indices(step)
        lo, hi = asked
        shared_lo, shared_hi = max(lo, made[0]), min(hi, made[1])
        if self.collate_fn is not default_collate or shared_lo >= shared_hi:
            return self._read(indices[lo:hi])
        parts = [take_rows(batch, shared_lo - made[0], shared_hi - made[0])]
        if lo < shared_lo:
            parts.insert(0, self._read(indices[lo:shared_lo]))
        if shared_hi < hi:
            parts.append(self._read(indices[shared_hi:hi]))
        return join_rows(parts)

    def _read(self, indices: Any) -> Any:
        return self.collate_fn([self.dataset[int(i)] for i in indices])

    def close(self) -> None:
        """Ends the DataLoader's processes (an iterator's are stopped when it is dropped)."""
        shutdown = getattr(self._batches, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
        self._batches = self._sampler = None
        self.planned.clear()


def _is_rows(value: Any) -> bool:
    """A batch of strings as torch's default collate leaves it: the samples' own list."""
    return isinstance(value, list | tuple) and all(isinstance(v, str | bytes) for v in value)


def take_rows(batch: Any, lo: int, hi: int) -> Any:
    """Rows [lo, hi) of a batch torch's default collate made: its tensors' first dimension,
    walked through mappings and sequences as the collate built them."""
    import torch

    if isinstance(batch, torch.Tensor) or _is_rows(batch):
        return batch[lo:hi]
    if isinstance(batch, Mapping):
        return type(batch)({k: take_rows(v, lo, hi) for k, v in batch.items()})  # type: ignore[call-arg]
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a named tuple
        return type(batch)(*(take_rows(b, lo, hi) for b in batch))
    if isinstance(batch, list | tuple):
        return type(batch)(take_rows(b, lo, hi) for b in batch)
    raise TypeError(f"a {type(batch).__name__} in a default-collated batch")


def join_rows(parts: list[Any]) -> Any:
    """The batches `parts` (of one structure, as torch's default collate made them) one
    after another."""
    import torch

    first = parts[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(parts)
    if _is_rows(first):
        return type(first)(row for part in parts for row in part)
    if isinstance(first, Mapping):
        return type(first)({k: join_rows([p[k] for p in parts]) for k in first})  # type: ignore[call-arg]
    if isinstance(first, tuple) and hasattr(first, "_fields"):
        return type(first)(*(join_rows(list(fields)) for fields in zip(*parts, strict=True)))
    if isinstance(first, list | tuple):
        return type(first)(join_rows(list(fields)) for fields in zip(*parts, strict=True))
    raise TypeError(f"a {type(first).__name__} in a default-collated batch")


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

    def announce(self, step: int, lo: int, hi: int) -> None:
        """The slice from step `step` on (SliceBatches.announce)."""
        self.slices.announce(step, lo, hi)

    def read(self, step: int, lo: int, hi: int) -> tuple[Any, Any]:
        """The same slice read in this process, outside the DataLoader (the exactness check
        before training)."""
        return read_batch(self.job, self.job.train, self.order.indices(step)[lo:hi])

    def close(self) -> None:
        self.slices.close()
