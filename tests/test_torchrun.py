"""The worker entry point joins a torchrun (env://) rendezvous: no home-made launcher."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from hetbench.analysis.view.metrics import idle_agreement
from hetbench.harness.records import collector
from hetbench.harness.records.results import load_run
from hetbench.harness.system import interfaces
from hetbench.harness.system.interfaces import INTERFACE_VARIABLES
from tests.conftest import REPO, Spawn
from tests.test_listeners import listeners_of

pytestmark = pytest.mark.slow

SUITE = """
[suite]
name = "multinode"

[[runs]]
name = "pair"
steps = 12
global_batch = 32
partition = { policy = "sizes", sizes = [8, 24] }
workers = [ { device = "cpu" }, { device = "cpu", slowdown = 2.0 } ]
"""


# Worker 1 stalls from step 6 (a 2000x slowdown); worker 0's all-reduce times out after 2 s.
STALLING_SUITE = SUITE.replace("steps = 12", "steps = 12\ntimeout_s = 2").replace(
    '{ device = "cpu", slowdown = 2.0 }',
    '{ device = "cpu", slowdown_at = [[5, 1.0], [6, 2000.0]] }')


def torchrun(spawn: Spawn, suite: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return spawn.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
         "--nproc-per-node", "2", "-m", "hetbench.harness.loop.worker", "--suite", str(suite),
         "--run-name", "pair", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=180,
        env={**os.environ, "GLOO_SOCKET_IFNAME": "lo"},
    )


def test_torchrun_starts_workers_that_write_one_run_directory(tmp_path: Path, write_suite,
                                                              spawn: Spawn) -> None:
    suite = write_suite(SUITE)
    out = tmp_path / "out"
    done = torchrun(spawn, suite, out)
    assert done.returncode == 0, done.stderr[-3000:]
    (run_dir,) = list((out / "multinode").glob("pair-r0-*"))
    run = load_run(run_dir)
    assert run.status == "completed"
    clock = run.manifest["clock"]
    assert clock["same_clock"] is True and clock["applied"] is False
    # one clock: the estimated offsets are the method's error, within its own bound
    for estimate in (clock["start"], clock["end"]):
        assert abs(estimate["offset_ns"][1]) <= estimate["uncertainty_ns"][1] + 50_000
    assert sorted(run.steps["rank"].unique()) == [0, 1]
    assert run.steps.groupby("rank")["batch_size"].first().tolist() == [8, 24]
    # CPU time during compute: the main thread's at every step, all the worker's threads'
    # over one step in counters_every (default 8) and -1 on the others, covering the main
    # thread's (read around it)
    steps = run.steps.sort_values(["rank", "step"])
    sampled = steps["step"] % 8 == 0
    main, every = steps["compute_cpu_ns"], steps["compute_cpu_all_ns"]
    assert (main > 0).all() and (steps["compute_wait_ns"] >= 0).all()
    assert (every[sampled] >= main[sampled]).all() and (every[~sampled] == -1).all()
    assert (steps.loc[~sampled, "ctx_involuntary"] == -1).all()
    assert len(run.steps) == 24
    params = np.load(run_dir / "params.npz")
    assert params["fc1.weight"].dtype == np.float32


def test_a_failed_torchrun_job_is_marked_failed_with_its_steps(tmp_path: Path, write_suite,
                                                               spawn: Spawn) -> None:
    """No hetbench launcher watches a torchrun job: rank 0 closes the run directory."""
    out = tmp_path / "out"
    done = torchrun(spawn, write_suite(STALLING_SUITE), out)
    assert done.returncode != 0
    (run_dir,) = list((out / "multinode").glob("pair-r0-*"))
    run = load_run(run_dir)
    assert run.status == "failed"
    assert run.manifest["reason"].startswith("worker 0: ")
    assert (run_dir / "steps.parquet").is_file()
    assert set(run.steps.loc[run.steps["rank"] == 0, "step"]) >= set(range(6))


def test_an_interface_this_host_lacks_is_one_line(tmp_path: Path, write_suite,
                                                  spawn: Spawn) -> None:
    done = torchrun(spawn,
                    write_suite(SUITE.replace("steps = 12", 'steps = 12\ninterface = "nosuch0"')),
                    tmp_path / "out")
    assert done.returncode != 0
    assert "hetbench worker: error: interface: 'nosuch0' is not an interface of this host" \
        in done.stderr


def ipv4_interface() -> tuple[str, str] | None:
    """(name, address) of an interface of this host with an IPv4 address, not loopback."""
    return next(((name, address) for name, address in interfaces.ipv4_addresses().items()
                 if not address.startswith("127.")), None)


def test_the_suite_interface_is_the_one_the_workers_listen_on(tmp_path: Path, write_suite,
                                                               spawn: Spawn) -> None:
    """Across hosts the suite names the interface (`interface`); gloo's listeners in the
    workers bind it, though torchrun's own environment names none."""
    found = ipv4_interface()
    if found is None:
        pytest.skip("no interface with an IPv4 address other than loopback here")
    name, address = found
    suite = write_suite(SUITE.replace("steps = 12", f'steps = 100000\ninterface = "{name}"'))
    env = {k: v for k, v in os.environ.items() if k not in INTERFACE_VARIABLES}
    proc = spawn(  # in a process group of its own, as a Ctrl-C in a terminal signals it
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
         "--nproc-per-node", "2", "-m", "hetbench.harness.loop.worker", "--suite", str(suite),
         "--run-name", "pair", "--out", str(tmp_path / "out")],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline, workers = time.monotonic() + 90, []
        while time.monotonic() < deadline and proc.poll() is None:
            runs = list((tmp_path / "out" / "multinode").glob("pair-r0-*"))
            if runs and collector.steps_done(runs[0], 2) >= 20:
                workers = [json.loads((runs[0] / "parts" / f"rank{r}.json").read_text())["pid"]
                           for r in range(2)]
                break
            time.sleep(0.2)
        assert workers, proc.stderr.read() if proc.poll() is not None else "no steps in 90 s"
        addresses = {listener[1] for listener in listeners_of(workers)}
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        proc.communicate(timeout=60)
    assert address in addresses, addresses  # gloo's pair listeners, on the suite's interface
    assert not addresses & {"0.0.0.0", "::"}, addresses


