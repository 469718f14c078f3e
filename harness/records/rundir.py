"""A run directory: its layout (DESIGN.md), made when a run starts, closed however it ends.

Made by the launcher (or by rank 0 under torchrun): manifest.json saying `running`, with
the process that will close it; run.json with the run's configuration for its workers; a
reserve file that leaves room to close the run on a full disk. Closed by the launcher,
by rank 0 under torchrun, or by `hetbench recover` when its launcher died: the manifest
says how it ended and why, and the flushed records become steps.parquet.
"""

from __future__ import annotations

import glob
import json
import os
import re
import socket
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hetbench.harness.records import collector, jsonfile, manifest, trace
from hetbench.harness.spec.errors import NotClosed, UsageError
from hetbench.harness.spec.suite import RunSpec, run_from_dict
from hetbench.harness.system import environment, paths, procfs, services

RUN_FILE = "run.json"  # the run's configuration, read by its workers and servers


@dataclass(frozen=True)
class RunResult:
    run: RunSpec
    repeat: int
    run_dir: Path
    status: str
    reason: str


def new_launch() -> str:
    """The id of one `hetbench run` (or one torchrun job): its runs share it."""
    return f"{datetime.now(UTC).strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"


def next_repeat(suite_dir: Path, run_name: str) -> int:
    """The repeat number a new launch of run `run_name` into this suite folder starts from:
    after every repeat of that run already there, so that two launches of a run never share
    a number, and a run launched for the first time is repeat 0 whatever other runs the
    folder holds (`-k` one run at a time)."""
    named = re.compile(re.escape(run_name) + r"-r(\d+)-\d{8}T\d{6}(?:-\d+)?")
    found = [int(m.group(1)) for d in suite_dir.glob(f"{glob.escape(run_name)}-r*-*")
             if (m := named.fullmatch(d.name))] if suite_dir.is_dir() else []
    return max(found) + 1 if found else 0


