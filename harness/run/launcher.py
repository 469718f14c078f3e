"""Starts one OS process per worker on this host, joined over torch.distributed (env://).

The launcher imports no framework (across hosts, torch.distributed alone: the hosts'
launchers meet in its store). It watches the workers: when one dies the others are stopped
within a bounded time, and whatever they flushed becomes the run's records, marked
`failed` (or `interrupted` on Ctrl-C) with the reason. Across hosts (`hetbench run
--nnodes N` on each), every host's launcher starts and watches its own workers, and the
launchers keep the runs in lockstep through hetbench.harness.run.nodes (docs/howto/multi-host.md).
"""

from __future__ import annotations

import errno
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from hetbench.adapters import missing_framework
from hetbench.harness import exchange
from hetbench.harness.records import collector, manifest
from hetbench.harness.records.rundir import (
    RunResult,
    close_run,
    new_launch,
    next_repeat,
    prepare_run_dir,
)
from hetbench.harness.run.nodes import Nodes, Seat, prepare_share, record_share_tmp
from hetbench.harness.spec.errors import DeviceUnavailable, NodeLost, UsageError
from hetbench.harness.spec.loops import RUN_DIR_VARIABLE
from hetbench.harness.spec.suite import RunSpec, SuiteSpec
from hetbench.harness.spec.workers import cpu_list
from hetbench.harness.system import interfaces, procfs, signals
from hetbench.harness.system import sampler as system
from hetbench.harness.system import services as aggregator_services

POLL_S = 0.1
TERMINATE_GRACE_S = 5.0
SERVICE_FAILURE_GRACE_S = 0.5
STALL_GRACE_S = 1.0  # for workers stuck in a wait, between SIGTERM and SIGKILL
SETTLE_S = 3.0  # after a failure, for the healthy peers of a hung worker to time out too
# the fewest open files a run may be started with: measured here (`ulimit -n N; hetbench
# run` of a pair of PyTorch CPU workers), 24 were enough and 22 were not; other
# frameworks need more, and a limit between this and their needs is named by the reason
MIN_OPEN_FILES = 64
QUIET_S = 5.0  # no step for longer than this before a failure: the failures were waits
FULL_DISK_BYTES = 64 * 1024  # less free than this after a failure: it was the disk


def gpu_count(framework: str) -> int:
    """GPUs that `framework` itself sees here, probed in a throw-away process (the launcher
    imports no framework). It can differ between frameworks on one host: tensorflow-cpu
    and MXNet's CPU wheel see none even where torch sees several."""
    from hetbench.harness.run.probe import DEFAULT_TIMEOUT_S, probe

    info = probe(framework, DEFAULT_TIMEOUT_S)
    if info.status != "ok":
        raise DeviceUnavailable(framework, f"cannot list its GPUs: {info.reason}")
    return sum(d.startswith(("cuda:", "gpu:")) for d in info.devices)


def check_devices(run: RunSpec, where: str, gpu_counts: dict[str, int],
                  node: int | None = None) -> None:
    """Raise DeviceUnavailable naming the first worker whose device, cores or framework
    this host lacks (a framework is looked up, not imported). `gpu_counts` caches the
    probes per framework across the runs of a suite. `node`: across hosts, only the
    workers this host (that node) runs."""

    cores_here = os.sched_getaffinity(0)
    for i, w in enumerate(run.workers):
        if node is not None and w.node != node:
            continue
        absent = missing_framework(w.framework)
        if absent:
            raise DeviceUnavailable(f"{where}.workers[{i}].framework", absent)
        missing = set(w.cores or ()) - cores_here
        if missing:  # checked before the GPUs: probing them starts the framework
            raise DeviceUnavailable(f"{where}.workers[{i}].cores",
                                    f"{cpu_list(missing)} not available (this host allows "
                                    f"{cpu_list(cores_here)})")
        if w.is_cuda:
            if w.framework not in gpu_counts:
                gpu_counts[w.framework] = gpu_count(w.framework)
            count, index = gpu_counts[w.framework], int(w.device.split(":")[1])
            if index >= count:
                raise DeviceUnavailable(f"{where}.workers[{i}].device",
                                        f"{w.device} not available ({w.framework} sees "
                                        f"{count} GPU(s) on this host)")


