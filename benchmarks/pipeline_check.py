"""Does the advisor's pipeline model (analysis/models/pipeline_model.py) predict the pipelined runs
of the `pipeline` suite from its data-parallel job (issue 29)?

From a `pipeline` suite result: the devices and the exchange are fitted on the `dp` runs
and dp-adaptive's (the same workers under another partition), as `hetbench advise --job
dp` does; the model's layers are timed here, as advise times them (each one's share of the
time and its forward's share of that); and each pipelined run recorded beside them (its
virtual workers, schedule, micro-batches and wave bound, read from its manifest) is
predicted and set against its measurement: samples/s, mean step and idle, means over its
repeats; the data-parallel job's own replay beside them. The measured side's spread over
its repeats is shown too.

    hetbench run pipeline -k "dp" --repeats 2 --out results
    hetbench run pipeline -k "hetpipe-*" --repeats 2 --out results
    python benchmarks/pipeline_check.py results/pipeline
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from hetbench.analysis.advice import advisor
from hetbench.analysis.advice.advice_fit import fitted_job, fitted_remedies
from hetbench.analysis.models.pipeline_model import Pipeline
from hetbench.analysis.view.metrics import run_summary
from hetbench.harness.cli.advise import layer_shape
from hetbench.harness.records.results import find_runs, load_run

REPEATS = 5  # simulated repeats per run
MEASURES = ("samples_per_s", "mean_step_ms", "idle_fraction")


def measured(runs: list[Any]) -> pd.DataFrame:
    """Per run name: the measures, means and ranges over its repeats."""
    rows = []
    for r in runs:
        summary = run_summary(r.steps, int(r.manifest["run"].get("warmup_steps", 0)))
        rows.append({"run": r.manifest["run"]["name"], **{m: summary[m] for m in MEASURES}})
    table = pd.DataFrame(rows)
    out = table.groupby("run")[list(MEASURES)].mean()
    spread = table.groupby("run")["samples_per_s"].agg(["min", "max"])
    out["samples_per_s_spread"] = (spread["max"] - spread["min"]) / out["samples_per_s"]
    out["repeats"] = table.groupby("run").size()
    return out


def predicted(runs: list[Any], job_name: str) -> pd.DataFrame:
    """Per run name: the job's replay and each pipelined run's prediction."""
    job = fitted_job([r for r in runs if not
                      r.manifest["run"].get("pipeline")], job_name)
    shape = layer_shape(job["recorded"])
    fitted = fitted_remedies(job, shape)
    steps = job["recorded"].steps - job["recorded"].warmup_steps
    batch = job["recorded"].global_batch
    rows = [{"run": job_name, **chosen_measures(fitted.predict(fitted.remedies[0], REPEATS))}]
    pipelined = {r.manifest["run"]["name"]: r.manifest["run"]["pipeline"] for r in runs
                 if r.manifest["run"].get("pipeline")}
    for name, pipe in pipelined.items():
        plan = Pipeline(tuple(tuple(g) for g in pipe["virtual_workers"]),
                        int(pipe["micro_batches"]), int(pipe["wave_bound"]),
                        str(pipe["schedule"]))
        remedy = advisor.Remedy(name, name, "pipeline", fitted.remedies[0].scheme,
                                tuple(range(len(fitted.workers))), job["recorded"],
                                pipeline=plan)
        rows.append({"run": name, **chosen_measures(advisor.predict_pipeline(
            remedy, fitted.workers, fitted.host, fitted.comm, shape, steps, batch,
            REPEATS))})
    return pd.DataFrame(rows).set_index("run")


def chosen_measures(prediction: dict[str, Any]) -> dict[str, float]:
    return {m: prediction[m] for m in MEASURES}


def completed_runs(folder: Path) -> list[Any]:
    return [r for r in (load_run(p) for p in find_runs([folder])) if r.status == "completed"]


def job_arguments(description: str, result: str) -> argparse.Namespace:
    """A check's command line: the suite result and the data-parallel job in it."""
    parser = argparse.ArgumentParser(description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("suite_dir", type=Path, help=result)
    parser.add_argument("--job", default="dp", help="the data-parallel job (default dp)")
    return parser.parse_args()


def against(runs: list[Any], model: pd.DataFrame) -> pd.DataFrame:
    """The runs measured (means over repeats) beside the model's predictions, with each
    error; printed."""
    table = measured(runs).join(model, rsuffix="_predicted", how="inner")
    for m in ("samples_per_s", "mean_step_ms"):
        table[f"{m}_error"] = table[f"{m}_predicted"] / table[m] - 1
    print(table.to_string(float_format=lambda v: f"{v:.3f}"))
    return table


def main() -> None:
    args = job_arguments(__doc__, "a pipeline suite result")
    runs = completed_runs(args.suite_dir)
    table = against(runs, predicted(runs, args.job))
    others = table.drop(index=args.job)
    errors = others["samples_per_s_error"].abs()
    print(f"pipelines: samples/s error {errors.median():.1%} median, {errors.max():.1%} "
          f"largest over {len(others)} runs; replay of {args.job} "
          f"{table.loc[args.job, 'samples_per_s_error']:+.1%}")
    order = np.argsort(-others["samples_per_s"].to_numpy())
    predicted_order = np.argsort(-others["samples_per_s_predicted"].to_numpy())
    print("fastest measured first: " + ", ".join(others.index[order]) + "; predicted: "
          + ", ".join(others.index[predicted_order]))


if __name__ == "__main__":
    main()
