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

The gate's paired rounds (`hetbench ci`, analysis/tables/paired.py) on a user's job whose
compute is really slower (benchmarks/gate_job.py), beside other work:

    python benchmarks/calibrate_gate.py pool --job --rounds 30 --hogs two --out /tmp/job-two
    python benchmarks/calibrate_gate.py analyse /tmp/job-two --paired

`pool --job` launches A and A2 (gate_job:make) and C1.1 and C1.3 (its forward and backward
on 10% and 30% more samples), the suite `hetbench init` writes (two CPU workers, 60
steps); `--hogs two` keeps two CPU hogs spinning for the whole pool, `--hogs mixed` one
steady and one that spins 3 s and sleeps 3 s, `--hogs none` (the default) nothing.
`analyse --paired` cuts the pool into disjoint gates as `hetbench ci` runs them: from a
gate's first round, rounds added one at a time from the fifth on until a verdict or
`--max-rounds`; each gate's verdict, rounds and ratio of worker 1's CPU time per sample.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd

from hetbench.analysis.tables.compare import (
    Settings,
    compare_values,
    metric_values,
    overall_verdict,
)
from hetbench.analysis.tables.paired import MIN_ROUNDS, compare_paired, stop_after
from hetbench.harness.records.results import Run, find_runs, load_run
from hetbench.harness.run.launcher import run_suite
from hetbench.harness.spec.suite import SuiteSpec, load_suite, parse_suite

VARIANTS = {"A": 1.0, "A2": 1.0, "S1.2": 1.2, "S1.5": 1.5}
PAIRS = (("A", "A2", "false alarm"), ("A", "S1.2", "detection"), ("A", "S1.5", "detection"))
# --job: the user's job and its really slower versions (benchmarks/gate_job.py)
JOB_VARIANTS = {"A": "make", "A2": "make", "C1.1": "make_slower_10", "C1.3": "make_slower_30"}
JOB_PAIRS = (("A", "A2", "false alarm"), ("A", "C1.1", "detection"),
             ("A", "C1.3", "detection"))
HOGS = {"none": [], "two": ["steady", "steady"], "mixed": ["steady", "intermittent"]}
HOG_CODE = {"steady": "while True: pass",
            "intermittent": "import time\nwhile True:\n    t = time.monotonic() + 3\n"
                            "    while time.monotonic() < t: pass\n    time.sleep(3)"}


def job_suite(factory: str) -> SuiteSpec:
    """What `hetbench init gate_job:FACTORY` writes, cut to the gate's one run."""
    return parse_suite({
        "suite": {"name": "gate", "repeats": 1},
        "runs": [{"name": "pair", "workload": f"gate_job:{factory}",
                  "project": str(Path(__file__).resolve().parent), "steps": 60,
                  "warmup_steps": 10, "global_batch": 64,
                  "workers": [{"device": "cpu", "threads": 1},
                              {"device": "cpu", "threads": 1}]}]})


# --probe: the machine's speed beside the pool, a fixed torch kernel timed by its thread's
# CPU clock every 25 ms (monotonic ns, CPU ns a line: the steps' clock)
PROBE_CODE = """
import sys, time, torch
torch.set_num_threads(1)
x, w, a = torch.randn(4, 16, 16, 16), torch.randn(32, 16, 3, 3), torch.randn(128, 128)
with open(sys.argv[1], "w") as out:
    while True:
        c0 = time.thread_time_ns()
        torch.nn.functional.conv2d(x, w, padding=1)
        a @ a
        out.write(f"{time.monotonic_ns()} {time.thread_time_ns() - c0}\\n")
        out.flush()
        time.sleep(0.025)
"""


@contextlib.contextmanager
def beside(kind: str, probe: Path | None) -> Iterator[None]:
    """The other work beside the pool (CPU hogs) and the probe, started here and stopped
    on the way out."""
    procs = [subprocess.Popen([sys.executable, "-c", HOG_CODE[h]]) for h in HOGS[kind]]
    if probe is not None:
        probe.parent.mkdir(parents=True, exist_ok=True)
        procs.append(subprocess.Popen([sys.executable, "-c", PROBE_CODE, str(probe)]))
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(timeout=10)


def spreads(pool: Path) -> pd.DataFrame:
    """Per comparison, the spread (sd) of the rounds' log ratios of worker 1's CPU time per
    sample, by the statistic of a launch's steps: median, 10th percentile, minimum; and,
    where the pool has a probe, of the median divided by the probe's over the launch."""
    runs = pool_runs(pool)
    probe = pool / "probe.txt"
    ticks = pd.read_csv(probe, sep=" ", names=["t", "cpu"]) if probe.is_file() else None

    def launch(run: Run) -> dict[str, float]:
        steps = run.steps[run.steps["step"] >= run.warmup_steps]
        mine = steps[steps["rank"] == 1]
        cpu = (mine["compute_cpu_ns"] / mine["batch_size"]).to_numpy(float)
        out = {"median": float(np.median(cpu)), "p10": float(np.quantile(cpu, 0.1)),
               "min": float(cpu.min())}
        if ticks is not None:
            window = ticks[(ticks["t"] >= steps["begin_ns"].min() - 2e8)
                           & (ticks["t"] <= steps["end_ns"].max() + 2e8)]
            # a launch the probe did not see (none of its ticks in the window): NaN, left out
            out["median / probe"] = (out["median"] / float(window["cpu"].median())
                                     if len(window) else np.nan)
        return out

    rows = []
    for base_name, current_name, _ in JOB_PAIRS:
        if base_name not in runs or current_name not in runs:
            continue
        pairs = list(zip(runs[base_name], runs[current_name], strict=False))
        values = [(launch(b), launch(c)) for b, c in pairs]
        for statistic in values[0][0]:
            d = np.log([c[statistic] / b[statistic] for b, c in values])
            d = d[np.isfinite(d)]
            rows.append((base_name, current_name, statistic, len(d), float(np.mean(d)),
                         float(np.std(d, ddof=1))))
    return pd.DataFrame(rows, columns=["base", "current", "statistic", "rounds",
                                       "mean_log_ratio", "sd_log_ratio"])


