"""`hetbench testbed up|down`: hosts emulated on this machine as network namespaces
(harness/system/testbed.py), for studies and tests of runs across hosts.

    hetbench testbed up --hosts 3 --link 2:rate=100mbit            # until Ctrl-C
    hetbench testbed up --hosts 2 -- python my_study.py            # while it runs
    hetbench testbed down --all                                    # after a SIGKILL

`up` builds the hosts, prints one line per host (namespace, address, link), and holds
them until Ctrl-C, SIGTERM or SIGHUP, or, given a command, while the command runs (its
exit status is `up`'s; HETBENCH_TESTBED tells it the hosts, as JSON, and HETBENCH_HOST<k>
host k's namespace). Either way it removes every namespace it made. Run a process on a
host with `ip netns exec NAMESPACE COMMAND`.

A signal to `up` while its command runs is passed on to the command (system/children.py),
and the hosts stay until it has closed its runs across them (a bounded wait; a second
Ctrl-C ends it): torn down earlier, the links would vanish under launchers still closing.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from hetbench.harness.spec.errors import UsageError
from hetbench.harness.system import children, testbed


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    up = sub.add_parser("up", help="build the hosts; hold them until Ctrl-C or a command ends")
    up.add_argument("--hosts", type=int, default=2, help="how many hosts (default: 2)")
    up.add_argument("--link", action="append", default=[], metavar="HOST:KEY=VALUE,...",
                    help="shape host HOST's link: rate (tbf, e.g. 200mbit), delay, jitter, "
                         "loss (netem, where the kernel has it); repeatable")
    up.add_argument("command", nargs=argparse.REMAINDER,
                    help="-- COMMAND...: run it with the hosts up, then remove them")
    down = sub.add_parser("down", help="remove testbed namespaces left by a killed `up`")
    down.add_argument("tag", nargs="?", help="the testbed's tag (in its namespaces' names)")
    down.add_argument("--all", action="store_true", help="every testbed on this machine")


def parse_link(text: str) -> tuple[int, dict[str, str]]:
    """"2:rate=100mbit,delay=1ms" -> (2, {"rate": "100mbit", "delay": "1ms"})."""
    host, sep, pairs = text.partition(":")
    if not sep or not host.isdigit():
        raise UsageError("--link", f"{text!r} is not HOST:KEY=VALUE[,KEY=VALUE...] "
                         "(e.g. 1:rate=100mbit)")
    values: dict[str, str] = {}
    for pair in filter(None, pairs.split(",")):
        key, eq, value = pair.partition("=")
        if not eq or key not in testbed.LINK_KEYS:
            raise UsageError("--link", f"{pair!r} in {text!r}: allowed keys are "
                             f"{', '.join(testbed.LINK_KEYS)}, as KEY=VALUE")
        values[key] = value
    if not values:
        raise UsageError("--link", f"{text!r} shapes nothing (allowed keys: "
                         f"{', '.join(testbed.LINK_KEYS)})")
    return int(host), values


def run(args: argparse.Namespace) -> int:
    if args.action == "down":
        return down(args)
    links = {}
    for text in args.link:
        rank, values = parse_link(text)
        links[rank] = testbed.Link(**values)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    bed = testbed.Testbed(args.hosts, links)
    try:
        bed.check()  # one line, exit 2, before anything is made
    except testbed.TestbedError as exc:
        raise UsageError("", str(exc)) from None
    try:
        bed.up()
    except testbed.TestbedError as exc:
        print(f"hetbench: error: testbed: {exc}", file=sys.stderr)
        return 1
    try:
        for host in bed.all_hosts:
            link = ", ".join(f"{k} {v}" for k, v in host.link.to_dict().items()) or "unshaped"
            print(f"host {host.rank}: {host.namespace} {host.address} ({link})")
        print(f"testbed {bed.tag} up: `ip netns exec NAMESPACE COMMAND` runs on a host; "
              + ("it goes when the command ends" if command else "Ctrl-C removes it"),
              flush=True)
        if command:  # a signal goes on to it, and the hosts stay until it closed its runs
            return children.run_and_wait(
                command, "the command", "hetbench recover FOLDER (the folder of its runs)",
                env={**os.environ, **bed.environment()})
        while True:  # until a signal (harness/system/signals.py raises it here)
            time.sleep(3600)
    finally:
        bed.down()


def down(args: argparse.Namespace) -> int:
    if not args.all and not args.tag:
        raise UsageError("down", "name the testbed's tag, or --all")
    names = testbed.leftovers(None if args.all else args.tag)
    for name in names:
        testbed.remove_namespace(name)
    left = testbed.leftovers(None if args.all else args.tag)
    print(f"removed {len(names) - len(left)} namespace(s)" + (f"; left: {', '.join(left)}"
                                                              if left else ""))
    return 1 if left else 0
