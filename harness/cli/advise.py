"""`hetbench advise RESULTS [--target ...] [--top K] [--verify] --out DIR`: fit the devices of
a recorded job, predict every remedy it can run with the simulator, rank them, and write
advice.md (the ranking, a sentence on each of the top ones, what was refused and why),
advice.csv, figures/advice.png and advised.toml: a suite of the top K remedies and the
recorded job, ready for `hetbench run`. `--verify` runs that suite and sets what was
measured against what was predicted: the error, Kendall's tau of the two rankings and the
regret (the pick's measured time over the best measured). analysis/advisor.py holds the
remedies and their predictions."""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from pathlib import Path
from typing import Any

from harness.cli import arguments
from harness.cli.simulate import load_runs
from harness.spec.errors import UsageError

SUITE = "advised"
MAX_TOP = 20
MAX_REPEATS = 50
SHOWN = 12  # rows of the ranking printed; advice.md has them all


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
    parser.add_argument("--steps", type=int,
                        help="steps of the advised runs (default: the recorded run's)")
    parser.add_argument("-k", dest="runs", metavar="PATTERN",
                        help="read only the runs whose name matches (a glob, else a substring)")
    parser.add_argument("--job", metavar="NAME",
                        help="the run (by name: a glob, else a substring) that is the job to "
                        "advise; its devices and exchange are fitted on its repeats, the other "
                        "runs given fit the steps to target of the schemes that change the "
                        "gradient (default: the first run that can be fitted)")
    parser.add_argument("--out", type=arguments.folder, required=True,
                        help="folder for advice.md, advice.csv, advised.toml and figures/; "
                        f"--verify's runs go to {SUITE}/ in it")


def _bounded(value: int | None, name: str, low: int, high: int) -> None:
    if value is not None and not low <= value <= high:
        raise UsageError(name, f"{value} is outside {low}..{high}")


def run(args: argparse.Namespace) -> int:
    from harness.records.results import writable_folder

    _bounded(args.top, "--top", 1, MAX_TOP)
    _bounded(args.repeats, "--repeats", 1, MAX_REPEATS)
    _bounded(args.suite_repeats, "--suite-repeats", 1, MAX_REPEATS)
    _bounded(args.steps, "--steps", 2, 1_000_000)
    loaded = load_runs(args.results, args.runs)
    job = fitted_job([(r.manifest, r.steps) for r in loaded], args.job)
    if args.steps is not None:
        if args.steps <= job["recorded"].warmup_steps:
            raise UsageError("--steps", f"{args.steps} must be above the recorded warm-up "
                             f"({job['recorded'].warmup_steps} steps)")
        job["recorded"] = dataclasses.replace(job["recorded"], steps=args.steps)
    target = parse_target(args.target, job["recorded"], loaded)
    model = steps_model(loaded, job["fitted"][0][0], target) if target else None
    ranked, found, refused = ranked_remedies(job, target, model, args.repeats)
    out = writable_folder(args.out, "--out")  # all input checked: now write
    chosen = _advised(ranked, args.top)
    by_name = {r.name: r for r in found}
    suite_path = out / f"{SUITE}.toml"
    _write_suite(suite_path, [by_name[n] for n in chosen], args, job["fitted"][0][0])
    print(_table(ranked, target))
    measured = verify(suite_path, out, target) if args.verify else None
    if measured is not None:
        ranked = ranked.merge(measured, on="remedy", how="left")
    _write_advice(out, ranked, refused, job, target, chosen, args, model)
    print(f"\nadvice: {out / 'advice.md'}; suite: {suite_path}"
          f"{'' if args.verify else f' (run it: hetbench run {suite_path} --out {out})'}")
    return 1 if args.verify and measured is None else 0


