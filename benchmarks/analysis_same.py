"""Do two trees analyse the same recorded runs to the same outputs? (issue 59's check that a
restructuring of analysis/ changes no number.)

    python benchmarks/analysis_same.py RESULTS --base REV [--keep DIR]

RESULTS is a results folder holding recorded suites (quick, sync, pipeline: `hetbench run
NAME --out RESULTS`). Each tree, REV's (a temporary `git worktree`, its own code on
PYTHONPATH, as `hetbench ci` runs a base) and the working tree's, runs on copies of the same
runs: `report` (the summary as text and JSON, report.md and the figures' names), `compare`
of two runs, `paper` (table.md, table.tex), `simulate` (the table it prints) and `advise`
(advice.md, the suite it writes), and `report` of tests/fixtures/legacy (a run written by an
old hetbench). Paths are replaced by placeholders, launch stamps, durations ("took 3.1 s"),
the source tree's commit and a module's room in a path an output names masked, and what
times this host as the command runs left out (HOST_TIMED_ROWS); every other byte must be
the same. Prints each output that differs with its first differing
lines, and exits 1 if any does.
"""

from __future__ import annotations

import argparse
import csv
import difflib
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TIMEOUT_S = 900
# wall-clock durations a command prints about itself: not outputs of the analysis
DURATION = re.compile(r"\b\d+(?:\.\d+)?\s?(?:s|ms|min)\b(?= elapsed| to draw| \(figures)"
                      r"|\btook \d+(?::\d+)*(?:\.\d+)?\s?\w*")
# when a command wrote something: a launch's stamp (and pid) in names, ISO times inside
STAMP = re.compile(r"\d{8}T\d{6}(?:-\d+)*|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[\d.:+Z-]*")
# a module's path an output names (where it comes from): analysis/'s rooms moved modules
ROOM = re.compile(r"\banalysis/(?:view|measures|trends|tables|models|advice|render|export)/")
# what a long command says on stderr as it goes (harness/cli/progress.py): not an output
PROGRESS = re.compile(r"^ +\[[\d:]+ elapsed\] .*$\n?", re.M)
# the seconds each simulation took, in `simulate`'s lines ("[0.01 s]")
SIMULATION_SECONDS = re.compile(r"\[\d+\.\d+ s\]")
# the tree a simulated run's manifest says it came from (its commit, and whether dirty)
TREE_STATE = re.compile(r"\b[0-9a-f]{40}\b|(?<=\"dirty\": )(?:true|false)")
# Outputs that time something on this host as the command runs, so that no two runs agree:
# `simulate`'s summary column `seconds` (the simulation's own wall time), and advise's
# pipelined and fc-on-server remedies (predicted from the model's layers as timed on this
# host when advise runs: harness/cli/advise.py layer_shape). Their rows are left out.
HOST_TIMED_ROWS = re.compile(r"^.*(?:pipe-|pipeline: |fc-on-server).*$\n?", re.M)


def commands(runs: Path, out: Path) -> dict[str, list[str]]:
    """Each output's name and the command that writes it (into `out`, or to stdout)."""
    suites = [str(runs / name) for name in ("quick", "sync", "pipeline") if (runs / name).is_dir()]
    quick = sorted((runs / "quick").glob("hetero-equal-r0-*"))[:1]
    profiled = sorted((runs / "quick").glob("hetero-profiled-r0-*"))[:1]
    found: dict[str, list[str]] = {}
    for suite in suites:
        name = Path(suite).name
        found[f"report-{name}.txt"] = ["report", suite, "--out", str(out / f"report-{name}")]
        found[f"report-{name}.json"] = ["report", suite, "--no-figures", "--format", "json",
                                        "--out", str(out / f"report-{name}-json")]
    if quick and profiled:
        found["compare.json"] = ["compare", str(quick[0]), str(profiled[0]), "--json", "--all"]
        found["simulate.txt"] = ["simulate", str(quick[0]), "--seed", "1", "--no-figures",
                                 "--mix", "rank0:2,rank1:6", "--out", str(out / "simulate")]
    found["paper.txt"] = ["paper", *suites, "--out", str(out / "paper")]
    if (runs / "sync").is_dir():
        found["advise.txt"] = ["advise", str(runs / "sync"), "--out", str(out / "advise")]
    found["report-legacy.txt"] = ["report", str(runs / "legacy"), "--no-figures",
                                  "--out", str(out / "report-legacy")]
    return found


