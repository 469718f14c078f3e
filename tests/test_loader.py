"""The input pipeline (harness/training/loader.py, workloads/pipeline.py): decode and augmentation
are fixed by (seed, step, place in the global batch), so partitions and loader kinds never
change the mathematics; the prefetcher hands out exactly the batches asked for, drops those
made for a slice that moved, and every wait has its timeout."""

from __future__ import annotations

import threading
import time
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path

import numpy as np
import pytest

from hetbench.harness.spec.loaders import LoaderSpec
from hetbench.harness.training.loader import Prefetcher
from hetbench.workloads.pipeline import PAD, augment, decode_png, encode_png


def test_png_round_trip_is_8_bit_exact() -> None:
    rng = np.random.default_rng(0)
    for channels in (1, 3):
        images = rng.random((5, channels, 8, 12)).astype(np.float32)
        decoded = decode_png(encode_png(images), channels)
        assert decoded.shape == images.shape and decoded.dtype == np.float32
        np.testing.assert_allclose(decoded, np.rint(images * 255) / 255, atol=1e-7)


def test_augmentation_depends_on_the_place_in_the_global_batch_not_the_slice() -> None:
    rng = np.random.default_rng(1)
    batch = rng.random((16, 3, 10, 10)).astype(np.float32)
    whole = augment(batch, seed=3, step=7, lo=0, total=16)
    parts = np.concatenate([augment(batch[a:b], 3, 7, a, 16) for a, b in ((0, 5), (5, 16))])
    np.testing.assert_array_equal(parts, whole)
    assert not np.array_equal(whole, augment(batch, 3, 8, 0, 16))  # another step, other draws
    # each output is the input shifted by at most PAD pixels, maybe mirrored: a crop of the
    # zero-padded image, so every value is either an input value of that sample or 0
    for i in range(16):
        assert set(np.unique(whole[i])) <= set(np.unique(batch[i])) | {0.0}
    assert (whole == 0).mean() < (2 * PAD / 10)  # mostly image, some padding


def test_prefetcher_hands_out_the_batches_asked_for_and_follows_a_moved_slice() -> None:
    made: list[tuple[int, int, int]] = []
    lock = threading.Lock()

    def make(step: int, lo: int, hi: int) -> tuple[int, int]:
        with lock:
            made.append((step, lo, hi))
        return step * 1000 + lo, hi

    loader = Prefetcher(make, LoaderSpec(workers=2, prefetch=3), steps=10, timeout_s=5)
    try:
        assert loader.get(0, 0, 8) == (0, 8)
        assert loader.get(1, 0, 8) == (1000, 8)
        assert loader.get(2, 2, 8) == (2002, 8)  # the slice moved: made anew
        assert loader.get(3, 2, 8) == (3002, 8)
        assert loader.get(9, 2, 8) == (9002, 8)  # the last step: nothing beyond is queued
    finally:
        loader.close()
    assert (2, 2, 8) in made and all(step < 10 for step, _, _ in made)


def test_prefetcher_wait_has_the_run_timeout() -> None:
    def stuck(step: int, lo: int, hi: int) -> tuple[int, int]:
        time.sleep(2.0)
        return step, hi

    loader = Prefetcher(stuck, LoaderSpec(workers=1, prefetch=1), steps=3, timeout_s=0.2)
    started = time.monotonic()
    with pytest.raises(FutureTimeout):
        loader.get(0, 0, 4)
    assert time.monotonic() - started < 1.5
    loader.close()


SUITE = """
[suite]
name = "loader-exactness"

[defaults]
workload = "mlp"
dataset = "digits"
steps = 12
global_batch = 64
lr = 0.1
seed = 2
optimizer = "momentum"

[[runs]]
name = "one-threads"
workers = [ { device = "cpu" } ]
loader = { workers = 1, prefetch = 1, decode = true, augment = true }

[[runs]]
name = "two-unequal-processes"
partition = { policy = "sizes", sizes = [20, 44] }
workers = [ { device = "cpu" }, { device = "cpu", slowdown = 2.0 } ]
loader = { workers = 2, prefetch = 3, kind = "processes", decode = true, augment = true }

[[runs]]
name = "two-threads-no-augment"
partition = { policy = "sizes", sizes = [20, 44] }
workers = [ { device = "cpu" }, { device = "cpu" } ]
loader = { workers = 2, decode = true }
"""


@pytest.mark.slow
def test_loader_runs_keep_partition_invariance(tmp_path: Path, write_suite) -> None:
    from hetbench.harness.records.results import load_run
    from hetbench.harness.run.launcher import run_suite
    from hetbench.harness.spec.suite import load_suite

    results = run_suite(load_suite(str(write_suite(SUITE))), tmp_path / "results")
    assert [r.status for r in results] == ["completed"] * 3, [r.reason for r in results]
    params = [dict(np.load(r.run_dir / "params.npz")) for r in results]
    for name, value in params[0].items():
        np.testing.assert_allclose(params[1][name], value, rtol=0, atol=2e-5, err_msg=name)
    # augmentation changes what the model sees: the run without it ends elsewhere
    assert any(not np.allclose(params[2][n], v, atol=1e-3) for n, v in params[0].items())
    steps = load_run(results[1].run_dir).steps
    assert len(steps) == 2 * 12 and (steps["load_ns"] > 0).all()