def ranked_remedies(job: dict[str, Any], target: dict[str, Any] | None,
                    model: dict[str, Any] | None, repeats: int) -> tuple[Any, list[Any],
                                                                         list[Any]]:
    """Every remedy the job can run predicted and ranked (analysis.advisor); the remedies,
    and those refused."""
    from analysis import advisor

    fitted = fitted_remedies(job)
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
    host: Any  # analysis.advisor.Host
    remedies: list[Any]
    refused: list[Any]

    def predict(self, remedy: Any, repeats: int) -> dict[str, Any]:
        from analysis import advisor

        batch = self.recorded.global_batch
        return advisor.predict(remedy, advisor.remedy_workers(remedy, self.workers,
                                                              self.host, batch),
                               self.comm, self.recorded.steps - self.recorded.warmup_steps,
                               batch, repeats)


def fitted_remedies(job: dict[str, Any]) -> FittedRemedies:
    """The job's device classes and exchange fitted on its runs, its host, and the
    remedies it can run (analysis.advisor.remedies)."""
    from analysis import advisor, deviceclass
    from analysis.simulate import parse_scheme

    classes, names = deviceclass.fit_classes(job["fitted"])
    meta = job["fitted"][0][0]
    by_rank = [classes[names[f"rank{w['rank']}"]]
               for w in sorted(meta["workers"], key=lambda w: int(w["rank"]))]
    text, sizes = deviceclass.recorded_scheme(*job["fitted"][0])
    found, refused = advisor.remedies(job["recorded"], parse_scheme(text), sizes,
                                      [c.name for c in by_rank])
    return FittedRemedies(job["recorded"], by_rank, deviceclass.fit_comm(job["fitted"]),
                          recorded_host(*job["fitted"][0]), found, refused)


def fitted_job(loaded: list[tuple[dict[str, Any], Any]], job: str | None) -> dict[str, Any]:
    """The job: the runs named `job` (a glob, else a substring; default: the first run that
    can be fitted), those of them that can be fitted (an all-reduce scheme, completed,
    instrumented), and its RunSpec. The devices and the exchange are fitted on these alone;
    the other runs given serve the statistical model. UsageError naming why when none can
    be fitted, or when the runs are of more than one workload."""
    from analysis import deviceclass
    from harness.spec.suite import name_matches, run_from_dict

    workloads = {deviceclass.workload_name(m) for m, _ in loaded}
    if len(workloads) > 1:
        raise UsageError("RESULTS", f"runs of more than one workload "
                         f"({', '.join(sorted(workloads))}): advise one job at a time")
    fitted, problems = [], []
    for meta, steps in loaded:
        problem = deviceclass.fit_problem(meta, steps)
        if not problem and meta["run"].get("pipeline"):
            problem = "pipelined: advise fits data-parallel runs"
        if problem:
            problems.append((str(meta["run"]["name"]), problem))
        else:
            fitted.append((meta, steps))
    if not fitted:
        raise UsageError("RESULTS", f"no run can be fitted ({'; '.join(_grouped(problems))})")
    names = list(dict.fromkeys(str(m["run"]["name"]) for m, _ in fitted))
    chosen = [n for n in names if n == job] or [  # a name given whole is that job
        n for n in names if job is None or name_matches(n, job)]
    if not chosen:
        raise UsageError("--job", f"no run that can be fitted matches {job!r} (those that "
                         f"can: {', '.join(names)})")
    if len(chosen) > 1 and job is not None:
        raise UsageError("--job", f"{job!r} matches {len(chosen)} jobs ({', '.join(chosen)}): "
                         "name one")
    runs = [(m, s) for m, s in fitted if m["run"]["name"] == chosen[0]]
    # runs of the same workers and exchange under another partition: other slice sizes,
    # which tell a line's intercept from its slope (one slice size cannot)
    alike = [(m, s) for m, s in fitted
             if m["run"]["name"] != chosen[0] and _same_workers(m["run"], runs[0][0]["run"])]
    left_out = _grouped(problems)
    for line in left_out:
        print(f"not fitted (the steps to target may use them): {line}")
    return {"fitted": runs + alike, "recorded": run_from_dict(runs[0][0]["run"]),
            "left_out": left_out, "job_runs": len(runs),
            "alike": sorted({str(m["run"]["name"]) for m, _ in alike})}


