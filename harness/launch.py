"""Starts one OS process per worker on this host, joined over torch.distributed (env://).

The launcher imports no framework. It watches the workers: when one dies the others are
stopped within a bounded time, and whatever they flushed becomes the run's records, marked
`failed` (or `interrupted` on Ctrl-C) with the reason. For several hosts, start
harness.worker with torchrun instead (README).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from adapters import missing_framework
from harness import collector, environment, manifest
from harness.aggregators import services as aggregator_services
from harness.config import RunSpec, SuiteSpec
from harness.errors import DeviceUnavailable
from harness.worker import RUN_FILE

POLL_S = 0.1
TERMINATE_GRACE_S = 5.0
SERVICE_FAILURE_GRACE_S = 0.5


@dataclass(frozen=True)
class RunResult:
    run: RunSpec
    repeat: int
    run_dir: Path
    status: str
    reason: str


def prepare_run_dir(out: Path, suite_name: str, run: RunSpec, repeat: int,
                    suite_info: dict[str, Any] | None = None) -> Path:
    """results/<suite>/<run-id>/ with manifest.json (status running) and run.json."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    base = out / suite_name / f"{run.name}-r{repeat}-{stamp}"
    run_dir, n = base, 1
    while run_dir.exists():
        run_dir, n = base.with_name(f"{base.name}-{n}"), n + 1
    (run_dir / collector.PARTS_DIR).mkdir(parents=True)
    suite = suite_info or {"name": suite_name}
    (run_dir / RUN_FILE).write_text(json.dumps({"suite": suite_name, "run": run.to_dict()}))
    manifest.write(run_dir, manifest.new(suite, run.to_dict(), repeat, run_dir.name,
                                         environment.describe(), run.heterogeneity))
    return run_dir


def gpu_count(framework: str) -> int:
    """GPUs that `framework` itself sees here, probed in a throw-away process (the launcher
    imports no framework). It can differ between frameworks on one host: tensorflow-cpu
    and MXNet's CPU wheel see none even where torch sees several."""
    from harness.cli.devices import DEFAULT_TIMEOUT_S, probe

    info = probe(framework, DEFAULT_TIMEOUT_S)
    if info.status != "ok":
        raise DeviceUnavailable(framework, f"cannot list its GPUs: {info.reason}")
    return sum(d.startswith(("cuda:", "gpu:")) for d in info.devices)


def check_devices(run: RunSpec, where: str, gpu_counts: dict[str, int]) -> None:
    """Raise DeviceUnavailable naming the first worker whose device or framework this host
    lacks (a framework is looked up, not imported). `gpu_counts` caches the probes per
    framework across the runs of a suite."""
    cores_here = os.sched_getaffinity(0)
    for i, w in enumerate(run.workers):
        absent = missing_framework(w.framework)
        if absent:
            raise DeviceUnavailable(f"{where}.workers[{i}].framework", absent)
        if w.is_cuda:
            if w.framework not in gpu_counts:
                gpu_counts[w.framework] = gpu_count(w.framework)
            count, index = gpu_counts[w.framework], int(w.device.split(":")[1])
            if index >= count:
                raise DeviceUnavailable(f"{where}.workers[{i}].device",
                                        f"{w.device} not available ({w.framework} sees "
                                        f"{count} GPU(s) on this host)")
        missing = sorted(set(w.cores or ()) - cores_here)
        if missing:
            raise DeviceUnavailable(f"{where}.workers[{i}].cores",
                                    f"cores {missing} not available (allowed: "
                                    f"{sorted(cores_here)})")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def worker_environment(run: RunSpec, rank: int, port: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
        "LOCAL_RANK": str(rank), "WORLD_SIZE": str(run.world_size),
        "GLOO_SOCKET_IFNAME": "lo", "HETBENCH_LAUNCHER_PID": str(os.getpid()),
        "PYTHONUNBUFFERED": "1",
    })
    return env


