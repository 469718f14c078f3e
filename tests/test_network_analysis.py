"""Network heterogeneity across hosts (analysis/measures/network.py, the `network` straggler cause
and the report's section) on hand-built records and manifests whose answers are worked out
here by hand."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest

from hetbench.analysis.measures.network import (
    bytes_per_step,
    exchange_bandwidth,
    rate_mbit,
)
from hetbench.analysis.measures.stragglers import CAUSES, attribute
from hetbench.analysis.render import report
from hetbench.analysis.render.terminal import render
from hetbench.harness.records.results import Run
from hetbench.harness.spec.aggregators import AGGREGATORS
from hetbench.harness.spec.errors import UsageError
from tests.synthetic import MS, steps_frame

# a buffer of 250 000 float32 values (249 999 parameters and the loss sum): 1 MB
PARAMETERS = 249_999


def manifest(rates: list[str | None], aggregator: str = "torch",
             workers: list[dict[str, Any]] | None = None, **run: Any) -> dict[str, Any]:
    """A run across len(rates) hosts, worker k on node k, node k's link at rates[k] (None:
    a link not described)."""
    nodes = [{"node": k, "host": f"host{k}", "address": f"198.18.0.{k + 1}",
              "link": {} if rate is None else {"rate": rate, "delay": "1ms"}}
             for k, rate in enumerate(rates)]
    return {"run_id": "pair-r0", "repeat": 0, "status": "completed",
            "run": {"name": "pair", "warmup_steps": 0, "aggregator": {"name": aggregator},
                    "workers": [{"device": "cpu", "node": k} for k in range(len(rates))],
                    **run},
            "workers": workers or [{"rank": k, "parameters": PARAMETERS}
                                   for k in range(len(rates))],
            "nodes": nodes}


@pytest.mark.parametrize(("text", "mbit"), [
    ("100mbit", 100.0), ("1gbit", 1000.0), ("500kbit", 0.5), ("2.5gbit", 2500.0),
    ("64000bit", 0.064), ("12.5mbps", 100.0), ("1Gbit", 1000.0), (None, None), ("", None)])
def test_link_rates_are_read_in_tc_units_as_mbit_per_second(text: str | None,
                                                           mbit: float | None) -> None:
    assert rate_mbit(text) == (None if mbit is None else pytest.approx(mbit))


@pytest.mark.parametrize("text", ["fast", "100 megabit", "100mbits", "-5mbit", "mbit"])
def test_a_rate_tc_would_not_read_is_one_clear_error(text: str) -> None:
    with pytest.raises(UsageError, match=r"nodes\[1\]\.link\.rate: .* not a rate in tc's units"):
        rate_mbit(text, "nodes[1].link.rate")


def test_the_registry_says_which_aggregators_all_reduce_the_buffer() -> None:
    """The ring's bytes are counted for these four, read from their Kinds."""
    assert {name for name, kind in AGGREGATORS.items() if kind.allreduces_buffer} == \
        {"torch", "allreduce-host", "local-sgd", "tensorflow-collective"}


def test_all_reduce_bandwidth_per_node_against_its_link() -> None:
    """Two hosts, one worker each, 1 MB buffers: a ring sends 2 (2 - 1) / 2 x 1 MB = 1 MB
    per worker; the communication after the last arrival is 80 ms, so 8 Mbit / 0.08 s =
    100 Mbit/s: all of the 100mbit link, the slowest the ring crosses, for both workers."""
    frame = steps_frame(10, lambda r, s: [2.0, 3.0][r], comm_ms=80.0)
    table = exchange_bandwidth(Run.of(manifest(["1gbit", "100mbit"]), frame)).set_index("rank")
    assert table["node"].tolist() == [0, 1] and table["host"].tolist() == ["host0", "host1"]
    np.testing.assert_allclose(table["mb_per_step"], 1.0)
    # not the allreduce phase: worker 0 also waited 1 ms there for worker 1
    np.testing.assert_allclose(table["exchange_ms"], 80.0)
    np.testing.assert_allclose(table["achieved_mbit_s"], 100.0)
    np.testing.assert_allclose(table["link_mbit_s"], [100.0, 100.0])
    np.testing.assert_allclose(table["link_utilisation"], [1.0, 1.0])
    # three workers: 2 x 2 / 3 of the buffer; a link in the ring not described: no rate
    three = exchange_bandwidth(Run.of(manifest(["1gbit", None, "100mbit"]),
                                      steps_frame(10, lambda r, s: 2.0, world=3, comm_ms=80.0)))
    np.testing.assert_allclose(three["mb_per_step"], 4 / 3)
    np.testing.assert_allclose(three["achieved_mbit_s"], 4 / 3 * 8 / 0.08)
    assert three["link_mbit_s"].isna().all() and three["link_utilisation"].isna().all()


def parameter_server_rows(rows: np.ndarray) -> None:
    """ps-sync: worker 0 pushes for 3 ms and pulls for 1 ms, worker 1 30 and 10 ms."""
    for row in rows:
        row["push_ns"], row["pull_ns"] = (3 * MS, 1 * MS) if row["rank"] == 0 else (30 * MS,
                                                                                   10 * MS)


