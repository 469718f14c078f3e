"""Every metric hetbench reports per run, in one place: its name, which way is better,
whether it belongs to the run or to each worker, its unit, a heading and a definition for
tables and figures, and the one function that computes it from the run's records.

`hetbench.analysis.tables.runs` (the runs table behind report, figures and paper),
`hetbench.analysis.tables.compare` (and so the CI gate), `hetbench paper` and the report's
definitions all read this registry: a new metric is one entry here. Functions read a `RunView`,
which derives each shared table (summary, compute statistics, what-if, ...) once and only when a
metric asks for it, so that `compare --metric step_time_ms` does not pay for the what-if analysis.

`compared`: whether `compare` tests the metric. A ratio of medians needs values well away
from zero on both sides, which the costs (fractions that may be zero or negative),
staleness and dropped share (zero under synchronous schemes) and the shares (descriptive:
neither way is better) are not.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import pandas as pd

from hetbench.analysis.measures.costmodel import oracle, residual_cv
from hetbench.analysis.measures.stragglers import straggler_summary
from hetbench.analysis.measures.whatif import COSTS, costs, what_if
from hetbench.analysis.view.metrics import (
    after_warmup,
    complete_steps,
    heterogeneous_efficiency,
    instrumented,
    phase_stats,
    run_summary,
    with_derived,
)
from hetbench.harness.records.collector import PHASES

LOWER, HIGHER = "lower", "higher"
RUN, WORKER = "run", "worker"


class RunView:
    """One run's records as the metrics read them: steps after warm-up (complete steps
    only), and each derived table computed on first use."""

    def __init__(self, steps: pd.DataFrame, manifest: dict[str, Any] | None = None,
                 warmup_steps: int | None = None) -> None:
        self.records = steps
        self.manifest = manifest or {}
        self.run = self.manifest.get("run", {})
        self.warmup = int(self.run.get("warmup_steps", 0)) if warmup_steps is None \
            else warmup_steps

    @cached_property
    def steps(self) -> pd.DataFrame:
        return complete_steps(after_warmup(self.records, self.warmup))

    @cached_property
    def instrumented(self) -> bool:
        return instrumented(self.steps)

    @cached_property
    def world(self) -> int:
        return int(self.steps["rank"].nunique())

    @cached_property
    def summary(self) -> dict[str, float]:
        return run_summary(self.records, self.warmup)

    @cached_property
    def compute_stats(self) -> pd.DataFrame:
        """phase_stats' compute rows: per worker n, mean, cv, p50, p99_p50, ..."""
        stats = phase_stats(self.steps)
        return stats[stats["phase"] == "compute"]

    @cached_property
    def compute_ns(self) -> pd.core.groupby.SeriesGroupBy:
        return (self.steps["ready_ns"] - self.steps["begin_ns"]).groupby(self.steps["rank"])

    @cached_property
    def sliced(self) -> bool:
        """A data-parallel batch the oracle and the what-if can re-slice: a pipeline's
        stages do not share a batch that way (analysis/measures/pipeline.py reads those runs)."""
        return not self.run.get("pipeline")

    @cached_property
    def costs(self) -> dict[str, float]:
        if not self.sliced:
            return dict.fromkeys(COSTS, np.nan)
        return costs(what_if(self.steps, 0, self.manifest or None))

    @cached_property
    def comm_ms(self) -> pd.Series:
        """Communication after the last arrival (DESIGN.md comm = reduced - arrival), ms."""
        if self.steps.empty or not self.instrumented:
            return pd.Series(dtype=float)
        return with_derived(self.steps)["comm_ns"] / 1e6

    @cached_property
    def updates(self) -> pd.DataFrame:
        """The rows that became updates (a backup worker's dropped gradient did not)."""
        kept = after_warmup(self.records, self.warmup)
        if "dropped" in kept.columns:
            kept = kept[~kept["dropped"].to_numpy(dtype=bool)]
        return kept


