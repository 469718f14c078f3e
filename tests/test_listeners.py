"""Listen on loopback only (issue 18): while a real `hetbench run` trains, every TCP socket
that the launcher or any process under it listens on is bound to a loopback address.

The sockets are read from /proc: the listening ones of /proc/net/tcp and tcp6 (state 0A),
matched by inode to the file descriptors of the launcher and of every process whose
parent chain leads to it (workers, parameter servers, ps-lite's scheduler and server).
The ones the run must have are checked by address, so the test cannot pass on an empty
list: rank 0's rendezvous store on 127.0.0.1:MASTER_PORT and a gloo listener in every
worker; the RPC rendezvous store (ps-sync); ps-lite's scheduler on its root port and a
listener in its server (mxnet-kvstore).

Every process of a run lives in a network namespace of its own whose only interface is
loopback (issue 30; harness/system/netns.py): no other local user can reach a rendezvous
store or an RPC server, which runs pickled calls. Each listener is tried from the test
(refused) and from inside the run's namespace (taken), so the check can tell. TensorFlow's
gRPC servers bind "0.0.0.0:<port>" whatever address they are given: a wildcard there is
loopback too. Each process's sockets are read in its own namespace (/proc/PID/net), and a
wildcard counts as loopback only in a namespace whose interfaces are `lo` alone.
"""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Collection
from datetime import timedelta
from pathlib import Path

import pytest

from hetbench.harness.exchange import rendezvous
from hetbench.harness.records import collector
from hetbench.harness.records.results import load_run
from hetbench.harness.system import netns
from tests.conftest import REPO, Spawn, hetbench_command
from tests.test_mixed_frameworks import installed

pytestmark = pytest.mark.skipif(not Path("/proc/net/tcp").exists(),
                                reason="reads Linux's /proc")

READY_S = 120  # until every worker has flushed a step (TensorFlow starts slowest; CI took > 45 s)
SAMPLE_S = 1.0  # listeners are collected over this long, once the run trains
STOP_S = 30  # Ctrl-C until the launcher and everything under it are gone
QUICK_STOP_S = 15  # what the launcher takes at most after Ctrl-C (TensorFlow's servers too)

SUITE = """
[suite]
name = "listeners"

[[runs]]
name = "long"
framework = "{framework}"
aggregator = "{aggregator}"
workload = "mlp"
dataset = "digits"
steps = 10000  # outlasts the sampling; 100,000: tensorflow-ps 17 s more
global_batch = 64
timeout_s = 30
workers = [ {{ device = "cpu" }}, {{ device = "cpu" }} ]
"""

Listener = tuple[int, str, int]  # pid, address, port


def is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def _address(field: str) -> tuple[str, int]:
    """/proc/net/tcp's "HEX:PORT": the address in the kernel's byte order, 32 bits a word."""
    hex_ip, hex_port = field.split(":")
    raw = bytes.fromhex(hex_ip)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    family = socket.AF_INET if len(raw) == 4 else socket.AF_INET6
    return socket.inet_ntop(family, words), int(hex_port, 16)


def listening_sockets(pid: int | str = "self") -> dict[int, tuple[str, int]]:
    """inode -> (address, port) of every listening TCP socket of the network namespace
    of process `pid`."""
    found = {}
    for table in (f"/proc/{pid}/net/tcp", f"/proc/{pid}/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:  # no such table, or the process is gone
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A":
                found[int(fields[9])] = _address(fields[1])
    return found


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat from the state on (the command name before it may hold spaces)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rfind(")") + 2:].split()


