"""Regression statistics: two groups of runs (BASE, CURRENT) -> one verdict per metric.

Unit of replication. Each run (one launch of the worker processes) gives ONE value per
metric: every metric of hetbench.analysis.tables.registry marked `compared` (its median and mean
step time, samples/s, idle fraction, efficiencies, the largest compute and residual CV, the
communication percentiles, and each worker's median compute time, compute CV and per-phase
medians). Steps are not the unit: consecutive steps
of a run are autocorrelated (caches, allocator state, a noisy neighbour that stays for
seconds) and all share the fate of their process (core placement, memory layout, the gloo
connection, the machine's load while it ran). Thousands of steps from two runs are still
two observations of "how fast does this code run when launched"; testing steps would turn
any difference between two launches into a confident, false verdict.

Statistics, per metric (matched by suite, run name and, for per-worker metrics, worker):
- effect: ratio of medians CURRENT / BASE, with a percentile bootstrap confidence interval
  (each group resampled with replacement, seeded numpy generator; descriptive only);
- significance: two-sided Mann-Whitney U test on the per-run values (exact distribution
  when there are no ties, else the normal approximation), Holm-corrected over every metric
  compared. Holm controls the family-wise error rate at alpha under any dependence between
  metrics (step time and samples/s are nearly reciprocal, so independence cannot be
  assumed) and is uniformly more powerful than Bonferroni, whose level alpha/m it applies
  to the smallest p-value first;
- verdict: `regressed` needs BOTH significance (Holm-adjusted p < alpha) AND a change in
  the bad direction beyond the metric's threshold (a factor 1 + t: ratio > 1 + t for a
  lower-is-better metric, ratio < 1 / (1 + t) for a higher-is-better one, so swapping BASE
  and CURRENT swaps `regressed` and `improved`). `improved` is the mirror image.
  `unchanged` is an equivalence claim: the bootstrap interval of the ratio lies inside
  the threshold band [1 / (1 + t), 1 + t] (a ratio near 1 with a wide interval shows
  nothing). `inconclusive`: not significant with the ratio beyond the threshold, an
  interval that reaches beyond the band, fewer than two values on a side, or too few
  repeats for significance to be reachable at all.

Minimum repeats. With n runs per side the smallest two-sided exact Mann-Whitney p-value is
2 / C(2n, n) (complete separation). Holm's first step compares it with alpha / m, so no
metric can ever be significant unless 2 / C(2n, n) < alpha / m; below that a comparison is
`inconclusive`, never `unchanged`. For alpha = 0.002: m = 1-3 metrics need 7 repeats per
side, m = 4-12 need 8, m = 13-48 need 9, m = 49-184 need 10 (`min_repeats`).
"""

from __future__ import annotations

import fnmatch
import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from hetbench.analysis.tables import registry
from hetbench.harness.records.results import Run, find_runs, load_run
from hetbench.harness.spec.errors import UsageError

LOWER, HIGHER = "lower", "higher"
RUN_LEVEL = -1  # `worker` of a metric that belongs to the whole run
VERDICTS = ("unchanged", "improved", "inconclusive", "regressed")  # worst last
EXIT_STATUS = {"unchanged": 0, "improved": 0, "regressed": 1, "inconclusive": 3}

# metric -> which direction is better: every metric of the registry that compare tests
DIRECTIONS: dict[str, str] = registry.COMPARED

REQUIRED_COLUMNS = ("rank", "step", "batch_size", "begin_ns", "ready_ns", "reduced_ns", "end_ns")
VALUE_COLUMNS = ["suite", "run", "repeat", "run_id", "worker", "metric", "value"]
RESULT_COLUMNS = ["suite", "run", "worker", "metric", "better", "n_base", "n_current",
                  "base_median", "current_median", "ratio", "ci_low", "ci_high", "p_value",
                  "p_adjusted", "threshold", "reachable", "verdict", "note"]


# -- one value per run ----------------------------------------------------------------------