def skip_run(out: Path, suite: SuiteSpec, run: RunSpec, repeat: int, reason: str) -> RunResult:
    run_dir = prepare_run_dir(out, suite.name, run, repeat, suite_info(suite))
    manifest.update(run_dir, status="skipped", reason=reason, end=manifest.now_iso())
    return RunResult(run, repeat, run_dir, "skipped", reason)


def suite_info(suite: SuiteSpec) -> dict[str, Any]:
    return {"name": suite.name, "source": suite.source, "repeats": suite.repeats,
            "description": suite.description}


def launch_local(out: Path, suite: SuiteSpec, run: RunSpec, repeat: int,
                 progress: Any = None) -> RunResult:
    run_dir = prepare_run_dir(out, suite.name, run, repeat, suite_info(suite))
    port = free_port()
    logs = run_dir / "logs"
    logs.mkdir()
    # the aggregator's own processes (parameter servers, MXNet's ps-lite scheduler and
    # server), stopped below, and what its workers must be told (their addresses)
    services = aggregator_services.start(run, free_port, logs, run_dir)
    procs = []
    status, reason = "completed", ""
    # Services end by themselves once every worker has left them cleanly; after a failure or
    # a Ctrl-C nobody will, so they are signalled almost at once.
    grace_s = SERVICE_FAILURE_GRACE_S
    try:
        for rank in range(run.world_size):
            with open(logs / f"rank{rank}.log", "wb") as log:
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "harness.worker", "--run-dir", str(run_dir)],
                    env=worker_environment(run, rank, port) | services.env, stdout=log,
                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                ))
        status, reason, dropped = _watch(procs, run, run_dir, progress, services)
        if status == "completed" and dropped:
            reason = "; ".join(f"worker {d['rank']} dropped after {d['steps']} steps "
                               f"(status {d['status']}: {d['reason']})" for d in dropped)
        if status == "completed" and run.on_worker_failure != "continue":
            # (a run that may go on without a worker ends without a graceful goodbye)
            grace_s = aggregator_services.STOP_GRACE_S
    except KeyboardInterrupt:
        _stop(procs)
        close_run(run_dir, run, "interrupted", "interrupted by the user (Ctrl-C)", repeat)
        raise
    finally:
        services.stop(grace_s)
    return close_run(run_dir, run, status, reason, repeat, dropped)


def _watch(procs: list[subprocess.Popen[bytes]], run: RunSpec, run_dir: Path,
           progress: Any, services: aggregator_services.Services | None = None
           ) -> tuple[str, str, list[dict[str, Any]]]:
    """Wait for the workers; on the first failure (of a worker, or of a process the
    aggregator needs) stop the rest, unless the run goes on without a dead worker
    (on_worker_failure = "continue") while any other lives. Returns (status, reason, the
    workers dropped)."""
    last_progress, last_change = -1, time.monotonic()
    # No progress for longer than a collective may wait (plus start-up) means a hang.
    stall_limit = 2 * run.timeout_s + 60
    dropped: list[dict[str, Any]] = []
    while True:
        codes = [p.poll() for p in procs]
        gone = {d["rank"] for d in dropped}
        failed = [(r, c) for r, c in enumerate(codes) if c not in (None, 0) and r not in gone]
        living = [r for r, c in enumerate(codes) if c is None]
        if failed and run.on_worker_failure == "continue" and living:
            for rank, code in failed:
                dropped.append({"rank": rank, "status": code,
                                "reason": _worker_reason(run_dir, rank),
                                "steps": collector.steps_done(run_dir, 1, [rank])})
            continue
        if failed:
            # A worker killed by a signal (negative status) is the cause; the others it
            # leaves behind fail with collective errors, sometimes within the same poll.
            rank, code = min(failed, key=lambda rank_code: (rank_code[1] > 0, rank_code[0]))
            _stop(procs)
            return "failed", f"worker {rank} exited with status {code}: " + _worker_reason(
                run_dir, rank), dropped
        if all(c == 0 or r in gone for r, c in enumerate(codes)):
            return "completed", "", dropped
        if services is not None and (dead := services.failed()) is not None:
            _stop(procs)
            name, code = dead
            return "failed", f"{name} exited with status {code} while the workers ran", dropped
        done = collector.steps_done(run_dir, run.world_size, living)
        if progress is not None and done != last_progress:
            progress(done)
        if done != last_progress:
            last_progress, last_change = done, time.monotonic()
        elif time.monotonic() - last_change > stall_limit:
            _stop(procs)
            return ("failed", f"no step completed for {stall_limit:.0f} s; workers stopped",
                    dropped)
        time.sleep(POLL_S)


