"""TensorFlow's ParameterServerStrategy ("tensorflow-ps"): a native asynchronous cross-check
of ps-async for all-TensorFlow jobs, driven by a coordinator rather than by each worker.

Under ParameterServerStrategy the workers run no training loop: each is a TensorFlow
server, and a coordinator (the "chief") schedules step functions that whichever worker is
free executes; the variables and their updates live on the ps servers. hetbench starts:

- W worker processes (`python -m hetbench.harness.loop.worker`, as for every run: the worker's cores
  and threads apply), each serving as TensorFlow task `worker:<rank>` (serve_worker);
- S ps servers, each by the launcher of the node `server_nodes` names (node 0 by default),
  and the coordinator, by node 0's: the run's services (start_services).

They meet in a store the coordinator serves (a c10d TCPStore, the run's services'
rendezvous: on 127.0.0.1 inside the run's private network namespace on one host, on the
master's address across hosts). No launcher knows which ports are free on another host, so
each task takes a port free on its own host and says `address:port` there (TASK_KEY); every
task builds the cluster spec from the store before its server starts. A server says in the
store that it listens (READY_KEY, a worker with its description: INFO_KEY); the coordinator
waits for all, trains, writes every worker's records, and says SERVED_KEY once it has
closed the run directory; every server then leaves (LEFT_KEY counts them) and exits
(TensorFlow's servers never exit by themselves). Whatever else happens, the launchers stop
them: every process hetbench starts, hetbench stops. TensorFlow's gRPC servers listen on
every interface: on one host that is the private namespace's loopback; across hosts the
launchers say so (harness/exchange/native.py).

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
from datetime import timedelta
from pathlib import Path
from typing import Any

from hetbench.harness.exchange.native import warn_every_interface
from hetbench.harness.records import collector, rundir
from hetbench.harness.spec.suite import RunSpec, run_from_dict
from hetbench.harness.system import interfaces
from hetbench.harness.system.services import Services

STORE_ENV = "HETBENCH_TF_STORE"  # host:port of the store the coordinator serves
RANK_FILE = "hetbench-rank"  # in a worker server's working folder: its rank
POLL_S = 0.1
COORDINATOR = "tf-coordinator"
# the store's keys: a task's address (job: worker, ps or chief), that its server listens,
# a worker's description, the run closed (the servers may go), the servers gone
TASK_KEY, READY_KEY, INFO_KEY = "task/{job}/{index}", "ready/{job}/{index}", "info/{rank}"
SERVED_KEY, LEFT_KEY = "served", "left"
LEAVE_S = 10.0  # how long the coordinator keeps its store for the servers to see SERVED_KEY
# the instants a step function returns (tf.timestamp on the worker: wall clock seconds)
TIMES = ("t0", "pulled", "loaded", "forward", "backward", "ready", "pushed")


def start_services(run: RunSpec, free_port: Callable[[], int], logs: Path, run_dir: Path,
                   services: Services) -> None:
    """This host's ps servers, and on node 0 the coordinator, which serves the store every
    task of the run meets in (`free_port`: across hosts, the port node 0 picked for the
    run's services on the master's address)."""
    if services.across_hosts:
        warn_every_interface()
    store = f"{services.address}:{free_port()}"
    services.env[STORE_ENV] = store
    env = {**os.environ, STORE_ENV: store, **services.binding, "PYTHONUNBUFFERED": "1",
           "HETBENCH_LAUNCHER_PID": str(os.getpid()), "TF_CPP_MIN_LOG_LEVEL": "2"}
    for index in range(run.aggregator.servers):
        if run.aggregator.server_node(index) == services.node:
            services.start(f"tf-ps{index}", [sys.executable, "-m", __name__, "--run-dir",
                                              str(run_dir), "--ps", str(index)], env, logs)
    if services.node == 0:
        services.start(COORDINATOR, [sys.executable, "-m",
                                     "hetbench.harness.loop.tensorflow_coordinator", "--run-dir",
                                     str(run_dir)], env, logs)


def meet_timeout_s(run: RunSpec) -> float:
    """How long a task waits for the store and for the other tasks to say where they are:
    every process of the run starts TensorFlow first (seconds each, on shared cores)."""
    return 2 * run.timeout_s + 30


def meeting(run: RunSpec, serve: bool = False) -> Any:
    """The run's store: served here (the coordinator) or joined (a server)."""
    from hetbench.harness.exchange import rendezvous

    host, port = os.environ[STORE_ENV].rsplit(":", 1)
    timeout = timedelta(seconds=meet_timeout_s(run))
    if serve:
        return rendezvous.serve_store(host, int(port), timeout)
    return rendezvous.store_client(host, int(port), timeout)


def tasks(run: RunSpec) -> dict[str, int]:
    """The cluster's jobs and how many tasks each has."""
    return {"worker": run.world_size, "ps": run.aggregator.servers, "chief": 1}


