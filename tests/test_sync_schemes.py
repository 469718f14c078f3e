"""The synchronisation schemes end to end: real worker processes over torch.distributed,
real parameter-server processes over torch.distributed.rpc, started and stopped by
hetbench on 127.0.0.1.

Exactness where it must hold (issue 13): ps-sync (over 2 servers), ssp with s = 0, backup
with b = 0, local SGD with H = 1 and allreduce-host end with the parameters of the
all-reduce run, within
float rounding (the float32 sums are added in another order: 2e-5 after 12 steps, as in
test_exactness); ps-async with one worker is plain sequential SGD. The asynchronous
schemes on a slowed worker record staleness, drops and the servers' placement. Every
scheme's trace is a well-formed Trace Event Format file (tests/trace_check.py).
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from hetbench.harness.records import collector
from hetbench.harness.records.results import load_run
from hetbench.harness.run.launcher import run_suite
from hetbench.harness.spec.suite import load_suite
from tests.conftest import Spawn
from tests.test_exactness import plain_torch_sgd
from tests.test_faults import alive, finish, start_long_run
from tests.trace_check import check_trace

pytestmark = pytest.mark.slow
STEPS = 12
ATOL = 2e-5

SUITE = f"""
[suite]
name = "schemes"

[defaults]
workload = "mlp"
dataset = "digits"
steps = {STEPS}
global_batch = 96
lr = 0.1
seed = 3
partition = {{ policy = "sizes", sizes = [16, 48, 32] }}
workers = [ {{ device = "cpu" }}, {{ device = "cpu", slowdown = 2.0 }}, {{ device = "cpu" }} ]

[[runs]]
name = "bsp"

[[runs]]
name = "ps-sync"
aggregator = {{ name = "ps-sync", servers = 2 }}

[[runs]]
name = "ssp0"
aggregator = {{ name = "ssp", staleness = 0 }}

[[runs]]
name = "backup0"
aggregator = {{ name = "backup", backup = 0 }}

[[runs]]
name = "local1"
aggregator = {{ name = "local-sgd", local_steps = 1 }}

[[runs]]
name = "host"
aggregator = "allreduce-host"
"""


def test_synchronous_limits_of_every_scheme_equal_the_allreduce_run(tmp_path: Path,
                                                                     write_suite) -> None:
    results = run_suite(load_suite(str(write_suite(SUITE))), tmp_path / "out")
    assert [r.status for r in results] == ["completed"] * 6, [r.reason for r in results]
    expected = dict(np.load(results[0].run_dir / "params.npz"))
    for result in results:  # the trace of every scheme is a well-formed trace
        check_trace(result.run_dir / "trace.json", load_run(result.run_dir).steps)
    for result in results[1:]:
        params = dict(np.load(result.run_dir / "params.npz"))
        for name, value in expected.items():
            np.testing.assert_allclose(params[name], value, rtol=0, atol=ATOL,
                                       err_msg=f"{result.run.name}: {name}")
        run = load_run(result.run_dir)
        assert len(run.steps) == 3 * STEPS  # every worker took every step
        assert not run.steps["dropped"].any()
    sync = load_run(results[1].run_dir)
    assert (sync.steps["staleness"] == 0).all()
    placement = sync.manifest["aggregator"]["placement"]
    assert [p["server"] for p in placement] == ["ps0", "ps1"]
    assert sum(p["elements"] for p in placement) == sum(v.size for v in expected.values())
    names = [n for p in placement for n in p["parameters"]]
    assert sorted(names) == sorted(expected)
    # the exchange split into push, wait and pull, which make up nearly all of it (the
    # loop's phase also holds the calls around them)
    parts = sync.steps[["push_ns", "wait_ns", "pull_ns"]].sum(axis=1)
    assert (parts <= sync.steps["allreduce_ns"]).all()
    assert parts.sum() > 0.8 * sync.steps["allreduce_ns"].sum()
    assert (sync.steps["push_ns"] > 0).all()
    for server in ("ps0", "ps1"):  # hetbench started them, and they ended with the run
        info = json.loads((results[1].run_dir / "parts" / f"{server}.json").read_text())
        assert not alive(info["pid"])
    # ssp with s = 0 applies the three pushes of a round one by one
    ssp = load_run(results[2].run_dir).steps
    assert sorted(ssp.groupby("step")["staleness"].apply(sorted).iloc[3]) == [0, 1, 2]


ASYNC = """
[suite]
name = "async"

[defaults]
workload = "mlp"
dataset = "digits"
global_batch = 64
lr = 0.1
seed = 5