def free_port(address: str = "127.0.0.1") -> int:
    """A TCP port free on `address` now (the one process that will listen is told it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((address, 0))
        return int(s.getsockname()[1])


def worker_environment(run: RunSpec, rank: int, port: int, seat: Seat | None = None
                       ) -> dict[str, str]:
    """What a worker is told: the rendezvous (rank 0 serves its store), its rank, the
    interface its libraries bind. On one host, loopback only (issue 18): the store listens
    on MASTER_ADDR alone (hetbench.harness.exchange.comm), gloo's pair sockets and TensorPipe's
    (RPC) listeners on lo. Across hosts, the master's address and this host's `seat.interface`."""
    env = dict(os.environ)
    ranks_here = [rank] if seat is None else seat.ranks
    env.update({
        "MASTER_ADDR": "127.0.0.1" if seat is None else seat.nodes.place.master_addr,
        "MASTER_PORT": str(port), "RANK": str(rank),
        "LOCAL_RANK": str(ranks_here.index(rank) if seat else rank),
        "WORLD_SIZE": str(run.world_size),
        "HETBENCH_LAUNCHER_PID": str(os.getpid()), "PYTHONUNBUFFERED": "1",
    })
    if seat is None:
        env.update({"GLOO_SOCKET_IFNAME": "lo", "TP_SOCKET_IFNAME": "lo"})
    else:
        env.update(interfaces.binding(seat.interface))
    return env


def worker_command(run: RunSpec, run_dir: Path) -> list[str]:
    """What each worker process runs: hetbench's own loop, or a script's run's script
    under this Python (as torchrun starts it), which joins through hetbench.join."""
    if run.script is not None:
        return [sys.executable, run.script, *run.args]
    return [sys.executable, "-m", "hetbench.harness.loop.worker", "--run-dir", str(run_dir)]


def script_environment(run: RunSpec, rank: int, run_dir: Path) -> dict[str, str]:
    """What a script's worker is told beyond a worker's: the run directory its session
    records into (its run.json says the run), and its threads before torch starts them
    (hetbench's own worker sets them itself before any framework import)."""
    if run.script is None:
        return {}
    threads = str(run.workers[rank].threads)
    return {RUN_DIR_VARIABLE: str(run_dir),
            **{name: threads for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS",
                                          "OPENBLAS_NUM_THREADS")}}


def skip_run(out: Path, suite: SuiteSpec, run: RunSpec, repeat: int, reason: str,
             launch: str | None = None) -> RunResult:
    run_dir = prepare_run_dir(out, suite.name, run, repeat, suite_info(suite), launch)
    manifest.update(run_dir, status="skipped", reason=reason, end=manifest.now_iso())
    collector.remove_temporary(run_dir)
    return RunResult(run, repeat, run_dir, "skipped", reason)


def suite_info(suite: SuiteSpec) -> dict[str, Any]:
    return {"name": suite.name, "source": suite.source, "repeats": suite.repeats,
            "description": suite.description}


