"""This host's link as the suite describes it (`[[nodes]] link`), for a launch across hosts.

On a host of hetbench's testbed (the testbed tells its commands its hosts: HOSTS_ENV) the
launcher shapes its own host's link for the whole launch, at both ends of the host's veth
pair, and puts back the testbed's own shaping when the launch ends, however it ends. On
any other host hetbench cannot shape the network: the link is recorded, not applied, and
the launcher says so. Either way every run's manifest records it (`nodes`, at the join).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from hetbench.harness.spec.errors import UsageError
from hetbench.harness.spec.suite import SuiteSpec
from hetbench.harness.system import testbed


@contextmanager
def shaped(suite: SuiteSpec, node: int, address: str) -> Iterator[dict[str, Any]]:
    """Node `node`'s link shaped while the launch runs, where it can be: yields what the
    manifest records of it, {"link": {...}, "link_applied": bool}."""
    link = suite.link(node)
    if not link.shaped:
        yield {"link": {}, "link_applied": False}
        return
    host = testbed.testbed_host(address)
    if host is None:
        print(f"warning: nodes[{node}].link ({_text(link)}) is recorded, not applied: "
              f"hetbench shapes links only on its testbed's hosts (`hetbench testbed up`), "
              f"and {address} is not one", file=sys.stderr, flush=True)
        yield {"link": link.to_dict(), "link_applied": False}
        return
    ends = [(str(namespace), str(device)) for namespace, device in host["ends"]]
    before = testbed.Link(**host["link"])
    try:
        testbed.shape(ends, link, node)
    except testbed.TestbedError as exc:
        raise UsageError(f"nodes[{node}].link", str(exc)) from None
    try:
        yield {"link": link.to_dict(), "link_applied": True}
    finally:
        testbed.shape(ends, before, node)


def _text(link: testbed.Link) -> str:
    return ", ".join(f"{k} {v}" for k, v in link.to_dict().items())
