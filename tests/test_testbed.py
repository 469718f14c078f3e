"""Hosts emulated in network namespaces (issue 27, harness/system/testbed.py): real hosts to
every socket, with addresses from 198.18.0.0/15 and no route out of the machine, links
shaped by tc, and nothing of them left afterwards, whatever happens."""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from hetbench.harness.system import testbed
from hetbench.harness.system.testbed import Link, Testbed, TestbedError, leftovers
from tests.conftest import REPO, Spawn, hetbench_command
from tests.test_cli_errors import error_line

TIMEOUT_S = 60
BENCHMARKING = ipaddress.ip_network("198.18.0.0/15")

needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None,
    reason="the testbed needs root and iproute2 (ip, tc) to create network namespaces")

RECEIVER = """
import socket, sys
s = socket.socket()
s.bind((sys.argv[1], 5000))
s.listen()
print("listening", flush=True)
c, _ = s.accept()
n = 0
while (b := c.recv(65536)):
    n += len(b)
print(n, flush=True)
"""
SENDER = """
import socket, sys, time
c = socket.create_connection((sys.argv[1], 5000), timeout=20)
started = time.monotonic()
c.sendall(b"x" * int(sys.argv[2]))
c.shutdown(socket.SHUT_WR)
c.recv(1)  # the receiver has read everything once it closes
print(time.monotonic() - started)
"""


@pytest.fixture
def bed() -> Iterator[Testbed]:
    """Two hosts, host 1's link at 20 Mbit/s; removed after the test, also on failure."""
    made = Testbed(2, {1: Link(rate="20mbit")})
    with made:
        yield made
    assert leftovers(made.tag) == []


# -- what is allowed, without building ------------------------------------------------------


@pytest.mark.parametrize(("link", "problem"), [
    (Link(rate="fast"), ("rate", "'fast' is not a rate in tc's units, e.g. 200mbit or 1gbit")),
    (Link(delay="1 ms"), ("delay", "'1 ms' is not a time, e.g. 1ms or 250us")),
    (Link(loss="0.1"), ("loss", "'0.1' is not a percentage, e.g. 0.1%")),
    (Link(jitter="1ms"), ("jitter", "needs a delay")),
])
def test_a_bad_link_is_named(link: Link, problem: tuple[str, str]) -> None:
    assert link.problem() == problem


def test_a_link_becomes_tbf_or_netem() -> None:
    assert Link(rate="100mbit").qdisc() == ["tbf", "rate", "100mbit", "burst", "12500",
                                            "latency", "100ms"]
    assert Link(rate="1mbit").qdisc()[4] == str(4 * 1514)  # at least a few frames
    assert Link(rate="1gbit", delay="2ms", jitter="1ms", loss="1%").qdisc() == [
        "netem", "delay", "2ms", "1ms", "loss", "1%", "rate", "1gbit"]
    assert Link().problem() is None and not Link().shaped


@pytest.mark.parametrize(("clocks", "message"), [
    ({2: 5.0}, "clock of host 2: no such host (hosts 0 to 1)"),
    ({1: -5.0}, "clock of host 1: -5 s is out of range (0 to 86400 s ahead)"),
])
def test_a_bad_clock_is_named_before_anything_is_made(clocks: dict[int, float],
                                                      message: str) -> None:
    with pytest.raises(TestbedError) as caught:
        Testbed(2, clocks=clocks).check()
    assert str(caught.value) == message


def test_a_host_with_a_clock_of_its_own_runs_in_a_time_namespace() -> None:
    bed = Testbed(2, clocks={1: 5.0})
    told = ["env", f"HETBENCH_TESTBED={json.dumps(bed.describe())}"]  # the hosts, as JSON
    assert bed.command(0, ["true"]) == ["ip", "netns", "exec", bed.host(0).namespace, *told,
                                        "true"]
    assert bed.command(1, ["true"]) == ["ip", "netns", "exec", bed.host(1).namespace, *told,
                                        "unshare", "--time", "--monotonic", "5",
                                        "--boottime", "5", "--", "true"]
    assert json.loads(told[1].split("=", 1)[1])[1]["ends"] == [
        [bed.host(1).namespace, "eth0"], [bed.switch, "p1"]]


def test_hosts_get_benchmarking_addresses() -> None:
    bed = Testbed(64)
    addresses = [ipaddress.ip_address(h.address) for h in bed.all_hosts]
    assert all(a in BENCHMARKING for a in addresses) and len(set(addresses)) == 64


