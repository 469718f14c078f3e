"""What-if: how long the run would have taken without variability, or without imbalance.

Each step is modelled as the latest worker's compute plus what follows it (communication,
update, skew): step_time = max_i compute[i] + rest. A scenario replaces compute[i] and
keeps `rest`, so only the effect of compute differences is measured.

- actual:               the recorded step times;
- no_variability:       every worker computes in its own median time (DESIGN.md what-if);
- balanced:             medians, and the batch split so all workers finish together
                        (per-sample cost taken as linear: median / slice size; with a
                        large fixed cost per step this overstates what repartitioning
                        can recover);
- fastest:              every worker at the fastest worker's per-sample rate.

cost of variability = actual / no_variability - 1; cost of the mean imbalance (what the
partition leaves on the table) = no_variability / balanced - 1; cost of heterogeneity (what
having slower workers costs at all: issue 3's "every worker at the fastest per-sample rate")
= no_variability / fastest - 1.
"""

from __future__ import annotations

import pandas as pd

from analysis.metrics import after_warmup, complete_steps, instrumented, with_derived

SCENARIOS = ("actual", "no_variability", "balanced", "fastest")
COSTS = ("cost_of_variability", "cost_of_imbalance", "cost_of_heterogeneity")


def what_if(steps: pd.DataFrame, warmup_steps: int = 0) -> pd.DataFrame:
    """Columns: scenario, total_s, slowdown (actual total / scenario total)."""
    steps = complete_steps(after_warmup(steps, warmup_steps))
    if steps.empty or not instrumented(steps):
        return pd.DataFrame(columns=["scenario", "total_s", "slowdown"])
    d = with_derived(steps)
    g = d.groupby("step")
    step_ns = g["end_ns"].max() - g["begin_ns"].min()
    rest = step_ns - g["compute_ns"].max()
    median = d.groupby("rank")["compute_ns"].transform("median")
    per_sample = median / d["batch_size"]
    samples = g["batch_size"].transform("sum")
    rate_sum = (d["batch_size"] / median).groupby(d["step"]).transform("sum")
    scenario_compute = {
        "no_variability": median,
        "balanced": samples / rate_sum,
        "fastest": d["batch_size"] * per_sample.min(),
    }
    totals = {"actual": float(step_ns.sum())}
    for name, compute in scenario_compute.items():
        totals[name] = float((compute.groupby(d["step"]).max() + rest).sum())
    out = pd.DataFrame({"scenario": list(SCENARIOS),
                        "total_s": [totals[s] / 1e9 for s in SCENARIOS]})
    out["slowdown"] = totals["actual"] / 1e9 / out["total_s"]
    return out


def costs(what: pd.DataFrame) -> dict[str, float]:
    """cost_of_variability, cost_of_imbalance and cost_of_heterogeneity as fractions of
    the shorter time (module docstring)."""
    if what.empty:
        return dict.fromkeys(COSTS, float("nan"))
    t = what.set_index("scenario")["total_s"]
    return {"cost_of_variability": float(t["actual"] / t["no_variability"] - 1),
            "cost_of_imbalance": float(t["no_variability"] / t["balanced"] - 1),
            "cost_of_heterogeneity": float(t["no_variability"] / t["fastest"] - 1)}
