"""Calibrate the regression gate: how often does it cry wolf, and how often does it catch a
real slowdown? (issue 6; the numbers are in docs/measurements.md and docs/howto/ci-gate.md).

    python benchmarks/calibrate_gate.py pool --rounds 50 --out /tmp/gate-pool
    python benchmarks/calibrate_gate.py pool --rounds 100 --variants A,A2 --out /tmp/aa-pool
    python benchmarks/calibrate_gate.py analyse /tmp/gate-pool --per-side 10

`pool` launches the gate's suite (built-in `ci`, or SUITE) round after round in four
variants: A and A2 (the same code and configuration: A/A pairs), S1.2 and S1.5 (worker 1's
compute stretched by 1.2 and 1.5, the injected regressions). The order within a round
rotates, so every variant takes every position equally often, as `hetbench ci`
interleaves its sides.

`analyse` then runs the gate's statistics (hetbench.analysis.tables.compare, the same code as
`hetbench compare`) on groups of --per-side runs: A vs A2 (a `regressed` verdict is a false alarm)
and A vs S1.2, A vs S1.5 (a `regressed` verdict is a detection). It reports disjoint
comparisons (consecutive blocks of rounds: independent, few) and --draws random draws of
runs without replacement within each side (many, overlapping, so not independent: a
sharper estimate of the rate, a less honest one of its spread).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from hetbench.analysis.tables.compare import (
    Settings,
    compare_values,
    metric_values,
    overall_verdict,
)
from hetbench.harness.records.results import find_runs, load_run
from hetbench.harness.run.launcher import run_suite
from hetbench.harness.spec.suite import SuiteSpec, load_suite

VARIANTS = {"A": 1.0, "A2": 1.0, "S1.2": 1.2, "S1.5": 1.5}
PAIRS = (("A", "A2", "false alarm"), ("A", "S1.2", "detection"), ("A", "S1.5", "detection"))


def variant_suite(suite: SuiteSpec, slowdown: float) -> SuiteSpec:
    """The suite, one repeat, with the last worker of every run slowed down."""
    runs = []
    for run in suite.runs:
        workers = list(run.workers)
        workers[-1] = dataclasses.replace(workers[-1], slowdown=slowdown)
        runs.append(dataclasses.replace(run, workers=tuple(workers)))
    return dataclasses.replace(suite, repeats=1, runs=tuple(runs))


def build_pool(suite_name: str, rounds: int, out: Path, names: list[str]) -> None:
    suite = load_suite(suite_name)
    start = time.monotonic()
    for i in range(rounds):
        order = names[i % len(names):] + names[: i % len(names)]
        for name in order:
            results = run_suite(variant_suite(suite, VARIANTS[name]), out / name)
            failed = [r for r in results if r.status != "completed"]
            if failed:
                sys.exit(f"round {i}: {name} {failed[0].status}: {failed[0].reason}")
        print(f"round {i + 1}/{rounds} done, {time.monotonic() - start:.0f} s", flush=True)


def pool_values(pool: Path) -> dict[str, pd.DataFrame]:
    """Per-run metric values of each variant, runs numbered in launch order."""
    values = {}
    for name in VARIANTS:
        if not (pool / name).is_dir():  # a pool of some variants only (pool --variants)
            continue
        runs = [load_run(d) for d in find_runs([pool / name])]
        runs.sort(key=lambda r: str(r.manifest.get("start", r.run_dir.name)))
        frame = metric_values(runs)
        order = {run_id: k for k, run_id in enumerate(frame["run_id"].unique())}
        frame["launch"] = frame["run_id"].map(order)
        values[name] = frame
    return values


def subset(frame: pd.DataFrame, launches: np.ndarray) -> pd.DataFrame:
    return frame[frame["launch"].isin(launches)]


def analyse(pool: Path, per_side: int, draws: int, settings: Settings) -> pd.DataFrame:
    values = pool_values(pool)
    rng = np.random.default_rng(1)
    rows = []
    for base_name, current_name, kind in PAIRS:
        if base_name not in values or current_name not in values:
            continue
        base, current = values[base_name], values[current_name]
        n = min(base["launch"].nunique(), current["launch"].nunique())
        for block in range(n // per_side):
            launches = np.arange(block * per_side, (block + 1) * per_side)
            table = compare_values(subset(base, launches), subset(current, launches), settings)
            rows.append((base_name, current_name, kind, "disjoint", overall_verdict(table),
                         _step_ratio(table)))
        for _ in range(draws):
            b = rng.choice(base["launch"].nunique(), per_side, replace=False)
            c = rng.choice(current["launch"].nunique(), per_side, replace=False)
            table = compare_values(subset(base, b), subset(current, c), settings)
            rows.append((base_name, current_name, kind, "drawn", overall_verdict(table),
                         _step_ratio(table)))
    return pd.DataFrame(rows, columns=["base", "current", "kind", "sampling", "verdict",
                                       "step_time_ratio"])


def _step_ratio(table: pd.DataFrame) -> float:
    row = table[table["metric"] == "step_time_ms"]
    return float(row["ratio"].iloc[0]) if len(row) else float("nan")


def summarise(outcomes: pd.DataFrame) -> pd.DataFrame:
    counts = (outcomes.groupby(["base", "current", "kind", "sampling"])["verdict"]
              .value_counts().unstack(fill_value=0))
    counts["n"] = counts.sum(axis=1)
    counts["regressed_rate"] = counts.get("regressed", 0) / counts["n"]
    ratio = outcomes.groupby(["base", "current", "kind", "sampling"])["step_time_ratio"].median()
    counts["median_step_time_ratio"] = ratio.round(3)
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pool", help="launch the variants, round after round")
    p.add_argument("--suite", default="ci")
    p.add_argument("--rounds", type=int, default=50)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--variants", default=",".join(VARIANTS),
                   help="which to launch, e.g. A,A2 for false alarms only (default: all)")
    a = sub.add_parser("analyse", help="verdict rates of the gate's statistics on the pool")
    a.add_argument("pool", type=Path)
    a.add_argument("--per-side", type=int, default=10)
    a.add_argument("--draws", type=int, default=200)
    a.add_argument("--alpha", type=float, default=0.002)
    a.add_argument("--threshold", type=float, default=0.10)
    a.add_argument("--metric-threshold", action="append", default=[], metavar="NAME=X")
    a.add_argument("--metrics", default="")
    args = parser.parse_args()
    if args.command == "pool":
        names = [v for v in args.variants.split(",") if v]
        unknown = sorted(set(names) - set(VARIANTS))
        if unknown:
            parser.error(f"--variants: unknown {unknown} (allowed: {', '.join(VARIANTS)})")
        build_pool(args.suite, args.rounds, args.out, names)
        return
    pairs = tuple((name, float(x)) for name, _, x in
                  (item.partition("=") for item in args.metric_threshold))
    metrics = tuple(m for m in args.metrics.split(",") if m)
    settings = Settings(threshold=args.threshold, metric_thresholds=pairs, alpha=args.alpha,
                        metrics=metrics, n_boot=200)
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(summarise(analyse(args.pool, args.per_side, args.draws, settings)))


if __name__ == "__main__":
    main()
