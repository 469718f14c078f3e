"""Does the advisor predict ps-sync and its layer placements (analysis/advice/advisor.py: the
busiest server's share of the parameters; fc-on-server's tail computed on a server, from
the model's layers, timed here as advise times them) from a data-parallel job (issue 29)?

From a `benchmarks/placement_check.toml` result (or any result with a data-parallel job
and ps-sync runs of the same workers): the devices and the exchange are fitted on the job,
as `hetbench advise --job dp` does, and each ps-sync run recorded beside it (its servers
and placement, read from its manifest) is set against the advisor's remedy of the same
servers and placement: samples/s, mean step and idle, means over its repeats, with the
measured spread; the job's own replay beside them.

    hetbench run benchmarks/placement_check.toml --repeats 4 --out results
    python benchmarks/placement_check.py results/placement-check
"""

from __future__ import annotations

from typing import Any

import pandas as pd
from pipeline_check import against, chosen_measures, completed_runs, job_arguments

from hetbench.analysis.advice.advice_fit import fitted_job, fitted_remedies
from hetbench.harness.cli.advise import layer_shape, tensor_sizes

REPEATS = 5  # simulated repeats per remedy


def placed(servers: int, placement: str | None) -> tuple[int, str]:
    """A ps-sync run's (servers, placement): one server holds everything."""
    return servers, (placement or "sharded") if servers > 1 else "-"


def predicted(runs: list[Any], job_name: str) -> pd.DataFrame:
    """Per run name: the job's replay and each ps-sync run's remedy predicted."""
    job = fitted_job(runs, job_name)
    fitted = fitted_remedies(job, layer_shape(job["recorded"]),
                             tensor_sizes(job["recorded"], job["fitted"][0].manifest))
    remedies = {placed(r.run.aggregator.servers, r.run.placement): r for r in fitted.remedies
                if r.run.aggregator.name == "ps-sync"}
    rows = [{"run": job_name, **chosen_measures(fitted.predict(fitted.remedies[0], REPEATS))}]
    for r in runs:
        run = r.manifest["run"]
        aggregator = run.get("aggregator") or {}
        if aggregator.get("name") != "ps-sync":
            continue
        where = placed(int(aggregator.get("servers", 1)), run.get("placement"))
        if (remedy := remedies.get(where)) is None:
            print(f"{run['name']}: no remedy of {where} proposed")
            continue
        rows.append({"run": run["name"], "remedy": remedy.name,
                     **chosen_measures(fitted.predict(remedy, REPEATS))})
    return pd.DataFrame(rows).drop_duplicates("run").set_index("run")


def main() -> None:
    args = job_arguments(__doc__, "a placement-check suite result")
    runs = completed_runs(args.suite_dir)
    table = against(runs, predicted(runs, args.job))
    others = table.drop(index=args.job)["samples_per_s_error"].abs()
    print(f"ps-sync and placements: samples/s error {others.median():.1%} median, "
          f"{others.max():.1%} largest over {len(others)} runs; replay of {args.job} "
          f"{table.loc[args.job, 'samples_per_s_error']:+.1%}")


if __name__ == "__main__":
    main()