def launch_local(out: Path, suite: SuiteSpec, run: RunSpec, repeat: int,
                 progress: StepsDone | None = None, launch: str | None = None,
                 seat: Seat | None = None,
                 run_dir: Path | None = None) -> RunResult:
    """One run on this host, or this host's part of one across hosts (`seat`, in
    `run_dir`: node 0's run directory, or another node's share of it). However it ends
    (completed, a failure here or on another host, Ctrl-C or SIGTERM, a fault of the
    launcher itself), the run directory is closed: every process stopped, the flushed
    records written, the manifest saying how it ended. An interrupt or a launcher error
    is raised again once the run is closed."""
    if run_dir is None:
        run_dir = prepare_run_dir(out, suite.name, run, repeat, suite_info(suite), launch)
    ranks = list(range(run.world_size)) if seat is None else seat.ranks
    procs: dict[int, subprocess.Popen[bytes]] = {}
    services = aggregator_services.Services()
    sampler: system.Sampler | None = None
    status, reason = "failed", ""
    dropped: list[dict[str, Any]] = []
    # Services end by themselves once every worker has left them cleanly; after a failure or
    # an interrupt nobody will, so they are signalled almost at once.
    grace_s = SERVICE_FAILURE_GRACE_S
    raised: BaseException | None = None
    try:
        port = free_port() if seat is None else seat.port
        logs = run_dir / "logs"
        logs.mkdir(exist_ok=True)
        # every process of the run in a TMPDIR of its own, and on one host in a network
        # namespace of its own (across hosts the workers need the host's network)
        services.make_private(logs, network=seat is None)
        if seat is not None:  # this host's servers, on its interface towards node 0
            services.address, services.node = seat.nodes.place.master_addr, seat.node
            services.across_hosts = True
            services.binding = interfaces.binding(seat.interface)
        if seat is None:
            manifest.update(run_dir, network=services.network, tmp=str(services.tmp))
        elif seat.nodes.place.coordinator:
            manifest.update(run_dir, network=f"host network, across {seat.nodes.place.nnodes} "
                            f"hosts on {seat.interface}", tmp=str(services.tmp),
                            nodes=seat.nodes.hosts)
        elif services.tmp is not None:  # another node's share: its TMPDIR for `recover`
            record_share_tmp(run_dir, services.tmp)
        if services.network.startswith("host ("):
            print("   warning: the run's listeners are reachable from this host (TensorFlow's "
                  f"on every interface): {services.network}", flush=True)
        # the aggregator's own processes (parameter servers, MXNet's ps-lite scheduler and
        # server) and what its workers must be told (their addresses)
        exchange.start_services(run, free_port if seat is None else seat.service_port,
                                logs, run_dir, services)
        for rank in ranks:
            procs[rank] = services.spawn(
                services.worker_command(worker_command(run, run_dir)),
                services.environment(worker_environment(run, rank, port, seat)
                                     | services.env | script_environment(run, rank, run_dir)),
                logs / f"rank{rank}.log")
        sampler = system.Sampler(lambda: [os.getpid(), *(p.pid for p in procs.values()),
                                          *(p.pid for p in services.procs.values())]).start()
        status, reason, dropped = _watch(procs, run, run_dir, progress, services,
                                         None if seat is None else seat.trouble,
                                         until_services_end=seat is not None and not procs)
        if status == "completed" and dropped:
            reason = "; ".join(f"worker {d['rank']} dropped after {d['steps']} steps "
                               f"(status {d['status']}: {d['reason']})" for d in dropped)
        if status == "completed" and run.on_worker_failure != "continue":
            # (a run that may go on without a worker ends without a graceful goodbye)
            grace_s = aggregator_services.STOP_GRACE_S
    except KeyboardInterrupt as exc:
        raised, status, reason = exc, "interrupted", signals.describe(exc)
    except NodeLost as exc:
        raised, status, reason = exc, "failed", str(exc)
    except Exception as exc:  # noqa: BLE001 - the run is closed, then the error goes on
        raised, status = exc, "failed"
        reason = f"the launcher failed: {type(exc).__name__}: {exc}"
    with signals.held() as held:
        if isinstance(raised, KeyboardInterrupt):
            print(f"\nhetbench: {reason}: stopping the workers, closing {run_dir}",
                  file=sys.stderr, flush=True)
        _stop(procs)
        services.stop(grace_s)
        if sampler is not None:
            try:
                system.write(run_dir, sampler.stop())
            except OSError:  # a full disk: the step records matter more (close_run says)
                pass
        if seat is None:
            result = close_run(run_dir, run, status, reason, repeat, dropped)
        else:
            try:
                result = seat.close(run_dir, run, repeat, status, reason, raised, dropped)
            except NodeLost as lost:
                if not isinstance(raised, KeyboardInterrupt):
                    raise
                # this host's share is closed; the interrupt stays what ends the launcher
                print(f"hetbench: {lost}", file=sys.stderr, flush=True)
    if raised is not None:
        raise raised
    if held:  # a Ctrl-C or SIGTERM during the closing: the suite stops now
        raise signals.as_interrupt(held[0])
    return result