def run_tree(tree: Path, runs_source: Path, work: Path) -> dict[str, str]:
    """Every output of `tree`'s hetbench on a fresh copy of the runs, paths made neutral."""
    runs = work / "runs"
    shutil.copytree(runs_source, runs)
    shutil.copytree(REPO / "tests" / "fixtures" / "legacy", runs / "legacy")
    out = work / "out"
    out.mkdir()
    env = dict(os.environ, PYTHONPATH=str(tree), MPLBACKEND="Agg")
    outputs: dict[str, str] = {}
    for name, argv in commands(runs, out).items():
        done = subprocess.run([sys.executable, "-m", "hetbench.harness.cli.main", *argv],
                              cwd=tree, env=env, capture_output=True, text=True,
                              timeout=TIMEOUT_S)
        outputs[name] = f"exit {done.returncode}\n{done.stdout}{done.stderr}"
    for path in sorted(out.rglob("*")):
        if path.is_file():
            relative = str(path.relative_to(out))
            if path.suffix in {".md", ".tex", ".toml", ".csv", ".json", ".txt"}:
                outputs[relative] = path.read_text()
            else:  # figures: their names (pixels depend on matplotlib's build, not on us)
                outputs[relative] = "(a file)"
    neutral = {str(runs): "RUNS", str(out): "OUT", str(tree): "TREE"}
    made: dict[str, str] = {}
    for name, text in outputs.items():
        for path, placeholder in neutral.items():
            text = text.replace(path, placeholder)
        text = TREE_STATE.sub("TREE", STAMP.sub("STAMP", DURATION.sub("DURATION", text)))
        text = SIMULATION_SECONDS.sub("[SECONDS]", ROOM.sub("analysis/", PROGRESS.sub("", text)))
        if name.startswith("advise"):
            text = HOST_TIMED_ROWS.sub("", text)
        if Path(name).name.startswith("summary-") and name.endswith(".csv"):
            text = _without_column(text, "seconds")
        made[STAMP.sub("STAMP", name)] = text
    return made


def _without_column(text: str, column: str) -> str:
    rows = list(csv.reader(io.StringIO(text)))
    if not rows or column not in rows[0]:
        return text
    at = rows[0].index(column)
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows([r[:at] + r[at + 1:] for r in rows])
    return out.getvalue()


def differences(base: dict[str, str], current: dict[str, str]) -> list[str]:
    lines: list[str] = []
    for name in sorted(set(base) | set(current)):
        if base.get(name) == current.get(name):
            continue
        diff = difflib.unified_diff((base.get(name) or "").splitlines(),
                                    (current.get(name) or "").splitlines(),
                                    f"base/{name}", f"current/{name}", lineterm="", n=1)
        lines += [f"== {name} differs", *list(diff)[:40]]
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", type=Path, help="results folder of recorded suites")
    parser.add_argument("--base", required=True, help="the git revision to compare against")
    parser.add_argument("--keep", type=Path, help="keep both trees' outputs in this folder")
    args = parser.parse_args()
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="analysis-same-"))
    worktree = Path(tempfile.mkdtemp(prefix="analysis-base-"))
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "--force",
                    str(worktree), args.base], check=True, capture_output=True)
    try:
        outputs = {}
        for side, tree in (("base", worktree), ("current", REPO)):
            (work / side).mkdir(parents=True, exist_ok=True)
            outputs[side] = run_tree(tree, args.results.resolve(), work / side)
            print(f"{side}: {len(outputs[side])} outputs", flush=True)
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(worktree)],
                       capture_output=True)
        shutil.rmtree(worktree, ignore_errors=True)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    lines = differences(outputs["base"], outputs["current"])
    print("\n".join(lines) if lines else f"the same: {len(outputs['current'])} outputs")
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(main())
