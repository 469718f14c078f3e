"""Aggregators (harness/exchange): the suite key and its errors, the parameter servers'
placement, and the server's rules (sync, backup, async, ssp, DynSGD) driven in process,
without RPC, against updates worked out by hand."""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest
import torch

from hetbench.harness.exchange import kind
from hetbench.harness.exchange.parameter_server import ShardServer
from hetbench.harness.partition.shards import balanced_cuts as placement
from hetbench.harness.partition.shards import segments
from hetbench.harness.spec.aggregators import AGGREGATORS
from hetbench.harness.spec.errors import UsageError
from hetbench.harness.spec.suite import parse_suite, run_from_dict


def run_with(aggregator: Any, workers: int = 3, **extra: Any) -> Any:
    return parse_suite({"runs": [{"name": "r", "aggregator": aggregator, "global_batch": 12,
                                  "steps": 4, "lr": 0.5,
                                  "workers": [{}] * workers, **extra}]}).runs[0]


def error(raw: dict[str, Any]) -> UsageError:
    with pytest.raises(UsageError) as info:
        parse_suite({"runs": [{"name": "r", "workers": [{}, {}, {}], **raw}]})
    return info.value


# -- the suite key -------------------------------------------------------------------------


def test_aggregator_key_takes_a_name_or_a_table_and_strategy_still_names_one() -> None:
    assert run_with("ps-sync").aggregator.name == "ps-sync"
    spec = run_with({"name": "ssp", "staleness": 2, "servers": 2,
                     "staleness_lr": "dynsgd"}).aggregator
    assert (spec.name, spec.staleness, spec.servers, spec.staleness_lr) == ("ssp", 2, 2,
                                                                           "dynsgd")
    assert run_with(None, strategy="torch").aggregator.name == "torch"
    assert run_with(None).aggregator.name == "torch"
    # run.json written before aggregators said `strategy`
    data = run_with(None).to_dict()
    del data["aggregator"]
    data["strategy"] = "allreduce-host"
    assert run_from_dict(data).aggregator.name == "allreduce-host"
    assert run_from_dict(run_with({"name": "backup", "backup": 1}).to_dict()).aggregator \
        == run_with({"name": "backup", "backup": 1}).aggregator


@pytest.mark.parametrize(("raw", "where", "message"), [
    ({"aggregator": {"name": "ssp", "staleness": -1}}, "runs[0].aggregator.staleness",
     "-1 is below the minimum 0"),
    ({"aggregator": {"name": "backup", "backup": 3}}, "runs[0].aggregator.backup",
     "3 is not allowed (0 to 2: backup workers must be fewer than the workers)"),
    ({"aggregator": {"name": "ps-sync", "servers": 0}}, "runs[0].aggregator.servers",
     "0 is below the minimum 1"),
    ({"aggregator": {"name": "backup", "backup": 1, "servers": 2}},
     "runs[0].aggregator.servers", "servers = 1"),
    ({"aggregator": {"name": "torch", "staleness": 1}}, "runs[0].aggregator.staleness",
     "not an option of 'torch' ('torch' takes no options)"),
    ({"aggregator": {"name": "ps-sync", "staleness": 1}}, "runs[0].aggregator.staleness",
     "('ps-sync' takes only servers, server_nodes)"),
    ({"aggregator": {"name": "gossip"}}, "runs[0].aggregator.name", "unknown 'gossip'"),
    ({"aggregator": "mxnet-kvstore"}, "runs[0].aggregator",
     "needs every worker on mxnet (worker 0 is pytorch)"),
    ({"aggregator": {"name": "ssp", "staleness_lr": "sqrt"}},
     "runs[0].aggregator.staleness_lr", "allowed: dynsgd, none"),
    ({"aggregator": "torch", "strategy": "torch"}, "runs[0].strategy", "not both"),
    ({"aggregator": "ps-async", "partition": {"policy": "proportional"}},
     "runs[0].partition.policy", "needs a lockstep aggregator, not 'ps-async'"),
    ({"aggregator": "allreduce-device"}, "runs[0].aggregator",
     "needs at least one worker on a cuda device (use 'allreduce-host'"),
    ({"aggregator": "allreduce-device", "workers": [{"device": "cuda:0"}, {},
                                                     {"device": "cuda:0"}]},
     "runs[0].aggregator", "each on its own GPU (devices: cuda:0, cuda:0)"),
    ({"framework": "mxnet", "aggregator": "mxnet-async", "optimizer": "momentum"},
     "runs[0].optimizer", "plain 'sgd' only"),
])
def test_bad_aggregator_is_one_line_naming_the_field(raw: dict[str, Any], where: str,
                                                     message: str) -> None:
    exc = error(raw)
    assert exc.where == where
    assert message in exc.message
    assert "\n" not in str(exc)


