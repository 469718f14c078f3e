"""Interference by other processes, measured (docs/concepts/analysis.md): a two-worker run of the
MLP on digits, 1200 steps, with two CPU-bound processes outside the run for one second in
the middle; per repeat, what the host samples saw and what straggler attribution names in
that second and outside it.

    python benchmarks/interference_check.py [--repeats 3] [--out /tmp/interference]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

from hetbench.analysis.measures.stragglers import attribute
from hetbench.harness.records import collector
from hetbench.harness.records.results import load_run
from hetbench.harness.system import sampler as system

SUITE = Path(__file__).with_name("interference.toml")
HOG = "import time\nend = time.monotonic() + 30\nwhile time.monotonic() < end:\n    pass\n"
HOGS, HOG_S, SETTLE_NS = 2, 1.0, 200_000_000


def one(folder: Path) -> dict[str, float]:
    run = subprocess.Popen(["hetbench", "run", str(SUITE), "--out",
                            str(folder / "out"), "--no-progress"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not (dirs := list((folder / "out" / "host").glob("pair-*"))) \
            or collector.steps_done(dirs[0], 2) < 150:
        if run.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the run did not start: {run.communicate()[1]}")
        time.sleep(0.05)
    started = time.perf_counter_ns()
    hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(HOGS)]
    try:
        time.sleep(HOG_S)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    stopped = time.perf_counter_ns()
    run.communicate(timeout=300)
    data = load_run(dirs[0])
    samples = pd.read_parquet(dirs[0] / system.SYSTEM_FILE)
    steps = data.steps
    inside = steps.groupby("step").agg(begin=("begin_ns", "min"), end=("end_ns", "max"))
    window = (inside["begin"] > started + SETTLE_NS) & (inside["end"] < stopped)
    step_ms = (inside["end"] - inside["begin"]) / 1e6
    causes = attribute(steps, manifest=data.manifest).set_index("step")
    hit = causes.index.isin(inside.index[window])
    return {
        "others_before": samples.loc[samples["t_ns"] < started, "others_cores"].median(),
        "others_during": samples.loc[(samples["t_ns"] > started + SETTLE_NS)
                                     & (samples["t_ns"] < stopped), "others_cores"].mean(),
        "step_ms_during": step_ms[window].mean(), "step_ms_outside": step_ms[~window].mean(),
        "steps_during": int(window.sum()),
        "named_interference_during": int((causes.loc[hit, "cause"] == "interference").sum()),
        "named_interference_outside": int((causes.loc[~hit, "cause"] == "interference").sum()),
        "interference_ms_during": causes.loc[hit, "interference_ms"].sum(),
        "own_causes_ms_during": causes.loc[hit, ["preempted_ms", "off_cpu_ms",
                                                 "on_cpu_ms"]].sum().sum(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("/tmp/hetbench-interference"))
    args = parser.parse_args()
    shutil.rmtree(args.out, ignore_errors=True)
    rows = []
    for repeat in range(args.repeats):
        (folder := args.out / f"r{repeat}").mkdir(parents=True)
        rows.append(one(folder))
    table = pd.DataFrame(rows)
    print(table.to_string(float_format=lambda v: f"{v:.3g}"))
    print("\nmedian over repeats:")
    print(table.median().to_string(float_format=lambda v: f"{v:.3g}"))


if __name__ == "__main__":
    main()
