"""The fail-slow detector (analysis/trends/failslow.py) against a known truth: the emulated
schedules (`slowdown_at`) of a run's workers. Per episode: what was found, the error in its
step and factor, the detection delay (the detector run on every prefix of the run, as it
would run online), and the false alarms: detections that match no episode, and any on a
run without a schedule."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from hetbench.analysis.trends.failslow import (
    MIN_FACTOR,
    Series,
    describe,
    detect,
    episodes,
    worker_series,
)
from hetbench.harness.records.results import Run

MATCH_STEPS = 10  # a detected jump this close to the schedule's is the same one
CHECK_COLUMNS = ["run_id", "rank", "truth", "detected", "step_error", "factor_error",
                 "delay_steps", "false_alarms"]


def scheduled_episodes(manifest: dict[str, Any], first: int, last: int,
                       min_factor: float = MIN_FACTOR) -> list[dict[str, Any]]:
    """What each worker's `slowdown_at` did between steps `first` and `last`: a jump
    where two points are a step apart, a drift between points further apart, as detect()
    would report them (factor relative to the level where the window starts), with the
    step at which a drift had reached `min_factor` (`onset`)."""
    from hetbench.analysis.measures.costmodel import worker_specs

    out = []
    for rank, spec in enumerate(worker_specs(manifest)):
        points = spec.slowdown_at or ()
        for (s0, f0), (s1, f1) in zip(points, points[1:], strict=False):
            if f1 == f0 or s1 < first or s0 > last:
                continue
            if s1 - s0 <= 1:
                if max(f1 / f0, f0 / f1) >= min_factor:
                    out.append({"rank": rank, "kind": "jump", "step": s1, "end_step": s1,
                                "factor": f1 / f0, "onset": s1})
                continue
            a, b = max(s0, first), min(s1, last)
            level = np.array([spec.slowdown_for(s) for s in range(a, b + 1)])
            ratio = level / level[0]
            reached = np.flatnonzero(np.maximum(ratio, 1 / ratio) >= min_factor)
            if len(reached):
                out.append({"rank": rank, "kind": "drift", "step": a, "end_step": b,
                            "factor": float(ratio[-1]), "onset": a + int(reached[0])})
    return out


def _matches(found: Any, truth: dict[str, Any]) -> bool:
    if found.rank != truth["rank"] or (found.factor > 1) != (truth["factor"] > 1):
        return False
    if truth["kind"] == "jump":
        return abs(found.step - truth["step"]) <= MATCH_STEPS
    return found.step <= truth["end_step"] and found.end_step >= truth["step"]


def check(run: Run, min_factor: float = MIN_FACTOR) -> pd.DataFrame:
    """Per emulated episode of the run (and one row per worker with false alarms): what
    was detected, the error in its step (jumps) and factor, the detection delay (steps
    after the jump, or after a drift reached `min_factor`, until the detector run on the
    steps recorded so far reports it) and the detections that match no episode."""
    manifest, steps, warmup = run.manifest, run.steps, run.warmup_steps
    series = worker_series(steps, warmup)
    if not series:
        return pd.DataFrame(columns=CHECK_COLUMNS)
    first = min(int(s.steps[0]) for s in series.values())
    last = max(int(s.steps[-1]) for s in series.values())
    truths = scheduled_episodes(manifest, first, last, min_factor)
    found = detect(steps, warmup, min_factor)
    rows, used = [], set()
    for truth in truths:
        hits = [f for f in found.itertuples() if _matches(f, truth)]
        used |= {h.Index for h in hits}
        hit = hits[0] if hits else None
        rows.append({
            "rank": truth["rank"], "truth": describe(_Row(truth)),
            "detected": describe(hit) if hit else "missed",
            "step_error": hit.step - truth["step"] if hit and truth["kind"] == "jump"
            else math.nan,
            "factor_error": hit.factor / truth["factor"] - 1 if hit else math.nan,
            "delay_steps": _delay(series.get(truth["rank"]), truth, min_factor) if hit
            else math.nan,
            "false_alarms": 0})
    for rank, extra in found[~found.index.isin(used)].groupby("rank"):
        rows.append({"rank": rank, "truth": "none",
                     "detected": "; ".join(describe(r) for r in extra.itertuples()),
                     "step_error": math.nan, "factor_error": math.nan,
                     "delay_steps": math.nan, "false_alarms": len(extra)})
    out = pd.DataFrame(rows, columns=CHECK_COLUMNS[1:])
    out.insert(0, "run_id", manifest.get("run_id", "?"))
    return out


def _delay(series: Series | None, truth: dict[str, Any], min_factor: float) -> float:
    """Steps from the truth's onset until a prefix of the series first shows it."""
    if series is None:
        return math.nan
    start = int(np.searchsorted(series.steps, truth["onset"]))
    for end in range(start + 1, len(series.steps) + 1):
        prefix = Series(series.steps[:end], series.compute_ms[:end], series.slices[:end])
        rows = [_Row({"rank": truth["rank"], **e}) for e in episodes(prefix, min_factor)]
        if any(_matches(r, truth) for r in rows):
            return float(series.steps[end - 1] - truth["onset"])
    return math.nan


class _Row:
    """A dict read as a detect() row (attribute access), for describe() and _matches()."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.__dict__.update({"pm_steps": math.nan, "equal_slice": True, **values})


def suite_check(runs: Sequence[Run], min_factor: float = MIN_FACTOR
                ) -> tuple[pd.DataFrame, dict[str, float]]:
    """check() over a suite's runs, and its summary: episodes emulated and found, median
    absolute step error of the jumps, median and largest delay, median absolute factor
    error of the readings at equal slice, and false alarms: steady runs (no schedule) with
    any, and detections on scheduled runs that match no episode."""
    tables = [check(run, min_factor).assign(
        scheduled=scheduled(run.manifest)) for run in runs]
    table = pd.concat(tables, ignore_index=True) if tables else pd.DataFrame(
        columns=[*CHECK_COLUMNS, "scheduled"])
    emulated = table[table["truth"] != "none"]
    found = emulated[emulated["detected"] != "missed"]
    equal = found[~found["detected"].str.contains("per sample")]
    alarmed = table[table["false_alarms"] > 0]
    summary = {
        "episodes": len(emulated), "found": len(found),
        "step_error_median": float(found["step_error"].abs().median()),
        "delay_median": float(found["delay_steps"].median()),
        "delay_max": float(found["delay_steps"].max()),
        "factor_error_median": float(equal["factor_error"].abs().median()),
        "steady_runs": sum(not scheduled(run.manifest) for run in runs),
        "steady_runs_alarmed": alarmed.loc[~alarmed["scheduled"].astype(bool), "run_id"]
        .nunique(),
        "false_alarms_scheduled": int(alarmed.loc[alarmed["scheduled"].astype(bool),
                                                  "false_alarms"].sum()),
    }
    return table.drop(columns="scheduled"), summary


def scheduled(manifest: dict[str, Any]) -> bool:
    """Some worker's slowdown follows a schedule (`slowdown_at`): a run with a truth."""
    return any(w.get("slowdown_at") for w in manifest.get("run", {}).get("workers", []))
