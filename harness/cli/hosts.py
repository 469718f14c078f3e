"""`hetbench run --nnodes N --node-rank R --master-addr A --master-port P`: where this host
stands among the hosts of a suite, from the flags (torchrun's names), from torchrun's
environment when torchrun started this launcher, or under srun from SLURM's; checked
against the suite before anything runs."""

from __future__ import annotations

import argparse
import ipaddress
import os
import re
import socket
import sys
from typing import TYPE_CHECKING, Any

from hetbench.harness.spec.errors import UsageError
from hetbench.harness.spec.suite import SuiteSpec
from hetbench.harness.system import interfaces

if TYPE_CHECKING:  # loaded on use: nodes loads torch.distributed
    from hetbench.harness.run.nodes import Nodes, Place

MASTER_PORT = 29500  # torchrun's default
JOIN_TIMEOUT_S = 300.0
# What torchrun tells the process it starts (torch.distributed.elastic's LocalElasticAgent):
# this launcher's, never its workers' (a worker told TORCHELASTIC_USE_AGENT_STORE would wait
# for a store nobody serves); the workers get their own rendezvous from the launcher.
TORCHRUN_VARIABLES = (
    "RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "LOCAL_WORLD_SIZE",
    "WORLD_SIZE", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE")


def place(args: argparse.Namespace, suite: SuiteSpec) -> Place | None:
    """This host's Place among the hosts, or None for a run on this host alone. Raises
    UsageError naming the flag or the suite's field that does not fit."""
    from hetbench.harness.run.nodes import Place

    torchrun = _from_torchrun(args)
    if torchrun is not None:
        nnodes, node_rank, master, port, agent_store = torchrun
    else:
        nnodes, node_rank, master, port = _from_slurm(args)
        agent_store = False
    if args.join_timeout is not None and not args.join_timeout > 0:
        raise UsageError("--join-timeout", f"{args.join_timeout:g}: must be more than 0 s")
    if nnodes is None or nnodes == 1:
        if node_rank not in (None, 0):
            raise UsageError("--node-rank", f"{node_rank}, but there is one node (--nnodes "
                             f"{nnodes or 1}): 0 or none")
        _refuse_other_nodes(suite, 1)
        if any(node.link.shaped for node in suite.nodes):
            print("warning: nodes: the links are for runs across hosts (--nnodes); a run on "
                  "one host goes over loopback and records none", file=sys.stderr, flush=True)
        return None
    if nnodes < 1:
        raise UsageError("--nnodes", f"{nnodes}: must be at least 1")
    if node_rank is None:
        raise UsageError("--node-rank", f"required with --nnodes {nnodes}: 0 to {nnodes - 1}")
    if not 0 <= node_rank < nnodes:
        raise UsageError("--node-rank", f"{node_rank}: must be 0 to {nnodes - 1} "
                         f"(--nnodes {nnodes})")
    if master is None:
        raise UsageError("--master-addr", f"required with --nnodes {nnodes}: node 0's address")
    master = _address(master)
    if not 1 <= port <= 65535:
        raise UsageError("--master-port", f"{port}: must be 1 to 65535")
    _refuse_other_nodes(suite, nnodes)
    if len(suite.nodes) > nnodes:
        raise UsageError("nodes", f"{len(suite.nodes)} [[nodes]] tables, but --nnodes "
                         f"{nnodes}: at most one per node")
    if args.skip_unavailable:
        raise UsageError("--skip-unavailable", "not across hosts: every host runs every run "
                         "of the suite (a run this host cannot run is refused)")
    for i, run in enumerate(suite.runs):
        if run.interface is not None and (why := interfaces.missing(run.interface)):
            raise UsageError(f"runs[{i}].interface", why)
    return Place(nnodes, node_rank, master, port, args.join_timeout, agent_store)


def join(where: Place, suite: SuiteSpec, link: dict[str, Any]) -> Nodes:
    """Meet the other hosts (hetbench.harness.run.nodes), saying so on this one; `link`: what the
    manifests record of this host's link."""
    from hetbench.harness.run.nodes import Nodes, suite_digest

    print(f"node {where.node_rank} of {where.nnodes}: joining at {where.master_addr}:"
          f"{where.master_port} (up to {where.join_timeout_s:g} s)", flush=True)
    return Nodes.join(where, suite_digest(suite), link)


def address(where: Any) -> str:
    """This host's address towards node 0."""
    return interfaces.address_towards(where.master_addr, where.master_port)


def _address(master: str) -> str:
    """node 0's IP address: as given, or a host name (SLURM's node list) resolved."""
    try:
        return str(ipaddress.ip_address(master))
    except ValueError:
        pass
    try:
        return socket.gethostbyname(master)
    except OSError:
        raise UsageError("--master-addr", f"{master!r} is neither an IP address nor a host "
                         "name this host resolves (node 0's address, e.g. 198.18.0.1)"
                         ) from None


def _refuse_other_nodes(suite: Any, nnodes: int) -> None:
    """Every worker and server on a node some host joins, and every host running some."""
    named: set[int] = set()
    for i, run in enumerate(suite.runs):
        placed = [(f"runs[{i}].workers[{j}].node", w.node) for j, w in enumerate(run.workers)]
        placed += [(f"runs[{i}].aggregator.server_nodes[{k}]", node)
                   for k, node in enumerate(run.aggregator.server_nodes)]
        for field, node in placed:
            named.add(node)
            if node >= nnodes:
                if nnodes == 1:
                    raise UsageError(field, f"{node}, but this is a run on one host: give "
                                     "--nnodes, --node-rank and --master-addr on every host")
                raise UsageError(field, f"{node}, but --nnodes {nnodes} joins nodes 0 to "
                                 f"{nnodes - 1}")
    if nnodes > 1 and len(named) != nnodes:
        idle = sorted(set(range(nnodes)) - named)
        raise UsageError("--nnodes", f"{nnodes}, but no worker or server of the suite is on "
                         f"node {', '.join(map(str, idle))}: the suite names nodes "
                         f"{', '.join(map(str, sorted(named)))}")


def _from_torchrun(args: argparse.Namespace
                   ) -> tuple[int | None, int | None, str | None, int, bool] | None:
    """Under torchrun (TORCHELASTIC_RUN_ID set), with one process a host: node GROUP_RANK
    of GROUP_WORLD_SIZE, node 0 at MASTER_ADDR, where torchrun's agent serves its store on
    MASTER_PORT (the launchers then use that store, under a prefix of their own). torchrun's
    variables are then taken out of the environment that every process this launcher
    starts inherits. None when torchrun did not start this launcher."""
    env = os.environ
    if "TORCHELASTIC_RUN_ID" not in env:
        return None
    local = _env_int("LOCAL_WORLD_SIZE", 1)
    if local != 1:
        raise UsageError("--nproc-per-node", f"{local} (torchrun's): must be 1, hetbench "
                         "starts each host's workers itself")
    restarts = _env_int("TORCHELASTIC_MAX_RESTARTS", 0)
    if restarts != 0:
        raise UsageError("--max-restarts", f"{restarts} (torchrun's): must be 0, hetbench "
                         "closes a failed run itself and goes on with the next (a restart "
                         "would run the whole suite again)")
    theirs: dict[str, Any] = {
        "--nnodes": _env_int("GROUP_WORLD_SIZE", 1), "--node-rank": _env_int("GROUP_RANK", 0),
        "--master-addr": env.get("MASTER_ADDR", "127.0.0.1"),
        "--master-port": _env_int("MASTER_PORT", MASTER_PORT)}
    given = {"--nnodes": args.nnodes, "--node-rank": args.node_rank,
             "--master-addr": args.master_addr, "--master-port": args.master_port}
    for flag, value in given.items():
        if value is not None and value != theirs[flag]:
            raise UsageError(flag, f"{value}, but torchrun says {theirs[flag]}: under "
                             "torchrun, give it to torchrun alone")
    agent_store = env.get("TORCHELASTIC_USE_AGENT_STORE") == str(True)
    for name in TORCHRUN_VARIABLES:
        env.pop(name, None)
    return (theirs["--nnodes"], theirs["--node-rank"], theirs["--master-addr"],
            theirs["--master-port"], agent_store)


def _from_slurm(args: argparse.Namespace) -> tuple[int | None, int | None, str | None, int]:
    """The flags, each absent one read from SLURM's environment when under srun
    (SLURM_NNODES, SLURM_NODEID, MASTER_ADDR or the first host of SLURM_JOB_NODELIST,
    MASTER_PORT)."""
    env = os.environ
    nnodes, node_rank, master = args.nnodes, args.node_rank, args.master_addr
    port = args.master_port
    if "SLURM_JOB_ID" in env:
        nnodes = nnodes if nnodes is not None else _env_int("SLURM_NNODES")
        node_rank = node_rank if node_rank is not None else _env_int("SLURM_NODEID")
        if master is None:
            master = env.get("MASTER_ADDR") or first_host(env.get("SLURM_JOB_NODELIST", ""))
        if port is None and env.get("MASTER_PORT"):
            port = _env_int("MASTER_PORT")
    return nnodes, node_rank, master, MASTER_PORT if port is None else port


def _env_int(name: str, absent: int | None = None) -> int | None:
    raw = os.environ.get(name)
    if raw is None:
        return absent
    try:
        return int(raw)
    except ValueError:
        raise UsageError(name, f"{raw!r} in the environment is not a number") from None


def first_host(nodelist: str) -> str | None:
    """The first host of a SLURM node list ("node[03-05,07],gpu1" -> "node03"), as
    `scontrol show hostnames` would list it first."""
    match = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist.strip())
    if not match:
        return None
    prefix, ranges = match.groups()
    if ranges is None:
        return prefix
    first = ranges.split(",")[0].split("-")[0]
    return prefix + first
