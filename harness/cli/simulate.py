"""`hetbench simulate RESULTS... [--mix NAME:COUNT,...] [--scheme NAME] --out DIR`: fit
device classes to recorded runs and simulate larger jobs under each scheme
(hetbench.analysis.models.simulate). Every simulated run is a run directory like a real one
(manifest marked `simulated`), so report, figures and compare read it; beside them
summary-<launch>.csv and figures/scale-<launch>.png (idle, throughput and staleness against the
number of workers); <launch> is the invocation's id, also in each run's manifest."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from hetbench.analysis.models.simulated import SCHEME_FORMS, SIMULATED
from hetbench.harness.cli import arguments
from hetbench.harness.spec.aggregators import AggregatorSpec
from hetbench.harness.spec.errors import UsageError
from hetbench.harness.spec.suite import picked
from hetbench.harness.system import environment

SUITE = "simulate"
MAX_STEPS = 1_000_000
MAX_REPEATS = 100
RECORDS_LIMIT = 2_000_000  # rows: above, only the summary (steps.parquet would be GBs)
DEFAULT_SCHEMES = ("bsp", "bsp-profiled", "bsp-adaptive", "backup:1", "ssp:2", "ps-async",
                   "local-sgd:4")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", nargs="*", type=Path,
                        help="recorded runs to fit (run directories or folders of them); "
                        "may be left out when --mix names only profiles")
    parser.add_argument("--mix", action="append", metavar="NAME:COUNT,...",
                        help="the simulated workers: device classes of the runs (rank0, "
                        "rank1, ..., a worker's label, or short names such as cpu-3x) or "
                        "named profiles (--profiles lists them); repeat the flag for "
                        "several job sizes. Default: the first run's workers as recorded")
    parser.add_argument("--scheme", action="append", metavar="NAME",
                        help=f"{SCHEME_FORMS}; repeat for several. Default: the first run's own "
                        "scheme with the recorded mix, else "
                        f"{', '.join(DEFAULT_SCHEMES)}")
    parser.add_argument("--steps", type=int,
                        help="steps per simulated run (default: the first run's steps after "
                        "warm-up)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="simulated repeats, each with its own draws (default 1)")
    parser.add_argument("--global-batch", type=int,
                        help="samples per step (default: the first run's samples per worker "
                        "x the workers simulated)")
    parser.add_argument("--servers", type=int, default=1,
                        help="parameter servers for backup, ssp and ps-async (default 1)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the first repeat")
    arguments.add_run_filter(parser, "fit only the runs")
    parser.add_argument("--out", type=arguments.folder, default=Path("results"),
                        help=f"results folder (default: results/); runs go to {SUITE}/")
    parser.add_argument("--max-records", type=int, default=RECORDS_LIMIT,
                        help="write steps.parquet only for simulations of at most this many "
                        f"worker-steps (default {RECORDS_LIMIT:,}); larger ones: summary only")
    parser.add_argument("--save-profiles", type=Path, metavar="DIR",
                        help="also write each fitted class as a named profile into DIR")
    parser.add_argument("--profiles", action="store_true",
                        help="list the named profiles and where each came from, and exit")
    parser.add_argument("--no-figures", action="store_true", help="no scale figure")


def _bounded(value: int | None, name: str, low: int, high: int) -> None:
    if value is not None and not low <= value <= high:
        raise UsageError(name, f"{value} is outside {low}..{high:,}")


def run(args: argparse.Namespace) -> int:
    from hetbench.analysis.models import deviceclass
    from hetbench.analysis.models.simulate import parse_scheme

    profiles = deviceclass.named_profiles()
    if args.profiles:
        for name, data in profiles.items():
            origin = data.get("origin", {})
            slowdown = f"slowdown {data['slowdown']:g}" if not data.get("slowdown_at") else \
                "slowdown " + ",".join(f"{f:g}@{s}" for s, f in data["slowdown_at"])
            print(f"{name:24s} {data['a_ns'] / 1e3:.1f} us + {data['b_ns'] / 1e3:.2f} us/sample,"
                  f" {slowdown}; {origin.get('description', '')}, {origin.get('made', '')}")
        return 0
    _bounded(args.steps, "--steps", 1, MAX_STEPS)
    _bounded(args.repeats, "--repeats", 1, MAX_REPEATS)
    _bounded(args.global_batch, "--global-batch", 1, 10**9)
    _bounded(args.seed, "--seed", 0, 2**32 - 1)
    _bounded(args.servers, "--servers", 1, 4096)
    _bounded(args.max_records, "--max-records", 0, 10**9)
    schemes = []
    for text in args.scheme or []:
        try:
            schemes.append(parse_scheme(text))
        except ValueError as exc:
            raise UsageError("--scheme", str(exc)) from None
    mixes = [deviceclass.parse_mix(text) for text in args.mix or []]
    if not args.results and not mixes:
        raise UsageError("RESULTS", "give recorded runs to fit, or --mix with named "
                         "profiles (--profiles lists them)")
    runs = load_runs(args.results, args.runs) if args.results else []
    classes, names = deviceclass.fit_classes(runs) if runs else ({}, {})
    comm = deviceclass.fit_comm(runs) if runs else None
    from hetbench.harness.records.results import writable_folder

    jobs = _jobs(runs, names, mixes, schemes, args)
    for job in jobs:  # every name resolved before anything is written
        job["classes"], profile_comm = deviceclass.resolve_mix(job["mix"], classes, names,
                                                               profiles)
        job["comm"] = comm or profile_comm
    out = writable_folder(args.out / SUITE, "--out")
    if args.save_profiles:
        _save_profiles(args.save_profiles, classes, comm, runs)
    return _simulate_all(jobs, runs, out, args)


def load_runs(paths: list[Path], patterns: list[str] | None) -> list[Any]:
    """The runs at `paths` (Run), those whose name matches one of `patterns` where given."""
    from hetbench.harness.records.results import find_runs, load_run

    loaded = [load_run(p) for p in find_runs(paths)]
    if patterns is not None:
        kept = set(picked([r.name for r in loaded], patterns,
                          f" at {' '.join(map(str, paths))}"))
        loaded = [r for r in loaded if r.name in kept]
    return loaded


def _jobs(runs: list[Any], names: dict[str, str], mixes: list[Any], schemes: list[Any],
          args: argparse.Namespace) -> list[dict[str, Any]]:
    """(mix, scheme, sizes, steps, global batch) of every simulated configuration."""
    from hetbench.analysis.models import deviceclass
    from hetbench.analysis.models.simulate import parse_scheme

    first = runs[0] if runs else None
    recorded_sizes = None
    if not mixes:  # the recorded job: its workers, its slices, its scheme unless given
        mixes = [deviceclass.recorded_mix(runs, names)]
        if first is not None:
            text, recorded_sizes = deviceclass.recorded_scheme(first)
            schemes = schemes or [parse_scheme(text)]
    schemes = schemes or [parse_scheme(s) for s in DEFAULT_SCHEMES]
    per_worker = None
    default_steps = 1000
    if first is not None:
        meta = first.manifest
        per_worker = meta["run"]["global_batch"] / max(len(meta["workers"]), 1)
        default_steps = max(meta["run"]["steps"] - meta["run"].get("warmup_steps", 0), 1)
    jobs = []
    for mix in mixes:
        workers = sum(count for _, count in mix)
        batch = args.global_batch or (round(per_worker * workers) if per_worker else 64 * workers)
        if batch < workers:
            raise UsageError("--global-batch", f"{batch} samples cannot be shared by {workers} "
                             "workers (one sample each at least)")
        for scheme in schemes:
            sizes = recorded_sizes if (scheme.simulated.takes_sizes and args.mix is None) \
                else None
            jobs.append({"mix": mix, "scheme": scheme, "sizes": sizes, "workers": workers,
                         "steps": args.steps or default_steps, "global_batch": batch})
    return jobs


def _simulate_all(jobs: list[dict[str, Any]], runs: list[Any], out: Path,
                  args: argparse.Namespace) -> int:
    import pandas as pd

    from hetbench.analysis.models.simulate import simulate, summarise
    from hetbench.harness.records.rundir import new_launch

    launch, rows = new_launch(), []
    for job in jobs:
        workers, model = job["classes"], job["comm"]
        for repeat in range(args.repeats):
            started = time.perf_counter()
            sim = simulate(workers, model, job["scheme"], job["steps"], job["global_batch"],
                           seed=args.seed + repeat, sizes=job["sizes"], servers=args.servers)
            seconds = time.perf_counter() - started
            summary = summarise(sim)
            written = ""
            if sim.kept.sum() <= args.max_records:
                written = _write_run(out, sim, job, repeat, launch, summary, runs, model, args)
            rows.append({"mix": _mix_text(job["mix"]), "scheme": job["scheme"].label,
                         "repeat": repeat, **summary, "seconds": seconds, "run": written})
            print(_line(rows[-1]))
    table = pd.DataFrame(rows)
    summary_path = out / f"summary-{launch}.csv"  # one per invocation, none overwritten
    table.to_csv(summary_path, index=False)
    skipped = int((table["run"] == "").sum())
    if skipped:
        print(f"({skipped} simulation(s) above --max-records {args.max_records:,} worker-steps:"
              " summary only, no run directory)")
    print(f"summary: {summary_path}")
    if not args.no_figures and table["workers"].nunique() > 1:
        from hetbench.analysis.render.figures import scale_figure

        classes = sorted({name.rpartition(":")[0] for mix in table["mix"].unique()
                          for name in mix.split(",")})
        paths = scale_figure(table, out / "figures", f"simulated: {table['workers'].min()} to "
                             f"{table['workers'].max()} workers of {', '.join(classes)}",
                             f"scale-{launch}")
        print(f"figure: {paths[0]}")
    return 0


def _mix_text(mix: list[tuple[str, int]]) -> str:
    return ",".join(f"{name}:{count}" for name, count in mix)


def _line(row: dict[str, Any]) -> str:
    return (f"{row['mix']:24s} {row['scheme']:12s} r{row['repeat']}: {row['workers']} workers, "
            f"{row['mean_step_ms']:.2f} ms/step (p99 {row['p99_step_ms']:.2f}), idle "
            f"{row['idle_fraction']:.1%}, {row['samples_per_s']:.0f} samples/s, staleness "
            f"{row['mean_staleness']:.2f} [{row['seconds']:.2f} s]")


def _write_run(out: Path, sim: Any, job: dict[str, Any], repeat: int, launch: str,
               summary: dict[str, Any], runs: list[Any], comm: Any,
               args: argparse.Namespace) -> str:
    """A run directory like a real run's: manifest (marked simulated) and steps.parquet."""
    from hetbench.analysis.models.simulate import BLOCK, records
    from hetbench.harness.records import collector, manifest
    from hetbench.harness.records.rundir import RUN_FILE

    scheme = job["scheme"]
    name = f"{scheme.label.replace(':', '')}-n{job['workers']}"
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    run_dir, n = out / f"{name}-r{repeat}-{stamp}", 1
    while run_dir.exists():
        run_dir, n = out / f"{name}-r{repeat}-{stamp}-{n}", n + 1
    run_dir.mkdir(parents=True)
    recorded = runs[0].spec if runs else {}
    simulated = SIMULATED[scheme.name]
    policy = simulated.policy or ("sizes" if job["sizes"] else "equal")
    default = AggregatorSpec()
    run = {
        "name": name, "framework": recorded.get("framework", "pytorch"),
        "workload": recorded.get("workload"), "dataset": recorded.get("dataset"),
        "size": recorded.get("size", "small"), "steps": job["steps"], "warmup_steps": 0,
        "global_batch": job["global_batch"], "instrument": True, "seed": args.seed + repeat,
        "partition": {"policy": policy, "sizes": list(job["sizes"]) if job["sizes"] else None},
        "aggregator": {"name": simulated.aggregator, "staleness": default.staleness,
                       "backup": default.backup, "local_steps": default.local_steps,
                       **({simulated.key: scheme.value} if simulated.key else {})},
        "workers": [_worker(cls) for cls in sim.workers],
    }
    emulated = any(w["slowdown"] != 1.0 or w["slowdown_at"] for w in run["workers"])
    meta = manifest.new({"name": SUITE, "description": "hetbench simulate"}, run, repeat,
                        run_dir.name, environment.describe(),
                        "emulated" if emulated else "homogeneous")
    meta.update(
        status="completed", end=manifest.now_iso(), launch=launch,
        workers=[{"rank": i, "label": f"{cls.name} (simulated)", "host": "simulated",
                  "device": _worker(cls)["device"]} for i, cls in enumerate(sim.workers)],
        partition_history=sim.partition_history,
        simulated={"from": sorted({r for c in sim.workers for r in c.origin.get("from", [])})
                   or sorted({str(c.origin.get("profile")) for c in sim.workers}),
                   "mix": _mix_text(job["mix"]), "scheme": scheme.label, "block": BLOCK,
                   "servers": args.servers,
                   "comm": comm.describe(),
                   "classes": {c.name: c.describe() for c in {id(c): c for c in
                                                              sim.workers}.values()},
                   "summary": summary})
    (run_dir / RUN_FILE).write_text(json.dumps({"suite": SUITE, "run": run}))
    manifest.write(run_dir, meta)
    collector.write_steps(run_dir, collector.records_frame([records(sim)]))
    return str(run_dir)