def _same_workers(run: dict[str, Any], job: dict[str, Any]) -> bool:
    """The same workers (devices, threads, emulation) exchanging through the same
    aggregator: a run whose devices and exchange are the job's."""
    def aggregator(r: dict[str, Any]) -> Any:
        return (r.get("aggregator") or {}).get("name", "torch")

    return run.get("workers") == job.get("workers") and aggregator(run) == aggregator(job)


def _grouped(problems: list[tuple[str, str]]) -> list[str]:
    """'ssp1 (3 runs), ps-async: recorded under ...', one line per reason."""
    by_reason: dict[str, dict[str, int]] = {}
    for name, reason in problems:
        counts = by_reason.setdefault(reason, {})
        counts[name] = counts.get(name, 0) + 1
    return [", ".join(f"{n} ({c} runs)" if c > 1 else n for n, c in names.items()) +
            f": {reason}" for reason, names in by_reason.items()]


def steps_model(loaded: list[Any], meta: dict[str, Any], target: dict[str, Any]
                ) -> dict[str, Any] | None:
    """The statistical model (analysis.statistical) fitted on the given runs of the job (its
    workers, any scheme) that evaluated the target's metric, with each scheme's
    leave-one-out prediction; None when no run of BSP's gradient reached the target."""
    from analysis import statistical

    same = [(r.manifest, r.steps, r.evals) for r in loaded
            if r.status == "completed" and len(r.manifest["workers"]) == len(meta["workers"])
            and target["metric"] in r.evals.columns]
    points = statistical.scheme_points(same, target["metric"], target["value"])
    fitted = statistical.fit(points)
    if fitted is None:
        return None
    return {"model": fitted, "points": points, "validation": statistical.leave_one_out(points)}


def recorded_host(meta: dict[str, Any], steps: Any) -> Any:
    """The cores the recorded job's workers shared (its manifest's `load`), their threads
    on them and their typical slices (the median after warm-up)."""
    from analysis.advisor import Host
    from analysis.metrics import after_warmup

    workers = sorted(meta["workers"], key=lambda w: int(w["rank"]))
    specs = meta["run"]["workers"]
    threads = tuple(int(specs[int(w["rank"])].get("threads", 1))
                    if str(specs[int(w["rank"])].get("device", "cpu")) == "cpu" else 0
                    for w in workers)
    slices = after_warmup(steps, int(meta["run"].get("warmup_steps", 0))).groupby(
        "rank")["batch_size"].median()
    return Host((meta.get("load") or {}).get("cores"), threads,
                tuple(int(slices[int(w["rank"])]) for w in workers))


def parse_target(text: str | None, recorded: Any, runs: list[Any]) -> dict[str, Any] | None:
    """The target (metric, value) and the steps the recorded job's runs took to reach it
    (their median), or None without a target."""
    import numpy as np

    from analysis.convergence import time_to_target

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


def _advised(ranked: Any, top: int) -> list[str]:
    """The recorded job and the top remedies (the recorded one not counted among them)."""
    others = [n for n in ranked["remedy"] if n != "recorded"]
    return ["recorded", *others[:top]]


def _write_suite(path: Path, chosen: list[Any], args: argparse.Namespace,
                 meta: dict[str, Any]) -> None:
    from harness.spec.suite import load_suite
    from harness.spec.tables import run_table, suite_text

    text = suite_text(SUITE, f"the recorded job {meta['run']['name']} and the top "
                      f"{len(chosen) - 1} remedies hetbench advise predicted",
                      args.suite_repeats, [run_table(r.run) for r in chosen],
                      comment=f"Written by hetbench advise from {meta.get('run_id')}.")
    path.write_text(text)
    load_suite(str(path))  # what was written is a suite hetbench runs


def verify(suite_path: Path, out: Path, target: dict[str, Any] | None) -> Any:
    """Run the advised suite; each remedy's measured time of the work, step time, idle
    fraction and (with a target) time to target: medians over the suite's repeats."""
    import pandas as pd

    from analysis.convergence import time_to_target
    from analysis.metrics import run_summary
    from harness.cli import run as run_command
    from harness.records.results import load_run

    parser = argparse.ArgumentParser()
    run_command.add_arguments(parser)
    run_args = parser.parse_args([str(suite_path), "--out", str(out), "--no-progress"])
    print(f"\n--verify: running {suite_path}")
    results: list[Any] = []
    status = run_command.run_and_collect(run_args, results)
    rows = []
    for result in results:
        if result.status != "completed":
            continue
        data = load_run(Path(result.run_dir))
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
    return pd.DataFrame(rows).groupby("remedy", as_index=False).median()


