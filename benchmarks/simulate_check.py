"""How well does `hetbench simulate` predict jobs other than the ones it was fitted on?

Fits the device classes on the 2-worker runs of a `scaleout` suite result (`pair` for the
steady classes, `pair-abrupt` for the class whose slowdown jumps: an injected straggler),
simulates the configuration of every other run (same classes, scheme, slices and steps,
warm-up included, 5 simulated repeats per recorded repeat, so that each recorded repeat
weighs the same), and compares with the real runs, averaged over their repeats: mean step
time, idle fraction, p99 step time; for the runs with an injected straggler, the slowdown
it causes (mean step after the jump over before it). The fitted configurations themselves
give the replay error; the others, the estimation error (median and p90 of its size).
Targets (issue 29): replay 3% median, estimation 5% median and 10% p90.

    hetbench run scaleout --out results      # about 10 minutes on 2 cores
    python benchmarks/simulate_check.py results/scaleout

`--comm` instead measures the loopback gloo all-reduce latency of 4 bytes between two
processes (deviceclass.DEFAULT_ALPHA_NS is half its median).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from hetbench.analysis.models import deviceclass, simulate
from hetbench.analysis.view.metrics import run_summary, step_metrics
from hetbench.harness.records import collector
from hetbench.harness.records.results import find_runs, load_run

FITTED_ON = {"pair": ("trio", "quad", "six", "eight", "quad-fast", "six-slow", "quad-backup",
                      "quad-ssp", "quad-async", "quad-local"),
             "pair-abrupt": ("quad-abrupt", "six-abrupt")}
JUMP = 120  # the step at which pair-abrupt's class slows from 20x to 60x
SIMULATED_PER_RECORDED = 5


COLUMNS = ["mean_step_ms", "idle_fraction", "p99_step_ms", "straggler_slowdown"]


def summarised(steps: pd.DataFrame, warmup: int) -> dict[str, float]:
    """What the analysis reports of a run (real or simulated), and the slowdown after the
    injected straggler's jump (the mean step after it over the mean step before)."""
    summary = run_summary(steps, warmup)
    per_step = step_metrics(steps, warmup)
    before = per_step[per_step["step"] < JUMP]["step_ms"].mean()
    after = per_step[per_step["step"] >= JUMP]["step_ms"].mean()
    return {**summary, "p99_step_ms": float(per_step["step_ms"].quantile(0.99)),
            "straggler_slowdown": float(after / before)}


def measured(runs: list[Any]) -> dict[str, float]:
    """Mean over repeats of what the analysis reports for each real run."""
    rows = [summarised(r.steps, r.warmup_steps) for r in runs]
    return pd.DataFrame(rows)[COLUMNS].mean().to_dict()


def predicted(fit_runs: list[Any], target: Any) -> dict[str, float]:
    """The target's configuration simulated from classes fitted on `fit_runs`: its workers
    by short name, its slices, all its steps; summarised after its warm-up as for real."""
    classes, names = deviceclass.fit_classes(fit_runs)
    comm = deviceclass.fit_comm(fit_runs)
    mix = [(deviceclass.short_name(w), 1) for w in target.manifest["run"]["workers"]]
    workers, _ = deviceclass.resolve_mix(mix, classes, names)
    scheme, sizes = deviceclass.recorded_scheme(target)
    run = target.manifest["run"]
    servers = int((run.get("aggregator") or {}).get("servers", 1))
    rows = []
    # simulated repeat r keeps to recorded repeat r mod len(fit_runs)
    for seed in range(SIMULATED_PER_RECORDED * len(fit_runs)):
        sim = simulate.simulate(workers, comm, simulate.parse_scheme(scheme), run["steps"],
                                run["global_batch"], seed=seed, sizes=sizes, servers=servers)
        frame = collector.records_frame([simulate.records(sim)])
        rows.append(summarised(frame, run["warmup_steps"]))
    return pd.DataFrame(rows)[COLUMNS].mean().to_dict()


