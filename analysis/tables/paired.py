"""The regression gate's statistics: rounds of one launch a side, compared pair by pair.

`hetbench ci` launches BASE and CURRENT in rounds, A B B A A B ..., so the two launches of a
round ran a minute apart on the same machine. A shared runner's load comes and goes over
minutes (identical code ran 148-475 ms a step from one launch to the next, issue 75); a
round's two launches see much the same of it, so their ratio cancels most of what
comparing the two groups as wholes (analysis/tables/compare.py) leaves as noise.

Unit: as in compare.py, one value per launch and metric (a launch's median: its steps are
autocorrelated and share its fate); here, one log ratio per round, d = log(current / base).
Pairs are made per run of the suite by start time (each base run with the current run
that started nearest it, each run in one pair). The estimate is the geometric mean of the
rounds' ratios, exp(mean d), with Student's interval of mean d at level 1 - alpha / m, m
the gate metrics' rows (Bonferroni: every gate metric's claim holds together at 1 - alpha); the
other rows get the same level.

Metrics have roles (PairedSettings):
- gate: what the host's other work does not move: each worker's CPU time per sample and
  its compute's wall time less its wait for a CPU (registry: cpu_per_sample_us,
  compute_busy_ms). A confirmed no-change needs every gate row `unchanged` (or improved).
- felt: what the user feels, step time and samples/s: reported with their verdicts, never
  gating. A busy machine moves them whatever the code did: beside two CPU hogs an A/A gate
  of 10 rounds put samples/s at -12.7% [-22.3%, -2.0%] (docs/measurements.md), so gating
  on them would fail unchanged code. A change that only the wall clock sees outside the
  compute (a slower exchange) is shown, not gated.
- shown: every other compared metric (the phases, the exchange): where a change is.
A run whose records lack the counters (a base from before they existed) is gated on its felt
metrics, with a warning.

Per row: `regressed` needs the interval above 1 and the estimate worse than the threshold;
`improved` the mirror; `unchanged` the interval inside [1 / (1 + t), 1 + t] (an
equivalence claim); else `inconclusive`, with the rounds its observed spread would need for
one claim or the other (`rounds_needed`). Overall: regressed if any gate row is; else
unchanged (improved) when every gate row is; else inconclusive, needing the most rounds
any inconclusive gate row needs.

Peeking: `hetbench ci` looks after every round from MIN_ROUNDS on and stops at the first
verdict. Looking often raises the chance that noise crosses a bound; the estimate must then
also be beyond the threshold, which the noise of these metrics (a few percent from launch
to launch: docs/measurements.md) reaches rarely.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np
import pandas as pd

from hetbench.analysis.tables import registry
from hetbench.analysis.tables.compare import (
    DIRECTIONS,
    LOWER,
    RUN_LEVEL,
    environment_warnings,
    metric_values,
    run_key,
    threshold_for,
    usable_runs,
)
from hetbench.harness.records.results import Run

GATE, FELT, SHOWN = "gate", "felt", "shown"
GATE_METRICS = ("cpu_per_sample_us", "compute_busy_ms")
FELT_METRICS = ("step_time_ms", "samples_per_s")
# where a change is: the phases, the exchange, the wait (the variability metrics, the oracle
# and the what-if are `hetbench compare`'s: each costs a second a run here)
SHOWN_METRICS = ("compute_ms", "phase_*", "comm_p50_ms", "comm_p95_ms", "idle_fraction")
MIN_PAIRS = 3  # Student's interval needs a spread; with 2 pairs it is too wide to claim
MIN_ROUNDS = 5  # hetbench ci looks for a verdict from this round on
MOST_ROUNDS_PLANNED = 200  # beyond: "more than 200"
COLUMNS = ["suite", "run", "worker", "metric", "role", "better", "pairs", "base_median",
           "current_median", "ratio", "ci_low", "ci_high", "threshold", "verdict", "note",
           "rounds_needed"]


@dataclass(frozen=True)
class PairedSettings:
    threshold: float = 0.05
    # (metric name or fnmatch pattern, threshold); the last matching entry wins
    metric_thresholds: tuple[tuple[str, float], ...] = ()
    alpha: float = 0.05
    gate: tuple[str, ...] = GATE_METRICS  # names or patterns
    felt: tuple[str, ...] = FELT_METRICS
    shown: tuple[str, ...] = SHOWN_METRICS

    def selects(self, metric: str) -> bool:
        return any(fnmatch.fnmatchcase(metric, p)
                   for p in (*self.gate, *self.felt, *self.shown))

    def threshold_for(self, metric: str) -> float:
        return threshold_for(metric, self.threshold, self.metric_thresholds)

    def role(self, metric: str) -> str:
        if any(fnmatch.fnmatchcase(metric, p) for p in self.gate):
            return GATE
        if any(fnmatch.fnmatchcase(metric, p) for p in self.felt):
            return FELT
        return SHOWN


@dataclass(frozen=True)
class PairedComparison:
    table: pd.DataFrame
    verdict: str
    rounds: int  # pairs of the run with the fewest
    rounds_needed: int | None  # inconclusive: the rounds the gate rows' spread would need
    delayed: dict[str, float]  # side -> share of its steps delayed by a wait for a CPU
    warnings: list[str] = field(default_factory=list)
    settings: PairedSettings = field(default_factory=PairedSettings)

    @property
    def exit_status(self) -> int:
        return {"unchanged": 0, "improved": 0, "regressed": 1, "inconclusive": 3}[self.verdict]

    def moved(self) -> list[str]:
        """Where: each row whose change its interval shows (beyond 1 either way and its
        estimate beyond the threshold), gate and felt rows first, largest first."""
        table = self.table
        if table.empty:
            return []
        limit = np.log1p(table["threshold"].astype(float))
        size = np.log(table["ratio"].astype(float))
        shown = table[((table["ci_low"] > 1) | (table["ci_high"] < 1)) & (size.abs() > limit)]
        order = shown.assign(rank=shown["role"].map({GATE: 0, FELT: 1, SHOWN: 2}),
                             size=-size[shown.index].abs()).sort_values(["rank", "size"])
        return [f"{_where(r)} {r.metric} {_percent(r.ratio)} "
                f"[{_percent(r.ci_low)}, {_percent(r.ci_high)}]"
                for r in order.itertuples(index=False)]


def _where(row: Any) -> str:
    return f"{row.run}" + ("" if row.worker == RUN_LEVEL else f" worker {row.worker}") + ":"


def _percent(ratio: float) -> str:
    return f"{(ratio - 1) * 100:+.1f}%" if math.isfinite(ratio) else "-"


def stop_after(comparison: PairedComparison, most: int) -> str | None:
    """Why a gate looking after each round can stop now (None: run another): a verdict, or
    a spread that would need more than twice `most` rounds (a plan from a handful of pairs
    is itself rough: within twice, the rounds left may still settle it)."""
    if comparison.verdict != "inconclusive":
        return f"{comparison.verdict} after {comparison.rounds} rounds"
    needed = comparison.rounds_needed
    if needed is None or needed > 2 * most:
        return (f"after {comparison.rounds} rounds the gate metrics' spread would need "
                f"{'more than ' + str(MOST_ROUNDS_PLANNED) if needed is None else needed} "
                f"rounds, far beyond {most}: inconclusive")
    return None


def pair_runs(base: Sequence[Run], current: Sequence[Run]
              ) -> tuple[list[tuple[Run, Run]], list[str]]:
    """Each base run with the current run of its round, per (suite, run name): the closest
    in start time first, each run in one pair at most (rounds alternate A B B A, so a
    launch's round partner is the other side's launch next to it, and a round whose launch
    failed on one side leaves its partner out instead of shifting every pair after it).
    Runs left without a partner are said so."""
    def by_key(runs: Sequence[Run]) -> dict[tuple[str, str], list[Run]]:
        out: dict[tuple[str, str], list[Run]] = {}
        for run in sorted(runs, key=_start):
            out.setdefault(run_key(run), []).append(run)
        return out

    b, c = by_key(base), by_key(current)
    pairs: list[tuple[Run, Run]] = []
    warnings: list[str] = []
    for key in sorted(set(b) & set(c)):
        gaps = sorted((abs(_start(x) - _start(y)), i, j)
                      for i, x in enumerate(b[key]) for j, y in enumerate(c[key]))
        matched: list[tuple[int, int]] = []
        for _, i, j in gaps:
            if all(i != m and j != n for m, n in matched):
                matched.append((i, j))
        matched.sort()
        pairs.extend((b[key][i], c[key][j]) for i, j in matched)
        left = len(b[key]) + len(c[key]) - 2 * len(matched)
        if left:
            warnings.append(f"{key[0]}/{key[1]}: {len(b[key])} BASE and {len(c[key])} "
                            f"CURRENT runs: {len(matched)} pairs by start time, {left} run(s) "
                            "without a partner left out")
    for key in sorted(set(b) ^ set(c)):
        side = "BASE" if key in b else "CURRENT"
        warnings.append(f"{key[0]}/{key[1]} is only in {side}: not compared")
    return pairs, warnings


def _start(run: Run) -> float:
    """When the run started, in seconds (its manifest's `start`; 0 where unreadable)."""
    try:
        return datetime.fromisoformat(str(run.manifest.get("start"))).timestamp()
    except ValueError:
        return 0.0


def interval(d: np.ndarray, level: float) -> tuple[float, float, float]:
    """(mean, half-width, sd) of the log ratios' mean: Student's interval at `level`."""
    from scipy.stats import t

    n = len(d)
    mean = float(np.mean(d)) if n else math.nan
    if n < 2:
        return mean, math.inf, math.nan
    sd = float(np.std(d, ddof=1))
    return mean, float(t.ppf(0.5 + level / 2, n - 1)) * sd / math.sqrt(n), sd


def rounds_needed(mean: float, sd: float, n: int, threshold: float, level: float) -> int | None:
    """Pairs at which an interval of this spread would make a claim: inside the threshold
    band (the estimate within it), or clear of 1 (beyond it). None: more than
    MOST_ROUNDS_PLANNED, or no claim can come (the estimate on the threshold itself)."""
    from scipy.stats import t

    if not (math.isfinite(mean) and math.isfinite(sd)):
        return None
    limit = math.log1p(threshold)
    margin = limit - abs(mean) if abs(mean) < limit else abs(mean)
    if margin <= 0:
        return None
    for k in range(max(n, MIN_PAIRS), MOST_ROUNDS_PLANNED + 1):
        if float(t.ppf(0.5 + level / 2, k - 1)) * sd / math.sqrt(k) < margin:
            return k
    return None


def row_verdict(mean: float, half: float, n: int, better: str, threshold: float
                ) -> tuple[str, str]:
    """(verdict, why) of one metric's log ratios' mean and interval half-width."""
    if n < MIN_PAIRS:
        return "inconclusive", f"fewer than {MIN_PAIRS} pairs"
    limit = math.log1p(threshold)
    worse = mean if better == LOWER else -mean
    if worse - half > 0 and worse > limit:
        return "regressed", ""
    if worse + half < 0 and worse < -limit:
        return "improved", ""
    if -limit <= mean - half and mean + half <= limit:
        return "unchanged", ""
    if abs(worse) > limit:
        return "inconclusive", (f"{'worse' if worse > 0 else 'better'} beyond the threshold, "
                                "the interval reaching 1")
    return "inconclusive", "the interval reaches beyond the threshold"


def _delayed(runs: Sequence[Run]) -> float:
    """The share of the runs' steps delayed by a wait for a CPU (registry: delayed_steps),
    over the runs that counted it."""
    metric = registry.BY_NAME["delayed_steps"]
    shares = [metric.value(registry.RunView(r.steps, r.manifest, r.warmup_steps))
              for r in runs]
    finite = [s for s in shares if math.isfinite(s)]
    return float(np.mean(finite)) if finite else math.nan


def compare_paired(base: Sequence[Run], current: Sequence[Run],
                   settings: PairedSettings | None = None,
                   cache: dict[str, pd.DataFrame] | None = None) -> PairedComparison:
    """`cache`: each run's metric values by run directory, kept between calls (hetbench ci
    compares after every round: each run's values computed once)."""
    settings = settings or PairedSettings()
    base_runs, warnings = usable_runs(base, "BASE")
    current_runs, more = usable_runs(current, "CURRENT")
    warnings += more + environment_warnings(base_runs, current_runs)
    pairs, more = pair_runs(base_runs, current_runs)
    warnings += more
    cache = {} if cache is None else cache
    for run in (run for pair in pairs for run in pair):
        if str(run.run_dir) not in cache:
            cache[str(run.run_dir)] = metric_values([run], settings.selects)
    values = {side: _by_run([cache[str(p[i].run_dir)] for p in pairs])
              for i, side in enumerate(("base", "current"))}
    table = _rows(pairs, values, settings, warnings)
    verdict, needed = _overall(table)
    rounds = int(table["pairs"].min()) if len(table) else 0
    if table.empty:
        warnings.append("no metric could be compared (no run in both groups)")
    delayed = {"base": _delayed(base_runs), "current": _delayed(current_runs)}
    return PairedComparison(table, verdict, rounds, needed, delayed, warnings, settings)


def _by_run(frames: list[pd.DataFrame]) -> dict[str, dict[tuple[int, str], float]]:
    """run id -> (worker, metric) -> value, from runs' metric_values."""
    out: dict[str, dict[tuple[int, str], float]] = {}
    for frame in frames:
        for row in frame.itertuples(index=False):
            out.setdefault(str(row.run_id), {})[(int(row.worker), str(row.metric))] = \
                float(row.value)
    return out


def _run_id(run: Run) -> str:
    return str(run.manifest.get("run_id", run.run_dir.name))


def _rows(pairs: list[tuple[Run, Run]], values: dict[str, Any], settings: PairedSettings,
          warnings: list[str]) -> pd.DataFrame:
    """One row per (suite, run, worker, metric) measured on both sides of a pair."""
    series: dict[tuple[str, str, int, str], list[tuple[float, float]]] = {}
    for b, c in pairs:
        bv, cv = values["base"].get(_run_id(b), {}), values["current"].get(_run_id(c), {})
        suite, name = run_key(b)
        for key in sorted(set(bv) & set(cv)):
            series.setdefault((suite, name, *key), []).append((bv[key], cv[key]))
    roles = {key: settings.role(key[3]) for key in series}
    for suite, name in sorted({key[:2] for key in series}):
        if not any(role == GATE for key, role in roles.items() if key[:2] == (suite, name)):
            warnings.append(f"{suite}/{name}: no gate metric on both sides (records without "
                            "the CPU counters: a base from before them?): gated on "
                            f"{', '.join(settings.felt)}")
            for key in roles:
                if key[:2] == (suite, name) and roles[key] == FELT:
                    roles[key] = GATE
    m = sum(role == GATE for role in roles.values())
    level = 1 - settings.alpha / max(1, m)
    rows = []
    for key in sorted(series, key=_order):
        both = np.array(series[key], dtype=float)
        base, current = both[:, 0], both[:, 1]
        d = _log_ratios(base, current)
        metric = key[3]
        better = DIRECTIONS.get(metric, LOWER)
        threshold = settings.threshold_for(metric)
        mean, half, sd = interval(d, level)
        verdict, note = row_verdict(mean, half, len(d), better, threshold)
        needed = (rounds_needed(mean, sd, len(d), threshold, level)
                  if verdict == "inconclusive" else None)
        rows.append({
            "suite": key[0], "run": key[1], "worker": key[2], "metric": metric,
            "role": roles[key], "better": better, "pairs": len(d),
            "base_median": float(np.median(base)),
            "current_median": float(np.median(current)),
            "ratio": math.exp(mean) if math.isfinite(mean) else math.nan,
            "ci_low": math.exp(mean - half) if math.isfinite(half) else math.nan,
            "ci_high": math.exp(mean + half) if math.isfinite(half) else math.nan,
            "threshold": threshold, "verdict": verdict, "note": note,
            "rounds_needed": needed,
        })
    return pd.DataFrame(rows, columns=COLUMNS)


def _log_ratios(base: np.ndarray, current: np.ndarray) -> np.ndarray:
    """log(current / base) of each pair; 0 where both are 0 (an absent phase stayed
    absent); a pair with one side 0 or below has no ratio and is left out."""
    both_zero = (base == 0) & (current == 0)
    positive = (base > 0) & (current > 0)
    ratios = np.divide(current, base, out=np.ones_like(base), where=positive)
    return np.log(ratios[positive | both_zero])


def _order(key: tuple[str, str, int, str]) -> tuple[Any, ...]:
    names = list(DIRECTIONS)
    return (key[0], key[1], key[2], names.index(key[3]) if key[3] in names else len(names),
            key[3])


def _overall(table: pd.DataFrame) -> tuple[str, int | None]:
    """(verdict, rounds needed where inconclusive) from the rows, as the module says."""
    gating = table[table["role"] == GATE]
    if (gating["verdict"] == "regressed").any():
        return "regressed", None
    if gating.empty:
        return "inconclusive", None
    open_rows = gating[gating["verdict"] == "inconclusive"]
    if open_rows.empty:
        return ("improved" if (gating["verdict"] == "improved").any() else "unchanged"), None
    needed = open_rows["rounds_needed"]
    return "inconclusive", (None if needed.isna().any() else int(needed.max()))