def run_metrics(steps: pd.DataFrame, warmup_steps: int = 0,
                manifest: dict[str, Any] | None = None,
                selects: Callable[[str], bool] = lambda name: True) -> pd.DataFrame:
    """The per-run values of every compared metric of hetbench.analysis.tables.registry that
    `selects` keeps, from one run's steps (after warm-up, complete steps only) and its manifest
    (without one, the metrics that need it are absent). Columns: worker (RUN_LEVEL for
    run-wide metrics), metric, value.

    Metrics that do not apply are absent: idle fraction with one worker (nobody waits),
    per-worker metrics of a run recorded with instrument = false (no phase timestamps)."""
    view = registry.RunView(steps, manifest, warmup_steps)
    rows = [(RUN_LEVEL if rank is None else rank, metric, value)
            for rank, metric, value in registry.values(
                view, lambda name: name in DIRECTIONS and selects(name))]
    frame = pd.DataFrame(rows, columns=["worker", "metric", "value"])
    return frame[np.isfinite(frame["value"].astype(float))].reset_index(drop=True)


def run_key(run: Run) -> tuple[str, str]:
    return str(run.manifest.get("suite", {}).get("name", "")), str(
        run.manifest.get("run", {}).get("name", ""))


def metric_values(runs: Iterable[Run],
                  selects: Callable[[str], bool] = lambda name: True) -> pd.DataFrame:
    """Tidy per-run values of a group, of the metrics `selects` keeps. Columns:
    VALUE_COLUMNS."""
    parts = []
    for run in runs:
        missing = [c for c in REQUIRED_COLUMNS if c not in run.steps.columns]
        if missing:
            raise UsageError(str(run.run_dir), f"steps lack column(s) {', '.join(missing)}: "
                             "not a hetbench step table this version reads")
        values = run_metrics(run.steps, run.warmup_steps, run.manifest, selects)
        suite, name = run_key(run)
        values.insert(0, "run_id", str(run.manifest.get("run_id", run.run_dir.name)))
        values.insert(0, "repeat", int(run.manifest.get("repeat", 0)))
        values.insert(0, "run", name)
        values.insert(0, "suite", suite)
        parts.append(values)
    if not parts:
        return pd.DataFrame(columns=VALUE_COLUMNS)
    return pd.concat(parts, ignore_index=True)[VALUE_COLUMNS]


# -- reading groups -------------------------------------------------------------------------


def load_group(path: Path) -> list[Run]:
    """The runs at `path`: a run directory, a suite's folder or a results folder."""
    return [load_run(d) for d in find_runs([path])]


def usable_runs(runs: Sequence[Run], side: str) -> tuple[list[Run], list[str]]:
    """Completed runs, and a warning for each one left out (a failed run's steps describe a
    run that did not finish, so its speed is not comparable)."""
    kept, warnings = [], []
    for run in runs:
        if run.status == "completed":
            kept.append(run)
        else:
            warnings.append(f"{side}: {run.run_dir} left out (status {run.status})")
    return kept, warnings


# -- environment ----------------------------------------------------------------------------

ENVIRONMENT_KEYS = ("host", "cpu_model", "cpu_count", "memory_bytes", "python", "platform")
# Keys of the suite record that may differ between comparable groups.
SUITE_KEYS_IGNORED = ("repeats", "source")
# ... and of the run record: where a job's code was imported from (`hetbench ci` runs the
# base's from a worktree: the code is what is compared, not its folder)
RUN_KEYS_IGNORED = ("project",)


def environment_facts(run: Run) -> dict[str, str]:
    """Flat environment facts a result depends on: machine, Python, every library version,
    GPU names, backend. Values are strings so that groups can be compared as sets."""
    env = run.manifest.get("environment", {})
    facts = {key: str(env.get(key)) for key in ENVIRONMENT_KEYS if key in env}
    for name, version in sorted((env.get("libraries") or {}).items()):
        facts[f"library {name}"] = str(version)
    for worker in run.manifest.get("workers") or []:
        for name, version in sorted((worker.get("versions") or {}).items()):
            facts[f"worker library {name}"] = str(version)
    facts["gpus"] = ", ".join(str(g.get("name")) for g in env.get("gpus") or []) or "none"
    if "backend" in run.manifest:
        facts["backend"] = str(run.manifest["backend"])
    return facts


def environment_warnings(base: Sequence[Run], current: Sequence[Run]) -> list[str]:
    """One line per environment fact or run configuration that differs between the groups
    (or within one: a group mixing two machines is not one condition)."""
    warnings = []
    base_facts = [environment_facts(r) for r in base]
    current_facts = [environment_facts(r) for r in current]
    keys = sorted({k for facts in base_facts + current_facts for k in facts})
    for key in keys:
        b = sorted({f.get(key, "not recorded") for f in base_facts})
        c = sorted({f.get(key, "not recorded") for f in current_facts})
        if b != c or len(b) > 1:
            warnings.append(f"environment differs: {key}: BASE {' | '.join(b)}; "
                            f"CURRENT {' | '.join(c)}")
    warnings.extend(_config_warnings(base, current))
    return warnings


