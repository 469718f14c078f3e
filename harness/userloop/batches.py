"""The data loader a user's loop iterates: this rank's slice of each global batch, read
through torch's DataLoader with hetbench's sampler (harness/training/job_loader.py) and
moved to the rank's device. Each pass yields the next `len(loader)` global batches (an
epoch of them: the dataset's samples // the global batch), in `BatchOrder`'s order, a
seeded permutation per epoch, the same whatever the slices; the session marks the step's
begin, the wait on the DataLoader (load) and the move (to_device)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from hetbench.harness.spec.errors import UsageError
from hetbench.harness.training.job_loader import SliceBatches
from hetbench.workloads.data import BatchOrder

PREPARE = "Session.prepare"


def slice_batches(data: Any, global_batch: int, seed: int, timeout_s: float
                  ) -> tuple[SliceBatches, BatchOrder, str]:
    """The slices of a map-style Dataset, or of a DataLoader's (its collate_fn, workers,
    prefetching, pinned memory and worker_init_fn kept; its sampler and batch size are
    hetbench's), with the kind of data the manifest names."""
    from torch.utils.data import DataLoader, IterableDataset, default_collate

    loader = data if isinstance(data, DataLoader) else None
    dataset = loader.dataset if loader is not None else data
    if isinstance(dataset, IterableDataset):
        raise UsageError(f"{PREPARE}(data)", f"{type(dataset).__name__} is an "
                         "IterableDataset: its samples have no index, so no rank can take "
                         "a slice of a global batch sized to its speed; give a map-style "
                         "Dataset (__getitem__ and __len__)")
    if not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
        raise UsageError(f"{PREPARE}(data)", f"a {type(data).__name__}: give a map-style "
                         "Dataset (__getitem__ and __len__) or a DataLoader over one")
    count = len(dataset)  # type: ignore[arg-type]
    if count < global_batch:
        raise UsageError(f"{PREPARE}(data)", f"{count} samples, fewer than one global "
                         f"batch ({global_batch}: hetbench.join(global_batch))")
    order = BatchOrder(count, global_batch, seed)
    collate: Callable[[list[Any]], Any] = default_collate
    workers, prefetch, pin, init = 0, None, False, None
    if loader is not None:
        collate = loader.collate_fn or default_collate
        workers, pin = loader.num_workers, loader.pin_memory
        prefetch = loader.prefetch_factor if workers else None
        init = loader.worker_init_fn
    batches = SliceBatches(dataset, collate, order, timeout_s, workers, prefetch, pin, init)
    return batches, order, type(dataset).__name__


def to_device(batch: Any, device: Any) -> Any:
    """The batch's tensors on `device` (tuples, lists and mappings of them walked), the rest
    as it is."""
    import torch

    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a named tuple
        return type(batch)(*(to_device(b, device) for b in batch))
    if isinstance(batch, list | tuple):
        return type(batch)(to_device(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    return batch


class SliceLoader:
    """What `Session.prepare` returns for the data: iterate it as a DataLoader."""

    def __init__(self, steps_per_epoch: int, next_batch: Callable[[int, int], Any],
                 first_step: Callable[[], int], pass_ended: Callable[[], None]) -> None:
        self.steps_per_epoch = steps_per_epoch
        self._next_batch, self._first_step, self._pass_ended = (next_batch, first_step,
                                                                pass_ended)

    def __len__(self) -> int:
        return self.steps_per_epoch

    def __iter__(self) -> Iterator[Any]:
        first = self._first_step()
        last = first + self.steps_per_epoch
        try:
            for step in range(first, last):
                yield self._next_batch(step, last)
        finally:  # the pass ran out, or the loop left it (break, an exception)
            self._pass_ended()
