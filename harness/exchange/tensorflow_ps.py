"""TensorFlow's ParameterServerStrategy ("tensorflow-ps"): a native asynchronous cross-check
of ps-async for all-TensorFlow jobs, driven by a coordinator rather than by each worker.

Under ParameterServerStrategy the workers run no training loop: each is a TensorFlow
server, and a coordinator (the "chief") schedules step functions that whichever worker is
free executes; the variables and their updates live on the ps servers. hetbench starts:

- W worker processes (`python -m harness.loop.worker`, as for every run: the worker's cores and
  threads apply), each serving as TensorFlow task `worker:<rank>` (serve_worker);
- S ps servers and the coordinator, as the run's services (start_services), all on
  127.0.0.1 ports hetbench hands out, in the workers' private network namespace
  (TensorFlow's gRPC servers bind every interface: harness/system/netns.py).

The coordinator (harness/loop/tensorflow_coordinator.py) writes every worker's
records; when it has closed the run directory it leaves `parts/served`, and every server
exits (TensorFlow's servers never exit by themselves). Whatever else happens, the
launcher stops them: every process hetbench starts, hetbench stops.

A worker learns nothing of its own identity from ParameterServerStrategy (the input
context's pipeline id is 0 on every worker): each worker server runs in a folder of its
own holding its rank (RANK_FILE), which its input pipeline reads by a relative path.

This module imports no framework at module level: the launcher and config use it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.records import collector
from harness.spec.suite import RunSpec
from harness.system.services import Services

CLUSTER_ENV = "HETBENCH_TF_CLUSTER"  # the cluster spec, JSON: {"worker": [...], "ps": [...], ...}
RANK_FILE = "hetbench-rank"  # in a worker server's working folder: its rank
SERVED = "served"  # in parts/: the coordinator closed the run, the servers may go
POLL_S = 0.1
COORDINATOR = "tf-coordinator"
# the instants a step function returns (tf.timestamp on the worker: wall clock seconds)
TIMES = ("t0", "pulled", "loaded", "forward", "backward", "ready", "pushed")


def cluster_spec(run: RunSpec, free_port: Callable[[], int]) -> dict[str, list[str]]:
    def ports(count: int) -> list[str]:
        return [f"127.0.0.1:{free_port()}" for _ in range(count)]

    return {"worker": ports(run.world_size), "ps": ports(run.aggregator.servers),
            "chief": ports(1)}


def start_services(run: RunSpec, free_port: Callable[[], int], logs: Path, run_dir: Path,
                   services: Services) -> None:
    """The ps servers and the coordinator, in the workers' network namespace."""
    cluster = json.dumps(cluster_spec(run, free_port))
    services.env[CLUSTER_ENV] = cluster
    env = {**os.environ, CLUSTER_ENV: cluster, "PYTHONUNBUFFERED": "1",
           "HETBENCH_LAUNCHER_PID": str(os.getpid()), "TF_CPP_MIN_LOG_LEVEL": "2"}
    for index in range(run.aggregator.servers):
        services.start(f"tf-ps{index}", [sys.executable, "-m", __name__, "--run-dir",
                                          str(run_dir), "--ps", str(index)], env, logs)
    services.start(COORDINATOR, [sys.executable, "-m",
                                 "harness.loop.tensorflow_coordinator", "--run-dir",
                                 str(run_dir)], env, logs)


def server_folder(run_dir: Path, job: str, index: int) -> Path:
    return run_dir / collector.PARTS_DIR / f"tf-{job}{index}"


def start_server(run_dir: Path, job: str, index: int, threads: int) -> Any:
    """TensorFlow task `job:index` of the run's cluster, serving from its own folder (where
    RANK_FILE says who it is); the folder's `ready` file says it listens (and its pid)."""
    from adapters.tensorflow import configure_threads, tf

    folder = server_folder(run_dir, job, index)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / RANK_FILE).write_text(str(index))
    os.chdir(folder)
    configure_threads(threads)
    cluster = tf.train.ClusterSpec(json.loads(os.environ[CLUSTER_ENV]))
    server = tf.distribute.Server(cluster, job_name=job, task_index=index, protocol="grpc",
                                  start=True)
    (folder / "ready").write_text(json.dumps({"pid": os.getpid(), "target": server.target}))
    return server


def serve_worker(run: RunSpec, run_dir: Path, rank: int) -> None:
    """A worker process of a tensorflow-ps run: TensorFlow task worker:<rank> until the
    coordinator has closed the run (or the launcher stops it)."""
    import socket

    from adapters.tensorflow import TensorFlowAdapter
    from harness.system import clocks

    worker = run.workers[rank]
    run_dir = run_dir.resolve()  # the server works in a folder of its own
    server = start_server(run_dir, "worker", rank, worker.threads)
    info = {"rank": rank, "host": socket.gethostname(), "clock_domain": clocks.domain(),
            "pid": os.getpid(), "label": worker.label,
            **run.to_dict()["workers"][rank], "emulated": worker.emulated,
            "affinity": sorted(os.sched_getaffinity(0)),
            "versions": TensorFlowAdapter.versions(), "serves": server.target}
    (run_dir / collector.PARTS_DIR / f"rank{rank}.json").write_text(json.dumps(info))
    wait_until_served(run_dir)


def wait_until_served(run_dir: Path) -> None:
    """Until the coordinator says the run is closed. No deadline of its own: a coordinator
    that fails or hangs is the launcher's to catch (its watch, its stall limit), and it
    stops this process then; a launcher that dies takes it along (PR_SET_PDEATHSIG)."""
    marker = run_dir / collector.PARTS_DIR / SERVED
    while not marker.exists():
        time.sleep(POLL_S)


def serve_ps(run_dir: Path, index: int) -> int:
    """A ps task (started by the launcher, which it dies with: services.py)."""
    run_dir = run_dir.resolve()  # the server works in a folder of its own
    start_server(run_dir, "ps", index, threads=1)
    wait_until_served(run_dir)
    return 0


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog=f"python -m {__name__}")
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--ps", type=int, required=True, help="the ps task's index")
    args = parser.parse_args(argv)
    return serve_ps(args.run_dir, args.ps)


if __name__ == "__main__":
    from harness.system.exits import exit_after

    exit_after(main)
