"""What `hetbench advise` fits before it ranks (harness/cli/advise.py): the job among the
recorded runs (and runs of the same workers under other partitions), its device classes,
exchange and host, the remedies it can run and those refused (analysis/advice/advisor.py), the
target and the statistical model of the steps to reach it (analysis/tables/statistical.py)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from hetbench.harness.records.results import Run
from hetbench.harness.spec.aggregators import recorded_name
from hetbench.harness.spec.errors import UsageError
from hetbench.harness.spec.suite import name_matches, run_from_dict


def ranked_remedies(job: dict[str, Any], target: dict[str, Any] | None,
                    model: dict[str, Any] | None, repeats: int, shape: Any = "no layer profile",
                    tensors: Any = None, refusal: Any = None
                    ) -> tuple[Any, list[Any], list[Any]]:
    """Every remedy the job can run predicted and ranked (hetbench.analysis.advice.advisor); the
    remedies, and those refused. `shape`: the model's layers
    (hetbench.analysis.models.pipeline_model.LayerShape) for the pipelines, or why there is none;
    `tensors`: the model's parameter tensors' sizes, for the placements (None: not known);
    `refusal`: why else a remedy cannot run, as advisor.remedies takes it."""
    from hetbench.analysis.advice import advisor

    fitted = fitted_remedies(job, shape, tensors, refusal)
    predictions = [fitted.predict(r, repeats) for r in fitted.remedies]
    ranked = advisor.rank(predictions, target["steps"] if target else None,
                          model["model"] if model else None)
    return ranked, fitted.remedies, fitted.refused


@dataclasses.dataclass(frozen=True)
class FittedRemedies:
    """The job's devices and exchange fitted, and the remedies it can run."""

    recorded: Any  # the job's RunSpec
    workers: list[Any]  # its device classes, in rank order
    comm: Any
    host: Any  # hetbench.analysis.advice.advisor.Host
    remedies: list[Any]
    refused: list[Any]
    shape: Any = None  # the model's layers, for the pipelines (else why there is none)

    def predict(self, remedy: Any, repeats: int) -> dict[str, Any]:
        from hetbench.analysis.advice import advisor

        batch = self.recorded.global_batch
        steps = self.recorded.steps - self.recorded.warmup_steps
        if remedy.pipeline is not None:
            return advisor.predict_pipeline(remedy, self.workers, self.host, self.comm,
                                            self.shape, steps, batch, repeats)
        return advisor.predict(remedy, advisor.remedy_workers(remedy, self.workers,
                                                              self.host, batch),
                               self.comm, steps, batch, repeats)


def fitted_remedies(job: dict[str, Any], shape: Any = "no layer profile", tensors: Any = None,
                    refusal: Any = None) -> FittedRemedies:
    """The job's device classes and exchange fitted on its runs, its host, and the
    remedies it can run (hetbench.analysis.advice.advisor.remedies; `shape`, `tensors` and
    `refusal` as ranked_remedies')."""
    from hetbench.analysis.advice import advisor
    from hetbench.analysis.models import deviceclass
    from hetbench.analysis.models.simulate import parse_scheme

    classes, names = deviceclass.fit_classes(job["fitted"])
    first = job["fitted"][0]
    by_rank = [classes[names[f"rank{w['rank']}"]]
               for w in sorted(first.workers, key=lambda w: int(w["rank"]))]
    text, sizes = deviceclass.recorded_scheme(first)
    found, refused = advisor.remedies(job["recorded"], parse_scheme(text), sizes,
                                      [c.name for c in by_rank], shape, tensors, refusal)
    return FittedRemedies(job["recorded"], by_rank, deviceclass.fit_comm(job["fitted"]),
                          recorded_host(first), found, refused, shape)


def fitted_job(loaded: Sequence[Run], job: str | None) -> dict[str, Any]:
    """The job: the runs named `job` (a glob, else a substring; default: the first run that
    can be fitted), those of them that can be fitted (an all-reduce scheme, completed,
    instrumented), and its RunSpec. The devices and the exchange are fitted on these alone;
    the other runs given serve the statistical model. UsageError naming why when none can
    be fitted, or when the runs are of more than one workload."""
    from hetbench.analysis.models import deviceclass

    workloads = {deviceclass.workload_name(run.manifest) for run in loaded}
    if len(workloads) > 1:
        raise UsageError("RESULTS", f"runs of more than one workload "
                         f"({', '.join(sorted(workloads))}): advise one job at a time")
    fitted, problems = [], []
    for run in loaded:
        problem = deviceclass.fit_problem(run)
        if not problem and run.spec.get("pipeline"):
            problem = "pipelined: advise fits data-parallel runs"
        if problem:
            problems.append((str(run.manifest["run"]["name"]), problem))
        else:
            fitted.append(run)
    if not fitted:
        raise UsageError("RESULTS", f"no run can be fitted ({'; '.join(grouped(problems))})")
    names = list(dict.fromkeys(run.name for run in fitted))
    chosen = [n for n in names if n == job] or [  # a name given whole is that job
        n for n in names if job is None or name_matches(n, job)]
    if not chosen:
        raise UsageError("--job", f"no run that can be fitted matches {job!r} (those that "
                         f"can: {', '.join(names)})")
    if len(chosen) > 1 and job is not None:
        raise UsageError("--job", f"{job!r} matches {len(chosen)} jobs ({', '.join(chosen)}): "
                         "name one")
    runs = [run for run in fitted if run.name == chosen[0]]
    # runs of the same workers and exchange under another partition: other slice sizes,
    # which tell a line's intercept from its slope (one slice size cannot)
    alike = [run for run in fitted
             if run.name != chosen[0] and same_workers(run.spec, runs[0].spec)]
    left_out = grouped(problems)
    for line in left_out:
        print(f"not fitted (the steps to target may use them): {line}")
    return {"fitted": runs + alike, "recorded": run_from_dict(runs[0].spec),
            "left_out": left_out, "job_runs": len(runs),
            "alike": sorted({run.name for run in alike})}


