"""A user's own training loop under torchrun, converted to hetbench (`hetbench.join`):
its slices, exact gradients, records, and its run directory read by report, simulate and
advise; every bad input refused with the call and the argument named."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch

from hetbench.harness.records.results import load_run
from hetbench.harness.spec.errors import UsageError
from hetbench.harness.spec.suite import load_suite
from hetbench.harness.userloop import config
from tests.conftest import REPO, Spawn

SCRIPT = REPO / "tests" / "fixtures" / "own_loop" / "train.py"
SLOWED = json.dumps([{"device": "cpu"}, {"device": "cpu", "slowdown": 3.0}])


def _script_module() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("own_loop_train", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def textbook(steps: int, global_batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    """The script's model, optimizer, clipping and scheduler over whole global batches in
    one process: the batches in the order hetbench documents (a permutation per epoch from
    numpy's default_rng([seed, epoch]), cut in order), the loss the batch's mean."""
    train = _script_module()
    data = train.make_data()
    model = train.make_model()
    optimizer, scheduler = train.make_optimizer(model)
    loss_fn = torch.nn.CrossEntropyLoss()
    per_epoch = len(data) // global_batch
    for step in range(steps):
        epoch, offset = divmod(step, per_epoch)
        order = np.random.default_rng([seed, epoch]).permutation(len(data))
        index = torch.as_tensor(order[offset * global_batch:(offset + 1) * global_batch])
        inputs, targets = data.tensors[0][index], data.tensors[1][index]
        loss = loss_fn(model(inputs), targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
    return {name: p.detach().numpy() for name, p in model.named_parameters()}


def torchrun(spawn: Spawn, out: Path, *args: str, workers: str | None = SLOWED,
             ranks: int = 2) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    env.pop(config.WORKERS_VARIABLE, None)
    if workers is not None:
        env[config.WORKERS_VARIABLE] = workers
    return spawn.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
         "--nproc-per-node", str(ranks), str(SCRIPT), "--out", str(out), *args],
        capture_output=True, text=True, timeout=240, env=env, cwd=out.parent)


# torchrun's report of a rank that died of SIGABRT ("exitcode  : -6")
TEARDOWN_ABORT = re.compile(r"exitcode\s*:\s*-6\b")


def assert_ran(done: subprocess.CompletedProcess[str], out: Path, suite: str = "train") -> None:
    """The launch succeeded: exit status 0, or (once in a few dozen launches on CI) a rank
    aborted in torch's own interpreter teardown after the run was written. The session
    cannot skip a user's script's teardown (harness/system/exits.py says why hetbench's
    processes do), but no rank leaves `finish` before rank 0 has completed the run, which
    is what is checked here: the run's manifest completed, and the only failure an abort."""
    if done.returncode == 0:
        return
    runs = list((out / suite).glob("*-r0-*"))
    aborted_after_the_run = (TEARDOWN_ABORT.search(done.stderr) is not None and len(runs) == 1
                             and load_run(runs[0]).status == "completed")
    assert aborted_after_the_run, done.stderr[-3000:]


def only_run(out: Path, suite: str = "train") -> Path:
    (run_dir,) = list((out / suite).glob("*-r0-*"))
    return run_dir


@pytest.mark.slow
def test_a_converted_loop_with_a_slowed_rank_trains_the_textbook_parameters(
        tmp_path: Path, spawn: Spawn) -> None:
    out = tmp_path / "out"
    done = torchrun(spawn, out, "--steps", "20", "--partition", "40", "24", "--checkpoint",
                    str(tmp_path / "checkpoint.pt"))
    assert_ran(done, out)
    run_dir = only_run(out)
    run = load_run(run_dir)
    assert run.status == "completed"
    # the parameters after 20 steps on slices of 40 and 24: the whole batch's loop's
    params = np.load(run_dir / "params.npz")
    expected = textbook(20, 64)
    assert sorted(params.files) == sorted(expected)
    for name, value in expected.items():
        np.testing.assert_allclose(params[name], value, rtol=0, atol=1e-6, err_msg=name)
    # rank 0's checkpoint after the run, from what the session says of the rank
    saved = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert (saved["rank"], saved["world_size"], saved["device"]) == (0, 2, "cpu")
    for name, value in expected.items():
        np.testing.assert_allclose(saved["model"][name].numpy(), value, rtol=0, atol=1e-6)
    steps = run.steps.sort_values(["rank", "step"])
    assert len(steps) == 40 and sorted(steps["step"].unique()) == list(range(20))
    assert steps.groupby("rank")["batch_size"].unique().map(list).tolist() == [[40], [24]]
    assert steps.groupby("rank")["slice_start"].first().tolist() == [0, 40]
    # every phase a mark in order, the instants between them
    for phase in ("load", "forward", "backward", "allreduce", "apply"):
        assert (steps[f"{phase}_ns"] >= 0).all(), phase
    assert (steps["forward_ns"] > 0).all() and (steps["backward_ns"] > 0).all()
    assert (steps["begin_ns"] <= steps["ready_ns"]).all()
    assert (steps["ready_ns"] <= steps["reduced_ns"]).all()
    assert (steps["reduced_ns"] <= steps["end_ns"]).all()
    # rank 1's compute stretched to 3x: twice its own compute again, rank 0's not at all
    stretched = steps.groupby("rank")["stretch_ns"].sum()
    assert stretched[0] == 0 and stretched[1] > 0
    # one global loss per step on both ranks, each rank's own beside it
    by_step = steps.pivot(index="step", columns="rank", values="loss")
    np.testing.assert_allclose(by_step[0], by_step[1])
    manifest = run.manifest
    assert manifest["run"]["steps"] == 20 and manifest["run"]["script"] == str(SCRIPT)
    loop = manifest["loop"]
    checkpoint = ["--checkpoint", str(tmp_path / "checkpoint.pt")]
    assert loop["argv"] == ["--out", str(out), "--steps", "20", "--partition", "40", "24",
                            *checkpoint]
    assert loop["loss_reduction"] == "mean" and loop["optimizers"] == ["SGD"]
    assert loop["data"] == {"type": "TensorDataset", "samples": 512, "loader_workers": 0}
    assert [w["slowdown"] for w in manifest["workers"]] == [1.0, 3.0]
    # the run directory reads as any run's: report (the slowed rank the straggler),
    # simulate and advise
    report = spawn.run([sys.executable, "-m", "hetbench.harness.cli.main", "report",
                             str(out / "train"), "--format", "json", "--no-figures"],
                            capture_output=True, text=True, timeout=180)
    assert report.returncode == 0, report.stderr[-2000:]
    stragglers = (out / "train" / "report" / "report.md").read_text().split(
        "Stragglers (ready last):")[1].split("\n\n")[1]
    shares = {int(row.split("|")[1]): float(row.split("|")[3])
              for row in stragglers.splitlines()[2:]}
    # rank 1's compute is 1.8x rank 0's (24 samples at 3x against 40): last in most steps,
    # though a sub-millisecond step's noise hands rank 0 a few (CI: 14 of 18 to rank 1)
    assert shares[1] > 0.5 > shares[0], stragglers
    simulate = spawn.run(
        [sys.executable, "-m", "hetbench.harness.cli.main", "simulate", str(out / "train"),
         "--mix", "rank0:2,rank1:2", "--scheme", "bsp", "--out", str(tmp_path / "sim"),
         "--no-figures"], capture_output=True, text=True, timeout=180)
    assert simulate.returncode == 0, simulate.stderr[-2000:]
    (summary,) = list((tmp_path / "sim" / "simulate").glob("summary-*.csv"))
    assert pd.read_csv(summary)["workers"].tolist() == [4]
    advise = spawn.run(
        [sys.executable, "-m", "hetbench.harness.cli.main", "advise", str(out / "train"),
         "--out", str(tmp_path / "advice"), "--no-figures"],
        capture_output=True, text=True, timeout=180)
    assert advise.returncode == 0, advise.stderr[-2000:]
    advice = (tmp_path / "advice" / "advice.md").read_text()
    assert "partition profiled" in advice and "ps-sync: aggregator: 'ps-sync'" in advice
    # the advised suite runs the same script with the same arguments
    advised = load_suite(str(tmp_path / "advice" / "advised.toml"))
    assert {(r.script, r.args) for r in advised.runs} == {
        (str(SCRIPT), ("--out", str(out), "--steps", "20", "--partition", "40", "24",
                       *checkpoint))}



@pytest.mark.slow
@pytest.mark.long
def test_torchrun_stopped_leaves_the_run_interrupted_with_its_records(tmp_path: Path,
                                                                      spawn: Spawn) -> None:
    import signal
    import time

    out = tmp_path / "out"
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1",
           config.WORKERS_VARIABLE: SLOWED}
    job = spawn([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes",
                 "1", "--nproc-per-node", "2", str(SCRIPT), "--out", str(out), "--steps",
                 "100000"], env=env, cwd=tmp_path, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not list(out.glob("train/*/parts/rank0.bin")) or \
            list(out.glob("train/*/parts/rank0.bin"))[0].stat().st_size == 0:
        assert time.monotonic() < deadline and job.poll() is None, "no step recorded"
        time.sleep(0.2)
    job.send_signal(signal.SIGTERM)  # torchrun passes it on to its ranks
    job.wait(timeout=120)
    run = load_run(only_run(out))
    assert run.status == "interrupted" and run.manifest["reason"] == "interrupted by SIGTERM"
    assert run.steps["step"].nunique() >= 1 and set(run.steps["rank"]) == {0, 1}

@pytest.mark.slow
def test_a_rank_that_aborts_after_finish_leaves_the_run_completed(
        tmp_path: Path, spawn: Spawn) -> None:
    """As torch's teardown does once in a few dozen launches: rank 1 aborts the moment its
    session finished. Rank 0 had written the whole run before either left `finish`."""
    out = tmp_path / "out"
    done = torchrun(spawn, out, "--steps", "6", "--partition", "40", "24",
                    "--abort-after-finish")
    assert done.returncode != 0 and TEARDOWN_ABORT.search(done.stderr), done.stderr[-3000:]
    assert_ran(done, out)
    run = load_run(only_run(out))
    assert run.status == "completed" and run.manifest["run"]["steps"] == 6
    assert sorted(run.steps.groupby("rank")["step"].nunique()) == [6, 6]
    params = np.load(only_run(out) / "params.npz")
    for name, value in textbook(6, 64).items():
        np.testing.assert_allclose(params[name], value, rtol=0, atol=1e-6, err_msg=name)


@pytest.mark.slow
@pytest.mark.parametrize("accumulate, chunks, partition", [
    (4, 1, ["proportional"]),  # over loader batches, the slices moving between them
    (2, 2, ["profiled"]),  # and over chunks of each batch too (3 alone: 6.0e-8 off,
    # benchmarks/accumulation_exactness.py; one launch less for CI)
])
def test_gradients_accumulated_under_no_sync_are_the_whole_batchs(
        tmp_path: Path, spawn: Spawn, accumulate: int, chunks: int,
        partition: list[str]) -> None:
    """The loop accumulates as under DDP (`no_sync()` on every backward but each optimizer
    step's last): 20 optimizer steps of 64 samples train the parameters of 20 whole-batch
    steps, on a slowed rank's moving slices too."""
    out = tmp_path / "out"
    done = torchrun(spawn, out, "--steps", "20", "--accumulate", str(accumulate),
                    "--chunks", str(chunks), "--partition", *partition)
    assert_ran(done, out)
    run_dir = only_run(out)
    params = np.load(run_dir / "params.npz")
    for name, value in textbook(20, 64).items():
        np.testing.assert_allclose(params[name], value, rtol=0, atol=1e-6, err_msg=name)
    run = load_run(run_dir)
    steps = run.steps.sort_values(["rank", "step"])
    # a record per loader batch; only an optimizer step's last batch exchanged
    assert run.manifest["run"]["steps"] == 20 * accumulate
    assert sorted(steps.groupby("rank")["step"].nunique()) == [20 * accumulate] * 2
    exchanged = steps["step"] % accumulate == accumulate - 1
    assert (steps.loc[~exchanged, ["pack_ns", "allreduce_ns", "apply_ns"]] == 0).all().all()
    assert (steps.loc[exchanged, "allreduce_ns"] > 0).all()
    assert (steps["forward_ns"] > 0).all() and (steps["backward_ns"] > 0).all()
    sizes = {tuple(h["sizes"]) for h in run.manifest["partition_history"]}
    assert len(sizes) > 1 or partition == ["40", "24"], sizes


@pytest.mark.slow
def test_ranks_that_accumulate_over_different_batches_both_say_so(
        tmp_path: Path, spawn: Spawn) -> None:
    out = tmp_path / "out"
    done = torchrun(spawn, out, "--steps", "4", "--accumulate", "2", "--skew-accumulation",
                    "--partition", "20", "12", workers=None)
    assert done.returncode != 0
    run = load_run(only_run(out))
    assert run.status == "failed"
    assert "the ranks disagree on when to exchange" in run.manifest["reason"], run.manifest
    assert done.stderr.count("the ranks disagree on when to exchange") >= 2, done.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("policy, loader_workers", [("profiled", 0), ("proportional", 0),
                                                    ("proportional", 1)])
def test_slices_sized_in_the_loop_move_to_the_slowed_rank_and_stay_exact(
        tmp_path: Path, spawn: Spawn, policy: str, loader_workers: int) -> None:
    out = tmp_path / "out"
    done = torchrun(spawn, out, "--steps", "20", "--partition", policy,
                    "--loader-workers", str(loader_workers))
    assert_ran(done, out)
    run_dir = only_run(out)
    run = load_run(run_dir)
    history = run.manifest["partition_history"]
    # profiled: equal for 5 steps, then by time per sample, then by the fitted lines;
    # proportional: equal, then by throughput half a window early (after 5 steps), then
    # where a window of 10 says to move
    steps_moved = [h["step"] for h in history]
    if policy == "profiled":
        assert steps_moved == [0, 5, 10]
    elif loader_workers:  # in force after the DataLoader's 1 x 2 batches made ahead
        assert steps_moved[:2] == [0, 7], history
        assert "in force after the 2 batches made ahead" in history[1]["reason"]
    else:
        assert steps_moved[:2] == [0, 5] and all(s % 10 == 0 for s in steps_moved[2:])
    assert history[0]["sizes"] == [32, 32]
    final = history[-1]["sizes"]
    assert sum(final) == 64 and final[1] < final[0]
    steps = run.steps
    last = steps[steps["step"] == 19].sort_values("rank")
    assert last["batch_size"].tolist() == final
    assert last["slice_start"].tolist() == [0, final[0]]
    params = np.load(run_dir / "params.npz")
    for name, value in textbook(20, 64).items():
        np.testing.assert_allclose(params[name], value, rtol=0, atol=1e-6, err_msg=name)


@pytest.mark.slow
def test_a_rank_left_out_stays_in_step_and_adds_nothing(tmp_path: Path, spawn: Spawn) -> None:
    """Slices of 64 and 0: the rank left out runs the loop's body on a shadow slice
    weighted 0 (its optimizer and scheduler keep it in step); the parameters are the
    textbook's, its rows say it computed no slice."""
    out = tmp_path / "out"
    done = torchrun(spawn, out, "--steps", "12", "--partition", "64", "0")
    assert_ran(done, out)
    run = load_run(only_run(out))
    steps = run.steps.sort_values(["rank", "step"])
    assert steps.groupby("rank")["batch_size"].unique().map(list).tolist() == [[64], [0]]
    assert steps[steps["rank"] == 1]["local_loss"].isna().all()
    params = np.load(only_run(out) / "params.npz")
    for name, value in textbook(12, 64).items():
        np.testing.assert_allclose(params[name], value, rtol=0, atol=1e-6, err_msg=name)
    report = spawn.run([sys.executable, "-m", "hetbench.harness.cli.main", "report",
                        str(out / "train"), "--no-figures"], capture_output=True, text=True,
                       timeout=180)
    assert report.returncode == 0, report.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.long
def test_the_model_policy_leaves_out_a_rank_that_only_slows_the_others(
        tmp_path: Path, spawn: Spawn) -> None:
    out = tmp_path / "out"
    done = torchrun(spawn, out, "--steps", "30", "--partition", "model-leave-out",
                    workers=json.dumps([{}, {"slowdown": 40.0}]))
    assert_ran(done, out)
    run = load_run(only_run(out))
    history = run.manifest["partition_history"]
    assert history[-1]["sizes"] == [64, 0], history
    last = run.steps[run.steps["step"] == 29].sort_values("rank")
    assert last["batch_size"].tolist() == [64, 0]
    params = np.load(only_run(out) / "params.npz")
    for name, value in textbook(30, 64).items():
        np.testing.assert_allclose(params[name], value, rtol=0, atol=1e-6, err_msg=name)

def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.slow
def test_a_rank_alone_is_told_where_it_waited_for_the_others(tmp_path: Path,
                                                             spawn: Spawn) -> None:
    port = free_port()
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    done = spawn.run([sys.executable, "-c", "import hetbench\n"
                      "hetbench.join(global_batch=8, loss_reduction='mean', timeout_s=2)"],
                     capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    assert done.returncode != 0
    assert (f"hetbench.join: rank 0 of 2 did not meet the others at 127.0.0.1:{port} "
            "within 2 s (timeout_s)") in done.stderr


# -- bad input: refused before anything runs, the call and the argument named --------------

ALONE = config.Place(0, 2, 0)


def parsed(**overrides: Any) -> config.LoopConfig:
    arguments: dict[str, Any] = {
        "global_batch": 64, "loss_reduction": "mean", "partition": "equal", "suite": None,
        "run": None, "out": "results", "seed": 0, "warmup_steps": 2, "timeout_s": 120.0,
        "counters_every": 8}
    return config.parse(ALONE, **{**arguments, **overrides})


@pytest.mark.parametrize(("overrides", "message"), [
    ({"loss_reduction": None}, "hetbench.join(loss_reduction): not declared: say how your "
                               "loss reduces over a batch, 'mean'"),
    ({"loss_reduction": "none"}, "hetbench.join(loss_reduction): 'none': say how"),
    ({"partition": [40, 20]}, "hetbench.join(partition).sizes: sum 60 must equal "
                              "global_batch 64"),
    ({"partition": [64]}, "hetbench.join(partition).sizes: must be a list of 2"),
    ({"partition": "fastest"}, "hetbench.join(partition): unknown policy 'fastest': "
                               "allowed: equal"),
    ({"partition": 3}, "hetbench.join(partition): a int: give a policy's name"),
    ({"partition": {"policy": "profiled", "profile_steps": 1}},
     "hetbench.join(partition).profile_steps: 1: at least 2 in a user's own loop"),
    ({"global_batch": 1}, "hetbench.join(global_batch): 1 is below the minimum 2"),
    ({"global_batch": "64"}, "hetbench.join(global_batch)"),
    ({"suite": "my suite"}, "hetbench.join(suite)"),
    ({"timeout_s": 0}, "hetbench.join(timeout_s)"),
])
def test_bad_arguments_are_refused_naming_the_argument(overrides: dict[str, Any],
                                                       message: str) -> None:
    with pytest.raises(UsageError) as refused:
        parsed(**overrides)
    assert message in str(refused.value)


@pytest.mark.parametrize(("environ", "message"), [
    ({"RANK": "x", "WORLD_SIZE": "2"}, "hetbench.join: RANK: 'x' is not a whole number"),
    ({"RANK": "2", "WORLD_SIZE": "2"}, "hetbench.join: RANK: 2 is not a rank of WORLD_SIZE=2"),
])
def test_a_bad_place_in_the_job_is_refused(environ: dict[str, str], message: str) -> None:
    with pytest.raises(UsageError) as refused:
        config.place(environ)
    assert message in str(refused.value)


@pytest.mark.parametrize(("workers", "message"), [
    ("[{", "HETBENCH_WORKERS: not JSON"),
    ('[{"device": "cpu"}]', "HETBENCH_WORKERS: 1 workers for WORLD_SIZE=2"),
    ('[{"device": "cpu"}, {"slowdown": 0.5}]', "HETBENCH_WORKERS[1].slowdown"),
    ('[{"device": "cpu"}, {"framework": "mxnet"}]', "HETBENCH_WORKERS[1].framework"),
])
def test_bad_launched_workers_are_refused(workers: str, message: str) -> None:
    with pytest.raises(UsageError) as refused:
        config.launched_workers(ALONE, {config.WORKERS_VARIABLE: workers})
    assert message in str(refused.value)


# -- a job of one rank, in this process: the session's own refusals ------------------------


@pytest.fixture
def alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A session of a job of one rank (no torchrun), closed and its group ended after."""
    import torch.distributed as dist

    import hetbench

    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
                 config.WORKERS_VARIABLE):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(sys, "argv", [str(SCRIPT)])
    session = hetbench.join(global_batch=8, loss_reduction="mean", out=tmp_path / "out")
    try:
        yield session
    finally:
        session.close("failed", "the test ended")
        if dist.is_initialized():  # finish() ended the group it began
            dist.destroy_process_group()


def model_and_data(samples: int = 32) -> tuple[Any, Any, Any]:
    train = _script_module()
    model = train.make_model()
    return model, torch.optim.SGD(model.parameters(), lr=0.1), \
        torch.utils.data.Subset(train.make_data(), range(samples))


def test_a_job_of_one_rank_leaves_a_completed_run(alone: Any) -> None:
    model, optimizer, data = model_and_data()
    model, optimizer, loader = alone.prepare(model, optimizer, data)
    assert len(loader) == 4
    loss_fn = torch.nn.CrossEntropyLoss()
    for epoch in range(2):
        for step, (inputs, targets) in enumerate(loader):
            assert len(inputs) == 8
            alone.backward(loss_fn(model(inputs), targets))
            optimizer.step()
            optimizer.zero_grad()
            if epoch == 1 and step == 1:
                break  # a pass left early: its steps so far are recorded
    run_dir = alone.finish()
    assert (alone.rank, alone.world_size, alone.is_main) == (0, 1, True)
    assert alone.device == torch.device("cpu")
    run = load_run(run_dir)
    assert run.status == "completed" and run.manifest["run"]["steps"] == 6
    assert run.steps["step"].tolist() == list(range(6))
    assert run.steps["batch_size"].tolist() == [8] * 6


class Stream(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
    def __iter__(self) -> Any:
        return iter(range(100))


def test_data_that_cannot_be_sliced_is_refused(alone: Any) -> None:
    model, optimizer, data = model_and_data()
    with pytest.raises(UsageError, match=r"Session.prepare\(data\): Stream is an "
                                         "IterableDataset: its samples have no index"):
        alone.prepare(model, optimizer, Stream())
    with pytest.raises(UsageError, match=r"Session.prepare\(data\): 4 samples, fewer than "
                                         r"one global batch \(8"):
        alone.prepare(model, optimizer, torch.utils.data.Subset(data, range(4)))


def test_a_model_already_wrapped_in_ddp_is_refused(alone: Any) -> None:
    model, optimizer, data = model_and_data()
    wrapped = torch.nn.parallel.DistributedDataParallel(model)
    with pytest.raises(UsageError, match=r"Session.prepare\(model\): a "
                                         "DistributedDataParallel: give the module itself"):
        alone.prepare(wrapped, optimizer, data)


def test_a_loop_that_skips_the_exchange_or_misuses_backward_is_stopped(alone: Any) -> None:
    model, optimizer, data = model_and_data()
    model, optimizer, loader = alone.prepare(model, optimizer, data)
    loss_fn = torch.nn.CrossEntropyLoss()
    with pytest.raises(UsageError, match=r"Session.prepare: called twice"):
        alone.prepare(model, optimizer, data)
    inputs, targets = next(iter(loader))
    with pytest.raises(UsageError, match=r"Session.backward: outside a step"):
        alone.backward(loss_fn(model(inputs), targets))
    batches = iter(loader)
    inputs, targets = next(batches)
    with pytest.raises(UsageError, match=r"Session.backward\(loss\): \(8, 4\): a scalar is "
                                         "needed"):
        alone.backward(model(inputs))
    loss_fn(model(inputs), targets).backward()  # the textbook call, not the session's
    with pytest.raises(UsageError, match=r"SGD.step\(\): before the exchange of step 0: "
                                         r"call session.backward\(loss\)"):
        optimizer.step()
    inputs, targets = next(batches)
    alone.backward(loss_fn(model(inputs), targets))
    with pytest.raises(UsageError, match=r"Session.backward: called again after step 1's "
                                         r"exchange: to accumulate gradients, run the "
                                         r"backwards before the last inside `with "
                                         r"session.no_sync\(\):`"):
        alone.backward(loss_fn(model(inputs), targets))
    optimizer.step()
    inputs, targets = next(batches)
    with alone.no_sync():
        alone.backward(loss_fn(model(inputs), targets))
    with pytest.raises(UsageError, match=r"SGD.step\(\): before the exchange of step 2 \(its "
                                         r"backwards ran inside session.no_sync\(\)"):
        optimizer.step()


# -- hetbench launch: the script as a suite's runs -------------------------------------------

CONFIG = """
[suite]
name = "study"

[defaults]
global_batch = 64
workers = [{}, { slowdown = 3.0 }]

[[runs]]
name = "equal"

[[runs]]
name = "profiled"
partition = { policy = "profiled", profile_steps = 3 }
"""


def hetbench(spawn: Spawn, *words: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return spawn.run([sys.executable, "-m", "hetbench.harness.cli.main", *words],
                     capture_output=True, text=True, timeout=240, cwd=cwd,
                     env={k: v for k, v in os.environ.items()
                          if k not in ("RANK", "WORLD_SIZE", config.WORKERS_VARIABLE)})


@pytest.mark.slow
def test_launch_runs_the_script_as_each_run_of_the_config_says(tmp_path: Path,
                                                               spawn: Spawn) -> None:
    (tmp_path / "study.toml").write_text(CONFIG)
    done = hetbench(spawn, "launch", "study.toml", "--out", "out", "--no-figures", "--",
                    "python", str(SCRIPT), "--steps", "12", cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "script train.py --steps 12, batch 64, profiled" in done.stdout
    expected = textbook(12, 64)
    for name in ("equal", "profiled"):
        (run_dir,) = list((tmp_path / "out" / "study").glob(f"{name}-r0-*"))
        run = load_run(run_dir)
        assert run.status == "completed", run.manifest["reason"]
        assert run.manifest["run"]["script"] == str(SCRIPT)
        assert run.manifest["run"]["args"] == ["--steps", "12"]
        assert run.manifest["run"]["steps"] == 12
        assert [w["slowdown"] for w in run.manifest["workers"]] == [1.0, 3.0]
        # the ranks ran in the run's own network namespace and TMPDIR, as hetbench's own
        assert run.manifest["network"].startswith("private")
        assert {"rank0.log", "rank1.log"} <= {p.name for p in (run_dir / "logs").iterdir()}
        params = np.load(run_dir / "params.npz")
        for key, value in expected.items():
            np.testing.assert_allclose(params[key], value, rtol=0, atol=1e-6, err_msg=key)
    history = run.manifest["partition_history"]
    assert [h["step"] for h in history] == [0, 3, 6] and history[-1]["sizes"][1] < 32


@pytest.mark.slow
@pytest.mark.long
def test_a_script_that_fails_leaves_its_run_failed_with_its_records(tmp_path: Path,
                                                                    spawn: Spawn) -> None:
    (tmp_path / "study.toml").write_text(CONFIG)
    done = hetbench(spawn, "launch", "study.toml", "-k", "equal", "--out", "out",
                    "--no-figures", "--", str(SCRIPT), "--steps", "12", "--fail-at", "5",
                    cwd=tmp_path)
    assert done.returncode == 1
    (run_dir,) = list((tmp_path / "out" / "study").glob("equal-r0-*"))
    run = load_run(run_dir)
    assert run.status == "failed"
    assert "RuntimeError: the script failed at step 5" in run.manifest["reason"]
    assert sorted(run.steps["step"].unique()) == list(range(5))  # every step it took


UNRULY = REPO / "tests" / "fixtures" / "own_loop" / "unruly.py"
PAIR = """
[suite]
name = "unruly"

[defaults]
global_batch = 64
workers = [{}, {}]

[[runs]]
name = "pair"
"""


def unruly_run(tmp_path: Path, spawn: Spawn, *args: str) -> Any:
    (tmp_path / "pair.toml").write_text(PAIR)
    done = hetbench(spawn, "launch", "pair.toml", "--out", "out", "--no-figures", "--",
                    str(UNRULY), *args, cwd=tmp_path)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    (run_dir,) = list((tmp_path / "out" / "unruly").glob("pair-r0-*"))
    return load_run(run_dir)


@pytest.mark.slow
def test_a_rank_raising_outside_with_session_is_the_runs_reason(tmp_path: Path,
                                                               spawn: Spawn) -> None:
    run = unruly_run(tmp_path, spawn, "--fail-rank", "1", "--fail-at", "5")
    assert run.status == "failed"
    # it said "the script ended without Session.finish()"
    assert "worker 1: RuntimeError: rank 1 failed at step 5" in run.manifest["reason"]
    # it said 0 steps beside 5 recorded
    assert run.manifest["run"]["steps"] == run.steps["step"].nunique() == 5


@pytest.mark.slow
@pytest.mark.timeout(100)  # they used to wait on each other for gloo's 120 s
@pytest.mark.parametrize("more", ["0", "1"])
def test_ranks_that_disagree_on_the_steps_are_named_at_once(tmp_path: Path, spawn: Spawn,
                                                            more: str) -> None:
    run = unruly_run(tmp_path, spawn, "--more-steps-rank", more)
    assert run.status == "failed"
    reason = run.manifest["reason"]
    assert "the ranks disagree on the step count" in reason, reason
    assert "Session.finish() after 12 steps" in reason and "took step 12" in reason, reason
    assert run.manifest["run"]["steps"] == 12


@pytest.mark.parametrize(("table", "message"), [
    ('script = "missing.py"', "runs[0].script: "),
    ('script = "train.py"\nworkload = "mlp"', "runs[0].workload: not for a script's run: "
                                               "the script builds its model"),
    ('script = "train.py"\nsteps = 20', "runs[0].steps: not for a script's run"),
    ('script = "train.py"\naggregator = "ps-sync"', "runs[0].aggregator: 'ps-sync': a "
                                                      "user's own loop exchanges"),
    ('script = "train.py"\nargs = "--steps 3"', "runs[0].args: must be a list of strings"),
    ('args = ["--steps"]', "runs[0].args: only with `script`"),
    ('script = "train.py"\nworkers = [{}, { framework = "mxnet" }]',
     "runs[0].workers[1].framework: a script's run is PyTorch's"),
])
def test_a_bad_script_run_is_refused_by_the_suite_check(tmp_path: Path, table: str,
                                                        message: str) -> None:
    (tmp_path / "train.py").write_text("")
    suite = tmp_path / "suite.toml"
    workers = "" if "workers" in table else "workers = [{}, {}]\n"
    suite.write_text(f'[suite]\nname = "s"\n[[runs]]\nname = "r"\nglobal_batch = 64\n'
                     f'{workers}{table}\n')
    with pytest.raises(UsageError) as refused:
        load_suite(str(suite))
    assert message in str(refused.value)


@pytest.mark.parametrize(("words", "message"), [
    ([], "hetbench: error: command: missing: hetbench launch CONFIG -- [python] SCRIPT"),
    (["--", "python"], "hetbench: error: command: missing"),
    (["--", "nowhere.py"], "hetbench: error: command: nowhere.py: no such file"),
    (["--", "-m", "pkg.train"], "hetbench: error: command: '-m': give the script's path"),
])
def test_launch_without_a_script_says_so(tmp_path: Path, spawn: Spawn, words: list[str],
                                         message: str) -> None:
    (tmp_path / "study.toml").write_text(CONFIG)
    done = hetbench(spawn, "launch", "study.toml", *words, cwd=tmp_path)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert not (tmp_path / "results").exists()


def test_launch_refuses_a_config_that_names_its_own_script(tmp_path: Path,
                                                           spawn: Spawn) -> None:
    (tmp_path / "study.toml").write_text(CONFIG.replace('name = "equal"',
                                                        'name = "equal"\nscript = "x.py"'))
    done = hetbench(spawn, "launch", "study.toml", "--", str(SCRIPT), cwd=tmp_path)
    assert done.returncode == 2
    assert "hetbench: error: runs[0].script: the command after `--` of hetbench launch " \
           "gives the script" in done.stderr


# -- the how-to's example: a DDP script converted ------------------------------------------

EXAMPLE = REPO / "examples" / "own_loop"


def changed_lines() -> list[str]:
    """The converted script's diff against the DDP one, code only: '+' and '-' lines."""
    import difflib

    def code(name: str) -> list[str]:
        lines = (EXAMPLE / name).read_text().splitlines()
        return lines[lines.index("import argparse"):]

    return [line for line in difflib.unified_diff(code("ddp_train.py"), code("train.py"),
                                                  lineterm="", n=0)
            if line[:1] in "+-" and line[:3] not in ("+++", "---")]


def test_the_howto_shows_the_whole_change_and_it_is_under_ten_lines() -> None:
    changed = changed_lines()
    written = [line for line in changed if line.startswith("+")]
    assert len(written) <= 10, written
    howto = (REPO / "docs" / "howto" / "own-loop.md").read_text()
    block = howto.split("```diff\n")[1].split("```")[0]
    assert [line for line in block.splitlines() if line[:1] in "+-"] == changed
    assert (f"{len(written)} lines written and "
            f"{len(changed) - len(written)} removed") in howto


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.parametrize("script", ["ddp_train.py", "train.py"])
def test_the_example_scripts_train_under_torchrun(tmp_path: Path, spawn: Spawn,
                                                  script: str) -> None:
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    env.pop(config.WORKERS_VARIABLE, None)
    done = spawn.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                      "--nnodes", "1", "--nproc-per-node", "2", str(EXAMPLE / script),
                      "--steps", "6"], capture_output=True, text=True, timeout=240, env=env,
                     cwd=tmp_path)
    assert_ran(done, tmp_path / "results")
    recorded = list((tmp_path / "results" / "train").glob("equal-r0-*"))
    assert len(recorded) == (script == "train.py")
    if recorded:
        assert load_run(recorded[0]).steps["step"].nunique() == 6
