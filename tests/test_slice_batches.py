"""A user's data through one DataLoader for the run (harness/training/job_loader.py): its
sampler follows the slice in force, so a repartition starts no worker processes, and every
step's batch is exactly its slice's samples, collated, whatever was made ahead."""

from __future__ import annotations

from collections import namedtuple
from typing import Any

import pytest
import torch
from torch.utils.data import Dataset, default_collate

from hetbench.harness.training.job_loader import SliceBatches, join_rows, take_rows
from hetbench.workloads.data import BatchOrder

SAMPLES, GLOBAL = 96, 16
Pair = namedtuple("Pair", "x y")


class Numbered(Dataset):
    """Sample i: a tensor holding i, its label, its name and a named pair; each read noted
    (in the process that reads it) in `reads`."""

    def __init__(self) -> None:
        self.reads: list[int] = []

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int) -> dict[str, Any]:
        self.reads.append(index)
        return {"x": torch.full((3,), float(index)), "y": index % 5, "name": f"s{index}",
                "pair": Pair(torch.tensor([index]), index * 2)}


def expected(dataset: Dataset, order: BatchOrder, step: int, lo: int, hi: int,
             collate: Any = default_collate) -> Any:
    """The slice's samples read one by one and collated: what the step must train on."""
    return collate([dataset[int(i)] for i in order.indices(step)[lo:hi]])


def same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and bool(torch.equal(a, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    return bool(a == b)


# a repartition every few steps, one that moves both edges, one that shrinks to a sliver
SLICES = [(0, 8)] * 4 + [(0, 11)] * 3 + [(3, 16)] * 3 + [(0, 4)] * 2 + [(10, 16)] * 3


@pytest.mark.parametrize("workers", [0, 2])
def test_a_moving_slice_is_followed_by_one_dataloader_and_every_batch_is_its_slices(
        workers: int) -> None:
    dataset, order = Numbered(), BatchOrder(SAMPLES, GLOBAL, seed=3)
    batches = SliceBatches(dataset, default_collate, order, timeout_s=30, workers=workers,
                           prefetch=2 if workers else None)
    try:
        for step, (lo, hi) in enumerate(SLICES):
            got = batches.get(step, lo, hi, len(SLICES))
            assert same(got, expected(dataset, order, step, lo, hi)), (step, lo, hi)
        assert batches.starts == 1
        # with worker processes, the batches made ahead at each move (2 x 2 at most) were
        # completed; without, the sampler runs when the batch is asked for, at the new slice
        moves = sum(a != b for a, b in zip(SLICES, SLICES[1:], strict=False))
        if workers:
            assert moves <= batches.completed <= 2 * 2 * moves
        else:
            assert batches.completed == 0
    finally:
        batches.close()


def test_a_slice_announced_as_many_steps_ahead_as_batches_are_made_needs_no_completing(
        ) -> None:
    """The adaptive policies tell a job's loader of a new slice 2 x 2 steps before it is in
    force (harness/loop/repartitioning.py): the batches made ahead are the new slice's,
    none is completed in the training process, and every batch is still its slice's."""
    dataset, order = Numbered(), BatchOrder(SAMPLES, GLOBAL, seed=3)
    batches = SliceBatches(dataset, default_collate, order, timeout_s=30, workers=2,
                           prefetch=2)
    # a move at most every 6 steps: the policy decides nothing while one waits
    slices = [(0, 8)] * 6 + [(0, 11)] * 6 + [(3, 16)] * 6 + [(10, 16)] * 6
    moves = {step: slices[step] for step in range(1, len(slices))
             if slices[step] != slices[step - 1]}
    try:
        for step, (lo, hi) in enumerate(slices):
            for at, (new_lo, new_hi) in moves.items():
                if at - 1 - 2 * 2 == step:  # decided after this step, in force at `at`
                    batches.announce(at, new_lo, new_hi)
            got = batches.get(step, lo, hi, len(slices))
            assert same(got, expected(dataset, order, step, lo, hi)), (step, lo, hi)
        assert batches.starts == 1 and batches.completed == 0
    finally:
        batches.close()


def test_a_batch_of_a_collate_of_its_own_is_read_again_for_the_moved_slice() -> None:
    def stacked(samples: list[dict[str, Any]]) -> tuple[torch.Tensor, list[str]]:
        return torch.stack([s["x"] for s in samples]) * 2, [s["name"] for s in samples]

    dataset, order = Numbered(), BatchOrder(SAMPLES, GLOBAL, seed=4)
    batches = SliceBatches(dataset, stacked, order, timeout_s=30, workers=2, prefetch=2)
    try:
        for step, (lo, hi) in enumerate(SLICES):
            got = batches.get(step, lo, hi, len(SLICES))
            assert same(got, expected(dataset, order, step, lo, hi, stacked)), step
        assert batches.starts == 1 and batches.completed > 0
    finally:
        batches.close()


def test_skipped_steps_go_on_and_a_step_asked_again_starts_the_loader_again() -> None:
    dataset, order = Numbered(), BatchOrder(SAMPLES, GLOBAL, seed=5)
    batches = SliceBatches(dataset, default_collate, order, timeout_s=30, workers=2,
                           prefetch=2)
    try:
        for step in (0, 1, 9, 10):  # 2-8 skipped: more than the 4 made ahead
            assert same(batches.get(step, 0, 8, 20), expected(dataset, order, step, 0, 8))
        assert batches.starts == 1
        assert same(batches.get(3, 2, 9, 20), expected(dataset, order, 3, 2, 9))  # back
        assert batches.starts == 2
        # past the run's count while the sampler goes on (a profiled policy's solo steps)
        assert same(batches.get(21, 0, 16, 20), expected(dataset, order, 21, 0, 16))
        assert batches.starts == 2
        # and once it has ended
        assert same(batches.get(22, 0, 16, 22), expected(dataset, order, 22, 0, 16))
        assert batches.starts == 3
    finally:
        batches.close()


def test_rows_taken_and_joined_are_the_collate_of_the_samples_they_hold() -> None:
    dataset = Numbered()
    whole = default_collate([dataset[i] for i in range(10)])
    parts = [take_rows(whole, 0, 3), take_rows(whole, 3, 4), take_rows(whole, 4, 10)]
    assert same(take_rows(whole, 3, 4), default_collate([dataset[3]]))
    assert same(join_rows(parts), whole)
    assert isinstance(join_rows(parts)["pair"], Pair)