def _config_warnings(base: Sequence[Run], current: Sequence[Run]) -> list[str]:
    def configs(runs: Sequence[Run]) -> dict[tuple[str, str], set[str]]:
        out: dict[tuple[str, str], set[str]] = {}
        for run in runs:
            suite = {k: v for k, v in (run.manifest.get("suite") or {}).items()
                     if k not in SUITE_KEYS_IGNORED}
            spec = {k: _unset_dropped(v) for k, v in (run.manifest.get("run") or {}).items()
                    if k not in RUN_KEYS_IGNORED}
            text = json.dumps({"suite": suite, "run": spec}, sort_keys=True, default=str)
            out.setdefault(run_key(run), set()).add(text)
        return out

    warnings = []
    b, c = configs(base), configs(current)
    for key in sorted(set(b) & set(c)):
        if b[key] != c[key] or len(b[key]) > 1:
            differ, partial = _differing_fields([json.loads(t) for t in b[key] | c[key]])
            name = f"{key[0]}/{key[1]}"
            if differ:
                warnings.append(f"configuration differs for {name}: {', '.join(differ)}")
            if partial:
                warnings.append(f"configuration fields recorded by only some runs of {name} "
                                f"(another hetbench version?): {', '.join(partial)}")
    for key in sorted(set(b) - set(c)):
        warnings.append(f"{key[0]}/{key[1]} is only in BASE: not compared")
    for key in sorted(set(c) - set(b)):
        warnings.append(f"{key[0]}/{key[1]} is only in CURRENT: not compared")
    return warnings