def _worker_reason(run_dir: Path, rank: int) -> str:
    if error := collector.read_error(run_dir, rank):
        return error
    log = run_dir / "logs" / f"rank{rank}.log"
    lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()] \
        if log.is_file() else []
    return lines[-1].strip() if lines else "no message"


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM (workers flush and exit), then SIGKILL whatever is left after a grace period."""
    for p in procs:
        if p.poll() is None:
            _signal_group(p, signal.SIGTERM)
    deadline = time.monotonic() + TERMINATE_GRACE_S
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal_group(p, signal.SIGKILL)
            p.wait()


def _signal_group(p: subprocess.Popen[bytes], sig: int) -> None:
    try:
        os.killpg(p.pid, sig)
    except ProcessLookupError:
        pass


def close_run(run_dir: Path, run: RunSpec, status: str, reason: str, repeat: int = 0,
              dropped: list[dict[str, Any]] | None = None) -> RunResult:
    """Make sure the run directory says how it ended and holds every flushed record."""
    current = manifest.read(run_dir)
    if status == "completed" and current.get("status") == "completed":
        return RunResult(run, repeat, run_dir, "completed", "")
    extra: dict[str, Any] = {}
    if status == "completed" and run.on_worker_failure == "continue":
        extra = _survivors_finish(run_dir, run.world_size, dropped or [])
        if not extra:
            status, reason = "failed", "no worker left its parameters"
    elif status == "completed":  # workers exited 0 but rank 0 did not finish the directory
        status, reason = "failed", "workers exited without finishing the run directory"
    infos = _worker_infos(run_dir, run.world_size)
    rows = collector.finalize(run_dir, collector.read_parts(run_dir),
                              [i.get("label", f"worker {r}") for r, i in enumerate(infos)])
    manifest.update(run_dir, status=status, reason=reason, end=manifest.now_iso(),
                    workers=infos, rows=rows,
                    **{**collector.read_partition_log(run_dir), **extra})
    return RunResult(run, repeat, run_dir, status, reason)


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
            return {**json.loads(finish.read_text()), "dropped_workers": dropped,
                    "params_from_rank": rank}
    return {}


def _worker_infos(run_dir: Path, world_size: int) -> list[dict[str, Any]]:
    infos = []
    for rank in range(world_size):
        path = run_dir / collector.PARTS_DIR / f"rank{rank}.json"
        infos.append(json.loads(path.read_text()) if path.is_file() else {"rank": rank})
    return infos


def run_suite(suite: SuiteSpec, out: Path, skip_unavailable: bool = False,
              on_start: Any = None, on_end: Any = None, progress_factory: Any = None
              ) -> list[RunResult]:
    """Every run of the suite, repeats interleaved (all runs of repeat 0, then repeat 1, ...)
    so slow drifts of a shared machine spread over runs instead of biasing one."""
    unavailable: dict[str, str] = {}
    gpu_counts: dict[str, int] = {}
    for i, run in enumerate(suite.runs):
        try:
            check_devices(run, f"runs[{i}]", gpu_counts)
        except DeviceUnavailable as exc:
            if not skip_unavailable:
                raise
            unavailable[run.name] = str(exc)
    results = []
    for repeat in range(suite.repeats):
        for run in suite.runs:
            if run.name in unavailable:
                result = skip_run(out, suite, run, repeat, unavailable[run.name])
            else:
                if on_start:
                    on_start(run, repeat)
                progress = progress_factory(run) if progress_factory else None
                try:
                    result = launch_local(out, suite, run, repeat,
                                          progress.update if progress else None)
                finally:
                    if progress:
                        progress.close()
            results.append(result)
            if on_end:
                on_end(result)
    return results