def _watch(procs: dict[int, subprocess.Popen[bytes]], run: RunSpec, run_dir: Path,
           progress: StepsDone | None,
           services: aggregator_services.Services | None = None,
           trouble: Callable[[], str | None] | None = None, until_services_end: bool = False
           ) -> tuple[str, str, list[dict[str, Any]]]:
    """Wait for the workers (rank -> process); on the first failure (of a worker, or of a
    process the aggregator needs) stop the rest, unless the run goes on without a dead
    worker (on_worker_failure = "continue") while any other lives. `trouble`: why the
    workers must stop though none failed here (the run failed on another host), asked at
    every poll. `until_services_end`: a host with servers and no worker of the run, whose
    part ends when its servers end (the workers elsewhere left them). Returns (status,
    reason, the workers dropped)."""
    last_progress, last_change = -1, time.monotonic()
    dropped: list[dict[str, Any]] = []
    while True:
        codes = {r: p.poll() for r, p in procs.items()}
        gone = {d["rank"] for d in dropped}
        failed = [(r, c) for r, c in codes.items() if c not in (None, 0) and r not in gone]
        living = [r for r, c in codes.items() if c is None]
        if failed and services is not None and (dead := services.failed()) is not None \
                and dead[1] < 0:
            # a service killed by a signal, seen in the same poll as the workers that lost
            # it: the cause is the service (a worker's RPC error is what followed)
            _stop(procs)
            return "failed", _service_reason(*dead, run_dir), dropped
        if failed and services is not None:  # their last words read from their logs
            services.settle_logs(run_dir / "logs" / f"rank{r}.log" for r, _ in failed)
        if failed and run.on_worker_failure == "continue" and living:
            for rank, code in failed:
                dropped.append({"rank": rank, "status": code,
                                "reason": _worker_reason(run_dir, rank, code),
                                "steps": collector.steps_done(run_dir, 1, [rank])})
            continue
        if failed:
            reason = _failure_reason(procs, run_dir, time.monotonic() - last_change)
            _stop(procs)
            return "failed", reason, dropped
        if until_services_end:
            if services is not None and all(p.poll() == 0 for p in services.procs.values()):
                return "completed", "", dropped
        elif all(c == 0 or r in gone for r, c in codes.items()):
            return "completed", "", dropped
        if trouble is not None and (why := trouble()) is not None:
            _stop(procs, grace_s=STALL_GRACE_S)  # they may be stuck waiting for a lost peer
            return "failed", why, dropped
        if services is not None and (dead := services.failed()) is not None:
            _stop(procs)
            return "failed", _service_reason(*dead, run_dir, services), dropped
        if until_services_end:  # no worker here: their progress is watched where they are
            time.sleep(POLL_S)
            continue
        done = collector.steps_done(run_dir, run.world_size, living)
        if progress is not None and done != last_progress:
            progress(done)
        if done != last_progress:
            last_progress, last_change = done, time.monotonic()
        elif time.monotonic() - last_change > run.stall_limit_s(started=done > 0):
            stuck = time.monotonic() - last_change
            reason = "; ".join(_stopped_workers(procs)) or "workers stopped"
            # waits with no timeout (ps-lite) hold the workers in C code, where a SIGTERM
            # is not handled until they return: they could not flush more anyway
            _stop(procs, grace_s=STALL_GRACE_S)
            return "failed", f"no step completed for {stuck:.0f} s: {reason}", dropped
        time.sleep(POLL_S)


