"""Choi's strategy 1 against strategy 2, from a run of benchmarks/choi_strategies.toml (run
names `<aggregator>.<size>`; needs a GPU):

    hetbench run benchmarks/choi_strategies.toml --out results/bench
    python benchmarks/choi_strategies.py results/bench/choi-strategies

Prints, per model size, each strategy's mean step time and median communication time per
step (from the last worker's arrival to the sums being back, the analysis' `comm_ns`: the
exchange without the idle wait before it), mean over repeats after warm-up, and the ratio
strategy 2 / strategy 1 of each.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from hetbench.analysis.view.metrics import after_warmup, complete_steps, run_summary, with_derived
from hetbench.harness.records.results import find_runs, load_run

STRATEGIES = ("allreduce-host", "allreduce-device")


def rows(folder: Path) -> pd.DataFrame:
    out = []
    for run_dir in find_runs([folder]):
        data = load_run(run_dir)
        if data.status != "completed":
            continue
        aggregator, size = data.manifest["run"]["name"].split(".")
        steps = complete_steps(after_warmup(data.steps, data.warmup_steps))
        comm = with_derived(steps).groupby("step")["comm_ns"].max()
        parameters = data.manifest["workers"][0]["parameters"]
        out.append({"aggregator": aggregator, "size": size,
                    "megabytes": parameters * 4 / 1e6, "repeat": data.manifest["repeat"],
                    "step_ms": run_summary(data.steps, data.warmup_steps)["mean_step_ms"],
                    "comm_ms": comm.median() / 1e6})
    return pd.DataFrame(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path)
    args = parser.parse_args(argv)
    table = rows(args.folder)
    if table.empty or set(table["aggregator"]) != set(STRATEGIES):
        print(f"{args.folder}: needs completed runs of both {' and '.join(STRATEGIES)}",
              file=sys.stderr)
        return 2
    means = table.groupby(["megabytes", "size", "aggregator"])[["step_ms", "comm_ms"]] \
        .mean().unstack("aggregator")
    for metric in ("step_ms", "comm_ms"):
        means[(metric, "ratio")] = means[(metric, STRATEGIES[1])] / means[(metric, STRATEGIES[0])]
    print("mean over repeats (ms); ratio = allreduce-device / allreduce-host")
    print(means.reset_index().to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