[[runs]]
name = "one-worker"
steps = 10
aggregator = "ps-async"

[[runs]]
name = "slowed"
steps = 30
eval_every = 10
aggregator = { name = "ps-async", staleness_lr = "dynsgd" }
workers = [ { device = "cpu" }, { device = "cpu", slowdown = 8.0 } ]

[[runs]]
name = "backup"
steps = 20
aggregator = { name = "backup", backup = 1 }
workers = [ { device = "cpu" }, { device = "cpu", slowdown = 8.0 }, { device = "cpu" } ]
"""


def test_asynchronous_schemes_record_staleness_and_drops(tmp_path: Path,
                                                         write_suite) -> None:
    one, slowed, backup = run_suite(load_suite(str(write_suite(ASYNC))), tmp_path / "out")
    assert [r.status for r in (one, slowed, backup)] == ["completed"] * 3
    for result in (one, slowed, backup):
        check_trace(result.run_dir / "trace.json", load_run(result.run_dir).steps)
    # one asynchronous worker is sequential SGD
    params = dict(np.load(one.run_dir / "params.npz"))
    for name, value in plain_torch_sgd(seed=5, steps=10, lr=0.1, batch=64).items():
        np.testing.assert_allclose(params[name], value, rtol=0, atol=ATOL, err_msg=name)

    steps = load_run(slowed.run_dir).steps
    used = steps[~steps["dropped"]]
    assert used["batch_size"].sum() == 30 * 64  # the sample budget of 30 global batches
    counts = steps.groupby("rank").size()
    assert counts[0] > counts[1]  # the fast worker took more steps: nobody waited
    assert (steps["staleness"] > 0).any() and steps["asynchronous"].all()
    evals = load_run(slowed.run_dir).evals
    assert evals["step"].tolist() == [0, 10, 20, 30]  # worker 0 alone, on global steps

    steps = load_run(backup.run_dir).steps
    counts = steps.groupby("rank").size()
    assert counts[1] == counts.min() < 20  # the slowed worker computed fewer steps
    assert steps["dropped"].any()
    # each of the 20 updates used exactly n - b = 2 gradients, computed on its version
    kept = steps[~steps["dropped"]].groupby("step")["rank"].nunique()
    assert (kept == 2).all() and list(kept.index) == list(range(20))


FAULT = """
[suite]
name = "fault"

[[runs]]
name = "long"
steps = 100000
global_batch = 64
timeout_s = 20
aggregator = "ps-async"
workers = [ { device = "cpu" }, { device = "cpu" } ]
"""


def kill_when(suite_dir: Path, pattern: str, part: str, world: int, steps: int
              ) -> tuple[threading.Thread, list[int]]:
    """A started thread that SIGKILLs the process whose pid parts/`part` records, once the
    run matching `pattern` has flushed `steps` steps on every rank; the pid lands in the
    list."""
    killed: list[int] = []

    def watch() -> None:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            runs = list(suite_dir.glob(pattern))
            info = runs[0] / "parts" / part if runs else None
            if info and info.is_file() and collector.steps_done(runs[0], world) >= steps:
                killed.append(json.loads(info.read_text())["pid"])
                os.kill(killed[0], 9)
                return
            time.sleep(0.05)

    thread = threading.Thread(target=watch)
    thread.start()
    return thread, killed


def test_a_dead_server_fails_the_run_and_keeps_the_flushed_steps(tmp_path: Path,
                                                                 write_suite) -> None:
    suite = load_suite(str(write_suite(FAULT)))
    out = tmp_path / "out"
    killer, killed = kill_when(out / "fault", "long-*", "ps0.json", world=2, steps=20)
    start = time.monotonic()
    [result] = run_suite(suite, out)
    killer.join()
    assert killed, "the server was never killed"
    assert result.status == "failed"
    assert "ps0 killed by SIGKILL" in result.reason
    assert time.monotonic() - start < 90
    steps = load_run(result.run_dir).steps
    assert len(steps) >= 20  # every flushed step stays readable


def test_ctrl_c_leaves_no_server_behind(tmp_path: Path, write_suite, spawn: Spawn) -> None:
    proc, run_dir, pids = start_long_run(spawn, tmp_path, write_suite, FAULT.replace(
        'name = "fault"', 'name = "faults"'))
    server = json.loads((run_dir / "parts" / "ps0.json").read_text())["pid"]
    assert alive(server)
    proc.send_signal(signal.SIGINT)
    started = time.monotonic()
    code, err = finish(proc)
    assert code == 130, err
    assert time.monotonic() - started < 15  # the server is not waited for, it is stopped
    assert not any(alive(p) for p in [*pids, server])
    assert load_run(run_dir).status == "interrupted"


GOES_ON = """
[suite]
name = "goes-on"

