"""`hetbench advise RESULTS [--target ...] [--top K] [--verify] --out DIR`: fit the devices of
a recorded job, predict every remedy it can run with the simulator (a pipeline from the
model's layers, timed here: layer_shape; a placement from its tensors: tensor_sizes), rank
them, and write advice.md (the ranking, a sentence on each of the top ones, what was
refused and why), advice.csv, figures/advice.png and advised.toml: a suite of the top K
remedies and the recorded job, ready for `hetbench run`. `--verify` runs that suite and
sets what was measured against what was predicted: the error, Kendall's tau of the two
rankings and the regret (the pick's measured time over the best measured).
analysis/advice/advisor.py holds the remedies and their predictions, analysis/advice/advice_fit.py
what is fitted before they are ranked, analysis/advice/advice_report.py what is written and
printed."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hetbench.harness.cli import arguments
from hetbench.harness.cli.simulate import load_runs
from hetbench.harness.run.jobcheck import CHECK_TIMEOUT_S, LayerProfiling, check_job, refuse_for_job
from hetbench.harness.spec.errors import UsageError
from hetbench.harness.spec.suite import load_suite
from hetbench.harness.spec.tables import run_table, suite_text
from hetbench.workloads import build_spec, get_workload
from hetbench.workloads.data import load_dataset
from hetbench.workloads.models import builder

SUITE = "advised"
MAX_TOP = 20
MAX_REPEATS = 50


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", nargs="+", type=Path,
                        help="recorded runs of one workload (run directories or folders of "
                        "them): the job's repeats, and runs of its other schemes")
    parser.add_argument("--target", metavar="[METRIC=]VALUE",
                        help="held-out value to reach (accuracy, token_accuracy or loss; "
                        "default: the recorded run's target): ranks by time to target")
    parser.add_argument("--top", type=int, default=3,
                        help="remedies in the advised suite, beside the recorded job "
                        "(default 3)")
    parser.add_argument("--verify", action="store_true",
                        help="run the advised suite and set measured against predicted")
    parser.add_argument("--repeats", type=int, default=5,
                        help="simulated repeats per remedy: the interval is their range "
                        "(default 5)")
    parser.add_argument("--suite-repeats", type=int, default=1,
                        help="repeats of each run of the advised suite (default 1)")
    parser.add_argument("--no-figures", action="store_true",
                        help="with --verify: draw no figures of the advised suite's runs "
                        "(hetbench run's --no-figures; advice's own figure is still drawn)")
    parser.add_argument("--steps", type=int,
                        help="steps of the advised runs (default: the recorded run's)")
    arguments.add_run_filter(parser, "read only the runs")
    parser.add_argument("--job", metavar="NAME",
                        help="the run (by name: a glob, else a substring) that is the job to "
                        "advise; its devices and exchange are fitted on its repeats, the other "
                        "runs given fit the steps to target of the schemes that change the "
                        "gradient (default: the first run that can be fitted)")
    parser.add_argument("--out", type=arguments.folder, required=True,
                        help="folder for advice.md, advice.csv, advised.toml and figures/; "
                        f"--verify's runs go to {SUITE}/ in it")


def run(args: argparse.Namespace) -> int:
    from hetbench.analysis.advice import advice_fit, advice_report
    from hetbench.harness.records.results import writable_folder

    arguments.check_bounds(args.top, "--top", 1, MAX_TOP)
    arguments.check_bounds(args.repeats, "--repeats", 1, MAX_REPEATS)
    arguments.check_bounds(args.suite_repeats, "--suite-repeats", 1, MAX_REPEATS)
    arguments.check_bounds(args.steps, "--steps", 2, 1_000_000)
    loaded = load_runs(args.results, args.runs)
    job = advice_fit.fitted_job(loaded, args.job)
    if args.steps is not None:
        if args.steps <= job["recorded"].warmup_steps:
            raise UsageError("--steps", f"{args.steps} must be above the recorded warm-up "
                             f"({job['recorded'].warmup_steps} steps)")
        job["recorded"] = dataclasses.replace(job["recorded"], steps=args.steps)
    target = advice_fit.parse_target(args.target, job["recorded"], loaded)
    model = advice_fit.steps_model(loaded, job["fitted"][0].manifest, target) if target else None
    recorded, manifest = job["recorded"], job["fitted"][0].manifest
    if recorded.is_imported and args.verify:
        raise UsageError("--verify", "the job was imported from its traces: hetbench cannot "
                         "run it or its remedies")
    made = job_now(recorded) if recorded.is_job else None
    ranked, found, refused = advice_fit.ranked_remedies(
        job, target, model, args.repeats, layer_shape(recorded, made),
        tensor_sizes(recorded, manifest), job_refusal(recorded, manifest, made))
    out = writable_folder(args.out, "--out")  # all input checked: now write
    chosen = _advised(ranked, args.top)
    by_name = {r.name: r for r in found}
    suite_path = out / f"{SUITE}.toml"
    if not recorded.is_imported:  # an imported job's remedies are predictions only
        _write_suite(suite_path, [by_name[n] for n in chosen], args, job["fitted"][0].manifest)
    print(advice_report.table(ranked, target))
    measured = verify(suite_path, out, target, args.no_figures) if args.verify else None
    if measured is not None:
        ranked = ranked.merge(measured, on="remedy", how="left")
    advice_report.write_advice(out, ranked, refused, job, target,
                               None if recorded.is_imported else SUITE, chosen,
                               args.repeats, args.top, model)
    if recorded.is_imported:
        print(f"\nadvice: {out / 'advice.md'} (an imported job: no suite, its remedies are "
              "predictions)")
    else:
        print(f"\nadvice: {out / 'advice.md'}; suite: {suite_path}"
              f"{'' if args.verify else f' (run it: hetbench run {suite_path} --out {out})'}")
    return 1 if args.verify and measured is None else 0


def data_and_model(run: Any) -> tuple[Any, Any]:
    """The recorded run's data set and its model's spec (hetbench.workloads.build_spec)."""
    data = load_dataset(run.dataset, run.workload, run.seed)
    return data, build_spec(run.workload, data.sample_shape, data.num_classes, run.size)


def tensor_sizes(run: Any, manifest: dict[str, Any]) -> tuple[int, ...] | None:
    """The model's parameter tensors' sizes in elements, in the order of the flat buffer
    the parameter servers cut (for the placements: hetbench.harness.partition.shards): a
    built-in workload's from its spec, a job's as its manifest recorded them (None where a
    run recorded before them)."""
    if run.is_imported:
        return None
    if run.is_job or run.is_loop:
        tensors = (manifest.get("job") or manifest.get("loop") or {}).get("tensors")
        return None if tensors is None else tuple(int(n) for n in tensors)
    return tuple(p.size for p in data_and_model(run)[1].params)


def job_refusal(run: Any, manifest: dict[str, Any], made: dict[str, Any] | str | None = None
                ) -> Callable[[Any], str] | None:
    """For a job, why the job check would refuse a remedy's run ('' where it would not),
    from what the job check says of the job now (`made`: job_now's), else what the recorded
    run's manifest says of it: what `hetbench run` of the advised suite checks."""
    if not run.is_job:
        return None
    described = made if isinstance(made, dict) else manifest.get("job") or {}

    def why(remedy: Any) -> str:
        try:
            refuse_for_job(remedy, described, "remedy.{}".format)
        except UsageError as exc:
            return str(exc).removeprefix("remedy.")
        return ""

    return why


PROFILE_PASSES = 5  # timed passes per layer (the median), after one to warm up


def job_now(run: Any) -> dict[str, Any] | str:
    """The recorded job made and checked now by the job check (a process of its own, as
    `hetbench run` makes it: the user's code never runs in this one), its layers timed
    (`layer_profile`); or why it could not be made."""
    if not Path(str(run.project)).is_dir():  # results copied from another machine
        return (f"the job could not be made to time its layers: its project {run.project} "
                "is not a folder here")
    try:
        return check_job(run.workload, str(run.project), run.global_batch, run.seed, "",
                         CHECK_TIMEOUT_S, _profiling(run))
    except UsageError as exc:
        return f"the job could not be made to time its layers: {exc}"


def _profiling(run: Any) -> LayerProfiling:
    """The micro-batch a virtual worker of two stages takes in 4, on a worker's threads."""
    return LayerProfiling(max(1, run.global_batch * 2 // len(run.workers) // 4),
                          PROFILE_PASSES, max(1, run.workers[0].threads))


def layer_shape(run: Any, made: dict[str, Any] | str | None = None) -> Any:
    """The model's layers for the pipelined remedies
    (hetbench.analysis.models.pipeline_model.LayerShape): each layer's share of a forward + backward
    and its forward's share of that, timed on the micro-batch a virtual worker of two stages would
    take in 4 micro-batches, as a pipelined run profiles them (harness/partition/layerprofile.py): a
    built-in model's here, a job's layers (Job.layers) where the job check makes it (`made`:
    job_now's, made here if not given); or why there is none (a str)."""
    if len(run.workers) < 2:
        return "one worker: no virtual worker of 2 or more stages"
    if any(w.framework != "pytorch" for w in run.workers):
        return "virtual workers run PyTorch stages only; the recorded job is not PyTorch's"
    if run.is_loop or run.is_imported:
        return (f"{'a user' if run.is_loop else 'an imported job'}'s model is not here: "
                "hetbench cannot cut its layers into stages")
    profiling = _profiling(run)
    if run.is_job:
        made = job_now(run) if made is None else made
        if isinstance(made, str):
            return made
        if made.get("layer_profile") is None:
            return f"{run.workload!r} gives no layers to pipeline (Job.layers)"
        return _shape(made["layer_profile"], profiling.micro)
    if get_workload(run.workload).layers is None:
        return f"{run.workload!r} has no layer sequence to pipeline"
    import torch

    from hetbench.harness.partition.layerprofile import profile_layers

    data, spec = data_and_model(run)
    module = builder(run.workload, "pytorch")
    model = module.build(spec)
    torch.set_num_threads(profiling.threads)  # as a worker computes
    with torch.random.fork_rng():
        profile = profile_layers(module.layers(model),
                                 torch.from_numpy(data.inputs[:profiling.micro]),
                                 profiling.passes)
    return _shape(dataclasses.asdict(profile), profiling.micro)


def _shape(profile: dict[str, list[float]], micro: int) -> Any:
    """A LayerProfile's fields (timed on `micro` samples) as the pipeline model's LayerShape."""
    from hetbench.analysis.models.pipeline_model import LayerShape

    total = sum(profile["time_ns"])
    return LayerShape(tuple(t / total for t in profile["time_ns"]),
                      tuple(b / micro for b in profile["activation_bytes"]),
                      tuple(profile["parameter_bytes"]),
                      tuple(f / t for f, t in zip(profile["forward_ns"], profile["time_ns"],
                                                  strict=True)))


def _advised(ranked: Any, top: int) -> list[str]:
    """The recorded job and the top remedies advised (the recorded one not counted among
    them; the unvalidated kinds, hetbench.analysis.advice.advisor.UNVALIDATED, never)."""
    others = [n for n, advised in zip(ranked["remedy"], ranked["advised"], strict=True)
              if n != "recorded" and advised]
    return ["recorded", *others[:top]]


def _write_suite(path: Path, chosen: list[Any], args: argparse.Namespace,
                 meta: dict[str, Any]) -> None:

    text = suite_text(SUITE, f"the recorded job {meta['run']['name']} and the top "
                      f"{len(chosen) - 1} remedies hetbench advise predicted",
                      args.suite_repeats, [run_table(r.run) for r in chosen],
                      comment=f"Written by hetbench advise from {meta.get('run_id')}.")
    path.write_text(text)
    load_suite(str(path))  # what was written is a suite hetbench runs


def verify(suite_path: Path, out: Path, target: dict[str, Any] | None,
           no_figures: bool = False) -> Any:
    """Run the advised suite; each remedy's measured time of the work, step time, idle
    fraction and (with a target) time to target: medians over the suite's repeats."""
    import pandas as pd

    from hetbench.analysis.advice.advice_report import repeat_range
    from hetbench.analysis.tables.convergence import time_to_target
    from hetbench.analysis.view.metrics import run_summary
    from hetbench.harness.cli.run import run_written

    print(f"\n--verify: running {suite_path}")
    status, completed = run_written(suite_path, out, no_figures)
    rows = []
    for data in completed:
        run = data.manifest["run"]
        summary = run_summary(data.steps, int(run.get("warmup_steps", 0)))
        work = (run["steps"] - run.get("warmup_steps", 0)) * run["global_batch"]
        row = {"remedy": run["name"], "measured_s": work / summary["samples_per_s"],
               "measured_step_ms": summary["mean_step_ms"],
               "measured_idle": summary["idle_fraction"]}
        if target is not None:
            row["measured_to_target_s"] = time_to_target(
                data.evals, target["metric"], target["value"])["time_to_target_s"]
        rows.append(row)
    if status != 0 or not rows:
        print(f"hetbench: --verify: the advised suite did not complete (status {status}): "
              f"nothing verified; its runs are in {out / SUITE}", file=sys.stderr)
        return None
    measured = pd.DataFrame(rows)
    grouped = measured.groupby("remedy")
    medians = grouped.median()
    # each compared measure's range over the repeats (a target never reached: +inf), for
    # the pairs the measurement orders (advice_report.resolved_tau); one repeat has none
    for column in ("measured_s", "measured_to_target_s"):
        if column in measured:
            medians[f"{column}_low"], medians[f"{column}_high"] = repeat_range(
                measured[column], measured["remedy"])
    return medians.reset_index()