def say_where(store: Any, job: str, index: int) -> str:
    """This task's address in the store: this host's address on the interface the run's
    libraries bind, and a port free here. Returns it."""
    address, port = interfaces.endpoint(os.environ.get("GLOO_SOCKET_IFNAME", "lo"))
    store.set(TASK_KEY.format(job=job, index=index), f"{address}:{port}")
    return f"{address}:{port}"


def wait_for(store: Any, keys: list[str], what: str, timeout_s: float) -> None:
    """Until every key is in the store; past `timeout_s`, a TimeoutError naming what is
    missing (polled, so that a SIGTERM is handled meanwhile)."""
    deadline = time.monotonic() + timeout_s
    while not store.check(keys):
        if time.monotonic() > deadline:
            missing = [k for k in keys if not store.check([k])]
            raise TimeoutError(f"{what} not within {timeout_s:.0f} s: no "
                               f"{', '.join(missing)} in the run's store")
        time.sleep(POLL_S)


def cluster_spec(store: Any, run: RunSpec) -> dict[str, list[str]]:
    """Every task's address, once each has said it: {"worker": [...], "ps": [...], ...}."""
    keys = {job: [TASK_KEY.format(job=job, index=i) for i in range(n)]
            for job, n in tasks(run).items()}
    wait_for(store, [k for ks in keys.values() for k in ks], "the cluster's addresses",
             meet_timeout_s(run))
    return {job: [bytes(v).decode() for v in store.multi_get(ks)] for job, ks in keys.items()}


def server_folder(run_dir: Path, job: str, index: int) -> Path:
    return run_dir / collector.PARTS_DIR / f"tf-{job}{index}"


def start_server(run: RunSpec, run_dir: Path, job: str, index: int, threads: int
                 ) -> tuple[Any, Any]:
    """TensorFlow task `job:index` of the run's cluster, serving from its own folder (where
    RANK_FILE says who it is, and once it listens, `ready` its pid: on its own host, for
    whoever watches there). Returns the server and the run's store."""
    from hetbench.adapters.tensorflow import configure_threads, tf

    folder = server_folder(run_dir, job, index)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / RANK_FILE).write_text(str(index))
    os.chdir(folder)
    configure_threads(threads)
    store = meeting(run)
    say_where(store, job, index)
    cluster = tf.train.ClusterSpec(cluster_spec(store, run))
    server = tf.distribute.Server(cluster, job_name=job, task_index=index, protocol="grpc",
                                  start=True)
    (folder / "ready").write_text(json.dumps({"pid": os.getpid(), "target": server.target}))
    return server, store


def serve_worker(run: RunSpec, run_dir: Path, rank: int) -> None:
    """A worker process of a tensorflow-ps run: TensorFlow task worker:<rank> until the
    coordinator has closed the run (or the launcher stops it)."""
    import socket

    from hetbench.adapters.tensorflow import TensorFlowAdapter
    from hetbench.harness.system import clocks

    worker = run.workers[rank]
    run_dir = run_dir.resolve()  # the server works in a folder of its own
    server, store = start_server(run, run_dir, "worker", rank, worker.threads)
    info = {"rank": rank, "host": socket.gethostname(), "clock_domain": clocks.domain(),
            "pid": os.getpid(), "label": worker.label,
            **run.to_dict()["workers"][rank], "emulated": worker.emulated,
            "affinity": sorted(os.sched_getaffinity(0)),
            "versions": TensorFlowAdapter.versions(), "serves": server.target}
    text = json.dumps(info)
    (run_dir / collector.PARTS_DIR / f"rank{rank}.json").write_text(text)  # for `recover`
    store.set(INFO_KEY.format(rank=rank), text)
    store.set(READY_KEY.format(job="worker", index=rank), str(os.getpid()))
    wait_until_served(store)


def wait_until_served(store: Any) -> None:
    """Until the coordinator says the run is closed; then say this server leaves. No
    deadline of its own: a coordinator that fails or hangs is the launchers' to catch
    (their watch, their stall limit), and they stop this process then; a launcher that dies
    takes it along (PR_SET_PDEATHSIG)."""
    while not store.check([SERVED_KEY]):
        time.sleep(POLL_S)
    store.add(LEFT_KEY, 1)


def serve_ps(run_dir: Path, index: int) -> int:
    """A ps task (started by its host's launcher, which it dies with: services.py)."""
    run_dir = run_dir.resolve()  # the server works in a folder of its own
    run = run_from_dict(json.loads((run_dir / rundir.RUN_FILE).read_text())["run"])
    _, store = start_server(run, run_dir, "ps", index, threads=1)
    store.set(READY_KEY.format(job="ps", index=index), str(os.getpid()))
    wait_until_served(store)
    return 0


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog=f"python -m {__name__}")
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--ps", type=int, required=True, help="the ps task's index")
    args = parser.parse_args(argv)
    return serve_ps(args.run_dir, args.ps)


if __name__ == "__main__":
    from hetbench.harness.system.exits import exit_after

    exit_after(main)
