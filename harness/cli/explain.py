"""`hetbench explain RESULTS [-k RUN] [--top K] [--repeats N] [--dry-run] --out DIR`: for
each of a recorded run's largest straggler causes (analysis/measures/stragglers.py) that a
run key can take away, the run's variant without it (analysis/advice/interventions.py: the
collector off, freed memory kept, workers pinned apart or on one thread, the loader fed, no
jitter), written as a suite beside the recorded configuration and run with the repeats
interleaved; then, per variant, what removing the cause measured (the change of the step
time, the cost of variability, the idle before the all-reduce and the step p99/p50, with
95% intervals over the repeats) against the share the attribution gave it
(analysis/advice/explain_report.py: explain.md, explain.csv, figures/explain.png). What
`advise --verify` is to remedies, this is to causes; a cause no key removes is said so."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path
from typing import Any

from hetbench.harness.cli import arguments
from hetbench.harness.cli.simulate import load_runs
from hetbench.harness.spec.errors import UsageError
from hetbench.harness.spec.suite import load_suite, run_from_dict
from hetbench.harness.spec.tables import run_table, suite_text

SUITE = "explained"
MAX_TOP = 10
MAX_REPEATS = 50


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", nargs="+", type=Path,
                        help="recorded runs of one configuration (run directories or folders "
                        "of them): its repeats")
    parser.add_argument("-k", dest="runs", metavar="RUN", type=arguments.run_pattern,
                        action="append", help="the run to explain, by name (a glob, else a "
                        "substring), where RESULTS hold several")
    parser.add_argument("--top", type=int, default=3,
                        help="the largest causes to take away, each of at least 5%% of the "
                        "straggler excess (default 3)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="repeats of the recorded configuration and of each variant, "
                        "interleaved (default 3)")
    parser.add_argument("--steps", type=int,
                        help="steps of the runs (default: the recorded run's)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the causes, the variants and the suite it would run; "
                        "run and write nothing")
    parser.add_argument("--no-figures", action="store_true",
                        help="draw no figures of the suite's runs (explain's own is drawn)")
    parser.add_argument("--out", type=arguments.folder, required=True,
                        help="folder for explain.md, explain.csv, explain.toml and figures/; "
                        f"the runs go to {SUITE}/ in it")


def run(args: argparse.Namespace) -> int:
    from hetbench.analysis.advice import explain_report, interventions
    from hetbench.harness.records.results import writable_folder

    arguments.check_bounds(args.top, "--top", 1, MAX_TOP)
    arguments.check_bounds(args.repeats, "--repeats", 1, MAX_REPEATS)
    recorded = _recorded_runs(args.results, args.runs)
    spec = run_from_dict(recorded[0].spec)
    if args.steps is not None:
        arguments.check_bounds(args.steps, "--steps", spec.warmup_steps + 2, 10_000_000)
        spec = dataclasses.replace(spec, steps=args.steps)
    shares = explain_report.pooled_shares([explain_report.run_measures(r) for r in recorded])
    base = dataclasses.replace(spec, name=explain_report.RECORDED)
    plan = [dataclasses.replace(item, run=dataclasses.replace(item.run, name=item.name))
            if isinstance(item, interventions.Intervention) else item
            for item in interventions.plan(base, shares, sorted(os.sched_getaffinity(0)),
                                           args.top)]
    variants = list({item.name: item.run for item in plan
                     if isinstance(item, interventions.Intervention)}.values())
    print(f"{recorded[0].name}: {len(recorded)} recorded run(s); the largest causes of its "
          "straggler excess and what takes them away:")
    for line in explain_report.plan_lines(plan, shares) or ["no cause of 5% or more"]:
        print(f"  {line}")
    text = suite_text(SUITE, f"{recorded[0].name} recorded and without each of its largest "
                      "straggler causes", args.repeats,
                      [run_table(base), *[run_table(v) for v in variants]],
                      comment=f"Written by hetbench explain from {recorded[0].run_id}.")
    if args.dry_run:
        print(f"\nthe suite it would run ({len(variants) + 1} runs x {args.repeats} "
              f"repeats, interleaved):\n\n{text}", end="")
        return 0
    out = writable_folder(args.out, "--out")  # all input checked: now write
    if not variants:
        explain_report.write_explain(out, explain_report.compared(_no_rows(), plan), plan,
                                     recorded[0], shares, None)
        print(f"\nno cause a run key takes away: nothing run; {out / 'explain.md'}")
        return 0
    suite_path = out / "explain.toml"
    suite_path.write_text(text)
    load_suite(str(suite_path))  # what was written is a suite hetbench runs
    rows, status = _run_suite(suite_path, out, args.no_figures)
    result = explain_report.compared(rows, plan)
    print(f"\n{explain_report.table(result)}")
    explain_report.write_explain(out, result, plan, recorded[0], shares, rows)
    print(f"\nexplain: {out / 'explain.md'}; suite: {suite_path}; runs: {out / SUITE}")
    return 0 if status == 0 else 1


def _recorded_runs(paths: list[Path], patterns: list[str] | None) -> list[Any]:
    """The completed runs of the one configuration RESULTS (with -k) hold."""
    loaded = load_runs(paths, patterns)
    names = sorted({r.name for r in loaded})
    if len(names) != 1:
        listed = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
        raise UsageError("-k", f"{len(names)} runs match ({listed}): name one to explain")
    completed = [r for r in loaded if r.status == "completed"]
    if not completed:
        raise UsageError("RESULTS", f"no completed run of {names[0]!r} (statuses: "
                         f"{', '.join(sorted({r.status for r in loaded}))})")
    spec = run_from_dict(completed[0].spec)
    if spec.is_imported:
        raise UsageError("RESULTS", "the run was imported from its traces: hetbench cannot "
                         "run it or its variants")
    if any(w.node for w in spec.workers):
        raise UsageError("RESULTS", "the run was across hosts: explain runs its variants on "
                         "this host only")
    return completed


def _no_rows() -> Any:
    import pandas as pd

    return pd.DataFrame(columns=["run", "repeat", "measures"])


def _run_suite(suite_path: Path, out: Path, no_figures: bool) -> tuple[Any, int]:
    """Run the explain suite; one row of measures per completed run, and its status."""
    import pandas as pd

    from hetbench.analysis.advice.explain_report import run_measures
    from hetbench.harness.cli.run import run_written
    from hetbench.harness.records.rundir import next_repeat

    # each run's repeats are numbered on from those the folder already holds: a variant is
    # paired with the recorded configuration's run of the same round of this launch
    first = {run.name: next_repeat(out / SUITE, run.name)
             for run in load_suite(str(suite_path)).runs}
    print(f"\nrunning {suite_path}")
    status, completed = run_written(suite_path, out, no_figures)
    rows = []
    for data in completed:
        measures = run_measures(data)
        rows.append({"run": data.name, "repeat": data.repeat - first[data.name],
                     "measures": measures,
                     **{k: v for k, v in measures.items() if not isinstance(v, dict)}})
    if status != 0:
        print(f"hetbench: explain: the suite did not complete (status {status}); what did is "
              f"compared; its runs are in {out / SUITE}", file=sys.stderr)
    return pd.DataFrame(rows) if rows else _no_rows(), status
