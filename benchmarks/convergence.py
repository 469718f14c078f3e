"""Adaptive policies against the best static split: for each results folder of
benchmarks/convergence.toml, every run's mean step (ms, each repeat), the best static
split's, each adaptive run's ratio to it (the mean over repeats of each, and the worst
repeat's) and the step at which its slices first came within 2 samples of where they
ended. Several folders (launches of the suite, for example two trees alternated) are
printed one after another.

    hetbench run benchmarks/convergence.toml --out results/conv
    python benchmarks/convergence.py results/conv/convergence
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pandas as pd

from hetbench.analysis.view.metrics import run_summary
from hetbench.harness.records.results import load_run


def settled_step(history: list[dict[str, Any]]) -> int:
    """The first step from which slow worker 0's slice stays within 2 samples of its last."""
    last = history[-1]["sizes"][0]
    settled = 0
    for change in history:
        if abs(change["sizes"][0] - last) > 2:
            settled = -1
        elif settled < 0:
            settled = int(change["step"])
    return max(settled, 0)


def one(run_dir: Path) -> dict[str, object]:
    run = load_run(run_dir)
    return {"run": run.name, "repeat": run.repeat,
            "mean_step_ms": run_summary(run.steps, run.warmup_steps)["mean_step_ms"],
            "settled_at": settled_step(run.partition_history),
            "ended": "/".join(map(str, run.partition_history[-1]["sizes"]))}


def table(folder: Path) -> pd.DataFrame:
    rows = [one(d) for d in sorted(folder.iterdir()) if (d / "manifest.json").is_file()]
    if not rows:
        raise SystemExit(f"{folder}: no run directories")
    frame = pd.DataFrame(rows)
    means = frame.groupby("run")["mean_step_ms"].mean()
    static = means[[name.startswith("static-") for name in means.index]]
    best = static.idxmin()
    out = frame.groupby("run").agg(mean_step_ms=("mean_step_ms", "mean"),
                                   worst_ms=("mean_step_ms", "max"),
                                   settled_at=("settled_at", "max"), ended=("ended", "last"))
    out["of_best_static"] = out["mean_step_ms"] / static[best]
    out["worst_of_best"] = out["worst_ms"] / static[best]
    out.attrs["best"] = best
    return out.round(3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", type=Path, nargs="+", help="the suite's results folders")
    for folder in parser.parse_args().folders:
        out = table(folder)
        print(f"{folder} (best static: {out.attrs['best']})")
        print(out.to_string())


if __name__ == "__main__":
    main()
