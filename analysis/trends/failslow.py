"""Fail-slow detection (Greyhound, ATC-25): when did a worker become slower, by how much,
and was it a jump or a drift? From each worker's compute time per sample, so that a slice
an adaptive policy shrank does not hide the slowdown that made it shrink.

    y(step) = log(compute / slice)

- change points: ruptures' kernel detector on y (least squares), its penalty from the
  series' own step-to-step noise (hetbench.analysis.trends.persistence.segment_ends);
- a shift must hold PERSIST steps: a shorter excursion above or below both neighbours is
  a burst (another process on the host for a moment) and is merged away, so are shifts
  left under 10%; a speed-up is reported only as the end of a reported slowdown;
- each run of same-direction change points is one episode, then told apart: a ramp (flat,
  linear, flat) that fits it at least as well as the steps do is a **drift**, "slowed 2.5x
  over steps 20-239"; else each change point is a **jump**, "became 3.1x slower at step 120
  (±3)", the ± the steps whose split the data cannot tell from the best one (likelihood
  ratio, 95%); a staircase whose steps are each too small but together large enough is a
  drift from its first step to its last;
- a jump's factor is read at equal slice where the worker kept its slice a few steps on
  both sides (compute over compute); else, and for a drift, per sample: then a factor no
  larger than the slice's own change (all of a step's cost fixed would make it that) may
  be the fixed cost per step spread over fewer samples, not the worker, and is not
  reported;
- only factors of at least MIN_FACTOR (either way) are reported, and a jump only when its
  equal-slice and per-sample readings agree: a shared 2-core host moves a worker's speed
  by 10-30% for stretches of tens of steps.

analysis/trends/failslow_check.py compares the episodes with the emulated schedules.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from hetbench.analysis.trends.persistence import MAX_POINTS, merge_small_shifts, segment_ends
from hetbench.analysis.view.metrics import after_warmup, complete_steps, instrumented, with_derived

MIN_FACTOR = 1.5  # smallest slowdown (or recovery) reported
MIN_SEGMENT = 10  # steps: the shortest drift; the search takes half as its shortest segment
PERSIST = 20  # steps a shift must hold to be reported
EQUAL_SLICE_STEPS = 5  # steps at one slice on each side of a jump to read it at equal slice
CHI2_95 = 3.84  # one degree of freedom: the step interval of a jump
RAMP_GRID = 48  # candidate knots per side in the ramp search
COLUMNS = ["rank", "kind", "step", "end_step", "factor", "pm_steps", "equal_slice"]


@dataclass(frozen=True)
class Series:
    """One worker's steps after warm-up, left-out steps dropped."""

    steps: np.ndarray
    compute_ms: np.ndarray
    slices: np.ndarray

    @property
    def log_rate(self) -> np.ndarray:
        return np.log(self.compute_ms / self.slices)


def worker_series(steps: pd.DataFrame, warmup_steps: int = 0) -> dict[int, Series]:
    """Each worker's Series from a run's records (complete steps after warm-up)."""
    steps = complete_steps(after_warmup(steps, warmup_steps))
    if steps.empty or not instrumented(steps):
        return {}
    d = with_derived(steps)[["rank", "step", "compute_ns", "batch_size"]]
    d = d[(d["batch_size"] > 0) & (d["compute_ns"] > 0)].sort_values(["rank", "step"])
    return {int(rank): _blocked(Series(g["step"].to_numpy(), g["compute_ns"].to_numpy() / 1e6,
                                       g["batch_size"].to_numpy(float)))
            for rank, g in d.groupby("rank")}


def _blocked(series: Series) -> Series:
    """Block medians of a series longer than MAX_POINTS, so that the search stays fast (a
    point then stands for its block, named by its first step; PERSIST and the segments
    then count blocks)."""
    block = math.ceil(len(series.steps) / MAX_POINTS)
    if block <= 1:
        return series
    n = len(series.steps) // block * block

    def median(x: np.ndarray) -> np.ndarray:
        return np.median(x[:n].reshape(-1, block), axis=1)
    return Series(series.steps[:n:block], median(series.compute_ms), median(series.slices))