PerWorker = Callable[[RunView], dict[int, float]]


@dataclass(frozen=True)
class Metric:
    name: str
    level: str  # RUN: one value per run; WORKER: one per worker
    better: str | None  # LOWER, HIGHER; None: descriptive
    heading: str  # short, for a table column or an axis
    definition: str
    value: Callable[[RunView], Any]  # RUN: float; WORKER: {rank: float}
    fmt: str = ".3g"
    compared: bool = True

    def __post_init__(self) -> None:
        if self.compared and self.better is None:
            raise ValueError(f"{self.name}: a compared metric needs a better direction")


def _max(series: pd.Series) -> float:
    return float(series.max()) if len(series) else np.nan


def _step_time_ms(v: RunView) -> float:
    if v.steps.empty:
        return np.nan
    grouped = v.steps.groupby("step")
    return float((grouped["end_ns"].max() - grouped["begin_ns"].min()).median() / 1e6)


def _idle_fraction(v: RunView) -> float:
    # with one worker nobody waits: no fraction to speak of (nor to compare)
    return v.summary["idle_fraction"] if v.world > 1 else np.nan


def _efficiency(v: RunView) -> float:
    standalone = pd.DataFrame(v.manifest.get("standalone") or [],
                              columns=["rank", "samples_per_s"])
    return heterogeneous_efficiency(v.summary["samples_per_s"], standalone)


def _oracle_efficiency(v: RunView) -> float:
    if not v.sliced or v.steps.empty:
        return np.nan
    return float(oracle(v.steps, v.manifest or None, 0)["oracle_efficiency"])


def _residual_cv_max(v: RunView) -> float:
    return _max(residual_cv(v.steps, v.manifest or None, 0)) if len(v.steps) else np.nan


def _top_straggler_share(v: RunView) -> float:
    return _max(straggler_summary(v.steps)["share_last"]) if len(v.steps) else np.nan


def _staleness_mean(v: RunView) -> float:
    """Over the updates whose staleness was measured (a native server reports none: -1)."""
    if "staleness" not in v.updates.columns:
        return np.nan
    measured = v.updates["staleness"][v.updates["staleness"] >= 0]
    return float(measured.mean()) if len(measured) else np.nan


def _dropped_share(v: RunView) -> float:
    records = v.records
    return float(records["dropped"].mean()) if "dropped" in records.columns and len(records) \
        else 0.0


def _per_worker(function: Callable[[RunView], pd.Series]) -> PerWorker:
    """A per-worker metric from instrumented runs (a run recorded with instrument = false
    has no phase timestamps)."""
    def per_rank(v: RunView) -> dict[int, float]:
        if v.steps.empty or not v.instrumented:
            return {}
        return {int(rank): float(x) for rank, x in function(v).items()}
    return per_rank


def _phase_median_ms(phase: str) -> PerWorker:
    column = f"{phase}_ns"

    def median(v: RunView) -> pd.Series:
        if column not in v.steps.columns:
            return pd.Series(dtype=float)
        return v.steps.groupby("rank")[column].median() / 1e6
    return _per_worker(median)


# A step whose compute waited for a CPU this long, of its wall time, was delayed by the
# host's other work (or the run's other processes): the gate counts them (analysis/tables/
# paired.py), and its metrics below are ones such a wait does not move.
DELAYED_WAIT_SHARE = 0.10


def _counted(v: RunView, column: str) -> pd.DataFrame:
    """The steps whose `column` was counted (-1: not read on that step, or not on this
    host) and that computed a slice."""
    steps = v.steps
    if column not in steps.columns:
        return steps.iloc[0:0]
    return steps[(steps[column] >= 0) & (steps["batch_size"] > 0)]


def _cpu_per_sample_us(v: RunView) -> pd.Series:
    counted = _counted(v, "compute_cpu_ns")
    return (counted["compute_cpu_ns"] / counted["batch_size"]).groupby(
        counted["rank"]).median() / 1e3


