"""Virtual workers (HetPipe, issue 14): models cut into layers, suites checked, and stages
trained over torch.distributed.pipelining end with the all-reduce path's parameters.

The reference is the plain data-parallel run (aggregator 'torch', one worker per virtual
worker, the same global batch and slices): with wave bound 0 every wave's gradient sums are
all-reduced before the update, so any schedule, micro-batch count and split gives the same
mathematics up to float32 summation order (atol 2e-5, as tests/test_exactness.py).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from hetbench.analysis.view.metrics import run_summary
from hetbench.harness.loop.stage import alike_times
from hetbench.harness.records.results import load_run
from hetbench.harness.spec.errors import UsageError
from hetbench.harness.spec.suite import parse_run
from hetbench.workloads import build_spec, get_workload
from hetbench.workloads.data import load_dataset
from hetbench.workloads.models import builder
from hetbench.workloads.torch_layers import parameter_range
from tests.conftest import completed_runs, hetbench_command
from tests.trace_check import check_trace

PIPED = [("mlp", "digits"), ("cnn", "digits"), ("resnet", "scenes"), ("vgg", "scenes")]


@pytest.mark.parametrize("workload,dataset", PIPED)
@pytest.mark.parametrize("size", ["tiny", "small"])
def test_layers_compose_to_the_model_and_hold_its_parameters_in_order(workload, dataset, size):
    data = load_dataset(dataset, workload, 0)
    spec = build_spec(workload, data.sample_shape, data.num_classes, size)
    module = builder(workload, "pytorch")
    model = module.build(spec)
    layers = module.layers(model)
    assert len(layers) == get_workload(workload).layers(size)
    x = torch.from_numpy(data.inputs[:3])
    out = x
    for layer in layers:
        out = layer(out)
    assert torch.equal(out, model(x))
    # every layer's parameters are one run of the spec's flat order, the runs in order
    ranges = [parameter_range(spec, model, [layer], {}) for layer in layers]
    assert ranges[0][0] == 0 and ranges[-1][1] == spec.num_elements
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))


BASE = {"name": "p", "workload": "vgg", "size": "small", "global_batch": 32,
        "workers": [{}] * 4, "virtual_workers": [[0, 1], [2, 3]]}


@pytest.mark.parametrize("change,field,words", [
    ({"virtual_workers": [[0, 1], [1, 3]]}, "runs[0].virtual_workers", "exactly once"),
    ({"virtual_workers": [[0, 1, 2, 3, 9]]}, "runs[0].virtual_workers", "not allowed"),
    ({"virtual_workers": [0, 1]}, "runs[0].virtual_workers", "lists of worker ranks"),
    ({"pipeline": {"split": [2, 3]}}, "runs[0].pipeline.split", "covers 5 layers"),
    ({"pipeline": {"split": [6]}}, "runs[0].pipeline.split", "one per stage"),
    ({"pipeline": {"split": "even"}}, "runs[0].pipeline.split", "allowed: profiled"),
    ({"pipeline": {"micro_batches": 0}}, "runs[0].pipeline.micro_batches", "minimum 1"),
    ({"pipeline": {"micro_batches": 3}}, "runs[0].pipeline.micro_batches", "does not divide"),
    ({"pipeline": {"schedule": "zb"}}, "runs[0].pipeline.schedule", "1f1b, gpipe"),
    ({"pipeline": {"stages": 2}}, "runs[0].pipeline.stages", "unknown key"),
    ({"virtual_workers": [[0, 1, 2, 3]], "workload": "mlp", "dataset": "digits"},
     "runs[0].virtual_workers", "4 stages exceed the 3 layers"),
    ({"workload": "lstm", "dataset": "text"}, "runs[0].workload", "no layer sequence"),
    ({"framework": "tensorflow"}, "runs[0].framework", "PyTorch stages"),
    ({"aggregator": "ps-sync"}, "runs[0].aggregator", "leave aggregator unset"),
    ({"virtual_workers": None, "aggregator": "wsp"}, "runs[0].aggregator",
     "pipeline.wave_bound > 0"),
    ({"virtual_workers": [[0, 1, 2], [3]], "pipeline": {"wave_bound": 1}},
     "runs[0].pipeline.wave_bound", "virtual workers of equal size"),
    ({"partition": {"policy": "proportional"}}, "runs[0].partition.policy", "does not run"),
    ({"virtual_workers": None, "pipeline": {}}, "runs[0].pipeline", "needs virtual_workers"),
    # a built-in workload's stages read in line (a job's through torch's DataLoader)
    ({"loader": {"workers": 1}}, "runs[0].loader", "read the batch in line"),
    ({"calibrate": True}, "runs[0].calibrate", "micro-batches'"),
])
def test_a_bad_pipeline_is_refused_naming_the_field(change, field, words):
    with pytest.raises(UsageError) as caught:
        parse_run({**BASE, **change}, "runs[0]")
    assert caught.value.where == field and words in caught.value.message


def test_a_bad_pipeline_exits_2_with_one_line_before_anything_runs(write_suite, tmp_path,
                                                                   spawn):
    suite = write_suite('[suite]\nname = "bad"\n[[runs]]\nname = "p"\nworkload = "vgg"\n'
                        'global_batch = 32\nworkers = [{}, {}, {}, {}]\n'
                        'virtual_workers = [[0, 1], [2, 3]]\n'
                        'pipeline = { split = [1, 2] }\n')
    done = spawn.run(hetbench_command("run", str(suite), "--out", str(tmp_path / "out")),
                     capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "runs[0].pipeline.split" in done.stderr
    assert not (tmp_path / "out").exists()


def test_alike_workers_share_one_profile_and_unlike_ones_keep_their_own():
    run = parse_run({**BASE, "workers": [{}, {"slowdown": 2.0}, {}, {"slowdown": 2.0}]},
                    "runs[0]")
    times = [[1.0, 3.0], [10.0, 30.0], [3.0, 5.0], [20.0, 50.0]]
    assert alike_times(run, times) == [[2.0, 4.0], [15.0, 40.0], [2.0, 4.0], [15.0, 40.0]]


STEPS = 6
SUITE = f"""
[suite]
name = "pipe"