def descendants(root: int) -> list[int]:
    """root and every process whose parent chain leads to it."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := _stat(int(entry))):
            children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def listeners_of(pids: list[int]) -> set[Listener]:
    found = set()
    for pid in pids:
        sockets = listening_sockets(pid)
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue  # gone meanwhile
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:[") and int(target[8:-1]) in sockets:
                found.add((pid, *sockets[int(target[8:-1])]))
    return found


def environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0")
                if "=" in item)


def alive(pid: int, started: str) -> bool:
    """The process with this pid and start time (field 22 of stat) runs (not a zombie)."""
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z" and fields[19] == started


def port_of(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def reachable(spawn: Spawn, port: int, pid: int | None = None) -> bool:
    """Whether a TCP connection to 127.0.0.1:port is taken: from this process, or from a
    process in the network namespace of process `pid`."""
    program = ("import socket, sys\ntry:\n"
               f"    socket.create_connection(('127.0.0.1', {port}), timeout=5).close()\n"
               "except OSError:\n    sys.exit(1)\n")
    command = [sys.executable, "-c", program]
    if pid is not None:
        command = netns.join_command(pid, command)
    return spawn.run(command, cwd=REPO, timeout=60).returncode == 0


def watch_run(spawn: Spawn, tmp_path: Path, framework: str, aggregator: str
              ) -> tuple[set[Listener], dict[int, dict[str, str]], Path, list[int], set[int],
                         dict[int, tuple[bool, bool]]]:
    """Start `hetbench run`, collect the listeners of its process tree while it trains,
    try to connect to each from here and from inside the run's namespace, Ctrl-C it and
    wait until every process seen is gone. Returns the listeners, each process's
    environment, the run directory, the workers' pids, the processes that lived where
    every interface is loopback, and per port listened on (reachable from here, from
    inside). Ctrl-C must end the run (interrupted) within QUICK_STOP_S, every process
    it started with it: this is the Ctrl-C test of every aggregator here."""
    suite = tmp_path / "suite.toml"
    suite.write_text(SUITE.format(framework=framework, aggregator=aggregator))
    out = tmp_path / "out"
    proc = spawn(hetbench_command("run", str(suite), "--out", str(out), "--no-progress"),
                 cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen: dict[int, str] = {}  # pid -> start time, to stop a leftover (and only it)
    envs: dict[int, dict[str, str]] = {}
    found: set[Listener] = set()
    isolated: set[int] = set()
    try:
        deadline = time.monotonic() + READY_S
        while True:
            runs = list((out / "listeners").glob("long-*"))
            if runs and collector.steps_done(runs[0], 2) >= 1:
                break
            if proc.poll() is not None:
                pytest.fail(f"the run ended before training: {proc.communicate()}")
            if time.monotonic() > deadline:
                pytest.fail(f"no step flushed by every worker in {READY_S} s")
            time.sleep(0.1)
        run_dir = runs[0]
        workers = [json.loads((run_dir / "parts" / f"rank{r}.json").read_text())["pid"]
                   for r in range(2)]
        end = time.monotonic() + SAMPLE_S
        while time.monotonic() < end:
            pids = descendants(proc.pid)
            for pid in pids:
                if pid not in seen and (fields := _stat(pid)):
                    seen[pid] = fields[19]
                    envs[pid] = environ(pid)
                    if loopback_only(pid):
                        isolated.add(pid)
            found |= listeners_of(pids)
            time.sleep(0.1)
        reach = {port: (reachable(spawn, port), reachable(spawn, port, pid))
                 for pid, _, port in found}
    finally:
        stopping = time.monotonic()
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        try:
            proc.communicate(timeout=STOP_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate(timeout=STOP_S)
        stopped_in = time.monotonic() - stopping
        deadline = time.monotonic() + STOP_S
        while any(alive(p, s) for p, s in seen.items()) and time.monotonic() < deadline:
            time.sleep(0.1)
        leftover = [p for p, s in seen.items() if alive(p, s)]
        for pid in leftover:
            os.kill(pid, signal.SIGKILL)
    assert not leftover, f"processes left after the run: {leftover}"
    assert proc.returncode == 130, proc.returncode
    assert stopped_in < QUICK_STOP_S, f"Ctrl-C took {stopped_in:.1f} s"
    assert load_run(run_dir).status == "interrupted"
    return found, envs, run_dir, workers, isolated, reach


def loopback_only(pid: int) -> bool:
    """The process lives in a network namespace of its own whose only interface is lo."""
    try:
        return (netns.namespace(pid) != netns.namespace()
                and netns.interfaces(pid) == ["lo"])
    except OSError:
        return False


def check(found: set[Listener], isolated: Collection[int] = ()) -> None:
    """Every listener is on a loopback address, or in a process of `isolated` (which
    loopback_only said live where every interface is loopback)."""
    assert found, "no listening socket seen: the check would be vacuous"
    exposed = sorted((pid, address, port) for pid, address, port in found
                     if not is_loopback(address) and pid not in isolated)
    assert not exposed, f"listening beyond loopback (pid, address, port): {exposed}"


def listens(found: set[Listener], pid: int, port: int | None = None) -> bool:
    return any(p == pid and (port is None or q == port) for p, _, q in found)


def test_the_check_sees_a_wildcard_and_a_loopback_listener() -> None:
    """The detector itself, on sockets of this process: a wildcard is caught, a loopback
    listener passes, a socket that does not listen is not a listener."""
    with socket.socket() as wild, socket.socket() as local, socket.socket() as bound, \
            socket.socket(socket.AF_INET6) as wild6:
        wild.bind(("0.0.0.0", 0))
        local.bind(("127.0.0.1", 0))
        bound.bind(("127.0.0.1", 0))  # not listening
        wild6.bind(("::", 0))
        for s in (wild, local, wild6):
            s.listen()
        found = listeners_of([os.getpid()])
        me = os.getpid()
        assert (me, "0.0.0.0", wild.getsockname()[1]) in found
        assert (me, "127.0.0.1", local.getsockname()[1]) in found
        assert (me, "::", wild6.getsockname()[1]) in found
        assert not any(port == bound.getsockname()[1] for _, _, port in found)
        check({(me, "127.0.0.1", 1), (me, "::1", 2), (me, "::ffff:127.0.0.1", 3)})
        with pytest.raises(AssertionError, match="beyond loopback"):
            check(found)
        check(found, {me})
        with pytest.raises(AssertionError, match="vacuous"):
            check(set())


def test_the_rendezvous_store_listens_on_its_loopback_host_only() -> None:
    """hetbench.harness.exchange.comm's store (what rank 0 serves): bound to 127.0.0.1, not to every
    interface as torch's own; a client reaches it; tcp:// URLs on loopback become the
    bound scheme (the RPC rendezvous), as do those on any address literal; names stay."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    store = rendezvous.tcp_store("127.0.0.1", port, 0, 1, timedelta(seconds=10))
    try:
        mine = {(a, q) for _, a, q in listeners_of([os.getpid()]) if q == port}
        assert mine == {("127.0.0.1", port)}
        store.set("k", "v")
        assert rendezvous.tcp_store("127.0.0.1", port, 1, 1, timedelta(seconds=10)).get("k") == b"v"
    finally:
        del store
    assert rendezvous.bound_url("tcp://127.0.0.1:29500") == \
        f"{rendezvous.BOUND_SCHEME}://127.0.0.1:29500"
    assert rendezvous.bound_url("tcp://[::1]:29500") == f"{rendezvous.BOUND_SCHEME}://[::1]:29500"
    assert rendezvous.bound_url("tcp://198.18.0.1:29500") == \
        f"{rendezvous.BOUND_SCHEME}://198.18.0.1:29500"
    assert rendezvous.bound_url("tcp://node0:29500") == "tcp://node0:29500"
    assert rendezvous.bound_url("env://") == "env://"
    assert not rendezvous.is_address("localhost") and rendezvous.is_address("0.0.0.0")