def validate(suite_dir: Path) -> pd.DataFrame:
    by_name: dict[str, list[Any]] = {}
    for run_dir in find_runs([suite_dir]):
        data = load_run(run_dir)
        if data.status == "completed":
            by_name.setdefault(data.manifest["run"]["name"], []).append(data)
    rows = []
    for fit_name, targets in FITTED_ON.items():
        fit_runs = by_name.get(fit_name, [])
        if not fit_runs:
            raise SystemExit(f"no completed '{fit_name}' runs in {suite_dir}")
        for target in (fit_name, *targets):  # the fitted config itself: the sanity row
            real = by_name.get(target)
            if not real:
                continue
            truth, guess = measured(real), predicted(fit_runs, real[0])
            rows.append({
                "run": target, "workers": len(real[0].manifest["workers"]),
                "repeats": len(real),
                "step_ms": truth["mean_step_ms"], "predicted_step_ms": guess["mean_step_ms"],
                "step_error": guess["mean_step_ms"] / truth["mean_step_ms"] - 1,
                "idle": truth["idle_fraction"], "predicted_idle": guess["idle_fraction"],
                "idle_error_points": 100 * (guess["idle_fraction"] - truth["idle_fraction"]),
                "p99_ms": truth["p99_step_ms"], "predicted_p99_ms": guess["p99_step_ms"],
                "p99_error": guess["p99_step_ms"] / truth["p99_step_ms"] - 1,
                "slowdown": truth["straggler_slowdown"],
                "predicted_slowdown": guess["straggler_slowdown"],
                "fitted": target == fit_name,
                "cpu_demand": real[0].manifest.get("load", {}).get("cpu_demand"),
                "oversubscribed": bool(real[0].manifest.get("load", {}).get("oversubscribed")),
            })
    return pd.DataFrame(rows)


def comm_latency(repeats: int = 400) -> float:
    """Median ns of a 4-byte gloo all-reduce between two processes on loopback."""
    import torch.multiprocessing as mp

    context = mp.get_context("spawn")
    queue = context.Queue()
    port = 29_000 + np.random.default_rng().integers(0, 1000)
    workers = [context.Process(target=_latency_worker, args=(r, int(port), repeats, queue))
               for r in range(2)]
    for w in workers:
        w.start()
    median = queue.get(timeout=120)
    for w in workers:
        w.join(timeout=60)
    return float(median)


def _latency_worker(rank: int, port: int, repeats: int, queue: Any) -> None:
    import os
    import time

    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    one = torch.zeros(1)
    times = []
    for i in range(repeats + 50):
        dist.barrier()
        start = time.perf_counter_ns()
        dist.all_reduce(one)
        if i >= 50:
            times.append(time.perf_counter_ns() - start)
    if rank == 0:
        queue.put(float(np.median(times)))
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("suite_dir", type=Path, nargs="?")
    parser.add_argument("--comm", action="store_true", help="measure all-reduce latency")
    parser.add_argument("--csv", type=Path, help="also write the table here")
    args = parser.parse_args()
    if args.comm:
        median = comm_latency()
        print(f"4-byte gloo all-reduce, 2 processes, loopback: median {median / 1e3:.1f} us "
              f"(alpha = {median / 2e3:.1f} us per message)")
        return
    if args.suite_dir is None:
        parser.error("give a scaleout suite result (hetbench run scaleout --out results)")
    table = validate(args.suite_dir)
    if args.csv:
        table.to_csv(args.csv, index=False)
    shown = table.copy()
    for column in ("step_error", "p99_error"):
        shown[column] = shown[column].map(lambda v: f"{v:+.1%}")
    for column in ("idle", "predicted_idle"):
        shown[column] = shown[column].map(lambda v: f"{v:.1%}")
    shown["idle_error_points"] = shown["idle_error_points"].map(lambda v: f"{v:+.1f}")
    print(shown.to_string(index=False, float_format=lambda v: f"{v:.2f}"))
    print()
    for line in error_lines(table):
        print(line)


def error_lines(table: pd.DataFrame) -> list[str]:
    """Replay error (the fitted configurations) and estimation error (the others): the
    median and p90 of each error's size."""
    lines = []
    for label, rows in (("replay", table[table["fitted"]]),
                        ("estimation", table[~table["fitted"]])):
        if rows.empty:
            continue
        parts = []
        for name, column, unit in (("step", "step_error", "%"),
                                   ("idle", "idle_error_points", " points"),
                                   ("p99", "p99_error", "%")):
            size = rows[column].abs() * (100 if unit == "%" else 1)
            parts.append(f"{name} {size.median():.1f}{unit} median, "
                         f"{size.quantile(0.9):.1f}{unit} p90")
        lines.append(f"{label} error over {len(rows)} configuration(s): " + "; ".join(parts))
    injected = table[~table["fitted"] & table["run"].str.contains("abrupt")]
    for row in injected.itertuples():
        lines.append(f"injected straggler, {row.run}: slowdown {row.slowdown:.2f} measured, "
                     f"{row.predicted_slowdown:.2f} simulated")
    return lines


if __name__ == "__main__":
    main()