[defaults]
workload = "mlp"
dataset = "digits"
steps = {STEPS}
global_batch = 32
lr = 0.1
seed = 5
optimizer = {{ name = "momentum", momentum = 0.9 }}

[[runs]]
name = "dp"
workers = [ {{}}, {{}} ]

[[runs]]
name = "gpipe-1"
workers = [ {{}}, {{}}, {{}}, {{}} ]
virtual_workers = [[0, 1], [2, 3]]
pipeline = {{ schedule = "gpipe", micro_batches = 1, split = [2, 1] }}

[[runs]]
name = "1f1b-4"
workers = [ {{}}, {{ slowdown = 2.0 }}, {{}}, {{ slowdown = 2.0 }} ]
# stages out of rank order (torch.distributed.pipelining finds peers by the group's rank)
virtual_workers = [[1, 0], [3, 2]]
pipeline = {{ schedule = "1f1b", micro_batches = 4 }}

[[runs]]
name = "wsp-one"
eval_every = 3
workers = [ {{}}, {{}} ]
virtual_workers = [[1, 0]]
pipeline = {{ micro_batches = 2, split = [2, 1], wave_bound = 1 }}

[[runs]]
name = "wsp-bound"
workers = [ {{}}, {{ slowdown = 4.0 }}, {{}}, {{}} ]
virtual_workers = [[0, 1], [2, 3]]
pipeline = {{ micro_batches = 2, split = [2, 1], wave_bound = 1 }}

