"""TensorFlow's ParameterServerStrategy (aggregator "tensorflow-ps"), hetbench's native
cross-check of ps-async for all-TensorFlow jobs: worker servers, ps servers and a
coordinator that hetbench starts and stops, records of every worker's steps, the
suite checks that refuse what the coordinator cannot do."""

from __future__ import annotations

import importlib.util
import json
import os
import time
from pathlib import Path

import numpy as np
import pytest

from hetbench.harness.records.results import load_run
from hetbench.harness.run.launcher import run_suite
from hetbench.harness.spec.errors import UsageError
from hetbench.harness.spec.suite import load_suite, parse_suite
from tests.conftest import Spawn
from tests.test_exactness import plain_torch_sgd
from tests.test_faults import alive
from tests.test_sync_schemes import ATOL, kill_when
from tests.trace_check import check_trace

needs_tensorflow = pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None,
                                      reason="TensorFlow not installed")
STEPS, BATCH = 20, 64

SUITE = f"""
[suite]
name = "tfps"

[defaults]
framework = "tensorflow"
workload = "mlp"
dataset = "digits"
global_batch = {BATCH}
lr = 0.1
seed = 5
aggregator = "tensorflow-ps"

[[runs]]
name = "one"
steps = 10

[[runs]]
name = "two"
steps = {STEPS}
eval_every = 5
workers = [ {{ device = "cpu" }}, {{ device = "cpu", slowdown = 3.0 }} ]
"""


def server_pids(run_dir: Path) -> list[int]:
    """The pids of the run's TensorFlow servers (workers and ps) and of its coordinator."""
    parts = run_dir / "parts"
    return [json.loads(p.read_text())["pid"]
            for p in [*parts.glob("tf-*/ready"), parts / "tf-coordinator.json"]]


@needs_tensorflow
def test_one_worker_is_sequential_sgd_and_two_train_on_their_own_clocks(
        tmp_path: Path, write_suite) -> None:
    one, two = run_suite(load_suite(str(write_suite(SUITE))), tmp_path / "out")
    assert [one.status, two.status] == ["completed"] * 2, [one.reason, two.reason]
    params = dict(np.load(one.run_dir / "params.npz"))
    for name, value in plain_torch_sgd(seed=5, steps=10, lr=0.1, batch=BATCH).items():
        np.testing.assert_allclose(params[name], value, rtol=0, atol=ATOL, err_msg=name)
    assert (load_run(one.run_dir).steps["staleness"] == 0).all()  # one worker: none

    run = load_run(two.run_dir)
    steps = run.steps
    assert steps["asynchronous"].all() and (steps["staleness"] >= 0).all()
    # the servers applied the samples of STEPS global batches, and the steps in flight then
    assert STEPS * BATCH <= steps["batch_size"].sum() <= (STEPS + 2) * BATCH
    for rank, mine in steps.groupby("rank"):
        assert list(mine["step"]) == list(range(len(mine))), rank  # its own clock
    assert (steps["ready_ns"] > steps["begin_ns"]).all()
    assert (steps["reduced_ns"] >= steps["ready_ns"] + steps["push_ns"]).all()
    assert (steps["wait_ns"] >= 0).all()
    # the slowed worker's stretch is twice its load, forward and backward
    computed = steps[["load_ns", "forward_ns", "backward_ns"]].sum(axis=1)
    ratio = (steps["stretch_ns"] / computed).groupby(steps["rank"]).median()
    assert ratio[0] == 0.0 and 1.6 < ratio[1] < 2.4, ratio
    check_trace(two.run_dir / "trace.json", steps)
    # the coordinator evaluated the servers' parameters every 5 global steps
    assert list(run.evals["step"])[:2] == [0, 5] and run.evals["step"].max() >= STEPS
    placement = run.manifest["aggregator"]["placement"]
    assert set(placement) == {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias",
                              "fc3.weight", "fc3.bias"}
    assert all(device.startswith("/job:ps/") for device in placement.values())
    for log in ("tf-ps0.log", "tf-coordinator.log", "rank0.log", "rank1.log"):
        assert (two.run_dir / "logs" / log).is_file()
    pids = server_pids(two.run_dir)
    assert len(pids) == 4 and not any(alive(p) for p in pids)  # servers never exit alone


FAULT = """
[suite]
name = "faults"

[[runs]]
name = "long"
framework = "tensorflow"
workload = "mlp"
dataset = "digits"
steps = 3000
global_batch = 64
timeout_s = 20
aggregator = "tensorflow-ps"
workers = [ { device = "cpu" }, { device = "cpu" } ]
"""