@pytest.mark.slow
@pytest.mark.parametrize(("framework", "aggregator"), [
    ("pytorch", "torch"),
    ("pytorch", "ps-sync"),
    pytest.param("mxnet", "mxnet-kvstore", marks=pytest.mark.long),
    pytest.param("tensorflow", "tensorflow-collective", marks=pytest.mark.long),
    pytest.param("tensorflow", "tensorflow-ps", marks=pytest.mark.long),
])
def test_every_listener_of_a_run_is_on_loopback(tmp_path: Path, spawn: Spawn, framework: str,
                                                 aggregator: str) -> None:
    if framework != "pytorch" and not installed(framework):
        pytest.skip(f"needs {framework} (pip install 'hetbench[{framework}]')")
    found, envs, run_dir, workers, isolated, reach = watch_run(spawn, tmp_path, framework,
                                                               aggregator)
    network = json.loads((run_dir / "manifest.json").read_text())["network"]
    if network.startswith("host ("):  # the run said so, with a warning
        pytest.skip(f"this host forbids network namespaces: {network}")
    assert network == "private namespace, loopback only"
    # every process of the run in it (issue 30): no other local user reaches a listener,
    # which the run's own processes reach
    assert set(workers) <= isolated, "a worker outside the run's private namespace"
    assert reach and all(inside for _, inside in reach.values()), reach
    assert not any(outside for outside, _ in reach.values()), \
        f"a listener of the run is reachable from outside it: {reach}"
    if aggregator == "tensorflow-collective":
        # TensorFlow binds its servers on every interface: in the workers' own namespace
        tf_ports = {port_of(w) for w in envs[workers[0]]["HETBENCH_TF_WORKERS"].split(",")}
        assert all(any(q == port for _, _, q in found) for port in tf_ports), \
            "a TensorFlow server not seen"
    elif aggregator == "tensorflow-ps":
        # every task of the cluster (worker and ps servers, the coordinator) listens, and
        # every process hetbench started for it lives in the loopback-only namespace
        # (the tasks meet in the store the coordinator serves: its port, and theirs)
        cluster = json.loads((run_dir / "parts" / "tf-coordinator.json").read_text())["cluster"]
        ports = {port_of(a) for addresses in cluster.values() for a in addresses}
        ports.add(port_of(envs[workers[0]]["HETBENCH_TF_STORE"]))
        assert all(any(q == port for _, _, q in found) for port in ports), \
            f"a TensorFlow task not seen: {ports}, {found}"
        tasks = {p for p, env in envs.items() if "HETBENCH_TF_STORE" in env}
        assert len(tasks) == sum(len(a) for a in cluster.values()), (tasks, cluster)
        assert set(workers) <= tasks <= isolated, "a task outside the private namespace"
        check(found, isolated)
        return  # the workers serve TensorFlow: no torch.distributed store, no gloo
    check(found, isolated)
    # what must be there, by address: rank 0's store, gloo in every worker
    store_port = int(envs[workers[0]]["MASTER_PORT"])
    assert any(p == workers[0] and q == store_port and a == "127.0.0.1"
               for p, a, q in found), f"rank 0's store on 127.0.0.1 not seen: {found}"
    for pid in workers:
        assert listens(found, pid), f"worker {pid} listens on nothing: {found}"
    if aggregator == "ps-sync":
        (server,) = (json.loads(p.read_text())["pid"]
                     for p in (run_dir / "parts").glob("ps*.json"))
        rpc_port = port_of(envs[workers[0]]["HETBENCH_PS_INIT"])
        assert listens(found, workers[0], rpc_port), "the RPC store on worker 0 not seen"
        assert listens(found, server), "the parameter server listens on nothing"
    elif aggregator == "mxnet-kvstore":
        services = [p for p, env in envs.items() if env.get("DMLC_ROLE") in ("scheduler",
                                                                              "server")]
        assert len(services) == 2, envs.keys()
        root_port = int(envs[workers[0]]["DMLC_PS_ROOT_PORT"])
        assert any(listens(found, p, root_port) for p in services), "no ps-lite scheduler"
        assert all(listens(found, p) for p in services), "a ps-lite process listens on nothing"


