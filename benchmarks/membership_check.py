"""Is a job with a slow worker ever slower than its fast worker alone? (issue 16, membership)

From a run of the built-in `membership` suite:

    hetbench run membership --out results/membership
    python benchmarks/membership_check.py results/membership/membership

Per run, against the single-worker run of the same global batch and repeat (the runs of a
suite take turns within each repeat): the ratio of its time per sample (the inverse of
samples/s: wall time from the first step's begin to the last one's end, the pauses between
steps included, where the repartitioning happens) and of its mean step time, each the
median over repeats of the paired ratios with a percentile-bootstrap 95% interval; the
workers left out at the end of the run and how often the membership changed. The target:
a pair with `leave_out` is never slower than its fast worker alone by more than 5%;
`vs alone` says whether the interval of the time-per-sample ratio ends within that.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from hetbench.analysis.view.metrics import run_summary
from hetbench.harness.records.results import find_runs, load_run

TOLERANCE = 0.05


def membership_changes(history: list[dict]) -> tuple[int, list[int]]:
    """How often the set of workers left out changed, and who is out at the end."""
    outs = [tuple(r for r, n in enumerate(h["sizes"]) if n == 0) for h in history]
    changes = sum(1 for a, b in zip(outs, outs[1:], strict=False) if a != b)
    return changes, list(outs[-1]) if outs else []


def per_sample_and_step(summary: dict[str, float]) -> dict[str, float]:
    return {"us_per_sample": 1e6 / summary["samples_per_s"], "step_ms": summary["mean_step_ms"]}


def rows(folder: Path) -> pd.DataFrame:
    out = []
    for run_dir in find_runs([folder]):
        data = load_run(run_dir)
        if data.status != "completed":
            continue
        run = data.manifest["run"]
        changes, left_out = membership_changes(data.manifest.get("partition_history") or [])
        out.append({"run": run["name"], "repeat": data.manifest["repeat"],
                    "workers": len(run["workers"]), "global_batch": run["global_batch"],
                    **per_sample_and_step(run_summary(data.steps, data.warmup_steps)),
                    "changes": changes, "left_out_at_end": str(left_out)})
    return pd.DataFrame(out)


def paired_ratio(base: pd.DataFrame, runs: pd.DataFrame, metric: str,
                 rng: np.random.Generator, n_boot: int = 4000) -> tuple[float, float, float]:
    """The median over repeats of run / base of the same repeat (a suite's runs take turns
    within each repeat: a pair ran minutes apart, not the whole suite apart), and a
    percentile-bootstrap 95% interval of that median."""
    paired = runs.set_index("repeat")[metric] / base.set_index("repeat")[metric]
    ratios = paired.dropna().to_numpy()
    if len(ratios) < 2:
        return float(np.median(ratios)) if len(ratios) else float("nan"), np.nan, np.nan
    boot = np.median(ratios[rng.integers(0, len(ratios), (n_boot, len(ratios)))], axis=1)
    low, high = np.quantile(boot, [0.025, 0.975])
    return float(np.median(ratios)), float(low), float(high)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path)
    args = parser.parse_args(argv)
    table = rows(args.folder)
    alone = table[table["workers"] == 1] if len(table) else table
    if alone.empty:
        print(f"{args.folder}: needs completed runs of the membership suite (a single-worker "
              "run per global batch)", file=sys.stderr)
        return 2
    rng = np.random.default_rng(0)
    lines = []
    for (name, batch), group in table.groupby(["run", "global_batch"], sort=False):
        base = alone[alone["global_batch"] == batch]
        if base.empty or group["workers"].iloc[0] == 1:
            continue
        ratios = {}
        for metric in ("us_per_sample", "step_ms"):
            ratios[metric] = paired_ratio(base, group, metric, rng)
        ratio, low, high = ratios["us_per_sample"]
        verdict = ("within 5%" if high <= 1 + TOLERANCE else
                   "slower by more than 5%" if low > 1 + TOLERANCE else "not shown within 5%")
        step_ratio, step_low, step_high = ratios["step_ms"]
        lines.append({"run": name, "repeats": len(group),
                      "us/sample": float(group["us_per_sample"].median()),
                      "alone": float(base["us_per_sample"].median()),
                      "ratio": ratio, "ci95": f"{low:.3f}-{high:.3f}", "vs alone": verdict,
                      "step ms": float(group["step_ms"].median()),
                      "step ratio": step_ratio, "step ci95": f"{step_low:.3f}-{step_high:.3f}",
                      "changes": int(group["changes"].median()),
                      "left out at end": "; ".join(sorted(set(group["left_out_at_end"])))})
    print("after warm-up, medians over repeats; ratios to the fast worker alone at the same "
          "global batch in the same repeat (time per sample, and mean step time)")
    print(pd.DataFrame(lines).to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
