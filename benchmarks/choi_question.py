"""Choi's question from a run of benchmarks/choi_question.toml (run names
`<workload>.<setup>`; needs a GPU):

    hetbench run benchmarks/choi_question.toml --out results/bench
    python benchmarks/choi_question.py results/bench/choi-question

Prints, per workload and setup, the samples/s and mean step after warm-up (mean over
repeats), the ratio of samples/s to the GPU alone (above 1: the CPU workers pay for
themselves; below: CPU+GPU is slower, as Choi found), and the last step's slices. Then
Choi's per-batch table in numbers: each worker's compute time per batch (begin to
gradients ready) in the runs with two CPU workers, its mean, standard deviation and
coefficient of variation, and how often it was the straggler (ready last).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from hetbench.analysis.view.metrics import after_warmup, complete_steps, run_summary
from hetbench.harness.records.results import find_runs, load_run

ALONE = "gpu"


def load(folder: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One row per completed run (throughput) and one per worker of each run (per batch)."""
    runs, batches = [], []
    for run_dir in find_runs([folder]):
        data = load_run(run_dir)
        if data.status != "completed":
            continue
        workload, setup = data.manifest["run"]["name"].split(".", 1)
        steps = complete_steps(after_warmup(data.steps, data.warmup_steps))
        summary = run_summary(data.steps, data.warmup_steps)
        last = steps[steps["step"] == steps["step"].max()].sort_values("rank")
        runs.append({"workload": workload, "setup": setup,
                     "samples_per_s": summary["samples_per_s"],
                     "step_ms": summary["mean_step_ms"],
                     "slices": "/".join(str(b) for b in last["batch_size"])})
        compute_ms = (steps["ready_ns"] - steps["begin_ns"]) / 1e6
        straggler = steps.loc[steps.groupby("step")["ready_ns"].idxmax(), "rank"]
        devices = [w["device"] for w in data.manifest["workers"]]
        for rank, times in compute_ms.groupby(steps["rank"]):
            batches.append({"workload": workload, "setup": setup, "rank": rank,
                            "device": devices[rank],
                            "batch": int(steps.loc[times.index, "batch_size"].median()),
                            "mean_ms": times.mean(), "std_ms": times.std(),
                            "cv": times.std() / times.mean(),
                            "straggler": float((straggler == rank).mean())})
    return pd.DataFrame(runs), pd.DataFrame(batches)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path)
    args = parser.parse_args(argv)
    runs, batches = load(args.folder)
    if runs.empty or ALONE not in set(runs["setup"]):
        print(f"{args.folder}: needs completed runs, the GPU alone ('<workload>.{ALONE}') "
              "among them", file=sys.stderr)
        return 2
    table = runs.groupby(["workload", "setup"]).agg(
        samples_per_s=("samples_per_s", "mean"), step_ms=("step_ms", "mean"),
        slices=("slices", "last")).reset_index()
    alone = table[table["setup"] == ALONE].set_index("workload")["samples_per_s"]
    table["vs_gpu_alone"] = table["samples_per_s"] / table["workload"].map(alone)
    print("throughput after warm-up, mean over repeats; vs_gpu_alone = samples/s over the "
          "GPU alone's (below 1: slower than the GPU alone)")
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    two = batches[batches["setup"].str.startswith("gpu-2cpu")]
    if not two.empty:
        per_batch = two.groupby(["workload", "setup", "rank", "device"]).mean(
            numeric_only=True).reset_index()
        print("\nChoi's per-batch table: compute time per batch (ms, begin to gradients "
              "ready), mean over repeats; straggler = share of steps it was ready last")
        print(per_batch.to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
