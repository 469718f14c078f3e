"""What torch.profiler costs on the steps it records, and that the steps it does not record
are untouched (issue 31, part 1), from the built-in `profile` suite: the same CPU pair with
and without a `profile` window, interleaved repeats apart.

    hetbench run profile --out results
    python benchmarks/profile_cost.py results/profile

Step time: a step's first begin to its last end over the workers (the summaries' mean step).
Per repeat, the profiled run against the unprofiled run of the same round:
- before: the steps from warm-up to the window (the two runs' own difference, the
  profiler not yet started);
- window: the median step time of the profiled steps against the same steps unprofiled (the
  first profiled step, which starts the profiler, apart);
- the step after: the one the profiled ranks stop the profiler before (left out too);
- after: every step after that, same steps against same steps; after/before: that ratio
  over the one before the window (1.00: the profiler left nothing behind);
- summary: the run summaries' mean step (which leave the window and the step after out).
Prints each ratio per repeat and their median; 1.00 is untouched.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hetbench.analysis.view.metrics import run_summary  # noqa: E402
from hetbench.harness.records.results import (  # noqa: E402
    LaunchChoice,
    choose_launches,
    finished_runs,
)


def step_times(steps: pd.DataFrame) -> pd.Series:
    """Each step's first begin to its last end (ms), by step."""
    grouped = steps[steps["batch_size"] > 0].groupby("step")
    return (grouped["end_ns"].max() - grouped["begin_ns"].min()) / 1e6


def ratios(profiled, unprofiled) -> dict[str, float]:  # type: ignore[no-untyped-def]
    window = profiled.manifest["run"]["profile"]
    first, last = int(window["first"]), int(window["last"])
    mine, theirs = step_times(profiled.steps), step_times(unprofiled.steps)

    def ratio(lo: int, hi: int) -> float:
        return float(mine.loc[lo:hi].median() / theirs.loc[lo:hi].median())

    warmup = profiled.warmup_steps
    end = int(profiled.steps["step"].max())
    before, after = ratio(warmup, first - 1), ratio(last + 2, end)
    return {
        "before": before,
        "first step": ratio(first, first),
        "window": ratio(first + 1, last),
        "step after": ratio(last + 1, last + 1),
        "after": after,
        "after/before": after / before,
        "summary": (run_summary(profiled.steps, warmup)["mean_step_ms"]
                    / run_summary(unprofiled.steps, unprofiled.warmup_steps)["mean_step_ms"]),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", type=Path, help="the profile suite's results folder")
    args = parser.parse_args()
    runs = choose_launches(finished_runs([args.results]), LaunchChoice(), str(args.results))
    by_repeat: dict[int, dict[str, object]] = {}
    for data in runs:
        if data.status == "completed":
            by_repeat.setdefault(int(data.manifest["repeat"]), {})[
                str(data.manifest["run"]["name"])] = data
    rows = {r: ratios(pair["profiled"], pair["unprofiled"]) for r, pair in sorted(
        by_repeat.items()) if {"profiled", "unprofiled"} <= set(pair)}
    if not rows:
        print(f"{args.results}: no repeat with both a completed 'profiled' and "
              "'unprofiled' run", file=sys.stderr)
        return 2
    names = list(next(iter(rows.values())))
    print("profiled / unprofiled step time (same steps, same round)")
    print(f"{'repeat':>7}" + "".join(f"{n:>13}" for n in names))
    for repeat, row in rows.items():
        print(f"{repeat:>7}" + "".join(f"{row[n]:>13.3f}" for n in names))
    print(f"{'median':>7}" + "".join(
        f"{statistics.median(r[n] for r in rows.values()):>13.3f}" for n in names))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
