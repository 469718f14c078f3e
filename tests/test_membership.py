"""A worker left out (issue 16, membership): an empty slice, given in the suite or decided by
the `model` policy with `leave_out`, changes who computes, never the parameters.

Real multi-process training over gloo. The reference is the plain PyTorch loop of
test_exactness (nn.Sequential, torch.optim.SGD with momentum) over the same global batches.
Rank 0 is the worker left out in both runs, so the parameters it writes at the end and
the held-out metrics it evaluates are right only if it received the members' parameters
(before every evaluation, and at the end) and, once taken back, their optimizer state.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from hetbench.analysis.tables.runs import analyse_run
from hetbench.analysis.view.metrics import complete_steps, run_summary, step_metrics
from hetbench.harness.records.results import load_run
from tests.conftest import Spawn, completed_runs
from tests.test_exactness import plain_torch
from tests.test_faults import finish, start_long_run
from tests.trace_check import check_trace

pytestmark = pytest.mark.slow
STEPS, BATCH, LR, SEED = 30, 64, 0.05, 5
ATOL = 2e-5

SUITE = f"""
[suite]
name = "membership-exactness"

[defaults]
workload = "mlp"
dataset = "digits"
steps = {STEPS}
global_batch = {BATCH}
lr = {LR}
seed = {SEED}
optimizer = "momentum"
eval_every = 10

[[runs]]
name = "rank0-out"
partition = {{ policy = "sizes", sizes = [0, 40, 24] }}
workers = [ {{ device = "cpu" }}, {{ device = "cpu" }}, {{ device = "cpu" }} ]

# Worker 0 is 20x slower: left out at the first update. From step 15 worker 1 is 60x
# slower: worker 0 pays for itself again and is taken back.
[[runs]]
name = "out-and-back"
partition = {{ policy = "model", every = 3, leave_out = true }}
workers = [ {{ device = "cpu", slowdown = 20.0 }},
            {{ device = "cpu", slowdown_at = [[14, 1.0], [15, 60.0]] }} ]
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return completed_runs(tmp_path_factory.mktemp("membership"), SUITE)


@pytest.fixture(scope="module")
def reference() -> dict[str, np.ndarray]:
    def momentum(params: Any) -> tuple[Any, None]:
        return torch.optim.SGD(params, lr=LR, momentum=0.9), None

    return plain_torch(SEED, STEPS, BATCH, momentum)[0]


def test_a_worker_left_out_changes_no_parameter(runs: dict[str, Path],
                                                reference: dict[str, np.ndarray]) -> None:
    for name in ("rank0-out", "out-and-back"):
        run_dir = runs[name]
        params = dict(np.load(run_dir / "params.npz"))
        for key, expected in reference.items():
            np.testing.assert_allclose(params[key], expected, rtol=0, atol=ATOL,
                                       err_msg=f"{name}: {key}")


def test_the_policy_left_worker_0_out_and_took_it_back(runs: dict[str, Path]) -> None:
    history = load_run(runs["out-and-back"]).manifest["partition_history"]
    out = [h for h in history if "left out worker(s) [0]" in h["reason"]]
    back = [h for h in history if "took back worker(s) [0]" in h["reason"]]
    assert out and back, [h["reason"] for h in history]
    assert out[0]["sizes"] == [0, BATCH] and out[0]["step"] < 15
    assert back[0]["step"] > 15 and back[0]["sizes"][0] > 0


