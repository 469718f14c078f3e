"""Hosts emulated on this machine (issue 27): each a network namespace of its own, joined by
a veth pair to a bridge that lives in a namespace of its own too (the switch), so nothing
of the testbed touches the machine's own network and no host has a route out of it.

Every socket sees a real host: its own interfaces, its own address from the benchmarking
range 198.18.0.0/15 (RFC 2544) and its own loopback. A host's link is shaped with tc on both
ends of its veth pair (the host's egress and the switch's egress towards it): `rate` with a
token bucket (tbf), `delay`, `jitter` and `loss` with netem, where the kernel has it.

A host may have a clock of its own: `clocks={1: 5.0}` runs host 1's commands in a time
namespace whose CLOCK_MONOTONIC (and CLOCK_BOOTTIME) is 5 s ahead, as two machines' clocks
differ; CLOCK_REALTIME has no namespace in Linux and stays shared.

Building needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN, as `ip netns add` does); where that is
not allowed, `Testbed.up` raises TestbedError with one line saying so. Whatever happens, `down`
deletes every namespace the testbed made (deleting a namespace deletes its interfaces), and
the context manager calls it on the way out, on an error or a Ctrl-C too.

    with Testbed(hosts=3, links={2: Link(rate="100mbit")}) as bed:
        subprocess.run(bed.command(1, ["python", "-m", "..."]))
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
import re
import subprocess
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

HOSTS_ENV = "HETBENCH_TESTBED"  # the hosts, as JSON (Testbed.describe), for its commands
HOST_ENV = "HETBENCH_HOST"  # HETBENCH_HOST<k>: host k's namespace, for a shell
PREFIX = "hbtb"  # every testbed namespace's name starts so: `down` removes no other
NETWORK = ipaddress.ip_network("198.18.0.0/24")  # in 198.18.0.0/15, the benchmarking range
MAX_HOSTS = 64
MAX_CLOCK_OFFSET_S = 86400.0  # a day ahead at most (a clock behind could go below zero)
IP_TIMEOUT_S = 30  # one `ip` or `tc` command
NETNS_DIR = Path("/run/netns")  # where `ip netns` names namespaces

RATE = re.compile(r"^\d+(\.\d+)?(bit|kbit|mbit|gbit)$")
TIME = re.compile(r"^\d+(\.\d+)?(us|ms|s)$")
PERCENT = re.compile(r"^\d+(\.\d+)?%$")
BITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9}


class TestbedError(Exception):
    """The testbed cannot be built here, or was asked for something tc cannot do: one line."""

    __test__ = False  # not a test class, whatever pytest makes of the name


@dataclass(frozen=True)
class Link:
    """How one host's link is shaped (both directions); None: as the veth pair is."""

    rate: str | None = None  # tc's units: "200mbit", "1gbit"
    delay: str | None = None  # "1ms" (netem)
    jitter: str | None = None  # "0.5ms", with a delay (netem)
    loss: str | None = None  # "0.1%" (netem)

    def problem(self) -> tuple[str, str] | None:
        """(key, what is allowed) for the first bad value, or None."""
        for key, value, pattern, allowed in (
                ("rate", self.rate, RATE, "a rate in tc's units, e.g. 200mbit or 1gbit"),
                ("delay", self.delay, TIME, "a time, e.g. 1ms or 250us"),
                ("jitter", self.jitter, TIME, "a time, e.g. 0.5ms"),
                ("loss", self.loss, PERCENT, "a percentage, e.g. 0.1%")):
            if value is not None and not pattern.match(value):
                return key, f"{value!r} is not {allowed}"
        if self.jitter is not None and self.delay is None:
            return "jitter", "needs a delay"
        return None

    @property
    def shaped(self) -> bool:
        return any(v is not None for v in (self.rate, self.delay, self.loss))

    def qdisc(self) -> list[str]:
        """The root qdisc's arguments for `tc qdisc add dev D root ...`."""
        if self.delay is None and self.loss is None:
            assert self.rate is not None
            return ["tbf", "rate", self.rate, "burst", str(_burst_bytes(self.rate)),
                    "latency", "100ms"]
        args = ["netem"]
        if self.delay is not None:
            args += ["delay", self.delay] + ([self.jitter] if self.jitter else [])
        if self.loss is not None:
            args += ["loss", self.loss]
        if self.rate is not None:
            args += ["rate", self.rate]
        return args

    def to_dict(self) -> dict[str, str]:
        """The keys set, as the manifest and `testbed up` show them."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


LINK_KEYS = tuple(f.name for f in dataclasses.fields(Link))


def _burst_bytes(rate: str) -> int:
    """The token bucket's depth: 1 ms at the rate, and at least a few full frames (a
    bucket under one frame would pass nothing). A deeper bucket passes its depth at the
    veth's speed: with 10 ms, a 271 KB exchange at 100mbit took 0.64 of bytes / rate."""
    match = re.match(r"^(\d+(?:\.\d+)?)(\w+)$", rate)
    assert match is not None
    bits_per_s = float(match.group(1)) * BITS[match.group(2)]
    return max(int(bits_per_s / 8 / 1000), 4 * 1514)