# -- a real testbed -----------------------------------------------------------------------


def run_on(spawn: Spawn, bed: Testbed, rank: int, argv: list[str]
           ) -> subprocess.CompletedProcess[str]:
    return spawn.run(bed.command(rank, argv), capture_output=True, text=True, timeout=60)


@needs_root
def test_each_host_is_a_namespace_with_its_address_and_no_route_out(
        bed: Testbed, spawn: Spawn) -> None:
    assert leftovers(bed.tag) == sorted([bed.switch, bed.host(0).namespace,
                                         bed.host(1).namespace])
    for host in bed.all_hosts:
        links = json.loads(run_on(spawn, bed, host.rank, ["ip", "-j", "addr"]).stdout)
        assert sorted(link["ifname"] for link in links) == ["eth0", "lo"]
        inet = [(a["local"], a["prefixlen"]) for link in links if link["ifname"] == "eth0"
                for a in link["addr_info"] if a["family"] == "inet"]
        assert inet == [(host.address, 24)]
        routes = json.loads(run_on(spawn, bed, host.rank, ["ip", "-j", "route"]).stdout)
        assert [r["dst"] for r in routes] == ["198.18.0.0/24"]  # no default route
    # nothing of the machine's own network is reachable from a host
    unreachable = run_on(spawn, bed, 0, [sys.executable, "-c",
                                         "import socket; socket.create_connection(('8.8.8.8', "
                                         "53), timeout=2)"])
    assert unreachable.returncode != 0 and "unreachable" in unreachable.stderr.lower()


@needs_root
def test_hosts_talk_over_their_shaped_link(bed: Testbed, spawn: Spawn) -> None:
    """2.5 MB to host 1 through its 20 Mbit/s link takes at least a second (unshaped, a
    veth pair carries it in milliseconds): a lower bound, which a busy machine cannot
    break."""
    size = 2_500_000
    receiver = spawn(bed.command(1, [sys.executable, "-c", RECEIVER, bed.host(1).address]),
                     stdout=subprocess.PIPE, text=True)
    assert receiver.stdout is not None and receiver.stdout.readline() == "listening\n"
    sent = run_on(spawn, bed, 0, [sys.executable, "-c", SENDER, bed.host(1).address,
                                  str(size)])
    assert sent.returncode == 0, sent.stderr
    out, _ = receiver.communicate(timeout=60)
    assert int(out) == size
    print(f"\n{size / 1e6:g} MB over a 20mbit link: {float(sent.stdout):.2f} s "
          f"(the rate's own {size * 8 / 20e6:.2f} s)")
    assert float(sent.stdout) >= 0.8 * size * 8 / 20e6, sent.stdout


@needs_root
def test_an_error_inside_removes_every_namespace() -> None:
    made = Testbed(3)
    with pytest.raises(RuntimeError, match="inside"), made:
        assert len(leftovers(made.tag)) == 4
        raise RuntimeError("inside")
    assert leftovers(made.tag) == []