def _failure_reason(procs: dict[int, subprocess.Popen[bytes]], run_dir: Path,
                    quiet_s: float) -> str:
    """Why the run failed, naming the worker that caused it, not the healthy peers that
    failed waiting for it: a worker killed by a signal; else a worker that ran out of
    what the system gives a process (its log says: too many open files, no memory);
    else a stopped worker (SIGSTOP); else, when nothing had moved for a while (the
    failures are timeouts), the workers still alive once the others had time to exit,
    which did not answer; else the first worker to fail."""
    deadline = time.monotonic() + SETTLE_S  # healthy peers time out nearly together
    while time.monotonic() < deadline and not any(p.poll() is not None and p.returncode < 0
                                                  for p in procs.values()):
        if sum(p.poll() is None for p in procs.values()) <= 1 or _stopped_workers(procs):
            break
        time.sleep(POLL_S)
    codes = {r: p.poll() for r, p in procs.items()}
    killed = [r for r, c in codes.items() if c is not None and c < 0]
    failed = [r for r, c in codes.items() if c not in (None, 0)]
    first = failed[0]
    waited = f"worker {first}: {_worker_reason(run_dir, first, codes[first])}"
    starved = {r: why for r, p in sorted(procs.items())
               if (why := _starved(run_dir, r, p.pid if p.poll() is None else None))}
    if killed:
        reason = "; ".join(_worker_reason(run_dir, r, codes[r], named=True) for r in killed)
    elif starved:
        reason = "; ".join(f"worker {r} ran out of {why}" for r, why in starved.items())
        if first not in starved:
            reason += f" ({waited})"
    elif stopped := _stopped_workers(procs):
        reason = f"{'; '.join(stopped)} ({waited})"
    elif refused := {r: why for r, p in sorted(procs.items())
                     if codes[r] is None and (why := _store_refused(run_dir, r))}:
        # alive and trying: the store's server (rank 0) did not take their connections
        limit = procfs.open_files(procs[min(refused)].pid)
        hint = f"; workers may open {limit[1]} files (ulimit -n)" if limit else ""
        reason = (f"worker 0's store did not take the connection of "
                  f"{', '.join(f'worker {r}' for r in refused)} "
                  f"({refused[min(refused)]}{hint}) ({waited})")
    elif quiet_s > QUIET_S and (alive := [r for r, c in codes.items() if c is None]):
        reason = (f"{', '.join(f'worker {r}' for r in alive)} stopped answering (no step "
                  f"for {quiet_s:.0f} s) ({waited})")
    else:
        reason = _worker_reason(run_dir, first, codes[first], named=True)
    if _disk_full(run_dir):
        reason += f" (no space left on the device holding {run_dir})"
    return reason


# what a process runs out of, as its log says it (strerror: Python's, gloo's, c10d's
# messages all carry it), and what to do about it
STARVED = {
    os.strerror(errno.EMFILE): "file descriptors (Too many open files: raise `ulimit -n`)",
    os.strerror(errno.ENFILE): "file descriptors (the system's table is full)",
    os.strerror(errno.ENOMEM): "memory (Cannot allocate memory)",
    # c10d's libuv store says no more when its event loop cannot open its own descriptors
    "Failed to init uv loop": "file descriptors, most likely (the store's event loop did not "
                              "start, as when a process may open no more files: raise "
                              "`ulimit -n`)",
}


def _starved(run_dir: Path, rank: int, pid: int | None = None) -> str | None:
    """What worker `rank` ran out of, if its error or its log's end says, or (`pid`: it
    lives) if it holds as many descriptors as it may: a start-up failure, before any
    step, where the peer left waiting for it must not take the blame. (A store server
    that cannot accept a peer's connection says nothing: its peer sees a reset.)"""
    held = procfs.open_files(pid) if pid is not None else None
    if held is not None and held[0] >= held[1]:
        return STARVED[os.strerror(errno.EMFILE)].replace(
            "(", f"(all {held[1]} it may open; ", 1)
    text = _log_tail(run_dir, rank) + collector.read_error(run_dir, rank)
    found = [(text.rfind(message), why) for message, why in STARVED.items() if message in text]
    return max(found)[1] if found else None