@dataclass(frozen=True)
class Host:
    rank: int
    namespace: str
    address: str
    link: Link


@dataclass
class Testbed:
    """N hosts, built by `up` (or `with`), removed by `down`."""

    __test__ = False

    hosts: int
    links: dict[int, Link] = field(default_factory=dict)
    clocks: dict[int, float] = field(default_factory=dict)  # host -> monotonic offset, s
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:6])
    made: list[str] = field(default_factory=list)  # namespaces made, to delete

    @property
    def switch(self) -> str:
        return f"{PREFIX}-{self.tag}-sw"

    def host(self, rank: int) -> Host:
        return Host(rank, f"{PREFIX}-{self.tag}-h{rank}", str(NETWORK[rank + 1]),
                    self.links.get(rank, Link()))

    @property
    def all_hosts(self) -> list[Host]:
        return [self.host(rank) for rank in range(self.hosts)]

    def command(self, rank: int, argv: list[str]) -> list[str]:
        """`argv` run on host `rank`: in its network namespace, and in a time namespace of
        its own where the host's clock is offset; told the testbed (HOSTS_ENV)."""
        offset = self.clocks.get(rank)
        if offset:
            argv = ["unshare", "--time", "--monotonic", f"{offset:g}", "--boottime",
                    f"{offset:g}", "--", *argv]
        return ["ip", "netns", "exec", self.host(rank).namespace, "env",
                f"{HOSTS_ENV}={json.dumps(self.describe())}", *argv]

    def environment(self) -> dict[str, str]:
        """What a command run beside the testbed is told: the hosts (HOSTS_ENV, as JSON)
        and each host's namespace (HETBENCH_HOST<k>, for a shell)."""
        return {HOSTS_ENV: json.dumps(self.describe()),
                **{f"{HOST_ENV}{h.rank}": h.namespace for h in self.all_hosts}}

    def check(self) -> None:
        """Refuse what cannot be built, before anything is made: one line."""
        if not 1 <= self.hosts <= MAX_HOSTS:
            raise TestbedError(f"hosts: {self.hosts} is out of range (1 to {MAX_HOSTS})")
        for rank, link in sorted(self.links.items()):
            if not 0 <= rank < self.hosts:
                raise TestbedError(f"link of host {rank}: no such host (hosts 0 to "
                                   f"{self.hosts - 1})")
            if (problem := link.problem()) is not None:
                raise TestbedError(f"link of host {rank}: {problem[0]}: {problem[1]}")
        for rank, offset in sorted(self.clocks.items()):
            if not 0 <= rank < self.hosts:
                raise TestbedError(f"clock of host {rank}: no such host (hosts 0 to "
                                   f"{self.hosts - 1})")
            if not 0 <= offset <= MAX_CLOCK_OFFSET_S:
                raise TestbedError(f"clock of host {rank}: {offset:g} s is out of range "
                                   f"(0 to {MAX_CLOCK_OFFSET_S:g} s ahead)")
        if os.geteuid() != 0:
            raise TestbedError("the testbed needs root to create network namespaces "
                               "(`ip netns add`): run it as root")

    def up(self) -> Testbed:
        """Build it; on any failure, remove what was made and raise TestbedError."""
        self.check()
        try:
            self._add_namespace(self.switch)
            _ip(["ip", "-n", self.switch, "link", "add", "br0", "type", "bridge"])
            _ip(["ip", "-n", self.switch, "link", "set", "br0", "up"])
            for host in self.all_hosts:
                self._add_host(host)
        except BaseException:
            self.down()
            raise
        return self

    def _add_namespace(self, name: str) -> None:
        _ip(["ip", "netns", "add", name])
        self.made.append(name)
        _ip(["ip", "-n", name, "link", "set", "lo", "up"])

    def _add_host(self, host: Host) -> None:
        port = f"p{host.rank}"  # the switch's end of the host's veth pair
        self._add_namespace(host.namespace)
        _ip(["ip", "-n", self.switch, "link", "add", port, "type", "veth", "peer", "name",
             "eth0", "netns", host.namespace])
        _ip(["ip", "-n", self.switch, "link", "set", port, "master", "br0", "up"])
        _ip(["ip", "-n", host.namespace, "addr", "add",
             f"{host.address}/{NETWORK.prefixlen}", "dev", "eth0"])
        _ip(["ip", "-n", host.namespace, "link", "set", "eth0", "up"])
        if host.link.shaped:
            shape(self.ends(host.rank), host.link, host.rank)

    def ends(self, rank: int) -> list[tuple[str, str]]:
        """Host `rank`'s link: (namespace, device) of each end of its veth pair."""
        return [(self.host(rank).namespace, "eth0"), (self.switch, f"p{rank}")]

    def down(self) -> None:
        """Delete every namespace made (hosts first, then the switch); their interfaces go
        with them. Safe to call twice."""
        for name in reversed(self.made):
            remove_namespace(name)
        self.made.clear()

    def __enter__(self) -> Testbed:
        return self.up()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.down()

    def describe(self) -> list[dict[str, object]]:
        """What its commands are told of the hosts (HOSTS_ENV): namespace, address, link,
        clock offset, and the ends of the link (to shape it: `shape`)."""
        return [{"rank": h.rank, "namespace": h.namespace, "address": h.address,
                 "link": h.link.to_dict(), "clock_offset_s": self.clocks.get(h.rank, 0.0),
                 "ends": [list(end) for end in self.ends(h.rank)]}
                for h in self.all_hosts]