[[runs]]
name = "survivors"
steps = 600
global_batch = 96
timeout_s = 20
aggregator = "ps-async"
on_worker_failure = "continue"
workers = [ { device = "cpu" }, { device = "cpu" }, { device = "cpu" } ]
"""


def test_ps_async_goes_on_without_a_dead_worker_when_the_suite_says_so(
        tmp_path: Path, write_suite) -> None:
    suite = load_suite(str(write_suite(GOES_ON)))
    out = tmp_path / "out"
    killer, killed = kill_when(out / "goes-on", "survivors-*", "rank2.json", world=3, steps=30)
    [result] = run_suite(suite, out)
    killer.join()
    assert killed, "worker 2 was never killed"
    assert result.status == "completed", result.reason
    assert result.reason.startswith("worker 2 dropped after")
    run = load_run(result.run_dir)
    [dropped] = run.manifest["dropped_workers"]
    assert dropped["rank"] == 2 and dropped["status"] == -9
    steps = run.steps
    used = steps[~steps["dropped"]]
    # the others made up the budget of 600 global batches; the killed worker's last pushes
    # were applied but their records, not yet flushed (16 at most), died with it
    assert 600 * 96 - 16 * 32 <= used["batch_size"].sum() < 600 * 96 + 3 * 32
    counts = steps.groupby("rank").size()
    assert counts[2] < counts[0] and counts[2] < counts[1]
    assert (result.run_dir / "params.npz").is_file()
    assert run.manifest["aggregator"]["servers"] == 1
    server = json.loads((result.run_dir / "parts" / "ps0.json").read_text())["pid"]
    assert not alive(server)


def test_going_on_without_a_worker_needs_ps_async() -> None:
    from hetbench.harness.spec.errors import UsageError
    from hetbench.harness.spec.suite import parse_suite

    with pytest.raises(UsageError) as info:
        parse_suite({"runs": [{"name": "r", "on_worker_failure": "continue",
                               "aggregator": "ssp"}]})
    assert info.value.where == "runs[0].on_worker_failure"
    assert "'continue' needs aggregator 'ps-async'" in info.value.message
    with pytest.raises(UsageError, match="allowed: continue, fail"):
        parse_suite({"runs": [{"name": "r", "on_worker_failure": "ignore"}]})


MXNET_ASYNC = """
[suite]
name = "mxnet-async"

[defaults]
framework = "mxnet"
workload = "mlp"
dataset = "digits"
global_batch = 64
lr = 0.1
seed = 5
steps = 10
aggregator = "mxnet-async"

[[runs]]
name = "one"

[[runs]]
name = "two"
workers = [ { device = "cpu" }, { device = "cpu", slowdown = 3.0 } ]
"""


@pytest.mark.skipif(importlib.util.find_spec("mxnet") is None, reason="MXNet not installed")
def test_mxnet_dist_async_is_a_native_cross_check_of_ps_async(tmp_path: Path,
                                                               write_suite) -> None:
    """MXNet's own async server (hetbench starts and stops its scheduler and server; the
    optimizer is set before any push): one worker is sequential SGD, two run unhindered."""
    one, two = run_suite(load_suite(str(write_suite(MXNET_ASYNC))), tmp_path / "out")
    assert [one.status, two.status] == ["completed"] * 2, [one.reason, two.reason]
    params = dict(np.load(one.run_dir / "params.npz"))
    for name, value in plain_torch_sgd(seed=5, steps=10, lr=0.1, batch=64).items():
        np.testing.assert_allclose(params[name], value, rtol=0, atol=ATOL, err_msg=name)
    steps = load_run(two.run_dir).steps
    assert len(steps) == 20 and steps["asynchronous"].all()
    check_trace(two.run_dir / "trace.json", steps)
    assert (steps["staleness"] == -1).all()  # MXNet does not report it
    # the whole exchange is communication (MXNet does not split it), none of it idle
    assert (steps["push_ns"] > 0).all() and (steps["push_ns"] <= steps["allreduce_ns"]).all()
    assert (steps["wait_ns"] == 0).all()
    for log in ("kvstore-scheduler.log", "kvstore-server.log"):
        assert (two.run_dir / "logs" / log).is_file()