def verdict(ranked: Any) -> dict[str, Any]:
    """Predicted against measured over the verified remedies: Kendall's tau of the two
    rankings, the median error, the pick (the best ranked) and its regret (its measured
    time over the best measured, minus one). With a target, on time to target (runs that
    never reached it rank last), else on the time of the work."""
    import numpy as np
    from scipy.stats import kendalltau

    verified = ranked.dropna(subset=["measured_s"]).sort_values("rank")
    predicted, measured = "seconds", "measured_s"
    if "measured_to_target_s" in verified:
        predicted, measured = "time_to_target_s", "measured_to_target_s"
    times = verified[measured].fillna(np.inf)
    pick, best = verified.iloc[0], verified.loc[times.idxmin()]
    both = verified.dropna(subset=[predicted, measured])
    tau = kendalltau(both[predicted], both[measured]).statistic if len(both) > 1 \
        else float("nan")
    error = (both[predicted] / both[measured] - 1).abs().median()
    # each against the recorded job measured in the same launch: what the machine's drift
    # between the recording and the check leaves out
    ratio_error = float("nan")
    if (verified["kind"] == "recorded").any():
        base = verified[verified["kind"] == "recorded"].iloc[0]
        others = both[both["kind"] != "recorded"]
        ratio_error = ((others[predicted] / base[predicted]) /
                       (others[measured] / base[measured]) - 1).abs().median()
    return {"pick": pick["label"], "best": best["label"], "tau": float(tau),
            "regret": float(times[pick.name] / times[best.name] - 1),
            "right": pick["remedy"] == best["remedy"], "verified": len(verified),
            "error": float(error), "compared": len(both), "ratio_error": float(ratio_error),
            "on": "time to target" if predicted != "seconds" else "time of the work"}


def _table(ranked: Any, target: dict[str, Any] | None) -> str:
    lines = [f"{'#':>3} {'remedy':44s} {'time of work s':>22s} {'step ms':>8s} {'idle':>6s} "
             f"{'vs recorded':>11s}" + ("  to target s" if target else "")]
    for _, row in ranked.head(SHOWN).iterrows():
        interval = f"{row['seconds']:.2f} [{row['seconds_low']:.2f}, {row['seconds_high']:.2f}]"
        line = (f"{row['rank']:>3} {_short(row['label'], 44):44s} {interval:>22s} "
                f"{row['mean_step_ms']:8.2f} {row['idle_fraction']:6.1%} "
                f"{row['vs_recorded']:+11.1%}")
        if target:
            line += "  " + (f"{row['time_to_target_s']:.2f}"
                            if math.isfinite(row["time_to_target_s"]) else "not predicted")
        lines.append(line)
    if len(ranked) > SHOWN:
        lines.append(f"    ... {len(ranked) - SHOWN} more in advice.md")
    return "\n".join(lines)


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "~"


