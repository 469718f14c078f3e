"""Is a slow step followed by slow steps? Autocorrelation and change points of each
worker's compute time: persistent slowness is what repartitioning can fix; independent
noise is not."""

from __future__ import annotations

import numpy as np
import pandas as pd

from hetbench.analysis.view.metrics import after_warmup, complete_steps, instrumented, with_derived

LAGS = (1, 2, 5, 10)
# Change-point search runs on at most this many points (block medians beyond it): the
# kernel detector is fast up to a few thousand points and slow past tens of thousands.
MAX_POINTS = 2000
# A change point must move the segment median by at least this much (relative): the
# detector's least-squares cost also splits at bursts of spikes in heavy-tailed series.
MIN_SHIFT = 0.10


def compute_series(steps: pd.DataFrame, warmup_steps: int = 0) -> dict[int, pd.Series]:
    """Each worker's compute time (ms) indexed by step, after warm-up."""
    steps = complete_steps(after_warmup(steps, warmup_steps))
    if steps.empty or not instrumented(steps):
        return {}
    d = with_derived(steps)[["rank", "step", "compute_ns"]]  # grouping narrow is cheaper
    return {int(rank): (g.set_index("step")["compute_ns"] / 1e6).sort_index()
            for rank, g in d.groupby("rank")}


def autocorrelation(steps: pd.DataFrame, warmup_steps: int = 0,
                    lags: tuple[int, ...] = LAGS) -> pd.DataFrame:
    """Per worker and lag: the autocorrelation of compute time. Columns rank, lag, acf."""
    rows = []
    for rank, series in compute_series(steps, warmup_steps).items():
        x = series.to_numpy() - series.mean()
        denominator = float(np.dot(x, x))
        for lag in lags:
            acf = (float(np.dot(x[:-lag], x[lag:])) / denominator
                   if lag < len(x) and denominator > 0 else np.nan)
            rows.append({"rank": rank, "lag": lag, "acf": acf})
    return pd.DataFrame(rows, columns=["rank", "lag", "acf"])


def change_points(steps: pd.DataFrame, warmup_steps: int = 0,
                  min_segment: int = 10) -> pd.DataFrame:
    """Steps where a worker's mean compute time shifts (ruptures' kernel change-point
    detection, linear kernel = least squares, penalty 3 sigma^2 log n with sigma from the
    median absolute step-to-step difference, so spikes alone do not make change points).
    Columns: rank, step (first step of the new segment), before_ms, after_ms."""
    rows = []
    for rank, series in compute_series(steps, warmup_steps).items():
        values, index = series.to_numpy(), series.index.to_numpy()
        block = max(1, int(np.ceil(len(values) / MAX_POINTS)))
        if block > 1:  # block medians keep the search fast on long runs
            n = len(values) // block * block
            values = np.median(values[:n].reshape(-1, block), axis=1)
            index = index[:n:block]
        if len(values) < 2 * min_segment:
            continue
        ends = segment_ends(values, max(2, min_segment // block))
        if ends is None:
            continue
        starts = [0, *ends[:-1]]
        for (a, b), c in zip(zip(starts, ends, strict=True), ends[1:], strict=False):
            rows.append({"rank": rank, "step": int(index[b]),
                         "before_ms": float(np.median(values[a:b])),
                         "after_ms": float(np.median(values[b:c]))})
    return pd.DataFrame(rows, columns=["rank", "step", "before_ms", "after_ms"])


def segment_ends(values: np.ndarray, min_size: int) -> list[int] | None:
    """The ends of the segments of constant mean in `values` (the last is len(values)), by
    the penalised search above; None for a series without step-to-step noise."""
    import ruptures

    clipped = np.clip(values, *np.percentile(values, [1, 99]))
    sigma = 1.4826 * np.median(np.abs(np.diff(clipped))) / np.sqrt(2)
    if sigma <= 0:
        return None
    penalty = 3 * sigma**2 * np.log(len(clipped))
    algo = ruptures.KernelCPD(kernel="linear", min_size=min_size)
    return merge_small_shifts(values, algo.fit(clipped.reshape(-1, 1)).predict(pen=penalty))


def merge_small_shifts(values: np.ndarray, ends: list[int]) -> list[int]:
    """Drop, smallest first, boundaries whose segment medians differ by < MIN_SHIFT."""
    ends = list(ends)
    while len(ends) > 1:
        starts = [0, *ends[:-1]]
        medians = [float(np.median(values[a:b])) for a, b in zip(starts, ends, strict=True)]
        shifts = [abs(after - before) / before if before > 0 else np.inf
                  for before, after in zip(medians, medians[1:], strict=False)]
        smallest = int(np.argmin(shifts))
        if shifts[smallest] >= MIN_SHIFT:
            break
        del ends[smallest]
    return ends