def same_workers(run: dict[str, Any], job: dict[str, Any]) -> bool:
    """The same workers (devices, threads, emulation) exchanging through the same
    aggregator: a run whose devices and exchange are the job's."""
    return run.get("workers") == job.get("workers") and recorded_name(run) == recorded_name(job)


def grouped(problems: list[tuple[str, str]]) -> list[str]:
    """'ssp1 (3 runs), ps-async: recorded under ...', one line per reason."""
    by_reason: dict[str, dict[str, int]] = {}
    for name, reason in problems:
        counts = by_reason.setdefault(reason, {})
        counts[name] = counts.get(name, 0) + 1
    return [", ".join(f"{n} ({c} runs)" if c > 1 else n for n, c in names.items()) +
            f": {reason}" for reason, names in by_reason.items()]


def steps_model(loaded: list[Any], meta: dict[str, Any], target: dict[str, Any]
                ) -> dict[str, Any] | None:
    """The statistical model (hetbench.analysis.tables.statistical) fitted on the given runs of the
    job (its workers, any scheme) that evaluated the target's metric, with each scheme's
    leave-one-out prediction; None when no run of BSP's gradient reached the target."""
    from hetbench.analysis.tables import statistical

    same = [r for r in loaded
            if r.status == "completed" and len(r.manifest["workers"]) == len(meta["workers"])
            and target["metric"] in r.evals.columns]
    points = statistical.scheme_points(same, target["metric"], target["value"])
    fitted = statistical.fit(points)
    if fitted is None:
        return None
    return {"model": fitted, "points": points, "validation": statistical.leave_one_out(points)}


def recorded_host(run: Run) -> Any:
    """The cores the recorded job's workers shared (its manifest's `load`), their threads
    on them and their typical slices (the median after warm-up)."""
    from hetbench.analysis.advice.advisor import Host
    from hetbench.analysis.view.metrics import after_warmup

    meta, steps = run.manifest, run.steps
    workers = sorted(meta["workers"], key=lambda w: int(w["rank"]))
    specs = meta["run"]["workers"]
    threads = tuple(int(specs[int(w["rank"])].get("threads", 1))
                    if str(specs[int(w["rank"])].get("device", "cpu")) == "cpu" else 0
                    for w in workers)
    slices = after_warmup(steps, run.warmup_steps).groupby(
        "rank")["batch_size"].median()
    return Host((meta.get("load") or {}).get("cores"), threads,
                tuple(int(slices[int(w["rank"])]) for w in workers))


def parse_target(text: str | None, recorded: Any, runs: list[Any]) -> dict[str, Any] | None:
    """The target (metric, value) and the steps the recorded job's runs took to reach it
    (their median), or None without a target."""
    import numpy as np

    from hetbench.analysis.tables.convergence import time_to_target

    if text is None:
        if recorded.target is None:
            return None
        metric, value = recorded.target.metric, recorded.target.value
    else:
        metric, _, number = text.rpartition("=")
        metric = metric or (recorded.target.metric if recorded.target else "accuracy")
        try:
            value = float(number)
        except ValueError:
            raise UsageError("--target", f"{text!r} is not [METRIC=]VALUE (e.g. 0.97 or "
                             "loss=0.2)") from None
        if not math.isfinite(value) or value < 0:
            raise UsageError("--target", f"{value} must be a finite value >= 0")
    evaluated = [r.evals for r in runs
                 if r.manifest["run"]["name"] == recorded.name and metric in r.evals.columns]
    if text is None and not any(metric in r.evals.columns for r in runs):
        return None  # the recorded target was never evaluated: ranked by the time of the work
    if not evaluated:
        raise UsageError("--target", f"the recorded runs of {recorded.name!r} never evaluated "
                         f"{metric!r} (held-out evaluations need eval_every)")
    reached = [time_to_target(e, metric, value)["steps_to_target"] for e in evaluated]
    reached = [s for s in reached if np.isfinite(s)]
    if not reached and text is None:
        print(f"no recorded run of {recorded.name!r} reached its target {metric} {value:g}: "
              "ranked by the time of the recorded work (--target sets another)")
        return None
    if not reached:
        best = max if metric != "loss" else min
        seen = best(float(best(e[metric])) for e in evaluated)
        raise UsageError("--target", f"no recorded run of {recorded.name!r} reached {metric} "
                         f"{value:g} (best {seen:.4g}): nothing to predict a time to target from")
    return {"metric": metric, "value": value, "steps": float(np.median(reached)),
            "runs": len(reached)}