SHIFT_S = 5  # node 1's CLOCK_MONOTONIC is 5 s ahead of node 0's


def test_two_nodes_with_clocks_apart_are_aligned(tmp_path: Path, write_suite,
                                                 spawn: Spawn) -> None:
    """Two torchrun "nodes" on loopback, the second in a time namespace whose monotonic
    clock runs SHIFT_S ahead (`unshare --time`): the offsets measured put every record on
    rank 0's clock, so that no worker leaves an all-reduce before the last one arrived,
    and idle from the aligned timestamps agrees with idle from local durations."""
    probe = spawn.run(["unshare", "-rT", "--monotonic", str(SHIFT_S), "true"],
                      capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip(f"no time namespace here (unshare -rT: {probe.stderr.strip()})")
    suite = write_suite(SUITE.replace("steps = 12", "steps = 40"))
    port = str(free_port())

    def node(rank: int) -> list[str]:
        return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
                "--node-rank", str(rank), "--nproc-per-node", "1", "--master-addr",
                "127.0.0.1", "--master-port", port, "-m", "hetbench.harness.loop.worker", "--suite",
                str(suite), "--run-name", "pair", "--out", str(tmp_path / "out")]

    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo"}
    first = spawn(node(0), cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                  stderr=subprocess.PIPE, text=True)
    second = spawn.run(["unshare", "-rT", "--monotonic", str(SHIFT_S), *node(1)],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    _, err = first.communicate(timeout=60)
    assert first.returncode == 0 and second.returncode == 0, (err[-2000:],
                                                               second.stderr[-2000:])
    (run_dir,) = list((tmp_path / "out" / "multinode").glob("pair-r0-*"))
    run = load_run(run_dir)
    clock = run.manifest["clock"]
    assert clock["same_clock"] is False and clock["applied"] is True
    for estimate in (clock["start"], clock["end"]):
        assert abs(estimate["offset_ns"][1] - SHIFT_S * 10**9) < 50_000_000
        assert 0 < estimate["uncertainty_ns"][1] < 5_000_000
    steps = run.steps.groupby("step")
    last_arrival, first_release = steps["ready_ns"].max(), steps["reduced_ns"].min()
    slack = clock["end"]["uncertainty_ns"][1] + clock["start"]["uncertainty_ns"][1]
    assert (last_arrival <= first_release + slack).all()
    agreement = idle_agreement(run.steps)
    assert agreement["median_abs_diff_ms"] < 1.0, agreement
    errors = [e["offset_ns"][1] - SHIFT_S * 10**9 for e in (clock["start"], clock["end"])]
    bounds = [e["uncertainty_ns"][1] for e in (clock["start"], clock["end"])]
    print(f"\noffset errors {errors} ns, uncertainties {bounds} ns, idle estimates {agreement}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
