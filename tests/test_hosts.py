"""Issue 27: `hetbench run SUITE --nnodes N --node-rank R --master-addr A` on every host runs
the whole suite across them, in lockstep. The runs themselves go over the testbed's hosts
(network namespaces, root only); the bad input and the join are checked over loopback,
everywhere."""

from __future__ import annotations

import importlib.util
import ipaddress
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import numpy as np
import pandas as pd
import psutil
import pytest

from hetbench.harness.run.nodes import STORE_CALL_S
from hetbench.harness.system import testbed
from hetbench.harness.system.testbed import Link, Testbed, leftovers
from tests.conftest import REPO, Spawn, hetbench_command
from tests.test_cli_errors import error_line
from tests.test_exactness import plain_torch_sgd
from tests.test_jobs import MODELS, textbook_sgd

TIMEOUT_S = 240

needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None,
    reason="the testbed needs root and iproute2 (ip, tc) to create network namespaces")

# {node}: ", node = 1" across hosts, "" for the same suite on one host
SUITE = """
[suite]
name = "hosts"
repeats = 1

[defaults]
workload = "mlp"
steps = {steps}
global_batch = 64
timeout_s = 20
partition = {{ policy = "sizes", sizes = [40, 24] }}

[[runs]]
name = "allreduce"
workers = [ {{ threads = 1 }}, {{ threads = 1{node} }} ]

[[runs]]
name = "host-buffer"
aggregator = "allreduce-host"
workers = [ {{ threads = 1 }}, {{ threads = 1{node} }} ]
{more}"""

# parameter servers, one on each host; a pipeline's stages on two hosts, in lockstep (D = 0)
# and pushing to one server per stage (wsp, one virtual worker: SGD on the global batch)
SERVERS_AND_STAGES = """
[[runs]]
name = "ps-sync"
aggregator = {{ name = "ps-sync", servers = 2{servers} }}
workers = [ {{ threads = 1 }}, {{ threads = 1{node} }} ]

[[runs]]
name = "pipeline-d0"
partition = {{ policy = "equal" }}
workers = [ {{ threads = 1 }}, {{ threads = 1{node} }} ]
virtual_workers = [[0, 1]]
pipeline = {{ schedule = "gpipe", micro_batches = 2, split = [2, 1] }}

[[runs]]
name = "wsp"
partition = {{ policy = "equal" }}
workers = [ {{ threads = 1 }}, {{ threads = 1{node} }} ]
virtual_workers = [[0, 1]]
pipeline = {{ micro_batches = 2, split = [2, 1], wave_bound = 1 }}
"""

# a user's job across the hosts (tests/test_jobs.py's model), its slices as the others'
JOB_RUN = """
[[runs]]
name = "job"
workload = "userjob.models:make"
workers = [ { threads = 1 }, { threads = 1, node = 1 } ]
"""


def write(folder: Path, steps: int = 12, node: str = ", node = 1", name: str = "suite.toml",
          servers: bool = False) -> Path:
    """The suite across hosts (`node`: worker 1 on node 1) or on one (`node` ""); with
    `servers`, the runs of parameter servers and pipelines too."""
    more = SERVERS_AND_STAGES.format(node=node, servers=", server_nodes = [0, 1]"
                                     if node else "") if servers else ""
    path = folder / name
    path.write_text(SUITE.format(steps=steps, node=node, more=more))
    return path


def node_command(rank: int, suite: Path, out: Path, master: str, port: int,
                 *extra: str) -> list[str]:
    return hetbench_command("run", str(suite), "--nnodes", "2", "--node-rank", str(rank),
                            "--master-addr", master, "--master-port", str(port),
                            "--out", str(out), "--no-progress", *extra)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_dirs(out: Path) -> dict[str, Path]:
    return {d.name.split("-r0-")[0]: d for d in sorted((out / "hosts").glob("*-r0-*"))}


def manifest(run_dir: Path) -> dict:
    return json.loads((run_dir / "manifest.json").read_text())


