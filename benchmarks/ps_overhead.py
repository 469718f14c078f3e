"""What the parameter server costs against the all-reduce, from a run of
benchmarks/sync_overhead.toml (run names `<aggregator>.w<workers>.<size>`):

    hetbench run benchmarks/sync_overhead.toml --out results/bench
    python benchmarks/ps_overhead.py results/bench/sync-overhead

Prints, per worker count and model size, the mean step time of each aggregator (mean over
repeats, after warm-up) and their ratio; then, for ps-sync, the median push and pull time
per step at each size and a least-squares line of push + pull against the megabytes of
parameters: its slope is the overhead per megabyte, its intercept the fixed cost of a step.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from hetbench.analysis.view.metrics import after_warmup, run_summary
from hetbench.harness.records.results import find_runs, load_run


def rows(folder: Path) -> pd.DataFrame:
    out = []
    for run_dir in find_runs([folder]):
        data = load_run(run_dir)
        if data.status != "completed":
            continue
        aggregator, workers, size = data.manifest["run"]["name"].split(".")
        steps = after_warmup(data.steps, data.warmup_steps)
        parameters = data.manifest["workers"][0]["parameters"]
        out.append({"aggregator": aggregator, "workers": int(workers[1:]), "size": size,
                    "megabytes": parameters * 4 / 1e6, "repeat": data.manifest["repeat"],
                    "step_ms": run_summary(data.steps, data.warmup_steps)["mean_step_ms"],
                    "push_ms": steps["push_ns"].median() / 1e6,
                    "pull_ms": steps["pull_ns"].median() / 1e6,
                    "wait_ms": steps["wait_ns"].median() / 1e6})
    return pd.DataFrame(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path)
    args = parser.parse_args(argv)
    table = rows(args.folder)
    if table.empty:
        print(f"no completed runs in {args.folder}", file=sys.stderr)
        return 2
    means = table.groupby(["workers", "megabytes", "size", "aggregator"])["step_ms"].agg(
        ["mean", "std", "count"]).reset_index()
    wide = means.pivot_table(index=["workers", "megabytes", "size"], columns="aggregator",
                             values="mean").reset_index()
    wide["ratio"] = wide["ps-sync"] / wide["allreduce"]
    print("mean step time (ms), mean over repeats; ratio = ps-sync / all-reduce")
    print(wide.to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    ps = table[table["aggregator"] == "ps-sync"]
    parts = ps.groupby(["workers", "megabytes"])[["push_ms", "pull_ms", "wait_ms"]].median()
    print("\nps-sync, median per step (ms):")
    print(parts.reset_index().to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    for workers, part in ps.groupby("workers"):
        slope, intercept = np.polyfit(part["megabytes"], part["push_ms"] + part["pull_ms"], 1)
        print(f"{workers} workers: push + pull = {intercept:.2f} ms + {slope:.2f} ms per MB "
              f"of parameters")
    return 0


if __name__ == "__main__":
    sys.exit(main())
