"""What a repartition costs the input pipeline: for each run of a results folder, its
samples/s, how many times its slices moved, and the load phase of the steps right after a
move against the median step's (the slowest worker's load in each step, after warm-up).
examples/classifier/loader_moves.toml is the study it reads.

    python benchmarks/moved_load.py results/loader-moves
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from hetbench.analysis.view.metrics import run_summary
from hetbench.harness.records.results import load_run


def one(run_dir: Path) -> dict[str, object]:
    run = load_run(run_dir)
    steps = run.steps[run.steps["step"] >= run.warmup_steps]
    load_ms = steps.groupby("step")["load_ns"].max() / 1e6
    moved = [c["step"] for c in run.partition_history[1:] if c["step"] in load_ms.index]
    after = load_ms.loc[moved]
    return {
        "run": run.name, "repeat": run.repeat,
        "samples_per_s": round(run_summary(run.steps, run.warmup_steps)["samples_per_s"], 1),
        "moves": len(moved), "median_load_ms": round(float(load_ms.median()), 1),
        "moved_load_ms_median": round(float(after.median()), 1) if moved else None,
        "moved_load_ms_max": round(float(after.max()), 1) if moved else None,
        "last_sizes": run.partition_history[-1]["sizes"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="a suite's results folder")
    args = parser.parse_args()
    rows = [one(d) for d in sorted(args.folder.iterdir()) if (d / "manifest.json").is_file()]
    if not rows:
        raise SystemExit(f"{args.folder}: no run directories")
    print(pd.DataFrame(rows).sort_values(["run", "repeat"]).to_string(index=False))


if __name__ == "__main__":
    main()