STORE_RETRY = "TCP client failed to connect/validate to host "  # c10d's client, retrying


def _store_refused(run_dir: Path, rank: int) -> str | None:
    """Why worker `rank` keeps failing to join the run's store, if the last lines of its
    log are c10d's retries (the error they end with: a reset, a broken pipe)."""
    lines = _log_tail(run_dir, rank).splitlines()
    tried = [ln for ln in lines[-20:] if STORE_RETRY in ln]
    return tried[-1].rsplit("): ", 1)[-1].strip() if tried else None


def _log_tail(run_dir: Path, rank: int) -> str:
    return aggregator_services.log_tail(run_dir / "logs" / f"rank{rank}.log")


def _stopped_workers(procs: dict[int, subprocess.Popen[bytes]]) -> list[str]:
    return [f"worker {r} was stopped (SIGSTOP or a debugger)"
            for r, p in procs.items() if p.poll() is None and procfs.stopped(p.pid)]


def _disk_full(run_dir: Path) -> bool:
    try:
        return shutil.disk_usage(run_dir).free < FULL_DISK_BYTES
    except OSError:
        return False


def _service_reason(name: str, code: int, run_dir: Path,
                    services: aggregator_services.Services | None = None) -> str:
    """What ended a service while the workers ran: the signal that killed it, else its exit
    status and (`services`) its last log line."""
    if code < 0:  # a signal's victim says nothing of it in its log
        return f"{name} killed by {_signal_name(-code)} while the workers ran"
    reason = f"{name} exited with status {code} while the workers ran"
    if services is not None and (words := services.last_words(name, run_dir / "logs")):
        reason += f" ({words})"
    return reason


def _worker_reason(run_dir: Path, rank: int, code: int | None = None,
                   named: bool = False) -> str:
    """What ended a worker: the signal that killed it, else the error it recorded, else its
    log's last line. `named`: as a sentence about worker `rank`."""
    if code is not None and code < 0:
        killed = f"worker {rank} killed by {_signal_name(-code)}"
        # a signal the process raised itself (an abort, a crash): its last words say why
        last = _last_log_line(run_dir, rank) if -code in SELF_INFLICTED else None
        return f"{killed} ({last})" if last else killed
    prefix = f"worker {rank} exited with status {code}: " if named else ""
    if error := collector.read_error(run_dir, rank):
        return prefix + error
    return prefix + (_last_log_line(run_dir, rank) or "no message")


SELF_INFLICTED = {signal.SIGABRT, signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL}


def _last_log_line(run_dir: Path, rank: int) -> str | None:
    lines = [ln for ln in _log_tail(run_dir, rank).splitlines() if ln.strip()]
    return lines[-1].strip() if lines else None


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _stop(procs: dict[int, subprocess.Popen[bytes]], grace_s: float = TERMINATE_GRACE_S) -> None:
    """SIGTERM (workers flush and exit), then SIGKILL whatever is left after a grace period."""
    for p in procs.values():
        if p.poll() is None:
            _signal_group(p, signal.SIGTERM)
            _signal_group(p, signal.SIGCONT)  # a stopped worker flushes too, not only dies
    deadline = time.monotonic() + grace_s
    for p in procs.values():
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


def check_open_files(least: int | None = None) -> None:
    """Refuse, before anything runs, a limit on open files (`ulimit -n`) under which no
    worker starts: one that cannot open its store's connections fails the run with a
    reason that can only guess (a reset connection, a store waiting for clients)."""
    least = MIN_OPEN_FILES if least is None else least
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < least:
        raise UsageError("ulimit -n", f"a process here may open {soft} files, and a "
                         f"worker needs more than that (at least {least}): raise the limit "
                         f"(ulimit -n 1024)")


class RunProgress(Protocol):
    """What a run's progress is told as its workers record steps (`hetbench run`'s bar)."""

    def update(self, done: int) -> None:
        ...

    def close(self) -> None:
        ...


# Told of each step count the workers reach, as the launcher watches them
StepsDone = Callable[[int], None]