def shape(ends: list[tuple[str, str]], link: Link, rank: int) -> None:
    """Shape a host's link as `link` says, at both ends of its veth pair (each end's
    egress), replacing what was there; Link(): as the veth pair is."""
    for namespace, device in ends:
        if link.shaped:
            _tc(["tc", "-n", namespace, "qdisc", "replace", "dev", device, "root",
                 *link.qdisc()], rank)
        else:  # no root qdisc of ours left (none there is fine)
            subprocess.run(["tc", "-n", namespace, "qdisc", "del", "dev", device, "root"],
                           capture_output=True, timeout=IP_TIMEOUT_S)


def testbed_host(address: str) -> dict[str, Any] | None:
    """The testbed host holding `address`, as the testbed told this process (HOSTS_ENV),
    or None: not on a testbed host."""
    try:
        hosts = json.loads(os.environ.get(HOSTS_ENV, "[]"))
    except ValueError:
        return None
    return next((h for h in hosts if isinstance(h, dict) and h.get("address") == address),
                None)


def remove_namespace(name: str) -> None:
    subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=IP_TIMEOUT_S)


def leftovers(tag: str | None = None) -> list[str]:
    """Testbed namespaces on this machine (of testbed `tag`, or of any)."""
    start = f"{PREFIX}-{tag}-" if tag else f"{PREFIX}-"
    return sorted(p.name for p in NETNS_DIR.glob(f"{start}*")) if NETNS_DIR.is_dir() else []


def _ip(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=IP_TIMEOUT_S)
    if done.returncode != 0:
        raise TestbedError(f"`{' '.join(argv)}` failed: {_last_line(done.stderr)}")


def _tc(argv: list[str], rank: int) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=IP_TIMEOUT_S)
    if done.returncode == 0:
        return
    why = _last_line(done.stderr)
    if "unknown" in why.lower() and argv[argv.index("root") + 1] == "netem":
        raise TestbedError(f"link of host {rank}: delay, jitter and loss need tc's netem, "
                           "which this kernel lacks (sch_netem); rate alone shapes with tbf")
    raise TestbedError(f"link of host {rank}: `{' '.join(argv)}` failed: {why}")


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "no message"