def variant_suite(suite: SuiteSpec, slowdown: float) -> SuiteSpec:
    """The suite, one repeat, with the last worker of every run slowed down."""
    runs = []
    for run in suite.runs:
        workers = list(run.workers)
        workers[-1] = dataclasses.replace(workers[-1], slowdown=slowdown)
        runs.append(dataclasses.replace(run, workers=tuple(workers)))
    return dataclasses.replace(suite, repeats=1, runs=tuple(runs))


def build_pool(suite_name: str, rounds: int, out: Path, names: list[str],
               job: bool = False) -> None:
    suite = load_suite(suite_name)
    start = time.monotonic()
    for i in range(rounds):
        order = names[i % len(names):] + names[: i % len(names)]
        for name in order:
            variant = job_suite(JOB_VARIANTS[name]) if job else \
                variant_suite(suite, VARIANTS[name])
            results = run_suite(variant, out / name)
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


def pool_runs(pool: Path) -> dict[str, list[Run]]:
    """Each variant's runs in launch order."""
    return {name: sorted((load_run(d) for d in find_runs([pool / name])),
                         key=lambda r: str(r.manifest.get("start", r.run_dir.name)))
            for name in JOB_VARIANTS if (pool / name).is_dir()}


def analyse_paired(pool: Path, max_rounds: int) -> pd.DataFrame:
    """Disjoint gates over the pool's rounds, each run as `hetbench ci` runs one: rounds
    added one at a time, a verdict looked for from MIN_ROUNDS on."""
    runs = pool_runs(pool)
    rows = []
    for base_name, current_name, kind in JOB_PAIRS:
        if base_name not in runs or current_name not in runs:
            continue
        base, current = runs[base_name], runs[current_name]
        n = min(len(base), len(current))
        cache: dict[str, pd.DataFrame] = {}
        first = 0
        while first + MIN_ROUNDS <= n:
            for last in range(first + MIN_ROUNDS, min(n, first + max_rounds) + 1):
                comparison = compare_paired(base[first:last], current[first:last],
                                            cache=cache)
                if stop_after(comparison, max_rounds):
                    break
            table = comparison.table
            cpu = table[(table["metric"] == "cpu_per_sample_us") & (table["worker"] == 1)]
            step = table[table["metric"] == "step_time_ms"]
            rows.append((base_name, current_name, kind, first, last - first,
                         comparison.verdict,
                         float(cpu["ratio"].iloc[0]) if len(cpu) else np.nan,
                         float(step["ratio"].iloc[0]) if len(step) else np.nan,
                         comparison.delayed.get("current", np.nan)))
            first = last
    return pd.DataFrame(rows, columns=["base", "current", "kind", "first_round", "rounds",
                                       "verdict", "cpu_ratio_w1", "step_ratio",
                                       "delayed_share"])


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
    p.add_argument("--variants", default="",
                   help="which to launch, e.g. A,A2 for false alarms only (default: all)")
    p.add_argument("--job", action="store_true",
                   help="the user's job of benchmarks/gate_job.py and its slower versions")
    p.add_argument("--hogs", choices=sorted(HOGS), default="none",
                   help="other work beside the pool (default: none)")
    p.add_argument("--probe", action="store_true",
                   help="time a fixed kernel beside the pool (OUT/probe.txt): the machine's "
                        "speed, which analyse --paired divides out")
    a = sub.add_parser("analyse", help="verdict rates of the gate's statistics on the pool")
    a.add_argument("pool", type=Path)
    a.add_argument("--per-side", type=int, default=10)
    a.add_argument("--draws", type=int, default=200)
    a.add_argument("--alpha", type=float, default=0.002)
    a.add_argument("--threshold", type=float, default=0.10)
    a.add_argument("--metric-threshold", action="append", default=[], metavar="NAME=X")
    a.add_argument("--metrics", default="")
    a.add_argument("--paired", action="store_true",
                   help="the gate's paired rounds on a `pool --job` pool")
    a.add_argument("--max-rounds", type=int, default=20)
    args = parser.parse_args()
    if args.command == "pool":
        known = JOB_VARIANTS if args.job else VARIANTS
        names = [v for v in args.variants.split(",") if v] or list(known)
        unknown = sorted(set(names) - set(known))
        if unknown:
            parser.error(f"--variants: unknown {unknown} (allowed: {', '.join(known)})")
        with beside(args.hogs, args.out / "probe.txt" if args.probe else None):
            build_pool(args.suite, args.rounds, args.out, names, args.job)
        return
    if args.paired:
        outcomes = analyse_paired(args.pool, args.max_rounds)
        with pd.option_context("display.width", 200, "display.max_columns", 20):
            print(outcomes.to_string(index=False))
            groups = outcomes.groupby(["base", "current", "kind"])
            summary = groups["verdict"].value_counts().unstack(fill_value=0)
            summary["rounds_median"] = groups["rounds"].median()
            summary["rounds_max"] = groups["rounds"].max()
            summary["cpu_ratio_w1_median"] = groups["cpu_ratio_w1"].median().round(3)
            print(summary)
            print(spreads(args.pool).round(3).to_string(index=False))
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
