"""The worker-by-step heatmap of ByteDance's SMon (OSDI '25): a row per worker, a column
per step, each cell that step's compute time over the worker's median. An isolated hot
cell is one bad step of one worker; a row band, a worker slow for a stretch (a failing or
throttled device, another job on its cores); a column band, a step slow for every worker
(a shared cause, or a stage imbalance); scatter, imbalance from step to step.

Long runs are binned: at most MAX_COLUMNS columns, each the largest ratio among its steps
(a hot cell must not average away). Marked: the cells of a worker left out of every step
of its bin (blank), the steps whose slices changed (a repartition, or a worker left out or
back) and the held-out evaluations.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from hetbench.analysis.view.metrics import after_warmup, with_derived

MAX_COLUMNS = 400  # readable at a paper's width; 10,000 steps become bins of 25


@dataclass
class Heatmap:
    """ratios: rank x bin (the bin's first step) -> the largest compute / median of the
    worker's steps in it; NaN where the worker computed none of them (left out)."""

    ratios: pd.DataFrame
    bin_steps: int  # steps a column holds
    repartitions: list[int]  # steps whose slices differ from the step before's
    evaluations: list[int]  # steps after which the held-out set was evaluated


def heatmap(steps: pd.DataFrame, warmup_steps: int,
            evaluations: pd.DataFrame | None = None) -> Heatmap | None:
    """The heatmap of one run's steps after warm-up, or None without compute times."""
    steps = after_warmup(steps, warmup_steps)
    if steps.empty or not (steps["ready_ns"] > 0).any():
        return None
    d = with_derived(steps)
    computing = d["batch_size"] > 0  # a worker left out of a step computed nothing
    compute = d["compute_ns"].where(computing)
    median = compute.groupby(d["rank"]).transform("median")
    ratio = compute / median.where(median > 0)
    first, last = int(d["step"].min()), int(d["step"].max())
    bin_steps = max(1, math.ceil((last - first + 1) / MAX_COLUMNS))
    bins = first + (d["step"] - first) // bin_steps * bin_steps
    ratios = ratio.groupby([d["rank"], bins]).max().unstack()
    ratios = ratios.reindex(columns=range(first, last + 1, bin_steps))
    slices = d.pivot_table(index="step", columns="rank", values="batch_size")
    changed = slices.ne(slices.shift()).any(axis=1).iloc[1:]
    evaluated: list[int] = []
    if evaluations is not None and "step" in evaluations.columns:
        evaluated = sorted(int(s) for s in evaluations["step"].unique() if first <= s <= last)
    return Heatmap(ratios, bin_steps, [int(s) for s in changed[changed].index], evaluated)


def hot_cells(map_: Heatmap, factor: float = 2.0) -> list[tuple[int, int, float]]:
    """(rank, bin's first step, ratio) of every cell at least `factor` times its worker's
    median, hottest first: what the figure's reader looks for."""
    stacked = map_.ratios.stack()
    hot = stacked[stacked >= factor].sort_values(ascending=False)
    return [(int(rank), int(step), float(value)) for (rank, step), value in hot.items()
            if np.isfinite(value)]
