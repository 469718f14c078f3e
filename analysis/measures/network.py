"""Network heterogeneity in a run across hosts (issue 27): each worker's exchange bandwidth
against its host's link, and the exchange time above its peers' that a slower link explains.

A run across hosts records `nodes` in its manifest, one entry per host (`node`, `host`,
`address`, and `link`: the rate, delay, jitter and loss it was shaped with, in tc's units,
or nothing where it was not described), and each worker of the run spec its `node`. A run
on one host has no `nodes`: every function here then gives nothing (an empty table, no
excess).

What one exchange moves over a worker's link, per step:
- all-reduce (an aggregator whose Kind `allreduces_buffer`): 2 (n - 1) / n times the buffer
  (float32 gradient sums and the loss sum: `parameters` + 1 values) for n workers. That is
  what every worker sends, and receives, in a ring all-reduce, and the least a symmetric
  all-reduce sends per worker (the bytes nccl-tests call bus bandwidth); an asymmetric one
  could send as little as the buffer itself through one worker's link. The algorithm gloo or
  NCCL picked is not recorded: this is the ring's figure. It assumes every worker's traffic
  crosses its host's link, true with one worker per host; with several on one host part of
  it stays on the host and the bandwidth shown is too high.
- parameter servers: the tensors the worker sent to and got from servers on other hosts
  (`workers[r].traffic`, analysis/measures/traffic.py; a server's host is `server_nodes`, default
  node 0): the traffic to a server on its own host never reaches the link.
- other aggregators (native servers, allreduce-device's detour through a GPU), and the
  fc-on-server placement (its tail's activations cross during forward and backward, not
  in the exchange): unknown.

The link a row is set against (`link_mbit_s`) is the slowest its exchange crosses: its own
host's and, for a parameter server's client, the links of the servers' hosts it talks to;
for an all-reduce, every worker's host's (a ring runs at its slowest link). Unknown (NaN)
where any of them is not described.

The exchange time of a row (`exchange_ns`): push + pull where the aggregator measured them
(parameter servers: the server's wait for the others left out); otherwise the
communication after the last arrival (reduced - arrival, DESIGN.md), not the recorded
allreduce phase, which also holds the wait for the last worker: bytes over that would
understate the bandwidth by however late the straggler was. A local step (local SGD's,
asynchronous, nothing pushed or pulled) exchanged nothing and is left out.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from hetbench.analysis.view.metrics import after_warmup, complete_steps, instrumented, with_derived
from hetbench.harness.records.results import Run
from hetbench.harness.spec.aggregators import AGGREGATORS, recorded_name
from hetbench.harness.spec.errors import UsageError

Runs = Sequence[Run]
BUFFER_VALUE_BYTES = 4  # float32: the buffer the exchange moves (harness/loop/worker.py)
# tc's rate units (tc(8), "RATES"): bits or bytes per second, decimal or binary prefixes; a
# bare number is bit/s
_PREFIXES = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
             "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}
RATE_UNITS = {**{f"{p}bit": f for p, f in _PREFIXES.items()},
              **{f"{p}bps": 8 * f for p, f in _PREFIXES.items()}, "": 1}
RATE = re.compile(r"^(\d+(?:\.\d+)?)([a-z]*)$")
BANDWIDTH_COLUMNS = ["node", "host", "rank", "link_mbit_s", "mb_per_step", "exchange_ms",
                     "achieved_mbit_s", "link_utilisation"]


def rate_mbit(text: str | None, where: str = "link.rate") -> float | None:
    """A rate in tc's units ("100mbit", "1gbit", "500kbit"; "mbps" is megabytes) in Mbit/s
    (10**6 bit/s); None when not given. Anything else is refused, naming `where`."""
    if text is None or text == "":
        return None
    match = RATE.match(str(text).strip().lower())
    if match is None or match.group(2) not in RATE_UNITS:
        raise UsageError(where, f"{text!r} is not a rate in tc's units (e.g. 100mbit, 1gbit, "
                         "500kbit)")
    return float(match.group(1)) * RATE_UNITS[match.group(2)] / 1e6


def spans_hosts(manifest: dict[str, Any] | None) -> bool:
    return bool((manifest or {}).get("nodes"))


def _run_label(manifest: dict[str, Any]) -> str:
    return f"run {manifest.get('run_id', '?')}"


def node_links(manifest: dict[str, Any]) -> dict[int, tuple[str, float | None]]:
    """Per node: its host name and its link's rate in Mbit/s (None: not described)."""
    out: dict[int, tuple[str, float | None]] = {}
    for i, entry in enumerate(manifest.get("nodes") or []):
        where = f"{_run_label(manifest)}: nodes[{i}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("link") or {}, dict):
            raise UsageError(where, "is not a node (an object with node, host, address and "
                             "link is expected)")
        link = entry.get("link") or {}
        out[int(entry.get("node", i))] = (str(entry.get("host", "")),
                                          rate_mbit(link.get("rate"), f"{where}.link.rate"))
    return out