def _worker(cls: Any) -> dict[str, Any]:
    s = cls.schedule
    device = "cpu" if "cpu" in cls.name else cls.name.split("-")[0]
    return {"device": device, "threads": 1, "slowdown": s.slowdown,
            "slowdown_at": [list(p) for p in s.slowdown_at] if s.slowdown_at else None,
            "jitter": list(s.jitter) if s.jitter else None, "class": cls.name}


def _save_profiles(folder: Path, classes: dict[str, Any], comm: Any, runs: list[Any]) -> None:
    from hetbench.analysis.models import deviceclass

    folder.mkdir(parents=True, exist_ok=True)
    meta = runs[0].manifest
    workload = deviceclass.workload_name(meta)
    host = environment.describe()
    for cls in classes.values():
        origin = {"description": f"fitted by hetbench simulate from {len(cls.sources)} "
                  f"recorded worker(s) of suite {meta['suite']['name']}",
                  "runs": sorted({s.run_id for s in cls.sources}),
                  "machine": {k: host.get(k) for k in ("host", "cpu_model", "cpu_count",
                                                        "platform", "git") if k in host},
                  "made": time.strftime("%Y-%m-%d", time.gmtime())}
        data = deviceclass.profile_json(cls, comm, workload, origin)
        (folder / f"{data['name']}.json").write_text(json.dumps(data, indent=1))
        print(f"profile {data['name']} -> {folder}")
