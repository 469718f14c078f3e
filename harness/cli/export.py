"""`hetbench export RESULTS... --to FORMAT DIR`: recorded runs where researchers already
look: TensorBoard scalars (tensorboard), MLPerf-style `:::MLLOG` logs (mlperf)."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

from hetbench.harness.cli import launches
from hetbench.harness.spec.errors import UsageError

# format -> the package it writes with (the `export` extra: pip install 'hetbench[export]')
FORMATS = {"tensorboard": "tensorboard", "mlperf": "mlperf_logging"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    launches.add_arguments(parser)
    parser.add_argument("paths", nargs="+", type=Path,
                        help="run directories, or suite/results folders holding them")
    parser.add_argument("--to", nargs=2, metavar=("FORMAT", "DIR"), required=True,
                        help="tensorboard: per-step scalars of each worker (phases, idle, "
                             "slice, staleness) and the held-out evaluations, one event folder "
                             "per worker under DIR/RUN_ID/ (tensorboard --logdir DIR); mlperf: "
                             "DIR/RUN_ID.log of each run with evaluations, in :::MLLOG lines, "
                             "checked with MLPerf's compliance checker")


def run(args: argparse.Namespace) -> int:
    from hetbench.harness.records.results import finished_runs_by_suite, note, writable_folder

    kind, folder = args.to
    if kind not in FORMATS:
        raise UsageError("--to", f"{kind!r}: the format is one of {', '.join(FORMATS)}, "
                                 "then a folder")
    if not folder.strip():
        raise UsageError("--to", "empty folder: name one ('.' for the current one)")
    if importlib.util.find_spec(FORMATS[kind]) is None:
        raise UsageError("--to", f"{kind} needs the {FORMATS[kind].replace('_', '-')} package: "
                                 "pip install 'hetbench[export]'")
    out = writable_folder(Path(folder), "--to")
    suites = finished_runs_by_suite(args.paths, f"exported together into {out}",
                                    launches.choice(args))
    runs = [r for loaded in suites.values() for r in loaded]
    failed = 0
    if kind == "tensorboard":
        from hetbench.analysis.export.to_tensorboard import export as to_tensorboard

        for r in runs:
            for written in to_tensorboard(r, out):
                print(written)
        print(f"\nread them with: tensorboard --logdir {out}")
        return 0
    from hetbench.analysis.export.to_mlperf import RULESET, check, checker_command, rules_file
    from hetbench.analysis.export.to_mlperf import export as to_mlperf

    rules = None
    for r in runs:
        path = out / f"{r.manifest.get('run_id', r.run_dir.name)}.log"
        if not to_mlperf(r.manifest, r.evals, path):
            note(f"{r.run_dir}: no held-out evaluations (eval_every), so no MLPerf log")
            continue
        rules = rules or rules_file(out)
        problems = check(path, rules)
        verdict = "passed" if not problems else f"FAILED: {problems[0].splitlines()[0]}"
        print(f"{path}: MLPerf compliance checker, training {RULESET} common rules: {verdict}")
        failed += bool(problems)
    if rules is not None:
        print(f"\nthe rules: {rules} (MLPerf's common rules without the chaining to its own "
              "benchmarks); check a log again with:\n  "
              + " ".join(checker_command(out / "RUN_ID.log", rules)))
    return 1 if failed else 0