@needs_root
def test_a_build_that_fails_midway_removes_what_it_made(monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    made = Testbed(3)
    real = testbed.Testbed._add_host

    def fail_on_last(self: Testbed, host: testbed.Host) -> None:
        if host.rank == 2:
            raise TestbedError("no more")
        real(self, host)

    monkeypatch.setattr(testbed.Testbed, "_add_host", fail_on_last)
    with pytest.raises(TestbedError, match="no more"):
        made.up()
    assert leftovers(made.tag) == []


# -- the command -------------------------------------------------------------------------


@needs_root
def test_up_holds_the_hosts_until_ctrl_c_and_then_removes_them(spawn: Spawn) -> None:
    proc = spawn(hetbench_command("testbed", "up", "--hosts", "2", "--link",
                                  "1:rate=100mbit"),
                 cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    lines = [proc.stdout.readline() for _ in range(3)]
    tag = lines[2].split()[1]
    try:
        assert lines[0].startswith(f"host 0: hbtb-{tag}-h0 198.18.0.1 (unshaped)")
        assert lines[1].startswith(f"host 1: hbtb-{tag}-h1 198.18.0.2 (rate 100mbit)")
        assert len(leftovers(tag)) == 3
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=TIMEOUT_S)
        assert proc.returncode == 130
        assert leftovers(tag) == []
    finally:
        for name in leftovers(tag):
            testbed.remove_namespace(name)


@needs_root
def test_up_with_a_command_gives_it_the_hosts_and_its_exit_status(tmp_path: Path,
                                                                  hetbench) -> None:
    program = ("import json, os, sys\nhosts = json.loads(os.environ['HETBENCH_TESTBED'])\n"
               "assert [os.environ[f'HETBENCH_HOST{k}'] for k in range(3)] == "
               "[h['namespace'] for h in hosts]\n"
               "print(json.dumps(hosts))\nsys.exit(3)\n")
    done = hetbench(tmp_path, "testbed", "up", "--hosts", "3", "--", sys.executable, "-c",
                    program)
    assert done.returncode == 3, done.stderr
    hosts = json.loads(done.stdout.splitlines()[-1])
    assert [h["address"] for h in hosts] == ["198.18.0.1", "198.18.0.2", "198.18.0.3"]
    assert leftovers(hosts[0]["namespace"].split("-")[1]) == []


@needs_root
def test_down_removes_what_a_killed_up_left(spawn: Spawn, tmp_path: Path, hetbench) -> None:
    proc = spawn(hetbench_command("testbed", "up"), cwd=REPO, stdout=subprocess.PIPE,
                 text=True)
    assert proc.stdout is not None
    tag = [proc.stdout.readline() for _ in range(3)][2].split()[1]
    proc.kill()
    proc.wait(timeout=TIMEOUT_S)
    try:
        assert len(leftovers(tag)) == 3  # SIGKILL: nothing could remove them
        done = hetbench(tmp_path, "testbed", "down", tag)
        assert (done.returncode, done.stdout.strip()) == (0, "removed 3 namespace(s)")
        assert leftovers(tag) == []
    finally:
        for name in leftovers(tag):
            testbed.remove_namespace(name)


@pytest.mark.parametrize(("args", "line"), [
    (["up", "--hosts", "0"], "hosts: 0 is out of range (1 to 64)"),
    (["up", "--link", "1:speed=3"], "--link: 'speed=3' in '1:speed=3': allowed keys are rate, "
                                    "delay, jitter, loss, as KEY=VALUE"),
    (["up", "--link", "rate=1mbit"], "--link: 'rate=1mbit' is not HOST:KEY=VALUE[,KEY=VALUE...] "
                                     "(e.g. 1:rate=100mbit)"),
    (["up", "--link", "3:rate=1mbit"], "link of host 3: no such host (hosts 0 to 1)"),
    (["up", "--link", "1:rate=fast"], "link of host 1: rate: 'fast' is not a rate in tc's "
                                      "units, e.g. 200mbit or 1gbit"),
    (["down"], "down: name the testbed's tag, or --all"),
], ids=["hosts", "key", "no host", "host range", "rate", "down"])
def test_bad_input_is_one_line_before_anything_is_made(tmp_path: Path, hetbench,
                                                       args: list[str], line: str) -> None:
    before = leftovers()
    assert error_line(hetbench(tmp_path, "testbed", *args)) == f"hetbench: error: {line}"
    assert leftovers() == before


# -- a run across emulated hosts ---------------------------------------------------------

ACROSS = """
[suite]
name = "hosts"

[[runs]]
name = "pair"
workload = "mlp"
dataset = "digits"
steps = 12
global_batch = 64
timeout_s = 30
{interface}
partition = {{ policy = "sizes", sizes = [40, 24] }}
workers = [ {{ device = "cpu" }}, {{ device = "cpu", slowdown = 1.5 }} ]
"""


def torchrun_on(bed: Testbed, rank: int, suite: Path, out: Path) -> list[str]:
    """torchrun for node `rank` of 2, on testbed host `rank`, node 0's address the master."""
    return bed.command(rank, [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank",
        str(rank), "--nproc-per-node", "1", "--master-addr", bed.host(0).address,
        "--master-port", "29500", "-m", "hetbench.harness.loop.worker", "--suite", str(suite),
        "--run-name", "pair", "--out", str(out)])


@pytest.mark.slow
@needs_root
def test_torchrun_across_two_emulated_hosts_trains_as_one_host_does(
        tmp_path: Path, spawn: Spawn, hetbench) -> None:
    """torchrun on each host of the testbed, joined over their eth0 (198.18.0.x) and a
    shaped link: the run completes, and its parameters are those of the same suite run by
    `hetbench run` on one host (unequal slices: weighted aggregation across hosts)."""
    across = tmp_path / "across.toml"
    across.write_text(ACROSS.format(interface='interface = "eth0"'))
    local = tmp_path / "local.toml"
    local.write_text(ACROSS.format(interface=""))
    with Testbed(2, {1: Link(rate="100mbit")}) as bed:
        nodes = [spawn(torchrun_on(bed, rank, across, tmp_path / f"node{rank}"), cwd=REPO,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                 for rank in (0, 1)]
        errors = [p.communicate(timeout=240)[1] for p in nodes]
    assert [p.returncode for p in nodes] == [0, 0], [e[-2000:] for e in errors]
    (run_dir,) = (tmp_path / "node0" / "hosts").glob("pair-r0-*")
    meta = json.loads((run_dir / "manifest.json").read_text())
    assert (meta["status"], meta["rows"], meta["run"]["interface"]) == ("completed", 24, "eth0")

    done = hetbench(tmp_path, "run", str(local), "--out", str(tmp_path / "one"), "--no-progress")
    assert done.returncode == 0, done.stdout + done.stderr
    (one_dir,) = (tmp_path / "one" / "hosts").glob("pair-r0-*")
    with np.load(run_dir / "params.npz") as got, np.load(one_dir / "params.npz") as want:
        assert sorted(got.files) == sorted(want.files) and got.files
        for name in want.files:
            np.testing.assert_allclose(got[name], want[name], rtol=0, atol=1e-5, err_msg=name)


SHIFT_S = 5.0  # host 1's CLOCK_MONOTONIC runs this far ahead of host 0's


@pytest.mark.slow
@needs_root
def test_clocks_of_emulated_hosts_apart_are_aligned(tmp_path: Path, spawn: Spawn) -> None:
    """Issue 27, clocks: host 1's monotonic clock SHIFT_S ahead (a time namespace); the
    offsets measured over the testbed's link put every record on rank 0's clock: no worker
    leaves an all-reduce before the last one arrived, and idle from the aligned instants
    agrees with idle from local durations. Prints both estimates."""
    from hetbench.analysis.view.metrics import idle_agreement
    from hetbench.harness.records.results import load_run

    suite = tmp_path / "suite.toml"
    suite.write_text(ACROSS.format(interface='interface = "eth0"').replace("steps = 12",
                                                                         "steps = 40"))
    with Testbed(2, {1: Link(rate="100mbit")}, clocks={1: SHIFT_S}) as bed:
        shifted = spawn.run(bed.command(1, [sys.executable, "-c", "import time; "
                                            "print(time.monotonic())"]),
                            capture_output=True, text=True, timeout=60)
        assert float(shifted.stdout) - time.monotonic() > SHIFT_S - 1  # the clock is apart
        nodes = [spawn(torchrun_on(bed, rank, suite, tmp_path / "out"), cwd=REPO,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                 for rank in (0, 1)]
        errors = [p.communicate(timeout=240)[1] for p in nodes]
    assert [p.returncode for p in nodes] == [0, 0], [e[-2000:] for e in errors]
    (run_dir,) = (tmp_path / "out" / "hosts").glob("pair-r0-*")
    run = load_run(run_dir)
    clock = run.manifest["clock"]
    assert clock["same_clock"] is False and clock["applied"] is True
    for estimate in (clock["start"], clock["end"]):
        assert abs(estimate["offset_ns"][1] - SHIFT_S * 1e9) < 50_000_000
        assert 0 < estimate["uncertainty_ns"][1] < 5_000_000
    steps = run.steps.groupby("step")
    slack = clock["end"]["uncertainty_ns"][1] + clock["start"]["uncertainty_ns"][1]
    assert (steps["ready_ns"].max() <= steps["reduced_ns"].min() + slack).all()
    agreement = idle_agreement(run.steps)
    assert agreement["median_abs_diff_ms"] < 1.0, agreement
    errors_ns = [e["offset_ns"][1] - SHIFT_S * 1e9 for e in (clock["start"], clock["end"])]
    bounds = [e["uncertainty_ns"][1] for e in (clock["start"], clock["end"])]
    print(f"\noffset errors {errors_ns} ns, uncertainties {bounds} ns, idle {agreement}")