[[runs]]
name = "uneven"
partition = {{ policy = "sizes", sizes = [8, 24] }}
workers = [ {{}}, {{}}, {{}} ]
virtual_workers = [[0], [1, 2]]
pipeline = {{ schedule = "gpipe", micro_batches = 2, split = "profiled" }}
"""


@pytest.fixture(scope="module")
def pipeline_runs(tmp_path_factory) -> dict[str, Path]:
    """The suite above, run once for the tests below."""
    return completed_runs(tmp_path_factory.mktemp("pipeline"), SUITE)


@pytest.mark.slow
def test_wave_synchronous_pipelines_end_with_the_all_reduce_parameters(pipeline_runs):
    folders = pipeline_runs
    reference = np.load(folders["dp"] / "params.npz")
    # one virtual worker pushing to its servers (wsp) is SGD on the global batch too
    for name in ("gpipe-1", "1f1b-4", "uneven", "wsp-one"):
        check_trace(folders[name] / "trace.json", load_run(folders[name]).steps)
        params = np.load(folders[name] / "params.npz")
        assert sorted(params.files) == sorted(reference.files)
        for key in reference.files:
            assert not np.array_equal(reference[key], build_initial(key)), key
            np.testing.assert_allclose(params[key], reference[key], atol=2e-5, err_msg=name)

    meta = json.loads((folders["1f1b-4"] / "manifest.json").read_text())
    pipeline = meta["pipeline"]
    assert pipeline["schedule"] == "1f1b" and pipeline["micro_batches"] == 4
    assert pipeline["local_staleness"] == 3
    assert pipeline["sync"] == "stage" and pipeline["bounds"][0] == pipeline["bounds"][1]
    assert len(pipeline["predicted_stage_ns"][0]) == 2
    micro = pd.read_parquet(folders["1f1b-4"] / "microbatches.parquet")
    # every stage: a forward and a backward of each micro-batch of every wave
    counts = micro.groupby(["rank", "backward"]).size()
    assert (counts == STEPS * 4).all() and len(counts) == 8
    assert (micro["end_ns"] > micro["begin_ns"]).all()
    slowed = micro[micro["rank"] == 1]
    assert (slowed["stretch_ns"] > 0).all() and (micro[micro["rank"] == 0]["stretch_ns"] == 0).all()

    steps = pd.read_parquet(folders["uneven"] / "steps.parquet")
    assert steps.groupby("rank")["stage"].first().tolist() == [0, 0, 1]
    assert steps.groupby("rank")["virtual_worker"].first().tolist() == [0, 1, 1]
    summary = run_summary(steps)
    per_step = steps[steps["stage"] == 0].groupby("step")["batch_size"].sum()
    assert (per_step == 32).all() and summary["steps"] == STEPS
    uneven = json.loads((folders["uneven"] / "manifest.json").read_text())["pipeline"]
    assert uneven["sync"] == "world" and uneven["bounds"][0] == [0, 3]


@pytest.mark.slow
def test_wave_bound_holds_virtual_workers_within_d_waves(pipeline_runs):
    """wsp-bound: a virtual worker's wave w is answered only after every other one pushed
    wave w - D (D = 1): the exchange of each stage ends after its peer stage's push."""
    steps = pd.read_parquet(pipeline_runs["wsp-bound"] / "steps.parquet")
    assert steps["asynchronous"].all()
    assert steps["wait_ns"].sum() > 0
    # pushes the servers applied (a push after the budget is spent is dropped and answered
    # at once; the push that spends it is answered at once too: no wave is left to wait for)
    applied = steps[~steps["dropped"]].set_index(["rank", "step"])["ready_ns"]
    checked = 0
    for row in steps[~steps["dropped"]].itertuples():
        peer = {0: 2, 2: 0, 1: 3, 3: 1}[row.rank]
        if (peer, row.step - 1) in applied.index:
            assert row.reduced_ns >= applied[(peer, row.step - 1)]
            checked += 1
    assert checked >= 4 * (STEPS - 3)
    # the budget: every wave's slice applied makes `steps` global batches, no more
    applied = steps[~steps["dropped"] & (steps["stage"] == 0)]["batch_size"].sum()
    assert applied == STEPS * 32
    meta = json.loads((pipeline_runs["wsp-bound"] / "manifest.json").read_text())
    assert meta["run"]["aggregator"] == {**meta["run"]["aggregator"], "name": "wsp",
                                         "staleness": 1, "servers": 2}
    evals = pd.read_parquet(pipeline_runs["wsp-one"] / "eval.parquet")
    assert evals["step"].tolist() == [0, 3, 6] and evals["accuracy"].between(0, 1).all()


def build_initial(key: str) -> np.ndarray:
    data = load_dataset("digits", "mlp", 5)
    return build_spec("mlp", data.sample_shape, data.num_classes).initial_parameters(5)[key]


DYING = """
[suite]
name = "dying"

[[runs]]
name = "long"
workload = "mlp"
dataset = "digits"
steps = 100000
global_batch = 32
timeout_s = 20
workers = [ {}, {}, {}, {} ]
virtual_workers = [[0, 1], [2, 3]]
pipeline = { micro_batches = 2, split = [2, 1], wave_bound = 1 }
"""


@pytest.mark.slow
@pytest.mark.long
def test_a_dead_stage_ends_the_run_keeping_its_records_and_stops_every_process(
        tmp_path, write_suite, spawn):
    """wsp (servers started by the launcher): stage 1 of virtual worker 0 is killed."""
    import os
    import signal
    import time

    from hetbench.harness.records import collector
    from tests.conftest import REPO
    from tests.test_faults import alive

    proc = spawn(hetbench_command("run", str(write_suite(DYING)), "--out",
                                  str(tmp_path / "out"), "--no-progress"),
                 cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    run_dir = None
    while time.monotonic() < deadline:
        runs = list((tmp_path / "out" / "dying").glob("long-*"))
        if runs and collector.steps_done(runs[0], 4) >= 20:
            run_dir = runs[0]
            break
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    assert run_dir is not None, "the run did not reach 20 waves in 120 s"
    parts = run_dir / "parts"
    pids = [json.loads((parts / f"rank{r}.json").read_text())["pid"] for r in range(4)]
    pids += [json.loads((parts / f"ps{s}.json").read_text())["pid"] for s in range(2)]
    os.kill(pids[1], signal.SIGKILL)
    started = time.monotonic()
    _, err = proc.communicate(timeout=90)
    assert time.monotonic() - started < 60  # the grace period and the timeout, not more
    assert proc.returncode == 1, err

    assert not any(alive(p) for p in pids)
    run = load_run(run_dir)
    assert run.status == "failed" and run.manifest["reason"] == "worker 1 killed by SIGKILL"
    assert set(run.steps["rank"]) == {0, 1, 2, 3} and run.steps["step"].nunique() >= 20
    assert (run_dir / "microbatches.parquet").is_file()
    assert set(run.micro["rank"]) == {0, 1, 2, 3} and run.micro["wave"].max() >= 19