def run_suite(suite: SuiteSpec, out: Path, skip_unavailable: bool = False,
              on_start: Callable[[RunSpec, int], None] | None = None,
              on_end: Callable[[RunResult], None] | None = None,
              progress_factory: Callable[[RunSpec], RunProgress] | None = None,
              gpu_counts: dict[str, int] | None = None, nodes: Nodes | None = None
              ) -> list[RunResult]:
    """Every run of the suite, repeats interleaved (all runs of repeat 0, then repeat 1, ...)
    so slow drifts of a shared machine spread over runs instead of biasing one. One launch:
    its runs share a launch id, and their repeats are numbered on from those already in the
    suite's folder. `gpu_counts`: the GPUs each framework sees, where already probed.
    `nodes`: the hosts this launch spans (each runs this with its own `nodes`), in lockstep:
    node 0 numbers the runs and writes their directories."""
    check_open_files()
    unavailable: dict[str, str] = {}
    gpu_counts = {} if gpu_counts is None else gpu_counts
    here = None if nodes is None else nodes.place.node_rank
    for i, run in enumerate(suite.runs):
        try:
            check_devices(run, f"runs[{i}]", gpu_counts, here)
        except DeviceUnavailable as exc:
            if not skip_unavailable:
                raise
            unavailable[run.name] = str(exc)
    results = []
    launch, first = new_launch(), {r.name: next_repeat(out / suite.name, r.name)
                                   for r in suite.runs}
    if nodes is not None:
        launch, first = nodes.launch_numbers(launch, first)
    index, total = 0, suite.repeats * len(suite.runs)
    try:
        for offset in range(suite.repeats):
            for run in suite.runs:
                repeat = first[run.name] + offset
                if nodes is not None:
                    nodes.require_all(total - index)
                if run.name in unavailable:
                    result = skip_run(out, suite, run, repeat, unavailable[run.name], launch)
                else:
                    if on_start:
                        on_start(run, repeat)
                    progress = progress_factory(run) if progress_factory else None
                    try:
                        result = _launch(out, suite, run, repeat, launch, nodes, index,
                                         progress.update if progress else None)
                    finally:
                        if progress:
                            progress.close()
                index += 1
                results.append(result)
                if on_end:
                    on_end(result)
        if nodes is not None:
            nodes.require_all(0)  # a node that stopped the suite during the last run
    except BaseException as exc:
        if nodes is not None:  # the other hosts stop too, not wait for a run never started
            nodes.leave(signals.describe(exc) if isinstance(exc, KeyboardInterrupt)
                        else str(exc) or type(exc).__name__)
        raise
    if nodes is not None:
        nodes.finish()
    return results


def _launch(out: Path, suite: SuiteSpec, run: RunSpec, repeat: int, launch: str,
            nodes: Nodes | None, index: int, progress: StepsDone | None) -> RunResult:
    """Run `index` of the launch on this host; across hosts, this host's part of it: node 0
    makes the run directory and picks the workers' rendezvous port, another node makes
    its share of the directory once node 0 says which."""
    if nodes is None:
        return launch_local(out, suite, run, repeat, progress, launch)
    place = nodes.place
    if place.coordinator:
        run_dir = prepare_run_dir(out, suite.name, run, repeat, suite_info(suite), launch)
        port, service_port = free_port(place.master_addr), free_port(place.master_addr)
        nodes.publish(f"run/{index}/start", {"dir": run_dir.name, "port": port,
                                             "service_port": service_port})
    else:
        start = nodes.await_key(f"run/{index}/start")
        run_dir = prepare_share(out / suite.name / str(start["dir"]) / "nodes"
                                / str(place.node_rank), suite.name, run, place.node_rank)
        port, service_port = int(start["port"]), int(start["service_port"])
    seat = Seat(nodes, index, port, service_port, run.interface or nodes.interface,
                [r for r, w in enumerate(run.workers) if w.node == place.node_rank])
    return launch_local(out, suite, run, repeat, progress, launch, seat, run_dir)