def worker_nodes(manifest: dict[str, Any]) -> dict[int, int]:
    """Per rank, the node (host) that ran it: the run spec's `node`, default 0."""
    workers = (manifest.get("run") or {}).get("workers") or []
    return {rank: int(w.get("node", 0)) for rank, w in enumerate(workers)}


def bytes_per_step(manifest: dict[str, Any], world: int) -> dict[int, float]:
    """Per rank, the bytes one exchange moved over its host's link (module docstring); NaN
    where the records do not say."""
    name, server_nodes = _aggregator(manifest)
    nodes = worker_nodes(manifest)
    out: dict[int, float] = {}
    for rank, info in enumerate(manifest.get("workers") or []):
        info = info or {}
        traffic = info.get("traffic")
        if (manifest.get("run") or {}).get("placement") == "fc-on-server":
            out[rank] = np.nan
        elif traffic and traffic.get("steps"):
            crossing = [server for server in {*traffic["sent"], *traffic["received"]}
                        if _server_node(server, server_nodes) != nodes.get(rank, 0)]
            moved = sum(traffic["sent"].get(s, 0) + traffic["received"].get(s, 0)
                        for s in crossing)
            out[rank] = moved / traffic["steps"]
        elif _allreduces_buffer(name) and isinstance(info.get("parameters"), int) and world > 0:
            buffer = BUFFER_VALUE_BYTES * (info["parameters"] + 1)
            out[rank] = 2 * (world - 1) / world * buffer
        else:
            out[rank] = np.nan
    return out


def path_rates(manifest: dict[str, Any]) -> dict[int, float | None]:
    """Per rank, the rate in Mbit/s of the slowest link its exchange crosses (module
    docstring); None where one of them is not described."""
    links, nodes = node_links(manifest), worker_nodes(manifest)
    name, server_nodes = _aggregator(manifest)
    out: dict[int, float | None] = {}
    for rank, info in enumerate(manifest.get("workers") or []):
        traffic = (info or {}).get("traffic") or {}
        if _allreduces_buffer(name):
            crossed = set(nodes.values())
        else:
            crossed = {nodes.get(rank, 0), *(_server_node(server, server_nodes)
                                             for server in traffic.get("sent", {}))}
        rates = [links.get(node, ("", None))[1] for node in crossed]
        out[rank] = None if any(r is None for r in rates) else min(rates)  # type: ignore
    return out


def _allreduces_buffer(aggregator: str) -> bool:
    kind = AGGREGATORS.get(aggregator)
    return kind is not None and kind.allreduces_buffer


def _aggregator(manifest: dict[str, Any]) -> tuple[str, list[int]]:
    """The run's aggregator name and its servers' nodes (empty: all on node 0)."""
    run = manifest.get("run") or {}
    return recorded_name(run), list((run.get("aggregator") or {}).get("server_nodes") or [])


def _server_node(server: str, server_nodes: list[int]) -> int:
    """The node of server "ps<k>" (`server_nodes[k]`; all on node 0 when not given)."""
    index = server.removeprefix("ps")
    if index.isdigit() and int(index) < len(server_nodes):
        return int(server_nodes[int(index)])
    return 0


def exchange_ns(steps: pd.DataFrame) -> pd.Series:
    """Per row, the time its exchange spent moving data (module docstring); NaN for a step
    that exchanged nothing."""
    d = with_derived(steps)
    measured = pd.Series(0.0, index=d.index)
    for column in ("push_ns", "pull_ns"):
        if column in d:
            measured += d[column].astype(float)
    own = d["asynchronous"].to_numpy(dtype=bool) if "asynchronous" in d \
        else np.zeros(len(d), dtype=bool)
    after_arrival = d["comm_ns"].astype(float).where(~own, np.nan)
    return after_arrival.where(measured <= 0, measured)