@needs_tensorflow
@pytest.mark.long
def test_a_dead_ps_server_fails_the_run_and_stops_every_other(tmp_path: Path,
                                                               write_suite) -> None:
    out = tmp_path / "out"
    killer, killed = kill_when(out / "faults", "long-*", "tf-ps0/ready", world=2, steps=10)
    start = time.monotonic()
    [result] = run_suite(load_suite(str(write_suite(FAULT))), out)
    killer.join()
    # (once in a loaded clean-clone run it never was: the run's end says why, next time)
    assert killed, f"the server was never killed; the run {result.status}: {result.reason}"
    assert result.status == "failed"
    assert "tf-ps0 killed by SIGKILL" in result.reason
    assert time.monotonic() - start < 90
    assert len(load_run(result.run_dir).steps) >= 20  # every flushed step stays readable
    assert not any(alive(p) for p in server_pids(result.run_dir))


# Ctrl-C (every server and worker gone, the run interrupted, within 15 s): the tensorflow-ps
# case of tests/test_listeners.py, which watches the same long run's processes.


def suite_with(**run: object) -> dict[str, object]:
    return {"runs": [{"name": "r", "framework": "tensorflow", "aggregator": "tensorflow-ps",
                      **run}]}


@pytest.mark.parametrize(("run", "where", "says"), [
    ({"workers": [{"framework": "tensorflow"}, {"framework": "pytorch"}]},
     "runs[0].aggregator", "needs every worker on tensorflow"),
    ({"partition": {"policy": "profiled"}}, "runs[0].partition.policy",
     "allowed: equal, sizes, weights"),
    ({"loader": {"workers": 1}}, "runs[0].loader", "leave loader unset"),
    ({"workload": "bert", "dataset": "text"}, "runs[0].workload", "allowed: "),
    ({"calibrate": True}, "runs[0].calibrate", "calibrate = false"),
    ({"instrument": False}, "runs[0].instrument", "instrument = true"),
    ({"placement": "sharded"}, "runs[0].placement", "not 'tensorflow-ps'"),
    ({"optimizer": "momentum"}, "runs[0].optimizer", "plain 'sgd' only"),
    ({"aggregator": {"name": "tensorflow-ps", "servers": 0}}, "runs[0].aggregator.servers",
     ""),
    ({"aggregator": {"name": "tensorflow-ps", "staleness": 1}},
     "runs[0].aggregator.staleness", "takes only servers"),
])
def test_what_the_coordinator_cannot_do_is_refused(run: dict[str, object], where: str,
                                                   says: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_suite(suite_with(**run))
    assert info.value.where == where
    assert says in info.value.message


def remote_step_output(rank: int, step: int, t0: float, staleness: int) -> dict[str, object]:
    """What the coordinator fetches of one step function: its instants are t0 (seconds
    since the epoch), then pulled, loaded, forward, backward, ready, pushed so many ms
    after it."""
    times = [t0 + ms / 1e3 for ms in (0, 1, 2, 4, 7, 9, 10)]
    return {"rank": rank, "step": step, "loss": 80.0, "samples": 40 if rank == 0 else 24,
            "staleness": staleness, "times": np.array(times)}


def test_a_workers_step_ends_with_its_next_steps_pull() -> None:
    """The coordinator's records: a step is load, compute, stretch, then the exchange: its
    push, the wait for the next function (idle) and that function's pull; a worker's last
    step ends with its push. Instants in wall-clock seconds become monotonic ns."""
    from hetbench.harness.loop.tensorflow_coordinator import Recorder
    from hetbench.harness.records import collector

    recorder = Recorder([(0, 40), (40, 64)])
    offset = recorder.offset
    out = remote_step_output
    base = 1.8e9  # seconds since the epoch
    assert recorder.add(out(0, 0, base, 0)) == []  # held until its next pull
    assert recorder.add(out(1, 0, base + 0.002, 1)) == []
    rows = recorder.add(out(0, 1, base + 0.015, 1))  # 5 ms after rank 0's push
    assert len(rows) == 1
    assert recorder.samples == 104
    rows += recorder.release()
    assert len(rows) == 3 and recorder.release() == []
    records = np.array(rows, dtype=collector.RECORD_DTYPE)
    first, last = records[records["rank"] == 0]
    ns = int(base * 1e9) - offset
    ms = 1_000_000
    assert first["begin_ns"] == pytest.approx(ns + 1 * ms, abs=1000)  # its pull ended
    assert first["load_ns"] == pytest.approx(1 * ms, abs=1000)
    assert first["to_device_ns"] == 0
    assert (first["forward_ns"], first["backward_ns"]) == pytest.approx((2 * ms, 3 * ms),
                                                                         abs=1000)
    assert first["stretch_ns"] == first["pack_ns"] == pytest.approx(2 * ms, abs=1000)
    assert first["push_ns"] == pytest.approx(1 * ms, abs=1000)
    assert first["wait_ns"] == pytest.approx(5 * ms, abs=1000)  # until the next t0
    assert first["pull_ns"] == pytest.approx(1 * ms, abs=1000)  # the next function's
    assert first["reduced_ns"] == first["end_ns"] == last["begin_ns"]
    assert first["allreduce_ns"] == first["push_ns"] + first["wait_ns"] + first["pull_ns"]
    assert first["loss"] == first["local_loss"] == 2.0 and first["asynchronous"]
    assert (last["step"], last["wait_ns"], last["pull_ns"]) == (1, 0, 0)
    assert last["reduced_ns"] == last["ready_ns"] + last["push_ns"]  # ends with its push
    (other,) = records[records["rank"] == 1]
    assert (other["slice_start"], other["batch_size"], other["staleness"]) == (40, 24, 1)


def test_a_workers_steps_fetched_out_of_order_are_recorded_in_the_order_it_ran_them() -> None:
    """The coordinator fetches in the order it scheduled, not always the order a worker
    ran them (a stopped worker's came as k = 53, 57, 54, 55, 56 in a test of issue 18): each
    step still ends with the pull of the worker's next step k + 1; a k lost with its
    function is skipped once more outputs than can be in flight came after it."""
    from hetbench.harness.loop.tensorflow_coordinator import Recorder
    from hetbench.harness.records import collector

    recorder = Recorder([(0, 40), (40, 64)])
    base = 1.8e9
    # worker 0 ran k = 0..3, one every 20 ms; their outputs came as 0, 3, 1, 2
    arrived = [recorder.add(remote_step_output(0, k, base + 0.02 * k, 0)) for k in (0, 3, 1, 2)]
    assert [len(rows) for rows in arrived] == [0, 0, 1, 2]
    # worker 1's k = 1 never came (lost with its function): k = 0 waits for 2*2+1 later
    # outputs, then ends with the next one there is
    later = [recorder.add(remote_step_output(1, k, base + 0.02 * k, 0)) for k in range(7)
             if k != 1]
    assert [len(rows) for rows in later] == [0, 0, 0, 0, 0, 5]
    rows = [row for rows in arrived + later for row in rows] + recorder.release()
    records = np.array(rows, dtype=collector.RECORD_DTYPE)
    for rank, steps in ((0, [0, 1, 2, 3]), (1, [0, 2, 3, 4, 5, 6])):
        mine = records[records["rank"] == rank]
        assert list(mine["step"]) == steps
        assert (mine["allreduce_ns"] >= 0).all() and (mine["wait_ns"] >= 0).all()
        assert (mine["end_ns"][:-1] == mine["begin_ns"][1:]).all()  # the next one's pull


def test_the_coordinator_feeds_hetbench_batches_and_slowdowns() -> None:
    """Worker r's k-th step: slice r of global batch k, as BatchOrder cuts it; its slowdown,
    factor_at(k) (the jitter drawn from seed, rank and step as in the training loop)."""
    from hetbench.harness.loop.tensorflow_coordinator import batch_tables
    from hetbench.workloads.data import BatchOrder

    [run] = parse_suite(suite_with(steps=7, global_batch=64, workers=[
        {"framework": "tensorflow"},
        {"framework": "tensorflow", "jitter": {"probability": 0.5, "factor": 4.0}}])).runs
    rows, factors = batch_tables(run, 1000)
    order = BatchOrder(1000, 64, run.seed)
    assert rows.shape == (14, 64) and factors.shape == (2, 14)
    for k in range(14):
        np.testing.assert_array_equal(rows[k], order.indices(k))
    assert set(factors[0]) == {1.0} and set(factors[1]) == {1.0, 4.0}
    assert [factors[1, k] for k in range(14)] == [run.workers[1].factor_at(k, run.seed, 1)
                                                  for k in range(14)]


def test_a_service_that_fails_is_named_with_its_last_words(tmp_path: Path,
                                                           spawn: Spawn) -> None:
    """The launcher's watch: a service (a coordinator, a server) that ends itself with an
    error fails the run with its last log line; one killed by a signal, without (its last
    line is not about that)."""
    import sys

    from hetbench.harness.run.launcher import _watch
    from hetbench.harness.system.services import Services

    [run] = parse_suite(suite_with()).runs
    (tmp_path / "parts").mkdir()
    logs = tmp_path / "logs"
    logs.mkdir()
    for code, says in ((3, " (hetbench coordinator: error: ValueError: no)"), (-9, None)):
        services = Services()
        services.start("tf-coordinator", [sys.executable, "-c", (
            "import os, sys\nprint('a line before', flush=True)\n"
            "print('hetbench coordinator: error: ValueError: no', file=sys.stderr, "
            f"flush=True)\nos.kill(os.getpid(), 9) if {code} < 0 else sys.exit({code})")],
            dict(os.environ), logs)
        worker = spawn([sys.executable, "-c", "import time; time.sleep(60)"])
        try:
            status, reason, _ = _watch({0: worker}, run, tmp_path, None, services)
        finally:
            worker.kill()
            worker.wait()
            services.stop(0.1)
        assert status == "failed"
        assert reason == ("tf-coordinator killed by SIGKILL while the workers ran" if code < 0
                          else f"tf-coordinator exited with status {code} while the workers "
                          "ran" + says)
