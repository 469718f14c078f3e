"""A suite's `[[nodes]]`: what it says of each host of a run across hosts, in node order.

    [[nodes]]                                   # node 0
    [[nodes]]                                   # node 1
    link = { rate = "100mbit", delay = "1ms" }

`link` is how the node's network link is shaped, in tc's units
(`hetbench.harness.system.testbed.Link`: rate by a token bucket, delay, jitter and loss by netem).
On hetbench's testbed each host's launcher shapes its own link for the suite and restores it after
(harness/run/links.py); on real hosts the link is recorded only, with a warning. Every run's
manifest records the links with the hosts (`nodes`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hetbench.harness.spec.errors import UsageError
from hetbench.harness.spec.fields import MAX_NODES, check_keys, table
from hetbench.harness.system.testbed import LINK_KEYS, Link

NODE_KEYS = {"link"}


@dataclass(frozen=True)
class NodeSpec:
    link: Link = field(default_factory=Link)  # Link(): as the host's network is


def parse_nodes(raw: Any) -> tuple[NodeSpec, ...]:
    """`[[nodes]]` tables, node 0 first; none: ()."""
    if raw is None:
        return ()
    if not isinstance(raw, list) or len(raw) > MAX_NODES:
        raise UsageError("nodes", f"an array of at most {MAX_NODES} [[nodes]] tables, one per "
                         "node from node 0")
    return tuple(_node(table(item, f"nodes[{k}]"), f"nodes[{k}]") for k, item in enumerate(raw))


def _node(raw: dict[str, Any], where: str) -> NodeSpec:
    check_keys(raw, NODE_KEYS, where)
    if "link" not in raw:
        return NodeSpec()
    values = table(raw["link"], f"{where}.link")
    check_keys(values, set(LINK_KEYS), f"{where}.link")
    for key, value in values.items():
        if not isinstance(value, str):
            raise UsageError(f"{where}.link.{key}", f"{value!r} is not allowed: a string in "
                             "tc's units, e.g. \"100mbit\", \"1ms\", \"0.1%\"")
    link = Link(**values)
    if (problem := link.problem()) is not None:
        raise UsageError(f"{where}.link.{problem[0]}", problem[1])
    return NodeSpec(link)
