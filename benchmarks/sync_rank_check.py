"""Does the simulator rank the `sync` suite's schemes as they measure, by throughput and by
time to target (issue 29 part 1)?

From a `sync` suite result: the devices and the exchange are fitted on the `bsp` runs alone
(as `hetbench advise --job bsp` does), then each scheme the simulator models is predicted
from them: ps-sync, ps-async, ssp s = 1/2/4, backup b = 1, local SGD H = 4, and BSP itself.
Throughput is the simulation's samples into updates per second; time to target is BSP's
measured steps to target times the statistical model's multiplier (analysis/tables/statistical.py)
at the scheme's simulated staleness, dropped share and period, fitted *without* the scheme
predicted (leave one out; BSP's own is its measured steps), at the simulated time per global
batch. Measured: the suite's runs, means over repeats. ddp is left out: the simulator has
no model of an exchange overlapped with the backward.

    hetbench run sync --out results        # about 5 minutes on 2 cores
    python benchmarks/sync_rank_check.py results/sync
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy.stats import kendalltau

from hetbench.analysis.advice.advice_fit import fitted_job, fitted_remedies
from hetbench.analysis.advice.advice_report import repeat_range, resolved_tau
from hetbench.analysis.tables import statistical
from hetbench.analysis.tables.convergence import time_to_target
from hetbench.analysis.view.metrics import run_summary
from hetbench.harness.records.results import find_runs, load_run

# the sync suite's run name -> the advisor's remedy name
SCHEMES = {"bsp": "recorded", "ps-sync": "ps-sync", "ps-async": "ps-async", "ssp1": "ssp1",
           "ssp2": "ssp2", "ssp4": "ssp4", "backup1": "backup1", "local4": "local-sgd4"}
REPEATS = 5  # simulated repeats per scheme


def measured(runs: list[Any], metric: str, value: float) -> pd.DataFrame:
    """Per sync run name: samples/s and training seconds to the target, means over repeats
    (time to target over the repeats that reached it)."""
    rows = []
    for r in runs:
        name = r.manifest["run"]["name"]
        if name not in SCHEMES:
            continue
        summary = run_summary(r.steps, int(r.manifest["run"].get("warmup_steps", 0)))
        rows.append({"run": name, "samples_per_s": summary["samples_per_s"],
                     "time_to_target_s": time_to_target(r.evals, metric, value)[
                         "time_to_target_s"]})
    table = pd.DataFrame(rows)
    out = table.groupby("run").mean()  # time to target: over the repeats that reached it
    for column in ("samples_per_s", "time_to_target_s"):  # the ranges of the repeats
        out[f"{column}_low"], out[f"{column}_high"] = repeat_range(table[column],
                                                                  table["run"])
    return out


def predicted(runs: list[Any], metric: str, value: float) -> pd.DataFrame:
    """Per sync run name: simulated samples/s and time to target (module docstring)."""
    job = fitted_job(runs, "bsp")
    fitted = fitted_remedies(job)
    by_name = {r.name: r for r in fitted.remedies}
    steps = job["recorded"].steps - job["recorded"].warmup_steps
    points = statistical.scheme_points(runs, metric, value)
    bsp_steps = float(points.set_index("run").loc["bsp", "steps_to_target"])
    rows = []
    for run_name, remedy_name in SCHEMES.items():
        remedy = by_name[remedy_name]
        p = fitted.predict(remedy, REPEATS)
        multiplier = 1.0
        if not remedy.exact:  # fitted without this scheme's own runs
            model = statistical.fit(points[points["run"] != run_name])
            multiplier = np.nan if model is None else model.steps(
                p["mean_staleness"], p["dropped_fraction"], p["period"]) / model.bsp_steps
        rows.append({"run": run_name, "samples_per_s": p["samples_per_s"],
                     "time_to_target_s": p["train_seconds"] / steps * bsp_steps
                     * multiplier})
    return pd.DataFrame(rows).set_index("run")


def compare(real: pd.DataFrame, model: pd.DataFrame
            ) -> tuple[pd.DataFrame, dict[str, tuple[float, float, int]]]:
    """The two side by side with each error, and per measure Kendall's tau of the two
    rankings: over every scheme predicted, and over the pairs whose repeats do not overlap
    (with their number)."""
    table = real.join(model, lsuffix="", rsuffix="_predicted")
    taus = {}
    for column in ("samples_per_s", "time_to_target_s"):
        table[f"{column}_error"] = table[f"{column}_predicted"] / table[column] - 1
        both = table.dropna(subset=[column, f"{column}_predicted"])
        resolved, pairs = resolved_tau(both[f"{column}_predicted"], both[f"{column}_low"],
                                       both[f"{column}_high"])
        taus[column] = (float(kendalltau(both[column], both[f"{column}_predicted"]).statistic),
                        resolved, pairs)
    return table, taus


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("suite_dir", type=Path, help="a sync suite result")
    parser.add_argument("--target", type=float, default=0.97,
                        help="held-out accuracy to reach (default 0.97, the suite's)")
    args = parser.parse_args()
    runs = [r for r in (load_run(p) for p in find_runs([args.suite_dir]))
            if r.status == "completed"]
    table, taus = compare(measured(runs, "accuracy", args.target),
                          predicted(runs, "accuracy", args.target))
    shown = [c for c in table.columns if not c.endswith(("_low", "_high"))]
    print(table[shown].to_string(float_format=lambda v: f"{v:.3f}"))
    for column, (tau, resolved, pairs) in taus.items():
        errors = table[f"{column}_error"].abs()
        print(f"{column}: Kendall's tau {tau:.2f}, {resolved:.2f} over the {pairs} pairs "
              f"whose repeats do not overlap; error {errors.median():.1%} median, "
              f"{errors.max():.1%} largest")


if __name__ == "__main__":
    main()