def _unset_dropped(value: Any) -> Any:
    """A run field's value without the unset (None) fields inside it: a nested field a later
    hetbench added (a worker's `loader_workers`) is unset in the runs written before it, not
    a change of configuration. (A top-level field unset on one side is still named.)"""
    if isinstance(value, dict):
        return {k: _unset_dropped(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_unset_dropped(v) for v in value]
    return value


def _differing_fields(configs: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """Dotted names of the top-level suite/run fields whose values differ among the configs
    that record them, and of those that some configs do not record at all (a run written
    by an older hetbench lacks fields added since)."""
    differ, partial = [], []
    for section in ("suite", "run"):
        tables = [c.get(section) or {} for c in configs]
        for key in sorted({k for t in tables for k in t}):
            present = [t for t in tables if key in t]
            if len({json.dumps(t[key], sort_keys=True) for t in present}) > 1:
                differ.append(f"{section}.{key}")
            if len(present) < len(tables):
                partial.append(f"{section}.{key}")
    return differ, partial


# -- statistics -----------------------------------------------------------------------------


def min_pvalue(n_base: int, n_current: int) -> float:
    """Smallest two-sided exact Mann-Whitney U p-value for these sample sizes."""
    if n_base < 1 or n_current < 1:
        return 1.0
    return min(1.0, 2.0 / math.comb(n_base + n_current, n_base))


def min_repeats(alpha: float, n_metrics: int) -> int:
    """Fewest runs per side (equal sides) for which a Holm-corrected family of n_metrics
    tests at level alpha can reject at all: 2 / C(2n, n) < alpha / n_metrics."""
    level = alpha / max(1, n_metrics)
    n = 1
    while min_pvalue(n, n) >= level:
        n += 1
    return n


def holm(pvalues: Sequence[float]) -> np.ndarray:
    """Holm step-down adjusted p-values (monotone, capped at 1); NaN counts as 1."""
    p = np.nan_to_num(np.asarray(pvalues, dtype=float), nan=1.0)
    m = len(p)
    if m == 0:
        return p
    order = np.argsort(p, kind="stable")
    scaled = (m - np.arange(m)) * p[order]
    adjusted = np.minimum(1.0, np.maximum.accumulate(scaled))
    out = np.empty(m)
    out[order] = adjusted
    return out


def mann_whitney_p(base: np.ndarray, current: np.ndarray) -> float:
    """Two-sided Mann-Whitney U p-value: exact without ties (small samples are the rule
    here and the normal approximation is poor in the far tail), asymptotic with ties."""
    from scipy.stats import mannwhitneyu

    if len(base) < 1 or len(current) < 1:
        return 1.0
    pooled = np.concatenate([base, current])
    if np.ptp(pooled) == 0:
        return 1.0
    ties = len(np.unique(pooled)) < len(pooled)
    method = "asymptotic" if ties or max(len(base), len(current)) > 100 else "exact"
    p = float(mannwhitneyu(current, base, alternative="two-sided", method=method).pvalue)
    return 1.0 if math.isnan(p) else p


def ratio(current: float, base: float) -> float:
    """current / base, with 0 / 0 = 1 (an absent phase stayed absent)."""
    if base == 0:
        return 1.0 if current == 0 else math.inf
    return current / base


def bootstrap_ratio_ci(base: np.ndarray, current: np.ndarray, rng: np.random.Generator,
                       n_boot: int = 4000, level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of median(current) / median(base), each group
    resampled with replacement independently."""
    if len(base) < 2 or len(current) < 2:
        return math.nan, math.nan
    b = np.median(base[rng.integers(0, len(base), (n_boot, len(base)))], axis=1)
    c = np.median(current[rng.integers(0, len(current), (n_boot, len(current)))], axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = np.where(b == 0, np.where(c == 0, 1.0, np.inf), c / np.where(b == 0, 1, b))
    tail = (1 - level) / 2
    low, high = np.quantile(ratios, [tail, 1 - tail])
    return float(low), float(high)


@dataclass(frozen=True)
class Settings:
    threshold: float = 0.10
    # (metric name or fnmatch pattern, threshold); the last matching entry wins
    metric_thresholds: tuple[tuple[str, float], ...] = ()
    alpha: float = 0.002
    n_boot: int = 4000
    ci_level: float = 0.95
    seed: int = 0
    # metric names or patterns to compare; empty: all
    metrics: tuple[str, ...] = ()

    def threshold_for(self, metric: str) -> float:
        return threshold_for(metric, self.threshold, self.metric_thresholds)

    def selects(self, metric: str) -> bool:
        return not self.metrics or any(fnmatch.fnmatchcase(metric, p) for p in self.metrics)


def threshold_for(metric: str, default: float,
                  by_pattern: Sequence[tuple[str, float]]) -> float:
    """The metric's threshold: the last (name or fnmatch pattern, threshold) that matches
    it, else `default`."""
    value = default
    for pattern, threshold in by_pattern:
        if fnmatch.fnmatchcase(metric, pattern):
            value = threshold
    return value


def metric_verdict(r: float, better: str, threshold: float, significant: bool, reachable: bool,
                   enough: bool, interval: tuple[float, float] = (math.nan, math.nan)
                   ) -> tuple[str, str]:
    """(verdict, why) for one metric; see the module docstring. `interval`: the bootstrap
    interval of the ratio, which must lie inside the threshold band for `unchanged`."""
    if not enough:
        return "inconclusive", "fewer than 2 runs on a side"
    if not reachable:
        return "inconclusive", "too few repeats for significance"
    worse = r if better == LOWER else (1 / r if r != 0 else math.inf)
    limit = 1 + threshold
    direction = "regressed" if worse > limit else "improved" if worse < 1 / limit else ""
    if significant and direction:
        return direction, ""
    if direction:
        return "inconclusive", f"{'worse' if direction == 'regressed' else 'better'} " \
                               "beyond threshold, not significant"
    low, high = interval
    if not (1 / limit <= low and high <= limit):  # NaN fails too: no interval, no claim
        return "inconclusive", "the interval reaches beyond the threshold: no change " \
                               "within it is shown"
    return "unchanged", "significant, within threshold" if significant else ""


def compare_values(base: pd.DataFrame, current: pd.DataFrame,
                   settings: Settings | None = None) -> pd.DataFrame:
    """Per-metric comparison of two tables of per-run values (VALUE_COLUMNS).

    Returns one row per (suite, run, worker, metric) present in both, columns RESULT_COLUMNS:
    better (lower/higher), n_base/n_current (runs), base_median/current_median, ratio
    (CURRENT/BASE medians) and its bootstrap interval ci_low/ci_high, p_value (Mann-Whitney,
    two-sided), p_adjusted (Holm over all rows), threshold, reachable (significance possible
    with these repeats), verdict and note (why, for inconclusive and unchanged-but-shifted)."""
    settings = settings or Settings()
    keys = ["suite", "run", "worker", "metric"]
    base = base[base["metric"].map(settings.selects)]
    current = current[current["metric"].map(settings.selects)]
    b_groups = {k: g["value"].to_numpy(float) for k, g in base.groupby(keys, sort=True)}
    c_groups = {k: g["value"].to_numpy(float) for k, g in current.groupby(keys, sort=True)}
    common = sorted(set(b_groups) & set(c_groups), key=_row_order)
    rng = np.random.default_rng(settings.seed)
    rows = []
    for key in common:
        b, c = b_groups[key], c_groups[key]
        metric = str(key[3])
        low, high = bootstrap_ratio_ci(b, c, rng, settings.n_boot, settings.ci_level)
        rows.append({
            "suite": key[0], "run": key[1], "worker": int(key[2]), "metric": metric,
            "better": DIRECTIONS.get(metric, LOWER), "n_base": len(b), "n_current": len(c),
            "base_median": float(np.median(b)), "current_median": float(np.median(c)),
            "ratio": ratio(float(np.median(c)), float(np.median(b))),
            "ci_low": low, "ci_high": high, "p_value": mann_whitney_p(b, c),
            "threshold": settings.threshold_for(metric),
        })
    table = pd.DataFrame(rows, columns=[c for c in RESULT_COLUMNS
                                        if c not in ("p_adjusted", "reachable", "verdict",
                                                     "note")])
    m = len(table)
    table["p_adjusted"] = holm(table["p_value"].to_list()) if m else []
    table["reachable"] = [min_pvalue(nb, nc) * m < settings.alpha
                          for nb, nc in zip(table["n_base"], table["n_current"], strict=True)]
    outcomes = [metric_verdict(row.ratio, row.better, row.threshold,
                               row.p_adjusted < settings.alpha, row.reachable,
                               row.n_base >= 2 and row.n_current >= 2,
                               (row.ci_low, row.ci_high))
                for row in table.itertuples(index=False)]
    table["verdict"] = [v for v, _ in outcomes]
    table["note"] = [n for _, n in outcomes]
    return table[RESULT_COLUMNS]


def _row_order(key: tuple[Any, ...]) -> tuple[Any, ...]:
    """Run-level metrics first, in a fixed order, then workers' metrics."""
    order = list(DIRECTIONS)
    metric = str(key[3])
    return (key[0], key[1], int(key[2]),
            order.index(metric) if metric in order else len(order), metric)


def overall_verdict(table: pd.DataFrame) -> str:
    """The worst verdict of any metric: regressed > inconclusive > improved > unchanged.
    An empty comparison (nothing matched) is inconclusive."""
    if table.empty:
        return "inconclusive"
    return max(table["verdict"], key=VERDICTS.index)


@dataclass(frozen=True)
class Comparison:
    table: pd.DataFrame
    verdict: str
    warnings: list[str] = field(default_factory=list)
    settings: Settings = field(default_factory=Settings)
    min_repeats: int = 0
    repeats_base: int = 0
    repeats_current: int = 0

    @property
    def exit_status(self) -> int:
        return EXIT_STATUS[self.verdict]


def compare_runs(base: Sequence[Run], current: Sequence[Run],
                 settings: Settings | None = None) -> Comparison:
    """Everything `hetbench compare` reports: per-metric table, overall verdict, warnings
    (runs left out, unmatched runs, environment and configuration differences) and the
    minimum number of repeats per side at which the family's alpha is reachable."""
    settings = settings or Settings()
    base_runs, warnings = usable_runs(base, "BASE")
    current_runs, more = usable_runs(current, "CURRENT")
    warnings += more
    warnings += environment_warnings(base_runs, current_runs)
    base_values = metric_values(base_runs, settings.selects)
    current_values = metric_values(current_runs, settings.selects)
    table = compare_values(base_values, current_values, settings)
    if table.empty:
        warnings.append("no metric could be compared (no run name in both groups)")
    needed = min_repeats(settings.alpha, len(table))
    fewest = (int(min(table["n_base"].min(), table["n_current"].min()))
              if len(table) else 0)
    if len(table) and fewest < needed:
        warnings.append(f"{fewest} run(s) on the smaller side: at least {needed} per side "
                        f"are needed for p < {settings.alpha:g} over {len(table)} metrics "
                        "to be reachable, so no verdict can be significant")
    return Comparison(table, overall_verdict(table), warnings, settings, needed,
                      _repeats(table, "n_base"), _repeats(table, "n_current"))


def _repeats(table: pd.DataFrame, column: str) -> int:
    return int(table[column].min()) if len(table) else 0


def compare_paths(base: Path, current: Path, settings: Settings | None = None) -> Comparison:
    return compare_runs(load_group(base), load_group(current), settings)