def on_testbed(bed: Testbed, spawn: Spawn, suite: Path, tmp_path: Path, *extra: str
               ) -> list[subprocess.Popen[str]]:
    """Node r's launcher on testbed host r, node 0's address the master."""
    return [spawn(bed.command(rank, node_command(rank, suite, tmp_path / f"node{rank}",
                                                 bed.host(0).address, 29400, *extra)),
                  cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for rank in (0, 1)]


# -- runs across the testbed's hosts -------------------------------------------------------


@pytest.mark.slow
@needs_root
def test_a_suite_across_two_hosts_trains_as_one_host_does(tmp_path: Path, spawn: Spawn
                                                         ) -> None:
    """Both hosts run the same command; every run completes, node 0 holds the run
    directories (with node 1's logs), node 1 keeps its parts, and the parameters are SGD's
    on the global batch, the textbook loop's that one host's runs equal
    (tests/test_exactness.py, test_pipeline.py): unequal slices aggregated with weights
    across hosts by all-reduce and by a parameter server on each host, a pipeline's stages on
    both (D = 0, and wsp), and a user's job (a workload named by import path, its module in
    the suite's folder, checked on each host). Node 1's clock is 5 s ahead: the workers map
    the stamps of the servers across the link."""
    suite = write(tmp_path, servers=True)
    (tmp_path / "userjob").mkdir()
    (tmp_path / "userjob" / "__init__.py").write_text("")
    (tmp_path / "userjob" / "models.py").write_text(MODELS)
    suite.write_text(suite.read_text() + JOB_RUN)
    with Testbed(2, {1: Link(rate="100mbit")}, clocks={1: 5.0}) as bed:
        nodes = on_testbed(bed, spawn, suite, tmp_path)
        ends = [p.communicate(timeout=TIMEOUT_S) for p in nodes]
        tag = bed.tag
    assert leftovers(tag) == []
    assert [p.returncode for p in nodes] == [0, 0], [e[1][-2000:] for e in ends]
    assert "6 completed; node 0 holds the runs" in ends[1][0]

    across = run_dirs(tmp_path / "node0")
    assert sorted(across) == ["allreduce", "host-buffer", "job", "pipeline-d0", "ps-sync",
                              "wsp"]
    job = across.pop("job")
    assert manifest(job)["job"]["factory"] == "userjob.models:make"
    textbook = textbook_sgd(tmp_path, "make", 12, 64, 0.1, 0)
    with np.load(job / "params.npz") as got:
        assert sorted(got.files) == sorted(textbook)
        for key, want in textbook.items():
            np.testing.assert_allclose(got[key], want, rtol=0, atol=1e-5, err_msg=f"job: {key}")
    sgd = plain_torch_sgd(seed=0, steps=12, lr=0.1, batch=64)
    _servers_across_the_link(across["ps-sync"], across["wsp"], tmp_path)
    for name, run_dir in across.items():
        meta = manifest(run_dir)
        assert (meta["status"], meta["rows"]) == ("completed", 24)
        assert [w["node"] for w in meta["workers"]] == [0, 1]
        assert [n["address"] for n in meta["nodes"]] == ["198.18.0.1", "198.18.0.2"]
        assert meta["network"] == "host network, across 2 hosts on eth0"
        assert (run_dir / "logs" / "rank1.log").is_file()  # sent over by node 1
        share = tmp_path / "node1" / "hosts" / run_dir.name / "nodes" / "1"
        assert (share / "parts" / "rank1.bin").stat().st_size > 0
        assert json.loads((share / "node.json").read_text())["status"] == "completed"
        with np.load(run_dir / "params.npz") as got:
            assert sorted(got.files) == sorted(sgd)
            for key, want in sgd.items():
                np.testing.assert_allclose(got[key], want, rtol=0, atol=1e-5,
                                           err_msg=f"{name}: {key}")


# a user's own script across the hosts (hetbench launch; tests/test_own_loop.py's script)
LOOP_CONFIG = """
[suite]
name = "loop"
repeats = 1

[[runs]]
name = "across"
global_batch = 64
timeout_s = 30
partition = { policy = "sizes", sizes = [40, 24] }
workers = [ { threads = 1 }, { threads = 1, slowdown = 2.0, node = 1 } ]
"""


@pytest.mark.slow
@needs_root
def test_a_script_launched_across_two_hosts_trains_the_textbook_parameters(
        tmp_path: Path, spawn: Spawn) -> None:
    """`hetbench launch --nnodes 2` on each host: the script's ranks on both hosts meet
    in rank 0's store on node 0, node 1's share keeps its parts, node 0 holds the run, and
    the parameters are the loop over whole batches'."""
    from tests.test_own_loop import SCRIPT, textbook

    config = tmp_path / "loop.toml"
    config.write_text(LOOP_CONFIG)
    with Testbed(2, {1: Link(rate="100mbit")}) as bed:
        nodes = [spawn(bed.command(rank, hetbench_command(
            "launch", str(config), "--nnodes", "2", "--node-rank", str(rank),
            "--master-addr", bed.host(0).address, "--master-port", "29400",
            "--out", str(tmp_path / f"node{rank}"), "--no-progress", "--no-figures", "--",
            str(SCRIPT), "--steps", "12")), cwd=REPO, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True) for rank in (0, 1)]
        ends = [p.communicate(timeout=TIMEOUT_S) for p in nodes]
        tag = bed.tag
    assert leftovers(tag) == []
    assert [p.returncode for p in nodes] == [0, 0], [e[0][-2000:] + e[1][-2000:] for e in ends]
    (run_dir,) = list((tmp_path / "node0" / "loop").glob("across-r0-*"))
    meta = manifest(run_dir)
    assert (meta["status"], meta["rows"]) == ("completed", 24), meta["reason"]
    assert [w["node"] for w in meta["workers"]] == [0, 1]
    assert meta["run"]["script"] == str(SCRIPT) and meta["run"]["steps"] == 12
    share = tmp_path / "node1" / "loop" / run_dir.name / "nodes" / "1"
    assert (share / "parts" / "rank1.bin").stat().st_size > 0
    with np.load(run_dir / "params.npz") as got:
        for key, want in textbook(12, 64).items():
            np.testing.assert_allclose(got[key], want, rtol=0, atol=1e-6, err_msg=key)

NATIVE_SUITE = """
[suite]
name = "hosts"
repeats = 1

[defaults]
workload = "mlp"
framework = "{framework}"
steps = 12
global_batch = 64
timeout_s = 30
partition = {{ policy = "sizes", sizes = [40, 24] }}
"""
NATIVE_RUN = """
[[runs]]
name = "{name}"
aggregator = {{ name = "{aggregator}"{server} }}
workers = [ {{ threads = 1 }}, {{ threads = 1{node} }} ]
"""
# framework -> its aggregators: (run name, aggregator, where its server runs across hosts)
NATIVE = {
    "mxnet": [("kvstore", "mxnet-kvstore", ", server_nodes = [1]"),
              ("kvstore-async", "mxnet-async", ", server_nodes = [1]")],
    "tensorflow": [("collective", "tensorflow-collective", ""),
                   ("ps", "tensorflow-ps", ", servers = 2, server_nodes = [0, 1]")],
}
ORDER_DEPENDENT = ("kvstore-async", "ps")  # asynchronous: results follow the push order


def native_suite(path: Path, framework: str) -> Path:
    """The framework's exchanges, worker 1 on node 1."""
    path.write_text(NATIVE_SUITE.format(framework=framework) + "".join(
        NATIVE_RUN.format(name=name, aggregator=aggregator, server=server, node=", node = 1")
        for name, aggregator, server in NATIVE[framework]))
    return path


@pytest.mark.slow
@pytest.mark.long
@needs_root
@pytest.mark.parametrize("framework", sorted(NATIVE))
def test_the_frameworks_own_exchanges_across_hosts_train_as_on_one_host(
        tmp_path: Path, spawn: Spawn, framework: str) -> None:
    """MXNet's ps-lite across two hosts: the scheduler on node 0 at the master's address,
    the server on node 1 (`server_nodes = [1]`), each started by its host's launcher.
    TensorFlow's ring all-reduce: each worker's TF server on a port its own host picked,
    the addresses exchanged over torch.distributed. dist_sync's and the ring's parameters are SGD's
    on the global batch (the textbook loop's, which one host's equal:
    test_mixed_frameworks.py); dist_async (order-dependent, so not compared) completes
    too. TensorFlow's ParameterServerStrategy: a ps task on each host, the coordinator on
    node 0, every task's address met in the coordinator's store; node 1's clock 5 s ahead,
    which the coordinator's records (mapped from the workers' wall clocks) do not show."""
    if importlib.util.find_spec(framework) is None:
        pytest.skip(f"needs {framework}")
    suite = native_suite(tmp_path / "across.toml", framework)
    with Testbed(2, clocks={1: 5.0} if framework == "tensorflow" else {}) as bed:
        nodes = on_testbed(bed, spawn, suite, tmp_path)
        ends = [p.communicate(timeout=TIMEOUT_S) for p in nodes]
        tag, addresses = bed.tag, (bed.host(0).address, bed.host(1).address)
    assert leftovers(tag) == []
    assert [p.returncode for p in nodes] == [0, 0], [e[1][-2000:] for e in ends]
    across = run_dirs(tmp_path / "node0")
    assert sorted(across) == sorted(name for name, _, _ in NATIVE[framework])
    servers = {"mxnet": ["kvstore-server.log"], "ps": ["tf-ps1.log"]}  # no scheduler there
    for name, run_dir in across.items():
        assert manifest(run_dir)["status"] == "completed"
        logs = tmp_path / "node1" / "hosts" / run_dir.name / "nodes" / "1" / "logs"
        here = servers.get(name, servers.get(framework, []))
        assert sorted(p.name for p in logs.iterdir()) == sorted([*here, "rank1.log"])
    if framework == "tensorflow":
        assert "warning: TensorFlow's servers listen on every interface of each host" \
            in ends[1][0]
        _tensorflow_ps_across_hosts(across["ps"], *addresses)
    sgd = plain_torch_sgd(seed=0, steps=12, lr=0.1, batch=64)
    for name in [name for name in across if name not in ORDER_DEPENDENT]:
        with np.load(across[name] / "params.npz") as got:
            assert sorted(got.files) == sorted(sgd)
            for key, want in sgd.items():
                np.testing.assert_allclose(got[key], want, rtol=0, atol=1e-5,
                                           err_msg=f"{name}: {key}")


def _tensorflow_ps_across_hosts(run_dir: Path, node0: str, node1: str) -> None:
    """Each task at its own host's address; every record in the coordinator's clock (the
    workers' instants differ by far less than node 1's 5 s); both workers stepped."""
    meta = manifest(run_dir)
    cluster = meta["aggregator"]["cluster"]
    hosts = {job: [a.rsplit(":", 1)[0] for a in addresses] for job, addresses in cluster.items()}
    assert hosts == {"worker": [node0, node1], "ps": [node0, node1], "chief": [node0]}, cluster
    assert all(device.startswith("/job:ps/") for device in meta["aggregator"]["placement"].values())
    workers = meta["workers"]
    assert workers[0]["clock_domain"] == workers[1]["clock_domain"] \
        != workers[1]["host_clock_domain"], workers
    steps = pd.read_parquet(run_dir / "steps.parquet")
    assert sorted(steps["rank"].unique()) == [0, 1]
    starts = steps.groupby("rank")["begin_ns"].min()
    assert abs(starts[1] - starts[0]) < 2e9, starts
    assert (steps["ready_ns"] > steps["begin_ns"]).all() and (steps["wait_ns"] >= 0).all()


def _servers_across_the_link(ps_sync: Path, wsp: Path, tmp_path: Path) -> None:
    """ps-sync's ps1 ran on node 1 (its launcher started it: its log there), ps0 on node 0;
    each worker applied the offset of the server across the link (node 1's clock 5 s ahead:
    +5 s seen from worker 0, -5 s from worker 1); wsp's servers are on node 0, so only
    worker 1's stage maps its server's stamps. No exchange part is off by the offset."""
    share = tmp_path / "node1" / "hosts" / ps_sync.name / "nodes" / "1"
    assert sorted(p.name for p in (share / "logs").glob("ps*.log")) == ["ps1.log"]
    assert sorted(p.name for p in (ps_sync / "logs").glob("ps*.log")) == ["ps0.log", "ps1.log"]
    for run_dir, across in ((ps_sync, [["ps1"], ["ps0"]]), (wsp, [[], ["ps1"]])):
        workers = manifest(run_dir)["workers"]
        assert [[c["server"] for c in w.get("server_clocks", [])] for w in workers] == across
        for worker, sign in zip(workers, (1, -1), strict=True):
            for clock in worker.get("server_clocks", []):
                assert abs(clock["offset_ns"] - sign * 5e9) < 1e6 + clock["uncertainty_ns"], \
                    clock
        steps = pd.read_parquet(run_dir / "steps.parquet")
        parts = steps[["push_ns", "wait_ns", "pull_ns"]]
        assert (parts >= 0).all().all() and (parts < 1e9).all().all(), parts.describe()


def _wait_for_steps(part: Path, deadline_s: float = 120) -> None:
    deadline = time.monotonic() + deadline_s
    while not (part.is_file() and part.stat().st_size > 0):
        assert time.monotonic() < deadline, f"no step flushed in {part}"
        time.sleep(0.1)


def _share_of_first_run(tmp_path: Path, name: str = "allreduce") -> Path:
    """Node 1's share of run `name`, once node 1 started it."""
    deadline = time.monotonic() + 120
    while not (found := sorted((tmp_path / "node1" / "hosts").glob(f"{name}-r0-*/nodes/1"))):
        assert time.monotonic() < deadline, f"node 1 never started run {name}"
        time.sleep(0.1)
    return found[0]


@pytest.mark.slow
@needs_root
def test_a_worker_killed_on_node_1_fails_the_run_everywhere_and_the_next_run_starts(
        tmp_path: Path, spawn: Spawn) -> None:
    suite = write(tmp_path, steps=2000)
    with Testbed(2) as bed:
        nodes = on_testbed(bed, spawn, suite, tmp_path, "--steps", "2000")
        share = _share_of_first_run(tmp_path)
        _wait_for_steps(share / "parts" / "rank1.bin")
        worker = json.loads((share / "parts" / "rank1.json").read_text())["pid"]
        os.kill(worker, signal.SIGKILL)
        # the second run is cut short: its own steps are not what is tested here
        second = None
        deadline = time.monotonic() + 120
        while second is None:
            assert time.monotonic() < deadline, "the second run never started"
            second = next(iter((tmp_path / "node0" / "hosts").glob("host-buffer-r0-*")), None)
            time.sleep(0.1)
        _wait_for_steps(second / "parts" / "rank0.bin")
        os.kill(nodes[0].pid, signal.SIGINT)
        ends = [p.communicate(timeout=TIMEOUT_S) for p in nodes]
        tag = bed.tag
    assert leftovers(tag) == []
    first = manifest(run_dirs(tmp_path / "node0")["allreduce"])
    print(f"\n{first['status']}: {first['reason']} ({first['rows']} rows)")
    assert first["status"] == "failed"
    assert first["reason"].startswith("node 1: worker 1 killed by SIGKILL"), first["reason"]
    assert first["rows"] > 0  # node 0's records, and node 1's flushed ones sent over
    assert (run_dirs(tmp_path / "node0")["allreduce"] / "parts" / "rank1.bin").is_file()
    second_meta = manifest(second)
    assert second_meta["status"] == "interrupted", second_meta
    assert [p.returncode for p in nodes] == [130, 130], "\n".join(e[1][-2000:] for e in ends)
    assert "stopped on node 0: interrupted by the user (Ctrl-C)" in ends[1][1]


def _listen_on_the_testbed_only(nodes: list[subprocess.Popen[str]], server: int,
                                *addresses: str) -> None:
    """Every TCP socket the hosts' launchers and their processes listen on is bound to a
    testbed host's address or loopback, none to every interface; among them node 0's
    launcher store on the master port and ps1's TensorPipe listener on node 1's address."""
    from tests.test_listeners import descendants, listeners_of

    found = listeners_of([pid for p in nodes for pid in descendants(p.pid)])
    print(f"\nlisteners: {sorted((a, q) for _, a, q in found)}")
    assert {(a, q) for _, a, q in found} >= {(addresses[0], 29400)}
    assert any(pid == server and a == addresses[1] for pid, a, _ in found), found
    outside = [(a, q) for _, a, q in found
               if not (a in addresses or ipaddress.ip_address(a).is_loopback)]
    assert outside == [], outside


def only_runs(path: Path, *names: str) -> Path:
    """The suite at `path` with only the runs named, in that order."""
    head, *runs = path.read_text().split("[[runs]]")
    named = {run.split('"')[1]: run for run in runs}
    path.write_text(head + "".join(f"[[runs]]{named[name]}" for name in names))
    return path


@pytest.mark.slow
@pytest.mark.long
@needs_root
def test_a_server_killed_on_node_1_fails_the_run_and_ctrl_c_on_node_1_stops_all(
        tmp_path: Path, spawn: Spawn) -> None:
    """ps-sync's ps1, which node 1's launcher started, SIGKILLed mid-run: node 0 closes the
    run `failed` naming node 1's ps1, with the flushed records; the next run starts on both
    hosts; Ctrl-C on node 1 then stops the suite on both (exit 130), nothing left over."""
    suite = only_runs(write(tmp_path, steps=2000, servers=True), "ps-sync", "allreduce")
    with Testbed(2) as bed:
        nodes = on_testbed(bed, spawn, suite, tmp_path)
        share = _share_of_first_run(tmp_path, "ps-sync")
        _wait_for_steps(share / "parts" / "rank1.bin")
        server = json.loads((share / "parts" / "ps1.json").read_text())["pid"]
        _listen_on_the_testbed_only(nodes, server, bed.host(0).address, bed.host(1).address)
        os.kill(server, signal.SIGKILL)
        killed = time.time()
        _wait_for_steps(_share_of_first_run(tmp_path, "allreduce") / "parts" / "rank1.bin")
        os.kill(nodes[1].pid, signal.SIGINT)
        ends = [p.communicate(timeout=TIMEOUT_S) for p in nodes]
        tag = bed.tag
    assert leftovers(tag) == []
    assert not _alive(server)
    first = manifest(run_dirs(tmp_path / "node0")["ps-sync"])
    ended = datetime.fromisoformat(first["end"]).timestamp()
    print(f"\n{first['status']} {ended - killed:.1f} s after ps1 was killed: "
          f"{first['reason']} ({first['rows']} rows)")
    assert first["status"] == "failed"
    assert first["reason"].startswith("node 1: ps1 killed by SIGKILL while the workers ran"), \
        first["reason"]
    assert ended - killed < first["run"]["timeout_s"] + 5
    assert first["rows"] > 0
    second_meta = manifest(run_dirs(tmp_path / "node0")["allreduce"])
    assert second_meta["status"] == "interrupted", second_meta
    assert second_meta["reason"] == "stopped on node 1: interrupted by the user (Ctrl-C)"
    assert [p.returncode for p in nodes] == [130, 130], "\n".join(e[1][-2000:] for e in ends)


@pytest.mark.slow
@needs_root
@pytest.mark.parametrize("number", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_to_testbed_up_closes_the_run_across_its_hosts_before_they_go(
        tmp_path: Path, spawn: Spawn, number: int) -> None:
    """Issue 58 (1): `testbed up -- COMMAND` where the command runs both hosts' launchers,
    stopped (Ctrl-C, or `timeout`'s SIGTERM) mid-run: the signal goes on to the launchers,
    the hosts stay while they close the run across them, then go; node 0's run is closed
    `interrupted` with the flushed records of both hosts, node 1's share too, and `up`
    exits 128 + N. (It used to tear the hosts down at once: the launchers hung in the
    store's socket and node 0's run stayed `running`.)"""
    suite = write(tmp_path, steps=5000)
    script = " & ".join(f'ip netns exec "$HETBENCH_HOST{rank}" ' + shlex.join(
        node_command(rank, suite, tmp_path / f"node{rank}", "198.18.0.1", 29400))
        for rank in (0, 1))
    up = spawn(hetbench_command("testbed", "up", "--hosts", "2", "--", "sh", "-c",
                                f"{script} & wait"),
               cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert up.stdout is not None
    tag = [up.stdout.readline() for _ in range(3)][2].split()[1]
    try:
        share = _share_of_first_run(tmp_path)
        _wait_for_steps(share / "parts" / "rank1.bin")
        launchers = psutil.Process(up.pid).children(recursive=True)
        up.send_signal(number)
        _, err = up.communicate(timeout=TIMEOUT_S)
    finally:
        for name in leftovers(tag):
            testbed.remove_namespace(name)
    name = signal.Signals(number).name
    assert up.returncode == 128 + number, err[-3000:]
    assert "passed on to the command; waiting up to" in err, err[-3000:]
    assert "the command ended" in err, err[-3000:]
    meta = manifest(run_dirs(tmp_path / "node0")["allreduce"])
    reason = "interrupted by the user (Ctrl-C)" if number == signal.SIGINT \
        else f"interrupted by {name}"
    assert meta["status"] == "interrupted", meta
    assert reason in meta["reason"], meta["reason"]
    steps = pd.read_parquet(run_dirs(tmp_path / "node0")["allreduce"] / "steps.parquet")
    assert set(steps["rank"]) == {0, 1} and meta["rows"] == len(steps) > 0
    held = json.loads((share / "node.json").read_text())
    assert held["status"] == "interrupted", held
    assert not Path(held["tmp"]).exists()  # node 1's launcher closed its share itself
    assert leftovers(tag) == []
    assert not [p for p in launchers if _alive(p.pid)]


@pytest.mark.slow
@pytest.mark.long
@needs_root
def test_a_launcher_closing_while_node_0_answers_nothing_ends_in_bounded_time(
        tmp_path: Path, spawn: Spawn) -> None:
    """Issue 58 (1): node 0's launcher frozen (SIGSTOP: its store keeps the socket open and
    answers nothing, as a host whose link went away), then Ctrl-C on node 1: node 1 closes
    its share `interrupted` with its flushed records and exits 130 within its closing
    deadline, saying node 0 did not answer, instead of waiting in the store's socket for
    good (c10d's own timeout does not bound it); node 0, resumed, closes the run too."""
    suite = write(tmp_path, steps=5000)
    with Testbed(2) as bed:
        nodes = on_testbed(bed, spawn, suite, tmp_path)
        share = _share_of_first_run(tmp_path)
        _wait_for_steps(share / "parts" / "rank1.bin")
        os.kill(nodes[0].pid, signal.SIGSTOP)
        try:
            began = time.monotonic()
            os.kill(nodes[1].pid, signal.SIGINT)
            _, err = nodes[1].communicate(timeout=TIMEOUT_S)
            took = time.monotonic() - began
        finally:
            os.kill(nodes[0].pid, signal.SIGCONT)
        nodes[0].communicate(timeout=TIMEOUT_S)
        tag = bed.tag
    assert leftovers(tag) == []
    print(f"\nnode 1 ended {took:.1f} s after its Ctrl-C, node 0 frozen: {err[-300:]}")
    assert took < 3 * STORE_CALL_S + 5, took
    assert nodes[1].returncode == 130, err[-2000:]  # the interrupt ends it, not node 0
    assert "node 0 (198.18.0.1) stopped answering: no answer within" in err, err[-2000:]
    held = json.loads((share / "node.json").read_text())
    assert held["status"] == "interrupted", held
    assert (share / "parts" / "rank1.bin").stat().st_size > 0
    meta = manifest(run_dirs(tmp_path / "node0")["allreduce"])
    assert meta["status"] in ("interrupted", "failed"), meta


@pytest.mark.slow
@pytest.mark.long
@needs_root
def test_a_host_killed_whole_fails_the_run_on_node_0_in_time(tmp_path: Path, spawn: Spawn,
                                                            hetbench) -> None:
    """Node 1's launcher and its workers SIGKILLed: node 0 closes the run `failed`, naming
    node 1, within timeout_s + 5 s; its flushed records are kept; the suite stops. Node 1's
    share still says `running` (its launcher could not close it): `hetbench recover` on
    node 1's results closes it `failed`, its flushed records kept in its parts."""
    suite = write(tmp_path, steps=2000)
    with Testbed(2) as bed:
        nodes = on_testbed(bed, spawn, suite, tmp_path)
        share = _share_of_first_run(tmp_path)
        _wait_for_steps(share / "parts" / "rank1.bin")
        worker = json.loads((share / "parts" / "rank1.json").read_text())["pid"]
        os.kill(nodes[1].pid, signal.SIGKILL)
        os.kill(worker, signal.SIGKILL)
        killed = time.time()
        ends = [p.communicate(timeout=TIMEOUT_S) for p in nodes]
        tag = bed.tag
    assert leftovers(tag) == []
    meta = manifest(run_dirs(tmp_path / "node0")["allreduce"])
    assert meta["status"] == "failed"
    assert meta["reason"].startswith("node 1 stopped answering"), meta["reason"]
    assert meta["rows"] > 0
    ended = datetime.fromisoformat(meta["end"]).timestamp()
    print(f"\nnode 0 closed the run {ended - killed:.1f} s after node 1 was killed "
          f"(timeout_s {meta['run']['timeout_s']}): {meta['reason']}")
    assert ended - killed < meta["run"]["timeout_s"] + 5, ended - killed
    assert nodes[0].returncode == 1, ends[0][1][-2000:]
    assert "node 1 stopped answering: the suite stops, 1 run(s) not started" in ends[0][1]
    held = json.loads((share / "node.json").read_text())
    assert held["status"] == "running"
    assert Path(held["tmp"]).is_dir()  # node 1's TMPDIR, its launcher killed
    flushed = (share / "parts" / "rank1.bin").read_bytes()
    recovered = hetbench(tmp_path, "recover", str(tmp_path / "node1"))
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    assert f"{share}: this node's share, closed as failed (" in recovered.stdout
    state = json.loads((share / "node.json").read_text())
    assert state["status"] == "failed" and state["node"] == 1, state
    assert "closed by hetbench recover" in state["reason"], state
    assert (share / "parts" / "rank1.bin").read_bytes() == flushed and flushed
    assert not Path(held["tmp"]).exists() and state["tmp"] == held["tmp"]
    again = hetbench(tmp_path, "recover", str(tmp_path / "node1"))
    assert again.returncode == 0 and "nothing to recover" in again.stdout, again.stdout


def test_recover_leaves_a_share_whose_launcher_lives_alone(tmp_path: Path, spawn: Spawn,
                                                           hetbench) -> None:
    """A share held by a live launcher (this process) is refused, naming it, exit 1; one
    whose launcher is gone is closed; a folder with neither runs nor shares is an error."""
    from hetbench.harness.run.nodes import prepare_share, record_share_tmp
    from hetbench.harness.spec.suite import load_suite
    from hetbench.harness.system.services import PRIVATE_TMP_PREFIX

    suite = write(tmp_path)
    run = load_suite(str(suite)).runs[0]
    live = prepare_share(tmp_path / "out" / "hosts" / "r0" / "nodes" / "1", "hosts", run, 1)
    gone = tmp_path / "out" / "hosts" / "r1" / "nodes" / "1"
    # each launcher's private TMPDIR, recorded in its share: the gone one's is removed
    tmps = [Path(tempfile.mkdtemp(prefix=PRIVATE_TMP_PREFIX)) for _ in range(2)]
    record_share_tmp(live, tmps[0])
    made = spawn([sys.executable, "-c", "import sys; from pathlib import Path; "
                  "from hetbench.harness.run.nodes import prepare_share, record_share_tmp; "
                  "from hetbench.harness.spec.suite import load_suite; "
                  "share = prepare_share(Path(sys.argv[1]), 'hosts', "
                  "load_suite(sys.argv[2]).runs[0], 1); "
                  "record_share_tmp(share, Path(sys.argv[3]))", str(gone), str(suite),
                  str(tmps[1])],
                 cwd=REPO, stderr=subprocess.PIPE, text=True)
    assert made.wait(timeout=120) == 0, made.communicate()[1]
    result = hetbench(tmp_path, "recover", str(tmp_path / "out"))
    assert tmps[0].is_dir() and not tmps[1].exists()
    shutil.rmtree(tmps[0])
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"hetbench: {live}: still running: its launcher (pid {os.getpid()}) lives" \
        in result.stderr
    assert f"{gone}: this node's share, closed as failed (0 step records kept" in result.stdout
    assert json.loads((live / "node.json").read_text())["status"] == "running"
    assert json.loads((gone / "node.json").read_text())["status"] == "failed"
    empty = tmp_path / "empty"
    empty.mkdir()
    result = hetbench(tmp_path, "recover", str(empty))
    assert result.returncode == 2 and "no run directories below it" in result.stderr


@pytest.mark.slow
@needs_root
def test_node_0_killed_stops_the_other_hosts_and_recover_closes_its_run(
        tmp_path: Path, spawn: Spawn, hetbench) -> None:
    """Node 0's launcher SIGKILLed (its store with it): node 1 stops its workers and ends
    within the run's timeout, saying node 0 stopped answering; node 0's worker follows its
    launcher; `hetbench recover` on node 0 closes the run it left, with its flushed records."""
    suite = write(tmp_path, steps=2000)
    with Testbed(2) as bed:
        nodes = on_testbed(bed, spawn, suite, tmp_path)
        share = _share_of_first_run(tmp_path)
        _wait_for_steps(share / "parts" / "rank1.bin")
        run_dir = run_dirs(tmp_path / "node0")["allreduce"]
        worker0 = json.loads((run_dir / "parts" / "rank0.json").read_text())["pid"]
        os.kill(nodes[0].pid, signal.SIGKILL)
        killed = time.monotonic()
        out1, err = nodes[1].communicate(timeout=TIMEOUT_S)
        stopped = time.monotonic() - killed
        nodes[0].wait(timeout=10)
        deadline = time.monotonic() + 30  # the worker follows its launcher (system/orphans)
        while _alive(worker0):
            assert time.monotonic() < deadline, "node 0's worker outlived its launcher"
            time.sleep(0.2)
        tag = bed.tag
    assert leftovers(tag) == []
    print(f"\nnode 1 ended {stopped:.1f} s after node 0's launcher was killed")
    assert nodes[1].returncode == 1, err[-2000:]
    assert stopped < 20 + 5  # the run's timeout_s, and a margin
    assert "hetbench: error: node 0 (198.18.0.1) stopped answering" in err, err[-2000:]
    assert (share / "node.json").is_file(), out1[-3000:] + err[-3000:]
    assert json.loads((share / "node.json").read_text())["status"] == "failed"
    assert manifest(run_dir)["status"] == "running"  # its launcher died before closing it
    recovered = hetbench(tmp_path, "recover", str(run_dir))
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    meta = manifest(run_dir)
    assert meta["status"] == "failed" and meta["rows"] > 0, meta


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


THREE_HOSTS = """
[suite]
name = "hosts"

[[nodes]]

[[nodes]]

[[nodes]]
link = { rate = "20mbit" }

[[runs]]
name = "allreduce"
workload = "mlp"
steps = 8
global_batch = 48
timeout_s = 60
workers = [ { threads = 1 }, { threads = 1, node = 1 }, { threads = 1, node = 2 } ]
"""


@pytest.mark.slow
@needs_root
def test_three_hosts_with_one_slow_link_the_suite_shapes(tmp_path: Path, spawn: Spawn) -> None:
    """Three hosts; the suite puts node 2 behind a 20 Mbit/s link, which node 2's launcher
    shapes for the suite and puts back after. The run completes; its manifest records each
    node's host, address and link; the exchange takes at least the ring's bytes over the
    link's rate (a lower bound: a busy machine only lengthens it). Node 2 must at least send
    its own gradients out, or the sums back: the buffer's bytes, whatever algorithm gloo
    picks (a ring sends 2 (n - 1) / n of it, 4/3 here)."""
    suite = tmp_path / "three.toml"
    suite.write_text(THREE_HOSTS)
    with Testbed(3) as bed:
        nodes = [spawn(bed.command(rank, hetbench_command(
            "run", str(suite), "--nnodes", "3", "--node-rank", str(rank), "--master-addr",
            bed.host(0).address, "--master-port", "29400", "--out",
            str(tmp_path / f"node{rank}"), "--no-progress")), cwd=REPO,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in range(3)]
        ends = [p.communicate(timeout=TIMEOUT_S) for p in nodes]
        after = [spawn.run(["tc", "-n", namespace, "qdisc", "show", "dev", device],
                           capture_output=True, text=True, timeout=30).stdout
                 for namespace, device in bed.ends(2)]
        tag = bed.tag
    assert leftovers(tag) == []
    assert [p.returncode for p in nodes] == [0, 0, 0], [e[1][-2000:] for e in ends]
    assert not any("tbf" in shown for shown in after), after  # the testbed's link again
    run_dir = run_dirs(tmp_path / "node0")["allreduce"]
    meta = manifest(run_dir)
    assert meta["status"] == "completed"
    assert [(n["node"], n["address"], n["link"], n["link_applied"]) for n in meta["nodes"]] \
        == [(0, "198.18.0.1", {}, False), (1, "198.18.0.2", {}, False),
            (2, "198.18.0.3", {"rate": "20mbit"}, True)]
    assert [w["node"] for w in meta["workers"]] == [0, 1, 2]
    steps = pd.read_parquet(run_dir / "steps.parquet")
    buffer_bytes = 4 * (meta["workers"][2]["parameters"] + 1)
    least_ms = buffer_bytes * 8 / 20e6 * 1e3
    exchange_ms = steps.loc[steps["step"] >= 1, "allreduce_ns"].min() / 1e6
    print(f"\nthe buffer's {buffer_bytes / 1e3:.0f} KB over 20mbit: at least {least_ms:.1f} "
          f"ms (a ring's share: {least_ms * 4 / 3:.1f} ms); the fastest all-reduce took "
          f"{exchange_ms:.1f} ms")
    assert exchange_ms >= 0.95 * least_ms  # (tbf's bucket lets 6 KB pass at once)


# -- what is refused before anything runs --------------------------------------------------


@pytest.mark.parametrize(("node", "flags", "expected"), [
    (", node = 1", ["--nnodes", "2", "--node-rank", "2", "--master-addr", "127.0.0.1"],
     "--node-rank: 2: must be 0 to 1 (--nnodes 2)"),
    (", node = 1", ["--nnodes", "3", "--node-rank", "0", "--master-addr", "127.0.0.1"],
     "--nnodes: 3, but no worker or server of the suite is on node 2: the suite names nodes "
     "0, 1"),
    (", node = 2", ["--nnodes", "2", "--node-rank", "0", "--master-addr", "127.0.0.1"],
     "runs[0].workers[1].node: 2, but --nnodes 2 joins nodes 0 to 1"),
    (", node = 1", [], "runs[0].workers[1].node: 1, but this is a run on one host: give "
     "--nnodes, --node-rank and --master-addr on every host"),
    (", node = 1", ["--nnodes", "2", "--node-rank", "1"],
     "--master-addr: required with --nnodes 2: node 0's address"),
    (", node = 1", ["--nnodes", "2", "--master-addr", "127.0.0.1"],
     "--node-rank: required with --nnodes 2: 0 to 1"),
    (", node = 1", ["--nnodes", "2", "--node-rank", "1", "--master-addr", "no such host!"],
     "--master-addr: 'no such host!' is neither an IP address nor a host name this host "
     "resolves (node 0's address, e.g. 198.18.0.1)"),
])
def test_bad_hosts_input_is_one_line_before_anything_runs(
        tmp_path: Path, hetbench, node: str, flags: list[str], expected: str) -> None:
    result = hetbench(tmp_path, "run", str(write(tmp_path, node=node)), "--out",
                      str(tmp_path / "out"), *flags)
    assert error_line(result) == f"hetbench: error: {expected}"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("nodes", "flags", "expected"), [
    ('[[nodes]]\n[[nodes]]\n[[nodes]]\n', ["--nnodes", "2", "--node-rank", "0",
                                         "--master-addr", "127.0.0.1"],
     "nodes: 3 [[nodes]] tables, but --nnodes 2: at most one per node"),
    ('[[nodes]]\n[[nodes]]\nlink = { rate = "fast" }\n', [],
     "nodes[1].link.rate: 'fast' is not a rate in tc's units, e.g. 200mbit or 1gbit"),
    ('[[nodes]]\nlink = { speed = "1gbit" }\n', [],
     "nodes[0].link.speed: unknown key (allowed: delay, jitter, loss, rate)"),
    ('[[nodes]]\nlink = { rate = 100 }\n', [],
     "nodes[0].link.rate: 100 is not allowed: a string in tc's units, e.g. \"100mbit\", "
     "\"1ms\", \"0.1%\""),
])
def test_bad_nodes_tables_are_one_line_before_anything_runs(
        tmp_path: Path, hetbench, nodes: str, flags: list[str], expected: str) -> None:
    path = write(tmp_path)
    path.write_text(path.read_text() + "\n" + nodes)
    result = hetbench(tmp_path, "run", str(path), "--out", str(tmp_path / "out"), *flags)
    assert error_line(result) == f"hetbench: error: {expected}"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("server_nodes", "flags", "expected"), [
    ("[0, 1]", [], "runs[2].aggregator.server_nodes[1]: 1, but this is a run on one host: "
     "give --nnodes, --node-rank and --master-addr on every host"),
    ("[0, 2]", ["--nnodes", "2", "--node-rank", "0", "--master-addr", "127.0.0.1"],
     "runs[2].aggregator.server_nodes[1]: 2, but --nnodes 2 joins nodes 0 to 1"),
    ("[1]", [], "runs[2].aggregator.server_nodes: [1] is not allowed: a list of 2 node "
     "number(s), one per server (servers = 2)"),
    ("[0, -1]", [], "runs[2].aggregator.server_nodes[1]: -1 is below the minimum 0"),
    ("[1, 1]", ["--nnodes", "3", "--node-rank", "0", "--master-addr", "127.0.0.1"],
     "--nnodes: 3, but no worker or server of the suite is on node 2: the suite names "
     "nodes 0, 1"),
])
def test_bad_server_nodes_are_one_line_before_anything_runs(
        tmp_path: Path, hetbench, server_nodes: str, flags: list[str], expected: str) -> None:
    path = write(tmp_path, node="" if not flags else ", node = 1", servers=True)
    text = path.read_text().replace(", server_nodes = [0, 1]", "")
    path.write_text(text.replace("servers = 2 }", f"servers = 2, server_nodes = {server_nodes} }}"))
    result = hetbench(tmp_path, "run", str(path), "--out", str(tmp_path / "out"), *flags)
    assert error_line(result) == f"hetbench: error: {expected}"
    assert not (tmp_path / "out").exists()


def test_rank_0_on_another_node_is_refused(tmp_path: Path, hetbench) -> None:
    path = write(tmp_path)
    path.write_text(path.read_text().replace("workers = [ { threads = 1 },",
                                             "workers = [ { threads = 1, node = 1 },", 1))
    result = hetbench(tmp_path, "run", str(path), "--nnodes", "2", "--node-rank", "0",
                      "--master-addr", "127.0.0.1")
    assert error_line(result) == ("hetbench: error: runs[0].workers[0].node: 1, but rank 0 "
                                  "writes the run directory on node 0: list a worker of node 0 "
                                  "first")


def test_an_unreachable_master_is_a_timeout_naming_it(tmp_path: Path, hetbench) -> None:
    port = free_port()  # nobody listens there
    started = time.monotonic()
    result = hetbench(tmp_path, "run", str(write(tmp_path)), "--nnodes", "2", "--node-rank",
                      "1", "--master-addr", "127.0.0.1", "--master-port", str(port),
                      "--join-timeout", "2", "--out", str(tmp_path / "out"))
    line = [ln for ln in result.stderr.splitlines() if ln.startswith("hetbench:")]
    assert result.returncode == 2, result.stderr
    assert line == [f"hetbench: error: --master-addr: no hetbench run of node 0 answered at "
                    f"127.0.0.1:{port} within 2 s"], result.stderr
    assert "Traceback" not in result.stderr
    assert time.monotonic() - started < 60  # a timeout, not a hang


def test_different_suites_on_two_hosts_are_refused_at_the_join(tmp_path: Path,
                                                               spawn: Spawn) -> None:
    """The suites' digests are compared when the hosts join (over loopback here): both
    refuse, naming the suite, before any run starts."""
    port = free_port()
    suites = [write(tmp_path, steps=12, name="a.toml"), write(tmp_path, steps=13, name="b.toml")]
    nodes = [spawn(node_command(rank, suites[rank], tmp_path / f"node{rank}", "127.0.0.1",
                                port, "--join-timeout", "60"),
                   cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank in (0, 1)]
    ends = [p.communicate(timeout=TIMEOUT_S) for p in nodes]
    assert [p.returncode for p in nodes] == [2, 2], [e[1] for e in ends]
    for _, err in ends:
        errors = [ln for ln in err.splitlines() if ln.startswith("hetbench:")]
        assert len(errors) == 1 and errors[0].startswith("hetbench: error: suite: "), err
        assert "run the same suite file" in errors[0]
    assert not list((tmp_path / "node0").glob("hosts/*-r0-*"))


# -- under srun: the flags from SLURM's environment ------------------------------------------


@pytest.mark.parametrize(("nodelist", "first"), [
    ("node[03-05,07],gpu1", "node03"), ("a,b", "a"), ("gpu7", "gpu7"), ("n[1]", "n1")])
def test_the_first_host_of_a_slurm_node_list(nodelist: str, first: str) -> None:
    from hetbench.harness.cli.hosts import first_host

    assert first_host(nodelist) == first


def test_under_srun_the_hosts_come_from_slurms_environment(tmp_path: Path,
                                                           spawn: Spawn) -> None:
    """SLURM's variables set by hand, as srun sets them on each node (no SLURM daemon): the
    same `hetbench run SUITE` on both "nodes" (two launchers on this host's loopback) runs
    the suite across them. Node 1's link, described, is recorded but not applied (these
    are no testbed hosts), and its launcher says so."""
    suite, port = write(tmp_path, steps=6), free_port()
    suite.write_text(suite.read_text() + '\n[[nodes]]\n\n[[nodes]]\nlink = { rate = "10mbit" }\n')
    nodes = []
    for rank in (0, 1):
        env = {**os.environ, "SLURM_JOB_ID": "4242", "SLURM_NNODES": "2",
               "SLURM_NODEID": str(rank), "SLURM_JOB_NODELIST": "localhost",
               "MASTER_PORT": str(port)}
        nodes.append(spawn(hetbench_command("run", str(suite), "-k", "allreduce", "--out",
                                            str(tmp_path / f"node{rank}"), "--no-progress"),
                           env=env, cwd=REPO, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True))
    ends = [p.communicate(timeout=TIMEOUT_S) for p in nodes]
    assert [p.returncode for p in nodes] == [0, 0], [e[1][-2000:] for e in ends]
    assert "(node 1 of 2)" in ends[1][0]
    meta = manifest(run_dirs(tmp_path / "node0")["allreduce"])
    assert (meta["status"], meta["rows"]) == ("completed", 12)
    assert [n["address"] for n in meta["nodes"]] == ["127.0.0.1", "127.0.0.1"]
    assert [(n["link"], n["link_applied"]) for n in meta["nodes"]] == [
        ({}, False), ({"rate": "10mbit"}, False)]
    assert "warning: nodes[1].link (rate 10mbit) is recorded, not applied: hetbench shapes " \
        "links only on its testbed's hosts (`hetbench testbed up`), and 127.0.0.1 is not " \
        "one" in ends[1][1]


# -- as torchrun's entry point: the hosts from torchrun's environment -----------------------


def test_as_torchruns_entry_point_the_launchers_meet_in_its_agents_store(
        tmp_path: Path, spawn: Spawn) -> None:
    """`torchrun --nnodes 2 --node-rank K ... -m hetbench.harness.cli.main run SUITE` on both
    "nodes" (two torchruns over loopback): each starts one hetbench launcher, which takes its node
    from torchrun's environment and meets the other in the store torchrun's agent serves on
    node 0 (the launchers' keys under their prefix). The workers inherit none of torchrun's
    variables (a worker told TORCHELASTIC_USE_AGENT_STORE would wait for a store nobody
    serves): the suite completes across the two."""
    suite, port = write(tmp_path, steps=6), free_port()
    nodes = [spawn([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
                    "--node-rank", str(rank), "--master-addr", "127.0.0.1", "--master-port",
                    str(port), "--nproc-per-node", "1", "-m", "hetbench.harness.cli.main", "run",
                    str(suite), "-k", "allreduce", "--out", str(tmp_path / f"node{rank}"),
                    "--no-progress", "--no-figures"],
                   cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank in (0, 1)]
    ends = [p.communicate(timeout=TIMEOUT_S) for p in nodes]
    assert [p.returncode for p in nodes] == [0, 0], [e[1][-2000:] for e in ends]
    assert f"node 1 of 2: joining at 127.0.0.1:{port}" in ends[1][0]
    meta = manifest(run_dirs(tmp_path / "node0")["allreduce"])
    assert (meta["status"], meta["rows"]) == ("completed", 12)
    assert [w["node"] for w in meta["workers"]] == [0, 1]
    assert len(meta["nodes"]) == 2
    share = tmp_path / "node1" / "hosts" / run_dirs(tmp_path / "node0")["allreduce"].name
    assert json.loads((share / "nodes" / "1" / "node.json").read_text())["status"] == "completed"


TORCHRUN_NODE_1 = {"TORCHELASTIC_RUN_ID": "none", "TORCHELASTIC_USE_AGENT_STORE": "True",
                   "TORCHELASTIC_MAX_RESTARTS": "0", "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2",
                   "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


@pytest.mark.parametrize(("variables", "flags", "expected"), [
    ({"LOCAL_WORLD_SIZE": "2"}, [],
     "--nproc-per-node: 2 (torchrun's): must be 1, hetbench starts each host's workers itself"),
    ({"TORCHELASTIC_MAX_RESTARTS": "3"}, [],
     "--max-restarts: 3 (torchrun's): must be 0, hetbench closes a failed run itself and goes "
     "on with the next (a restart would run the whole suite again)"),
    ({}, ["--node-rank", "0"],
     "--node-rank: 0, but torchrun says 1: under torchrun, give it to torchrun alone"),
    ({"GROUP_WORLD_SIZE": "3"}, [],
     "--nnodes: 3, but no worker or server of the suite is on node 2: the suite names nodes "
     "0, 1"),
    ({"GROUP_RANK": "two"}, [], "GROUP_RANK: 'two' in the environment is not a number"),
])
def test_bad_torchrun_settings_are_one_line_before_anything_runs(
        tmp_path: Path, hetbench, variables: dict[str, str], flags: list[str],
        expected: str) -> None:
    """torchrun's variables set by hand, as it sets them for the process it starts."""
    env = {**os.environ, **TORCHRUN_NODE_1, **variables}
    result = hetbench(tmp_path, "run", str(write(tmp_path)), "--out", str(tmp_path / "out"),
                      *flags, env=env)
    assert error_line(result) == f"hetbench: error: {expected}"
    assert not (tmp_path / "out").exists()