def test_parameter_server_bandwidth_counts_the_traffic_that_crosses_the_link() -> None:
    """Servers ps0 on node 0 and ps1 on node 1; over 10 steps each worker sent 1 MB a step
    to each server and got 1 MB a step back. Worker 0's link carries only ps1's 2 MB a step
    (4 ms of push and pull: 4000 Mbit/s), worker 1's only ps0's (40 ms: 400 Mbit/s). Each
    crosses both hosts' links, so each is set against the slower, 1gbit."""
    frame = steps_frame(10, lambda r, s: 2.0, edit=parameter_server_rows)
    step = {"ps0": 10 * 10**6, "ps1": 10 * 10**6}
    traffic = {"steps": 10, "sent": step, "received": step}
    meta = manifest(["10gbit", "1gbit"], "ps-sync",
                    workers=[{"rank": k, "parameters": PARAMETERS, "traffic": traffic}
                             for k in range(2)])
    meta["run"]["aggregator"].update(servers=2, server_nodes=[0, 1])
    table = exchange_bandwidth(Run.of(meta, frame)).set_index("rank")
    np.testing.assert_allclose(table["mb_per_step"], 2.0)
    np.testing.assert_allclose(table["exchange_ms"], [4.0, 40.0])
    np.testing.assert_allclose(table["achieved_mbit_s"], [4000.0, 400.0])
    np.testing.assert_allclose(table["link_mbit_s"], [1000.0, 1000.0])
    np.testing.assert_allclose(table["link_utilisation"], [4.0, 0.4])
    # both servers on node 0: worker 0's exchange never reaches its link
    meta["run"]["aggregator"]["server_nodes"] = [0, 0]
    assert bytes_per_step(meta, 2) == {0: 0.0, 1: 4 * 10**6}


def test_a_run_on_one_host_has_no_bandwidth_table() -> None:
    meta = manifest(["1gbit", "100mbit"])
    del meta["nodes"]
    assert exchange_bandwidth(Run.of(meta, steps_frame(5, lambda r, s: 2.0))).empty


def slow_exchange_at_step_7(rows: np.ndarray) -> None:
    """Worker 2's exchange of step 7 takes 6 ms longer; every later step starts 6 ms later."""
    for row in rows:
        if row["step"] > 7:
            for column in ("begin_ns", "ready_ns", "reduced_ns", "end_ns"):
                row[column] += 6 * MS
        elif row["step"] == 7 and row["rank"] == 2:
            for column in ("reduced_ns", "end_ns", "allreduce_ns"):
                row[column] += 6 * MS


def three_hosts() -> pd.DataFrame:
    """Workers 0 and 1 compute 2 ms, worker 2 3 ms: worker 2 is last every step, by its
    usual margin (no compute excess); in step 7 its exchange takes 0.5 + 6 ms against the
    others' 0.5 ms."""
    return steps_frame(20, lambda r, s: 3.0 if r == 2 else 2.0, world=3,
                       edit=slow_exchange_at_step_7)


def test_an_exchange_longer_on_a_slower_link_is_network() -> None:
    frame = three_hosts()
    a = attribute(frame, manifest=manifest(["1gbit", "1gbit", "100mbit"])).set_index("step")
    assert (a["rank"] == 2).all()
    # 6.5 ms against the median of the others' 0.5 ms: 6 ms, all of the excess
    assert a.loc[7, "cause"] == "network"
    assert a.loc[7, "network_ms"] == pytest.approx(6.0)
    assert a.loc[7, "excess_ms"] == pytest.approx(6.0)
    parts = a[[f"{c}_ms" for c in CAUSES]].sum(axis=1)
    np.testing.assert_allclose(parts, a["excess_ms"], atol=1e-9)
    others = a.drop(index=7)
    assert (others["network_ms"] == 0).all() and (others["cause"] == "none").all()


@pytest.mark.parametrize("rates", [["1gbit", "1gbit", "1gbit"], ["1gbit", "1gbit", None],
                                   [None, None, None], ["100mbit", "100mbit", "1gbit"]],
                         ids=["equal", "unknown-own", "none-described", "own-faster"])
def test_no_network_cause_unless_its_link_is_known_and_slower(rates: list[str | None]) -> None:
    a = attribute(three_hosts(), manifest=manifest(rates)).set_index("step")
    assert (a["network_ms"] == 0).all()
    assert a.loc[7, "cause"] == "none" and a.loc[7, "excess_ms"] == pytest.approx(0.0)


def test_on_one_host_the_attribution_is_as_before_with_network_zero() -> None:
    frame = three_hosts()
    meta = manifest(["1gbit", "1gbit", "100mbit"])
    del meta["nodes"]
    with_manifest = attribute(frame, manifest=meta)
    without = attribute(frame)
    assert (with_manifest["network_ms"] == 0).all() and (without["network_ms"] == 0).all()
    pd.testing.assert_frame_equal(with_manifest, without)


def test_the_report_shows_the_network_section_only_for_runs_across_hosts() -> None:
    frame = steps_frame(10, lambda r, s: [2.0, 3.0][r], comm_ms=80.0)
    across = manifest(["1gbit", "100mbit"])
    one_host = {k: v for k, v in across.items() if k != "nodes"}
    title = "## Network: exchange bandwidth per node"
    md, summary = report.build([Run.of(across, frame)])
    assert title in md and "Network: exchange bandwidth per node" in render(summary)
    section = md.split(title)[1].split("\n## ")[0]
    assert "| pair | 1 | host1 | 1 | 1 | 100 | 1 | 80 | 100 | 1 |" in section
    md, summary = report.build([Run.of(one_host, frame)])
    assert title not in md and "Network:" not in render(summary)