def detect(steps: pd.DataFrame, warmup_steps: int = 0,
           min_factor: float = MIN_FACTOR) -> pd.DataFrame:
    """Every worker's slowdowns and recoveries. Columns: rank, kind (jump/drift), step (a
    jump's first slow step, a drift's first), end_step (a drift's last; a jump's = step),
    factor (after / before: > 1 slower), pm_steps (a jump's 95% interval half-width),
    equal_slice (the factor read at one slice size, else per sample)."""
    rows = [dict(rank=rank, **episode) for rank, series in worker_series(steps, warmup_steps)
            .items() for episode in episodes(series, min_factor)]
    return pd.DataFrame(rows, columns=COLUMNS)


def episodes(series: Series, min_factor: float = MIN_FACTOR) -> list[dict[str, Any]]:
    """One worker's slowdowns and recoveries, as detect() reports them (without rank)."""
    y = series.log_rate
    if len(y) < 2 * MIN_SEGMENT:
        return []
    ends = segment_ends(np.exp(y), MIN_SEGMENT // 2)  # its merge rule reads relative shifts
    if ends is None:
        return []
    ends = merge_small_shifts(np.exp(y), _persistent(y, ends))  # merging leaves small ones
    levels = _levels(y, ends)
    found: list[dict[str, Any]] = []
    slowed = False
    for group in _same_direction(ends[:-1], levels):
        up = levels[group[-1] + 1] > levels[group[0]]
        if not up and not slowed:  # faster than the start: warm-up's end, say
            continue
        new = _classify(series, y, ends, group, min_factor)
        found += new
        slowed = (slowed or bool(new)) and not (new and not up)
    return found


def _levels(y: np.ndarray, ends: list[int]) -> list[float]:
    return [float(np.median(y[a:b])) for a, b in zip([0, *ends[:-1]], ends, strict=True)]


def _persistent(y: np.ndarray, ends: list[int]) -> list[int]:
    """The segment ends without stretches too short to show a speed: shortest first, a
    segment shorter than PERSIST steps that rises above (or falls below) both neighbours
    is merged away. Where the neighbours are at about one level it was a burst (another
    process on the host for a moment): both its cuts go. Else it is an overshoot, a jump
    that settled lower: it joins the nearer neighbour. Once none is left, a short segment
    at either end of the run joins its neighbour. A short segment between a lower and a
    higher one is a staircase's tread: kept."""
    while len(ends) > 1:
        levels, starts = _levels(y, ends), [0, *ends[:-1]]
        short = [k for k in range(len(ends)) if ends[k] - starts[k] < PERSIST]
        peaks = [k for k in short if 0 < k < len(ends) - 1
                 and (levels[k] - levels[k - 1]) * (levels[k] - levels[k + 1]) > 0]
        if peaks:
            k = min(peaks, key=lambda k: ends[k] - starts[k])
            before, after = abs(levels[k] - levels[k - 1]), abs(levels[k] - levels[k + 1])
            if abs(levels[k - 1] - levels[k + 1]) < min(before, after) / 2:
                drop = {k - 1, k}
            else:
                drop = {k - 1} if before < after else {k}
        elif edges := [k for k in short if k in (0, len(ends) - 1)]:
            k = min(edges, key=lambda k: ends[k] - starts[k])
            drop = {0} if k == 0 else {k - 1}
        else:
            break
        ends = [e for i, e in enumerate(ends) if i not in drop]
    return ends


def _same_direction(cuts: list[int], levels: list[float]) -> list[list[int]]:
    """Indices into `cuts`, grouped into runs whose level moves the same way."""
    groups: list[list[int]] = []
    for i in range(len(cuts)):
        up = levels[i + 1] > levels[i]
        if groups and (levels[groups[-1][-1] + 1] > levels[groups[-1][-1]]) == up:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def _classify(series: Series, y: np.ndarray, ends: list[int], group: list[int],
              min_factor: float) -> list[dict[str, Any]]:
    starts = [0, *ends[:-1]]
    lo, hi = starts[group[0]], ends[group[-1] + 1]
    window = y[lo:hi]
    cuts = [ends[i] - lo for i in group]
    ramp = _best_ramp(window)
    # BIC: the steps cost a level and a location per cut, the ramp its two levels and two
    # knots. The residual variance, not the step-to-step noise: the noise is autocorrelated.
    n = len(window)
    steps_bic = n * math.log(_piecewise_rss(window, cuts) / n) + (2 * len(cuts) + 1) * math.log(n)
    # ... and it must account for the same shift: its way, across the cuts it replaces.
    up = _rises(window, cuts)
    if (ramp is not None and ramp["b"] - ramp["a"] >= MIN_SEGMENT
            and (ramp["rise"] > 0) == up
            and ramp["a"] <= cuts[0] + MIN_SEGMENT and ramp["b"] >= cuts[-1] - MIN_SEGMENT
            and n * math.log(ramp["rss"] / n) + 4 * math.log(n) <= steps_bic):
        factor = math.exp(ramp["rise"])
        a, b = lo + ramp["a"], lo + ramp["b"]
        if _magnitude(factor) < min_factor or _slice_explains(
                factor, series.slices[lo:a + 1], series.slices[b - 1:hi]):
            return []
        return [{"kind": "drift", "step": int(series.steps[a]),
                 "end_step": int(series.steps[b - 1]), "factor": factor,
                 "pm_steps": math.nan, "equal_slice": _constant(series.slices[lo:hi])}]
    out = []
    for i in group:
        a, b = starts[i], ends[i + 1]
        # the best single split near the search's, leaving segments as long as it would
        least = MIN_SEGMENT // 2
        first = max(a + least, ends[i] - MIN_SEGMENT)
        last = min(b - least, ends[i] + MIN_SEGMENT)
        cut = first + int(np.argmin(_split_rss(y[a:b])[first - a - 1:last - a])) \
            if first <= last else ends[i]
        out += [j for j in _jump(series, y, a, cut, b, min_factor) if (j["factor"] > 1) == up]
    if out or len(cuts) < 2:
        return out
    # A staircase of shifts each too small, together large enough: a drift whose shape
    # the ramp did not fit (a factor growing linearly is concave on the log scale).
    factor = math.exp(float(np.median(window[cuts[-1]:]) - np.median(window[:cuts[0]])))
    if _magnitude(factor) < min_factor or _slice_explains(
            factor, series.slices[lo:lo + cuts[0]], series.slices[lo + cuts[-1]:hi]):
        return []
    return [{"kind": "drift", "step": int(series.steps[lo + cuts[0]]),
             "end_step": int(series.steps[lo + cuts[-1]]), "factor": factor,
             "pm_steps": math.nan, "equal_slice": _constant(series.slices[lo:hi])}]


def _rises(window: np.ndarray, cuts: Sequence[int]) -> bool:
    """The level after the last cut is above the level before the first."""
    return bool(np.median(window[cuts[-1]:]) > np.median(window[:cuts[0]]))


def _jump(series: Series, y: np.ndarray, a: int, cut: int, b: int, min_factor: float
          ) -> list[dict[str, Any]]:
    """A change point at `cut` between segments [a, cut) and [cut, b), if it is the
    worker's and large enough."""
    before, after = series.slices[a:cut], series.slices[cut:b]
    same_before = np.flatnonzero(before == before[-1])
    same_after = np.flatnonzero(after == before[-1])
    # the steps right before the cut and right after at the slice the worker had
    tail = same_before[same_before >= len(before) - 2 * MIN_SEGMENT]
    head = same_after[: 2 * MIN_SEGMENT]
    per_sample = math.exp(float(np.median(y[cut:b]) - np.median(y[a:cut])))
    if len(tail) >= EQUAL_SLICE_STEPS and len(head) >= EQUAL_SLICE_STEPS:
        factor = float(np.median(series.compute_ms[cut:b][head])
                       / np.median(series.compute_ms[a:cut][tail]))
        equal = True
    elif _slice_explains(per_sample, before, after):
        return []
    else:
        factor, equal = per_sample, False
    # Both readings must agree: a few steps at one slice alone are noisy on a shared host.
    if min(_magnitude(factor), _magnitude(per_sample)) < min_factor or \
            (factor > 1) != (per_sample > 1):
        return []
    low, high = _cut_interval(y[a:b], cut - a)
    step = int(series.steps[cut])
    return [{"kind": "jump", "step": step, "end_step": step, "factor": factor,
             "pm_steps": float(max(series.steps[a + high] - step, step - series.steps[a + low])),
             "equal_slice": equal}]


def _slice_explains(per_sample: float, before: np.ndarray, after: np.ndarray) -> bool:
    """A per-sample factor that the slice change alone could account for: were the whole
    step a fixed cost, per-sample time would grow by the ratio the slice shrank."""
    ratio = float(np.median(before) / np.median(after))
    return math.log(per_sample) * math.log(ratio) > 0 and _magnitude(per_sample) <= \
        _magnitude(ratio)


def _magnitude(factor: float) -> float:
    return max(factor, 1 / factor)


def _piecewise_rss(y: np.ndarray, cuts: Sequence[int]) -> float:
    bounds = [0, *cuts, len(y)]
    return float(sum(((y[a:b] - y[a:b].mean()) ** 2).sum()
                     for a, b in zip(bounds, bounds[1:], strict=False) if b > a))


def _split_rss(y: np.ndarray) -> np.ndarray:
    """RSS of two means split before each index 1..n-1 (cumulative sums: O(n))."""
    n = len(y)
    k = np.arange(1, n)
    s1, s2 = np.cumsum(y)[:-1], np.cumsum(y**2)[:-1]
    total, total2 = y.sum(), (y**2).sum()
    left = s2 - s1**2 / k
    right = (total2 - s2) - (total - s1) ** 2 / (n - k)
    return left + right


def _cut_interval(y: np.ndarray, cut: int) -> tuple[int, int]:
    """The cuts (indices into y) whose two-mean fit is within the 95% likelihood-ratio
    bound of the best one near `cut` (Gaussian, the variance the best split leaves)."""
    rss = _split_rss(y)
    delta = len(y) * np.log(rss / rss.min())
    inside = np.flatnonzero(delta <= CHI2_95) + 1
    near = inside[np.abs(inside - cut) <= MIN_SEGMENT * 2]
    if not len(near):
        return cut, cut
    return int(near.min()), int(near.max())


def _best_ramp(y: np.ndarray) -> dict[str, Any] | None:
    """Flat until knot a, linear to knot b, flat after: the least-squares best over a grid
    of knots (vectorised: every pair's two-parameter fit at once)."""
    n = len(y)
    if n < 3:
        return None
    grid = np.unique(np.linspace(0, n, min(RAMP_GRID, n + 1)).astype(int))
    a, b = np.meshgrid(grid, grid, indexing="ij")
    keep = b > a
    a, b = a[keep], b[keep]
    t = np.arange(n)
    shape = np.clip((t[None, :] - a[:, None]) / (b - a)[:, None], 0.0, 1.0)  # (pairs, n)
    mean_s, mean_y = shape.mean(axis=1), y.mean()
    cov = (shape * y).mean(axis=1) - mean_s * mean_y
    var = (shape**2).mean(axis=1) - mean_s**2
    rise = np.where(var > 0, cov / np.where(var > 0, var, 1), 0.0)
    rss = ((y - mean_y) ** 2).sum() - n * rise * cov
    best = int(np.argmin(rss))
    return {"a": int(a[best]), "b": int(b[best]), "rise": float(rise[best]),
            "rss": float(rss[best])}


def _constant(values: np.ndarray) -> bool:
    return bool(len(values)) and bool((values == values[0]).all())


def describe(row: Any) -> str:
    """One line: 'worker 2 became 3.1x slower at step 120 (±3)', 'worker 0 slowed 2.5x over
    steps 20-239', or the recovery."""
    slower = row.factor >= 1
    x = row.factor if slower else 1 / row.factor
    basis = "" if row.equal_slice else " per sample"
    if row.kind == "drift":
        verb = "slowed" if slower else "sped up"
        return (f"worker {row.rank} {verb} {x:.1f}x{basis} over steps "
                f"{row.step}-{row.end_step}")
    change = "slower" if slower else "faster"
    interval = "" if math.isnan(row.pm_steps) else f" (±{row.pm_steps:.0f})"
    return f"worker {row.rank} became {x:.1f}x {change}{basis} at step {row.step}{interval}"