def _compute_busy_ms(v: RunView) -> pd.Series:
    counted = _counted(v, "compute_wait_ns")
    busy = counted["ready_ns"] - counted["begin_ns"] - counted["compute_wait_ns"]
    return busy.groupby(counted["rank"]).median() / 1e6


def _delayed_steps(v: RunView) -> float:
    counted = _counted(v, "compute_wait_ns")
    if counted.empty:
        return np.nan
    wall = counted["ready_ns"] - counted["begin_ns"]
    return float((counted["compute_wait_ns"] > DELAYED_WAIT_SHARE * wall).mean())


METRICS: tuple[Metric, ...] = (
    Metric("step_time_ms", RUN, LOWER, "step (ms, median)",
           "median over steps of the last worker's end minus the first worker's begin",
           _step_time_ms),
    Metric("mean_step_ms", RUN, LOWER, "step (ms)",
           "mean over steps of the last worker's end minus the first worker's begin (under "
           "an asynchronous scheme: wall time per global batch of samples applied)",
           lambda v: v.summary["mean_step_ms"]),
    Metric("samples_per_s", RUN, HIGHER, "samples/s",
           "samples that went into an update over the wall time from the first step's begin "
           "to the last step's end (a profiled window's time left out)",
           lambda v: v.summary["samples_per_s"], fmt=".0f"),
    Metric("idle_fraction", RUN, LOWER, "idle fraction",
           "the workers' idle time before the exchange (waiting for the last arrival, or "
           "the measured wait) over their busy time (begin to end)", _idle_fraction,
           fmt=".2f"),
    Metric("compute_share", RUN, None, "compute share",
           "the workers' compute time (begin to ready) over their busy time",
           lambda v: v.summary["compute_share"], fmt=".2f", compared=False),
    Metric("comm_share", RUN, None, "comm. share",
           "the workers' communication after the last arrival over their busy time",
           lambda v: v.summary["comm_share"], fmt=".2f", compared=False),
    Metric("efficiency", RUN, HIGHER, "het. efficiency",
           "samples/s over the sum of the workers' standalone samples/s (measured when the "
           "run sets `calibrate = true`)", _efficiency, fmt=".2f"),
    Metric("oracle_efficiency", RUN, HIGHER, "of the oracle",
           "the step time of the best static partition (fitted cost models, no "
           "variability) over the run's mean step time", _oracle_efficiency, fmt=".2f"),
    Metric("compute_cv_max", RUN, LOWER, "compute CV (max)",
           "the largest coefficient of variation of a worker's compute time over steps",
           lambda v: _max(v.compute_stats["cv"]), fmt=".2f"),
    Metric("residual_cv_max", RUN, LOWER, "residual CV (max)",
           "the largest coefficient of variation of a worker's compute time over its cost "
           "model (slice size, scheduled slowdown): variability alone", _residual_cv_max,
           fmt=".2f"),
    Metric("compute_p99_p50_max", RUN, LOWER, "compute p99/p50 (max)",
           "the largest ratio of a worker's 99th to 50th percentile compute time",
           lambda v: _max(v.compute_stats["p99_p50"]), fmt=".2f"),
    Metric("cost_of_variability", RUN, LOWER, "cost of variability",
           "the run's time over the what-if time without per-step variability, minus 1",
           lambda v: v.costs["cost_of_variability"], fmt=".1%", compared=False),
    Metric("cost_of_imbalance", RUN, LOWER, "cost of imbalance",
           "the what-if time without variability over that with a balanced partition, "
           "minus 1", lambda v: v.costs["cost_of_imbalance"], fmt=".1%", compared=False),
    Metric("cost_of_heterogeneity", RUN, LOWER, "cost of heterogeneity",
           "the what-if time without variability over that with every worker at the "
           "fastest worker's time per sample, minus 1",
           lambda v: v.costs["cost_of_heterogeneity"], fmt=".1%", compared=False),
    Metric("comm_p50_ms", RUN, LOWER, "comm. p50 (ms)",
           "median over workers and steps of the communication after the last arrival",
           lambda v: float(v.comm_ms.median()) if len(v.comm_ms) else np.nan),
    Metric("comm_p95_ms", RUN, LOWER, "comm. p95 (ms)",
           "95th percentile over workers and steps of the communication after the last "
           "arrival", lambda v: float(v.comm_ms.quantile(0.95)) if len(v.comm_ms) else np.nan),
    Metric("top_straggler_share", RUN, None, "top straggler share",
           "the largest share of steps in which one worker was ready last",
           _top_straggler_share, fmt=".2f", compared=False),
    Metric("staleness_mean", RUN, LOWER, "staleness (mean)",
           "mean over updates of the server's version minus the version the gradient was "
           "computed on", _staleness_mean, fmt=".2f", compared=False),
    Metric("dropped_share", RUN, LOWER, "dropped share",
           "the share of computed gradients dropped (backup workers)", _dropped_share,
           fmt=".2f", compared=False),
    Metric("delayed_steps", RUN, None, "delayed steps",
           "the share of the workers' steps whose compute waited for a CPU more than "
           f"{DELAYED_WAIT_SHARE:.0%} of its time (other work on the host, or the run's own "
           "processes, held the cores)", _delayed_steps, fmt=".2f", compared=False),
    Metric("compute_ms", WORKER, LOWER, "compute (ms)",
           "median over steps of the worker's begin to ready (every compute phase)",
           _per_worker(lambda v: v.compute_ns.median() / 1e6)),
    Metric("cpu_per_sample_us", WORKER, LOWER, "CPU/sample (us)",
           "median over steps of the main thread's CPU time from begin to ready per sample "
           "of the slice (a step's wait for a CPU, or a core shared with other work, does "
           "not add to it)", _per_worker(_cpu_per_sample_us)),
    Metric("compute_busy_ms", WORKER, LOWER, "compute less wait (ms)",
           "median over steps of the worker's begin to ready less the time its main thread "
           "waited on a run queue for a CPU in it (schedstat)", _per_worker(_compute_busy_ms)),
    Metric("compute_cv", WORKER, LOWER, "compute CV",
           "std / mean of the worker's compute time over steps",
           _per_worker(lambda v: v.compute_ns.std(ddof=1) / v.compute_ns.mean()), fmt=".2f"),
    *(Metric(f"phase_{p.value}_ms", WORKER, LOWER, f"{p.value} (ms)",
             f"median over steps of the worker's {p.value} phase", _phase_median_ms(p.value))
      for p in PHASES),
)
BY_NAME: dict[str, Metric] = {m.name: m for m in METRICS}
RUN_LEVEL_NAMES: tuple[str, ...] = tuple(m.name for m in METRICS if m.level == RUN)
COMPARED: dict[str, str] = {m.name: str(m.better) for m in METRICS if m.compared}


def run_values(view: RunView, selects: Callable[[str], bool] = lambda name: True
               ) -> dict[str, float]:
    """Every run-level metric `selects` keeps, by name."""
    return {m.name: float(m.value(view)) for m in METRICS
            if m.level == RUN and selects(m.name)}


def values(view: RunView, selects: Callable[[str], bool] = lambda name: True
           ) -> Iterator[tuple[int | None, str, float]]:
    """(rank, metric, value) of every metric `selects` keeps; rank None for the run's."""
    for metric in METRICS:
        if not selects(metric.name):
            continue
        if metric.level == RUN:
            yield None, metric.name, float(metric.value(view))
        else:
            for rank, value in sorted(metric.value(view).items()):
                yield rank, metric.name, value


def definitions(names: Iterable[str]) -> list[str]:
    """Markdown lines `- **name** (heading): definition` for the metrics named."""
    return [f"- `{m.name}` ({m.heading}): {m.definition}."
            for m in (BY_NAME[n] for n in names if n in BY_NAME)]
