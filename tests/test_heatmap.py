"""Issue 31: SMon's worker-by-step heatmap. Each cell is the step's compute over the
worker's median, checked on step records whose answers are known by construction; a long
run is binned without averaging a hot cell away, and its figure is written."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from hetbench.analysis.measures.heatmap import MAX_COLUMNS, heatmap, hot_cells
from hetbench.harness.records import collector
from hetbench.harness.records.collector import RECORD_DTYPE
from hetbench.harness.records.results import Run
from tests.synthetic import MS, steps_frame, write_run

WARMUP = 2


def compute_ms(rank: int, step: int) -> float:
    """Worker 0 takes 2 ms, 6 ms at step 4; worker 1 3 ms, 3.5 ms at step 5."""
    if rank == 0:
        return 6.0 if step == 4 else 2.0
    return 3.5 if step == 5 else 3.0


def test_each_cell_is_the_steps_compute_over_its_workers_median() -> None:
    steps = steps_frame(10, compute_ms)
    map_ = heatmap(steps, WARMUP)
    assert map_ is not None and map_.bin_steps == 1
    assert list(map_.ratios.columns) == list(range(WARMUP, 10))  # after warm-up
    for rank in (0, 1):
        median = 2.0 if rank == 0 else 3.0
        for step in range(WARMUP, 10):
            assert map_.ratios.loc[rank, step] == pytest.approx(compute_ms(rank, step) / median,
                                                                rel=1e-6)
    assert hot_cells(map_) == [(0, 4, pytest.approx(3.0))]
    assert map_.repartitions == [] and map_.evaluations == []


def test_slice_changes_evaluations_and_left_out_workers_are_marked() -> None:
    # worker 1 left out of step 6 (batch 0); worker 0's slice grows from step 8
    def batch(rank: int, step: int) -> int:
        if rank == 1 and step == 6:
            return 0
        return 40 if rank == 0 and step >= 8 else 32

    steps = steps_frame(10, compute_ms)
    steps["batch_size"] = [batch(r, s) for r, s in zip(steps["rank"], steps["step"],
                                                       strict=True)]
    map_ = heatmap(steps, WARMUP, pd.DataFrame({"step": [3, 7, 42]}))
    assert map_ is not None
    assert np.isnan(map_.ratios.loc[1, 6])  # blank: it computed nothing
    assert not map_.ratios.drop(columns=6).isna().any().any()
    assert map_.repartitions == [6, 7, 8]  # out, back, the new slice
    assert map_.evaluations == [3, 7]  # 42 is past the run's steps


def _long_run(world: int, n_steps: int) -> pd.DataFrame:
    """world x n_steps records, vectorised: every worker computes 2 ms but worker 17 takes
    10 ms at step 5,003, worker 40 is left out of steps 6,000-6,099 and worker 3's slice
    changes at step 7,000."""
    rank = np.tile(np.arange(world), n_steps)
    step = np.repeat(np.arange(n_steps), world)
    compute = np.full(rank.shape, 2 * MS, dtype=np.int64)
    compute[(rank == 17) & (step == 5003)] = 10 * MS
    rows = np.zeros(rank.size, dtype=RECORD_DTYPE)
    rows["rank"], rows["step"] = rank, step
    rows["batch_size"] = np.where((rank == 3) & (step >= 7000), 40, 32)
    rows["batch_size"][(rank == 40) & (step >= 6000) & (step < 6100)] = 0
    rows["begin_ns"] = step.astype(np.int64) * 20 * MS
    rows["ready_ns"] = rows["begin_ns"] + compute
    rows["reduced_ns"] = rows["begin_ns"] + 11 * MS
    rows["end_ns"] = rows["reduced_ns"] + MS
    return collector.records_frame([rows])


def test_a_long_run_is_binned_and_a_hot_cell_stays_hot(tmp_path: Path) -> None:
    """64 workers x 10,000 steps: at most MAX_COLUMNS columns, each the largest ratio of
    its bin (worker 17's one 5x step is still a 5x cell), a worker left out of whole bins
    blank, and the figure written."""
    steps = _long_run(64, 10_000)
    map_ = heatmap(steps, 0)
    assert map_ is not None
    assert map_.bin_steps == 25 and map_.ratios.shape == (64, MAX_COLUMNS)
    assert hot_cells(map_) == [(17, 5000, pytest.approx(5.0))]
    assert map_.ratios.loc[40, 6000:6075].isna().all()  # bins 6000-6099: left out
    assert not map_.ratios.loc[40].drop(range(6000, 6100, 25)).isna().any()
    assert map_.repartitions == [6000, 6100, 7000]

    from hetbench.analysis.render.figures import heatmap_figure

    run_dir = write_run(tmp_path / "runs", steps.head(0), name="long",
                        slowdown=(1.0,) * 64)
    meta = json.loads((run_dir / "manifest.json").read_text())
    paths = heatmap_figure([Run.of(meta, steps)], tmp_path / "figures", "64 x 10,000")
    assert sorted(p.name for p in paths) == ["heatmap.pdf", "heatmap.png"]