def test_every_step_has_a_row_per_worker_and_the_analysis_reads_the_members(
        runs: dict[str, Path]) -> None:
    run = load_run(runs["out-and-back"])
    steps = run.steps
    assert len(steps) == 2 * STEPS  # a row per worker and step, sat out or not
    assert (steps.groupby("step")["batch_size"].sum() == BATCH).all()
    history = run.manifest["partition_history"]
    sizes_at = {h["step"]: h["sizes"] for h in history}
    current = history[0]["sizes"]
    for step in range(STEPS):
        current = sizes_at.get(step, current)
        recorded = steps[steps["step"] == step].sort_values("rank")["batch_size"].tolist()
        assert recorded == current, step
    out_rows = steps[steps["batch_size"] == 0]
    assert len(out_rows) and (out_rows[["begin_ns", "end_ns"]] == 0).all().all()
    members = complete_steps(steps)
    assert (members["batch_size"] > 0).all()
    assert complete_steps(members).equals(members)  # a filtered frame is complete again
    per_step = step_metrics(steps)
    assert len(per_step) == STEPS and (per_step["samples"] == BATCH).all()
    # a step one worker computed alone: it is the straggler, and nobody idles
    computing_rank = members.groupby("step")["rank"].first()
    lone = per_step[per_step["step"].isin(out_rows["step"])].set_index("step")
    assert (lone["straggler"] == computing_rank[lone.index]).all()
    assert (lone["idle_ms"] == 0).all()
    summary = run_summary(steps)
    assert summary["steps"] == STEPS and summary["samples_per_s"] > 0
    tables = analyse_run(steps, 0, None, run.manifest)
    assert len(tables["what_if"]) == 4 and tables["what_if"]["total_s"].notna().all()
    # the trace has no slices for a step sat out
    events = check_trace(runs["out-and-back"] / "trace.json", steps)
    sat_out = {(int(r.rank), int(r.step)) for r in out_rows.itertuples()}
    assert not [e for e in events["X"] if (e["pid"] - 1, e["args"]["step"]) in sat_out]


# Rank 1 left out for the whole run, rank 0 computing alone; the test stops rank 0 for
# PAUSE_S, three times the run's timeout, as a host's stall (or a long step) would.
PAUSE_S = 3.0
PAUSED_STEPS = 3000  # ~1.5 ms a step: still running when the test pauses it at step 40
PAUSED = f"""
[suite]
name = "faults"

[[runs]]
name = "long"
steps = {PAUSED_STEPS}
global_batch = {BATCH}
timeout_s = 1.0
partition = {{ policy = "sizes", sizes = [{BATCH}, 0] }}
workers = [ {{ device = "cpu" }}, {{ device = "cpu" }} ]
"""


def test_a_member_stopped_longer_than_the_timeout_leaves_the_left_out_worker_waiting(
        tmp_path: Path, write_suite: Any, spawn: Spawn) -> None:
    """The left-out worker's word comes between the members' steps: a member stopped for
    longer than the run's timeout delays it, and the left-out worker waits on (as long as
    the launcher lets a run go without a step), where a peer in a collective would time
    out. (In the clean-clone CI runs of 11-29, a slowed member's stretched stall timed the
    left-out worker's receive out, when it had the run's timeout.)"""
    proc, run_dir, pids = start_long_run(spawn, tmp_path, write_suite, PAUSED)
    os.kill(pids[0], signal.SIGSTOP)
    try:
        time.sleep(PAUSE_S)
    finally:  # the run may have failed meanwhile (as it did when the wait had the timeout)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pids[0], signal.SIGCONT)
    code, err = finish(proc)
    run = load_run(run_dir)
    assert (run.status, code) == ("completed", 0), (run.manifest.get("reason"), err)
    member = run.steps[run.steps["rank"] == 0].sort_values("step")
    longest_s = float(np.diff(member["begin_ns"].to_numpy()).max()) / 1e9
    assert longest_s > PAUSE_S - 0.5 > 2 * run.manifest["run"]["timeout_s"]  # it was paused
    left_out = run.steps[run.steps["rank"] == 1]
    assert sorted(left_out["step"]) == list(range(PAUSED_STEPS))
    assert (left_out["batch_size"] == 0).all()


def test_every_worker_evaluates_the_members_model(runs: dict[str, Path]) -> None:
    for name in ("rank0-out", "out-and-back"):
        evals = load_run(runs[name]).evals
        assert list(evals["step"]) == [0, 10, 20, STEPS], name
        assert evals["loss"].iloc[-1] < evals["loss"].iloc[0], name
    # the same model evaluated with rank 0 out (the first run) and in (the second)
    first, second = (load_run(runs[n]).evals for n in ("rank0-out", "out-and-back"))
    np.testing.assert_allclose(first["loss"], second["loss"], rtol=1e-4)
