"""How well does the offline replay predict a policy? For each scenario and repeat of a
`repartition` suite result, replay the recorded `equal` run under each adaptive policy and
compare with the real run of that policy (same scenario, same repeat).

    python benchmarks/replay_check.py results/repartition
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from hetbench.analysis.tables.repartition import replay_error
from hetbench.harness.partition.policies import Damping
from hetbench.harness.records.results import find_runs, load_run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("suite_dir", type=Path)
    args = parser.parse_args()
    runs = {}
    for run_dir in find_runs([args.suite_dir]):
        data = load_run(run_dir)
        runs[(data.manifest["run"]["name"], data.manifest["repeat"])] = data
    rows = []
    for (name, repeat), data in sorted(runs.items()):
        scenario, _, policy = name.partition(".")
        if policy not in ("proportional", "model") or (f"{scenario}.equal", repeat) not in runs:
            continue
        damping = Damping.of(data.manifest["run"]["partition"])
        recorded = runs[(f"{scenario}.equal", repeat)]
        error = replay_error(recorded.steps, data.steps, policy, damping,
                             warmup_steps=data.warmup_steps)
        rows.append({"scenario": scenario, "policy": policy, "repeat": repeat, **error})
    table = pd.DataFrame(rows)
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print("\nmedian |step time error| by policy:")
    print(table.assign(abs_error=table["step_ms_error"].abs())
          .groupby("policy")["abs_error"].median().to_string(float_format=lambda v: f"{v:.1%}"))


if __name__ == "__main__":
    main()