def test_registry_names_every_scheme_of_the_issue_and_loads_lazily() -> None:
    for name in ("torch", "allreduce-host", "allreduce-device", "ps-sync", "ps-async", "ssp",
                 "backup", "local-sgd", "mxnet-kvstore", "mxnet-async", "tensorflow-collective",
                 "tensorflow-ps"):
        assert name in AGGREGATORS
    assert {n for n, k in AGGREGATORS.items() if not k.lockstep} == {
        "ps-async", "ssp", "backup", "mxnet-async", "wsp", "tensorflow-ps"}
    assert {n for n, k in AGGREGATORS.items() if k.servers} == {
        "ps-sync", "ps-async", "ssp", "backup", "wsp", "tensorflow-ps"}
    # a coordinator drives it: its workers serve instead of running the loop
    assert [n for n, k in AGGREGATORS.items() if k.serves] == ["tensorflow-ps"]
    with pytest.raises(ValueError, match="unknown aggregator 'x'"):
        kind("x")


# -- placement -----------------------------------------------------------------------------


def best_largest_shard(sizes: list[int], servers: int) -> int:
    """Exhaustive: the smallest possible largest shard over every contiguous cut."""
    best = sum(sizes)
    for cuts in itertools.combinations(range(1, len(sizes)), servers - 1):
        bounds = [0, *cuts, len(sizes)]
        best = min(best, max(sum(sizes[a:b]) for a, b in zip(bounds, bounds[1:],
                                                                strict=False)))
    return best


def test_placement_is_contiguous_covers_everything_and_minimises_the_largest_shard() -> None:
    rng = random.Random(7)
    for _ in range(200):
        sizes = [rng.choice([1, 10, 256, 4096, 65536]) for _ in range(rng.randint(1, 8))]
        servers = rng.randint(1, len(sizes))
        shards = placement(sizes, servers)
        assert len(shards) == servers
        assert shards[0][0] == 0 and shards[-1][1] == len(sizes)
        assert all(a < b for a, b in shards)  # every server holds a parameter
        assert all(shards[i][1] == shards[i + 1][0] for i in range(servers - 1))
        largest = max(sum(sizes[a:b]) for a, b in shards)
        assert largest == best_largest_shard(sizes, servers), (sizes, servers, shards)


def test_shard_segments_are_element_ranges_and_the_last_holds_the_loss_slot() -> None:
    sizes = [16384, 256, 65536, 256, 2560, 10]  # mlp small: fc1.w, fc1.b, fc2.w, ...
    assert segments("sharded", sizes, 2) == [[(0, 16640)], [(16640, 85002), (85002, 85003)]]
    assert segments("sharded", sizes, 1) == [[(0, 85002), (85002, 85003)]]
    # round-robin by tensor (TensorFlow's default): the server that draws fc2.w is busiest
    assert segments("data-parallel", sizes, 2) == [
        [(0, 16384), (16640, 82176), (82432, 84992)],
        [(16384, 16640), (82176, 82432), (84992, 85002), (85002, 85003)]]
    # fc-on-server, the tail from tensor 4 on: no shard holds it, the last server only
    # computes it
    assert segments("fc-on-server", sizes, 2, tail_start=4) == [
        [(0, 82432), (85002, 85003)], []]
    assert segments("fc-on-server", sizes, 3, tail_start=4) == [
        [(0, 16640)], [(16640, 82432), (85002, 85003)], []]
    with pytest.raises(ValueError, match="7 servers for 6 parameters"):
        placement(sizes, 7)
    with pytest.raises(ValueError, match="7 servers for 6 tensors"):
        segments("data-parallel", sizes, 7)


# -- the server's rules --------------------------------------------------------------------


def server(aggregator: Any, workers: int = 3, initial: float = 1.0) -> ShardServer:
    return ShardServer(run_with(aggregator, workers), torch.full((2,), initial), True)


def push(s: ShardServer, version: int, clock: int, rank: int, grads: list[float],
         samples: int) -> torch.futures.Future[Any]:
    return s.push(version, clock, rank, torch.tensor(grads, dtype=torch.float32), samples)