def _write_advice(out: Path, ranked: Any, refused: list[Any], job: dict[str, Any],
                  target: dict[str, Any] | None, chosen: list[str],
                  args: argparse.Namespace, model: dict[str, Any] | None) -> None:
    from analysis.advisor import explain
    from analysis.figures import advice_figure

    recorded = ranked[ranked["kind"] == "recorded"].iloc[0]
    meta = job["fitted"][0][0]
    ranked.to_csv(out / "advice.csv", index=False)
    advice_figure(ranked, out / "figures", f"hetbench advise: {meta['run']['name']} "
                  f"({len(meta['workers'])} workers), predicted")
    alike = f" and {len(job['fitted']) - job['job_runs']} of the same workers and exchange " \
        f"({', '.join(job['alike'])})" if job["alike"] else ""
    lines = [f"# Advice for {meta['run']['name']} ({meta.get('run_id')})", "",
             f"Devices fitted on the job's {job['job_runs']} run(s){alike}; "
             f"{len(ranked)} configurations "
             f"simulated ({args.repeats} repeats each: the interval is their range), "
             f"ranked by {'time to target' if target else 'the time of the recorded work'}"
             f" ({recorded['steps']} steps of {recorded['global_batch']} samples).", ""]
    if target:
        lines += [f"Target: {target['metric']} {target['value']:g}, reached by the recorded "
                  f"job in {target['steps']:g} steps (median of {target['runs']} run(s)).",
                  "", *_model_lines(model), ""]
    lines += ["## Top remedies", ""]
    lines += [f"{i}. " + explain(row, recorded) for i, (_, row) in enumerate(
        ranked[ranked["kind"] != "recorded"].head(args.top).iterrows(), start=1)]
    lines += ["", "## Ranking", "", _markdown(ranked), "",
              f"The advised suite ({SUITE}.toml) runs: {', '.join(chosen)}.", ""]
    if "measured_s" in ranked:
        v = verdict(ranked)
        lines += ["## Verified", "",
                  f"{v['verified']} remedies run, compared on {v['on']}: Kendall's tau "
                  f"{v['tau']:.2f} between the predicted and measured rankings, median error "
                  f"{v['error']:.1%} ({v['compared']} predicted and measured; "
                  f"{v['ratio_error']:.1%} on each one's time over the recorded job's); "
                  "the pick "
                  f"({v['pick']}) "
                  + ("was the fastest measured" if v["right"] else
                     f"was wrong: {v['best']} measured fastest") +
                  f" (regret {v['regret']:.1%}).", ""]
        print(lines[-2])
    lines += ["## Not advised", ""] + [f"- {r.label}: {r.reason}" for r in refused]
    if job["left_out"]:
        lines += ["", "Runs not fitted: " + "; ".join(job["left_out"])]
    (out / "advice.md").write_text("\n".join(lines) + "\n")


def _model_lines(model: dict[str, Any] | None) -> list[str]:
    """What advice.md says of the statistical model: its coefficients, what it was fitted
    on, and each scheme predicted from the others."""
    if model is None:
        return ["Remedies that change the gradient have no predicted time to target: no "
                "run of the job given reached the target under BSP's gradient and another "
                "scheme (give the runs of the job's schemes, e.g. the `sync` suite's)."]
    fitted = model["model"]
    a, b, c = (f"{x:.3f}" if math.isfinite(x) else "unknown" for x in fitted.coefficients)
    lines = [f"Steps to target of the schemes that change the gradient (analysis/"
             f"statistical.py), fitted on {', '.join(fitted.schemes)}: BSP's "
             f"{fitted.bsp_steps:g} steps x (1 + {a} x staleness + {b} x dropped share + "
             f"{c} x (H - 1)). Each scheme predicted from the others:", ""]
    validation = model["validation"]
    if validation.empty:
        return [*lines, "(no scheme that changes the gradient reached the target)"]
    lines += ["| scheme | measured steps | predicted | error |", "|---|---|---|---|"]
    lines += [f"| {r.run} | {r.measured:g} | {_cell(r.predicted)} | "
              f"{r.error:+.1%} |" if math.isfinite(r.error) else
              f"| {r.run} | {r.measured:g} | not predictable without it | |"
              for r in validation.itertuples()]
    return lines


def _markdown(ranked: Any) -> str:
    columns = ["rank", "label", "seconds", "seconds_low", "seconds_high", "mean_step_ms",
               "idle_fraction", "p99_step_ms", "vs_recorded", "exact"]
    columns += [c for c in ("steps_to_target", "time_to_target_s", "measured_s",
                            "measured_step_ms",
                            "measured_idle", "measured_to_target_s") if c in ranked]
    head = "| " + " | ".join(columns) + " |"
    rule = "|" + "---|" * len(columns)
    body = ["| " + " | ".join(_cell(row[c]) for c in columns) + " |"
            for _, row in ranked.iterrows()]
    return "\n".join([head, rule, *body])


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.4g}"
    return str(value)