def test_a_joined_process_listens_on_every_interface_of_a_loopback_only_namespace(
        tmp_path: Path, spawn: Spawn) -> None:
    """harness/system/netns.py on its own: the holder's namespace has lo alone, up; a process
    started through join lives there (a wildcard listener it opens is not in the host's
    tables and takes a connection on 127.0.0.1); stopping the holder ends it."""
    holder = netns.start_holder(tmp_path / "netns.log")
    if isinstance(holder, str):
        pytest.skip(f"no network namespace on this host: {holder}")
    try:
        assert netns.interfaces(holder.pid) == ["lo"] and loopback_only(holder.pid)
        program = ("import socket\nfrom hetbench.harness.system import netns\n"
                   "s = socket.socket(); s.bind(('0.0.0.0', 0)); s.listen()\n"
                   "socket.create_connection(('127.0.0.1', s.getsockname()[1])).close()\n"
                   "print(netns.namespace(), s.getsockname()[1])\n")
        done = spawn.run(netns.join_command(holder.pid, [sys.executable, "-c", program]),
                         cwd=REPO, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        namespace, port = done.stdout.split()
        assert namespace == netns.namespace(holder.pid) != netns.namespace()
        assert int(port) not in {q for _, q in listening_sockets().values()}
    finally:
        netns.stop_holder(holder)
    assert holder.returncode == 0
    gone = spawn.run(netns.join_command(holder.pid, [sys.executable, "-c", "pass"]),
                     cwd=REPO, capture_output=True, text=True, timeout=60)
    assert gone.returncode == 1
    assert gone.stderr.startswith("hetbench: error: cannot enter the run's network namespace")