def test_sync_server_answers_when_every_worker_pushed_with_the_sum_over_the_batch() -> None:
    s = server("ps-sync")
    first = push(s, 0, 0, 0, [1.0, 2.0, 0.5], 2)  # gradient sums, then the loss sum
    second = push(s, 0, 0, 1, [3.0, 0.0, 1.5], 4)
    assert not first.done() and not second.done()
    third = push(s, 0, 0, 2, [2.0, 4.0, 1.0], 6)
    for future in (first, second, third):
        values, reply = future.wait()
        # 1 - lr * sum / global batch = 1 - 0.5 * (6, 6) / 12
        assert values.tolist() == [0.75, 0.75, 3.0]  # and the loss sum
        assert (reply.version, reply.staleness, reply.samples, reply.dropped) == (1, 0, 12,
                                                                                  False)
    assert first.wait()[1].received_ns <= first.wait()[1].released_ns


def test_backup_uses_the_first_n_minus_b_and_drops_the_late_one() -> None:
    s = server({"name": "backup", "backup": 1})
    a = push(s, 0, 0, 0, [1.0, 1.0, 1.0], 3)
    b = push(s, 0, 0, 2, [2.0, 2.0, 1.0], 3)
    values, reply = a.wait()
    # weighted by the samples that arrived: 1 - 0.5 * 3 / 6
    assert values.tolist() == [0.75, 0.75, 2.0] and reply.samples == 6
    assert b.done() and reply.version == 1
    late_values, late = push(s, 0, 0, 1, [9.0, 9.0, 4.0], 6).wait()
    assert late.dropped and late.staleness == 1 and late.version == 1
    assert late_values.tolist()[:2] == [0.75, 0.75]  # the current parameters, unchanged


def test_async_server_applies_each_push_as_its_share_and_counts_staleness() -> None:
    s = server("ps-async", workers=2)
    values, reply = push(s, 0, 0, 0, [6.0, 0.0, 1.0], 6).wait()
    assert values.tolist()[:2] == [0.75, 1.0] and reply.staleness == 0 and reply.version == 1
    # worker 1 computed on version 0 too: one update late
    values, reply = push(s, 0, 0, 1, [0.0, 12.0, 1.0], 6).wait()
    assert values.tolist()[:2] == [0.75, 0.5] and reply.staleness == 1
    assert reply.progress == 1  # 12 samples: one global batch


def test_dynsgd_divides_a_stale_update_by_one_plus_its_staleness() -> None:
    s = server({"name": "ps-async", "staleness_lr": "dynsgd"}, workers=2)
    push(s, 0, 0, 0, [6.0, 0.0, 0.0], 6).wait()
    values, reply = push(s, 0, 0, 1, [0.0, 12.0, 0.0], 6).wait()
    assert reply.staleness == 1
    assert values.tolist()[:2] == [0.75, 0.75]  # 1 - 0.5 * 12 / 12 / 2


def test_ssp_holds_a_worker_that_runs_more_than_s_clocks_ahead() -> None:
    s = server({"name": "ssp", "staleness": 1}, workers=2)
    assert push(s, 0, 0, 0, [0.0, 0.0, 0.0], 6).done()  # clock 0: needs everyone at -1
    ahead = push(s, 1, 1, 0, [0.0, 0.0, 0.0], 6)  # clock 1: needs worker 1 at clock 1
    assert not ahead.done()
    assert push(s, 0, 0, 1, [0.0, 0.0, 0.0], 6).done()
    assert ahead.done()
    _, reply = ahead.wait()
    assert reply.released_ns >= reply.received_ns


def test_ssp_with_bound_zero_is_a_barrier_and_ends_at_the_sample_budget() -> None:
    s = server({"name": "ssp", "staleness": 0}, workers=2)
    futures = []
    for clock in range(4):  # 4 steps of 12 samples: the budget is 4 global batches
        first = push(s, 2 * clock, clock, 0, [1.0, 1.0, 1.0], 6)
        assert not first.done()
        futures.append(push(s, 2 * clock, clock, 1, [1.0, 1.0, 1.0], 6))
        assert first.done()
    _, reply = futures[-1].wait()
    assert reply.done and reply.progress == 4
    late_values, late = push(s, 8, 4, 0, [1.0, 1.0, 1.0], 6).wait()
    assert late.dropped and late.done  # after the budget nothing more is applied


def test_torchrun_mode_refuses_what_needs_the_launcher() -> None:
    """torchrun starts only workers: no parameter server, and nobody to finish a run that
    went on without a dead worker."""
    from hetbench.harness.loop.worker import _torchrun_problem

    assert _torchrun_problem(run_with("local-sgd")) is None
    assert _torchrun_problem(run_with("allreduce-host")) is None
    assert "needs processes `hetbench run` starts" in (_torchrun_problem(run_with("ps-sync"))
                                                       or "")
    going_on = run_with("ps-async", on_worker_failure="continue")
    assert "needs processes" in (_torchrun_problem(going_on) or "")