def exchange_bandwidth(run: Run, warmup_steps: int | None = None) -> pd.DataFrame:
    """One row per worker of a run across hosts, by node: node, host, rank, link_mbit_s
    (the slowest link its exchange crosses: path_rates; NaN: not described), mb_per_step
    (MB, 10**6 bytes, over the link per exchange), exchange_ms (median over steps after
    warm-up of exchange_ns), achieved_mbit_s (mb_per_step x 8 / exchange time) and
    link_utilisation (achieved over that rate). Empty for a run on one host."""
    manifest = run.manifest
    if not spans_hosts(manifest):
        return pd.DataFrame(columns=BANDWIDTH_COLUMNS)
    warmup = run.warmup_steps if warmup_steps is None else warmup_steps
    steps = complete_steps(after_warmup(run.steps, warmup))
    if steps.empty or not instrumented(steps):
        return pd.DataFrame(columns=BANDWIDTH_COLUMNS)
    links = node_links(manifest)
    nodes = worker_nodes(manifest)
    rates = path_rates(manifest)
    moved = bytes_per_step(manifest, int(steps["rank"].nunique()))
    median_ns = exchange_ns(steps).groupby(steps["rank"]).median()
    rows = []
    for rank, ns in median_ns.items():
        node = nodes.get(int(rank), 0)
        host, rate = links.get(node, ("", None))[0], rates.get(int(rank))
        mb = moved.get(int(rank), np.nan) / 1e6
        achieved = mb * 8 / (ns / 1e9) if ns > 0 else np.nan
        link = np.nan if rate is None else rate
        rows.append({"node": node, "host": host, "rank": int(rank), "link_mbit_s": link,
                     "mb_per_step": mb, "exchange_ms": ns / 1e6, "achieved_mbit_s": achieved,
                     "link_utilisation": achieved / link if link else np.nan})
    out = pd.DataFrame(rows, columns=BANDWIDTH_COLUMNS)
    return out.sort_values(["node", "rank"]).reset_index(drop=True)


def bandwidth_table(runs: Runs) -> pd.DataFrame:
    """exchange_bandwidth of every run across hosts, with its run name and repeat."""
    frames = [exchange_bandwidth(run).assign(run=run.name, repeat=run.repeat)
              for run in runs if spans_hosts(run.manifest)]
    frames = [f for f in frames if not f.empty]
    if not frames:
        return pd.DataFrame(columns=["run", "repeat", *BANDWIDTH_COLUMNS])
    return pd.concat(frames, ignore_index=True)[["run", "repeat", *BANDWIDTH_COLUMNS]]


def bandwidth_summary(table: pd.DataFrame) -> pd.DataFrame:
    """bandwidth_table averaged over repeats: one row per run name and worker."""
    if table.empty:
        return table
    numbers = ["link_mbit_s", "mb_per_step", "exchange_ms", "achieved_mbit_s",
               "link_utilisation"]
    grouped = table.groupby(["run", "node", "host", "rank"], sort=False)
    out = grouped[numbers].mean()
    out.insert(0, "repeats", grouped.size())
    return out.reset_index()


def slow_link_excess_ns(derived: pd.DataFrame, manifest: dict[str, Any] | None
                        ) -> np.ndarray | None:
    """Per row of `derived` (complete steps, metrics.with_derived), in order: how much
    longer its exchange took than the median of the other workers' in the same step for
    the same bytes (their time per byte x its bytes; bytes taken as equal where the records
    do not give every worker's), counted only for a worker whose host's link rate is known
    and below that of another worker's host; 0 elsewhere. None when no row can have any:
    a run on one host, or no worker on a link slower than another's."""
    if not spans_hosts(manifest) or derived.empty:
        return None
    assert manifest is not None
    links, nodes = node_links(manifest), worker_nodes(manifest)
    ranks = sorted(int(r) for r in derived["rank"].unique())
    rate = {r: links.get(nodes.get(r, 0), ("", None))[1] for r in ranks}
    known = {r: v for r, v in rate.items() if v is not None}
    slower = [r for r, v in known.items()
              if any(other > v and nodes.get(o, 0) != nodes.get(r, 0)
                     for o, other in known.items())]
    if not slower:
        return None
    time = exchange_ns(derived).to_numpy(dtype=float)
    moved = derived["rank"].map(bytes_per_step(manifest, len(ranks))).to_numpy(dtype=float)
    scale = moved if bool(np.all(np.isfinite(moved) & (moved > 0))) else np.ones(len(moved))
    per_byte = pd.DataFrame({"step": derived["step"].to_numpy(),
                             "rank": derived["rank"].to_numpy(), "value": time / scale})
    wide = per_byte.pivot(index="step", columns="rank", values="value")
    excess = np.zeros(len(derived))
    for rank in slower:
        peers = wide.drop(columns=rank).median(axis=1)  # NaN: no peer exchanged
        mine = (derived["rank"] == rank).to_numpy()
        expected = derived["step"][mine].map(peers).to_numpy(dtype=float) * scale[mine]
        excess[mine] = np.nan_to_num(np.clip(time[mine] - expected, 0, None))
    return excess