def prepare_run_dir(out: Path, suite_name: str, run: RunSpec, repeat: int,
                    suite_info: dict[str, Any] | None = None,
                    launch: str | None = None) -> Path:
    """results/<suite>/<run-id>/ with manifest.json (status running) and run.json."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    # the suite's folder in a shared results folder may have been planted since --out
    if (found := paths.foreign_link(out / suite_name)) is not None:
        raise UsageError(str(found[0]), paths.refusal(*found))
    base = out / suite_name / f"{run.name}-r{repeat}-{stamp}"
    run_dir, n = base, 1
    while run_dir.exists():
        run_dir, n = base.with_name(f"{base.name}-{n}"), n + 1
    (run_dir / collector.PARTS_DIR).mkdir(parents=True)
    collector.reserve_space(run_dir)
    suite = suite_info or {"name": suite_name}
    (run_dir / RUN_FILE).write_text(json.dumps({"suite": suite_name, "run": run.to_dict()}))
    meta = manifest.new(suite, run.to_dict(), repeat, run_dir.name, environment.describe(),
                        run.heterogeneity)
    meta["launch"] = launch or new_launch()
    meta["load"] = core_load(run)
    # which process closes the run (recover tells a dead one from a live one by it)
    meta["launcher"] = {"host": socket.gethostname(), "pid": os.getpid(),
                        "started": procfs.start_ticks(os.getpid())}
    manifest.write(run_dir, meta)
    return run_dir


def core_load(run: RunSpec) -> dict[str, Any]:
    """What the run asks of this host's cores, and what else ran on them when it started:
    compute that needs more cores than there are (oversubscribed) waits for a core, and
    that waiting is in every timing the run records. The demand counts each worker's
    threads, a slowed CPU worker's as the share of the time it computes (it sleeps the
    rest: WorkerSpec.core_share)."""
    cores = len(os.sched_getaffinity(0))
    threads = sum(w.threads for w in run.workers)
    demand = sum(w.core_share for w in run.workers)
    return {"worker_threads": threads, "cpu_demand": round(demand, 3), "cores": cores,
            "oversubscribed": demand > cores, "load_average_1m": round(os.getloadavg()[0], 2)}


def close_run(run_dir: Path, run: RunSpec, status: str, reason: str, repeat: int = 0,
              dropped: list[dict[str, Any]] | None = None) -> RunResult:
    """Make sure the run directory says how it ended and holds every flushed record."""
    current = manifest.read(run_dir)
    if status == "completed" and current.get("status") == "completed":
        collector.remove_temporary(run_dir)
        return RunResult(run, repeat, run_dir, "completed", "")
    extra: dict[str, Any] = {}
    if status == "completed" and run.on_worker_failure == "continue":
        extra = _survivors_finish(run_dir, run.world_size, dropped or [])
        if not extra:
            status, reason = "failed", "no worker left its parameters"
    elif status == "completed":  # workers exited 0 but rank 0 did not finish the directory
        status, reason = "failed", "workers exited without finishing the run directory"
    infos = worker_infos(run_dir, run.world_size)
    parts = collector.read_parts(run_dir)
    frame = None
    try:
        frame = collector.write_records(run_dir, parts, collector.read_clock(run_dir))
        rows = len(frame)
    except OSError as exc:  # a full disk: the records stay in their parts, readable
        collector.remove_temporary(run_dir)
        rows = sum(len(p) for p in parts)
        status, reason = "failed", "; ".join(filter(None, [
            reason, f"could not write {exc.filename or run_dir} ({exc.strerror or exc}); "
            f"the {rows} flushed step records stay in {collector.PARTS_DIR}/"]))
    closing = {"status": status, "reason": reason, "end": manifest.now_iso(), "workers": infos,
               "rows": rows, **collector.read_partition_log(run_dir), **extra}
    if run.script is not None and frame is not None and isinstance(current.get("run"), dict):
        # a loop's steps are the script's to decide: the manifest says what it recorded
        closing["run"] = {**current["run"], "steps": int(frame["step"].nunique())}
    try:
        manifest.update(run_dir, **closing)
    except OSError:  # a full disk: the reserve's room, then once more
        try:
            collector.remove_temporary(run_dir)
            manifest.update(run_dir, **closing)
        except OSError as exc:  # not a full disk: a folder nobody may write
            raise NotClosed(run_dir, exc) from exc
    if frame is not None:  # closed: the trace is derived, and bounded (run.trace_steps)
        try:
            trace.write_trace(run_dir, frame, labels(infos), run.trace_steps)
        except OSError:  # a full disk: `hetbench report` writes a missing trace later
            pass
    collector.remove_temporary(run_dir)
    return RunResult(run, repeat, run_dir, status, reason)


def labels(infos: list[dict[str, Any]]) -> list[str]:
    """How the trace names each worker: its label from its description."""
    return [str(i.get("label", f"worker {r}")) for r, i in enumerate(infos)]


def write_missing_trace(run_dir: Path, meta: dict[str, Any], steps: Any) -> bool:
    """A closed run's trace, where its closing stopped before the trace (a SIGKILL during
    it, a full disk): written from its steps; True when written."""
    trace_steps = trace.recorded_window(meta.get("run", {}).get("trace_steps",
                                                                RunSpec.trace_steps))
    if (meta.get("status") == "running" or trace_steps == 0 or steps.empty
            or (run_dir / collector.TRACE_FILE).exists()):
        return False
    infos = meta.get("workers") or []
    columns = [c for c in collector.RECORD_FIELDS if c in steps.columns]
    trace.write_trace(run_dir, steps[columns], labels(infos), trace_steps)
    return True


def complete(run_dir: Path, arrays: list[Any], infos: list[dict[str, Any]],
             parameters: dict[str, Any] | None, clock: dict[str, Any], backend: str,
             closing: dict[str, Any], side: dict[str, list[Any]] | None = None) -> None:
    """A run that ended well, from every worker's records (RECORD_DTYPE arrays) and what
    each was (`infos`): steps.parquet and the trace, the side tables (`side`: rows by the
    table's file name, collector.SIDE_TABLES), params.npz (`parameters`, the whole
    model's), the manifest completed with `closing` in it. `clock`: start and end offsets;
    applied to the records when the workers do not share one clock domain."""
    import numpy as np

    same_clock = len({i.get("clock_domain") for i in infos}) <= 1
    frame = collector.write_records(run_dir, arrays, None if same_clock else clock, side)
    if parameters is not None:
        np.savez(run_dir / "params.npz", **parameters)
    meta = manifest.update(run_dir, status="completed", end=manifest.now_iso(), workers=infos,
                           rows=len(frame), clock={"same_clock": same_clock,
                                                   "applied": not same_clock, **clock},
                           backend=backend, **closing)
    trace.write_trace(run_dir, frame, labels(infos), trace.recorded_window(
        meta["run"].get("trace_steps", RunSpec.trace_steps)))


def recover(run_dir: Path) -> RunResult:
    """Close a run whose launcher died without closing it (a SIGKILL, a power cut): failed,
    its records written from the flushed parts, nothing lost. Its workers and services died
    with the launcher (they are told to, at start). Refused, with the reason, while the
    launcher lives or where this host cannot tell (UsageError)."""
    from hetbench.harness.records.results import checked_steps, require_launcher_gone  # pandas

    meta = manifest.read(run_dir)
    if meta.get("status") != "running":
        raise UsageError(str(run_dir), f"not running: it is already closed "
                         f"({meta.get('status')})")
    launcher = meta.get("launcher") or {}
    require_launcher_gone(meta, str(run_dir))
    try:  # no record that the readers would refuse is written
        checked_steps(run_dir, meta)
    except UsageError as exc:
        raise UsageError(exc.where, f"{exc.message}; recover writes no damaged record (move "
                                    "the file aside to close the run from the others)"
                         ) from None
    result = close_run(run_dir, run_from_dict(meta["run"]), "failed",
                       f"its launcher (pid {launcher.get('pid')}) ended without closing the "
                       "run; closed by hetbench recover from the flushed records",
                       int(meta.get("repeat", 0)))
    services.remove_private_tmp(meta.get("tmp"))  # what the dead launcher did not remove
    return result


def _survivors_finish(run_dir: Path, world_size: int, dropped: list[dict[str, Any]]
                      ) -> dict[str, Any]:
    """What rank 0 writes at the end of a run, taken from the lowest rank that finished
    (a run that went on without dead workers has no collective at its end): its parameters
    (the servers' at its last pull) and manifest entries, plus the workers dropped."""
    parts = run_dir / collector.PARTS_DIR
    for rank in range(world_size):
        params, finish = parts / f"params-rank{rank}.npz", parts / f"finish-rank{rank}.json"
        if params.is_file() and finish.is_file():
            params.replace(run_dir / "params.npz")
            return {**jsonfile.read(finish, "survivor's closing"), "dropped_workers": dropped,
                    "params_from_rank": rank}
    return {}


def worker_infos(run_dir: Path, world_size: int) -> list[dict[str, Any]]:
    infos = []
    for rank in range(world_size):
        path = run_dir / collector.PARTS_DIR / f"rank{rank}.json"
        info: dict[str, Any] = {"rank": rank}
        if path.is_file():
            try:
                info = jsonfile.read(path, "worker description")
            except UsageError as exc:  # the run is closed without it, and says so
                print(f"hetbench: warning: {exc}; worker {rank}'s description is left out "
                      "of the manifest", file=sys.stderr)
        infos.append(info if isinstance(info, dict) else {"rank": rank})
    return infos


