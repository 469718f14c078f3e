"""A workload named by import path (issue 56): a user's own PyTorch job, its suite keys, its
bad inputs refused before anything runs, and its training exact on uneven slices against
the textbook full-batch loop written here (not hetbench's)."""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
import re
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from hetbench.harness.spec.errors import UsageError
from hetbench.harness.spec.suite import load_suite, parse_run
from hetbench.harness.spec.tables import run_table
from hetbench.workloads.job import JobError, parse_reference
from tests.conftest import completed_runs

TIMEOUT_S = 240

# The user's project: a package of its own named like one of hetbench's rooms, to show that
# nothing collides, and a module of factories, good and bad.
MODELS = '''
import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

import hetbench

SAMPLES, FEATURES, CLASSES = 480, 12, 4


def data(seed=3):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(SAMPLES, FEATURES, generator=g)
    return x, (x[:, :CLASSES] * 2 + 0.3 * torch.randn(SAMPLES, CLASSES, generator=g)).argmax(1)


class Tied(nn.Module):
    """A forward that is no Sequential, LayerNorm, and a weight used twice."""

    def __init__(self, batchnorm=False, dropout=0.0):
        super().__init__()
        self.embed = nn.Linear(FEATURES, 16)
        self.norm = nn.BatchNorm1d(16) if batchnorm else nn.LayerNorm(16)
        self.mix = nn.Linear(16, 16)
        self.drop = nn.Dropout(dropout)
        self.out = nn.Linear(16, CLASSES)

    def forward(self, x):
        h = torch.tanh(self.norm(self.embed(x)))
        h = self.drop(h + torch.tanh(self.mix(h)) + torch.tanh(self.mix(h) * 0.5))
        return self.out(h)


def accuracy(outputs, targets):
    return float((outputs.argmax(-1) == targets).sum()), float(targets.numel())


def job(model, reduction="mean", **more):
    x, y = data()
    loss = nn.CrossEntropyLoss(reduction=reduction)
    return hetbench.Job(model=model, loss=loss, reduction=reduction,
                        train=TensorDataset(x[:416], y[:416]),
                        heldout=TensorDataset(x[416:], y[416:]), metric=accuracy, **more)


def make():
    return job(Tied())


def make_sum():
    return job(Tied(), reduction="sum")


def make_batchnorm():
    return job(Tied(batchnorm=True))


def make_dropout():
    return job(Tied(dropout=0.3))


def make_adamw():
    return job(Tied(), optimizer=lambda params: torch.optim.AdamW(params, lr=0.01,
                                                                  weight_decay=0.05))


class Cut(nn.Module):
    """One layer of a model cut for pipelines: the model's own submodules, a function."""

    def __init__(self, forward, **modules):
        super().__init__()
        self.compute = forward
        for name, module in modules.items():
            self.add_module(name, module)

    def forward(self, x):
        return self.compute(self, x)


def tied_layers(model):
    return [Cut(lambda m, x: torch.tanh(m.norm(m.embed(x))), embed=model.embed,
                norm=model.norm),
            Cut(lambda m, x: m.drop(x + torch.tanh(m.mix(x)) + torch.tanh(m.mix(x) * 0.5)),
                mix=model.mix, drop=model.drop),
            Cut(lambda m, x: m.out(x), out=model.out)]


def make_layered():
    return job(Tied(), layers=tied_layers)


def mixed(m, x):
    h = torch.tanh(m.norm(x))
    return m.drop(h + torch.tanh(m.mix(h)) + torch.tanh(m.mix(h) * 0.5))


def late_norm_layers(model):
    """Cut after the embedding: the normalisation in the second layer (a pipeline's second
    stage holds BatchNorm)."""
    return [Cut(lambda m, x: m.embed(x), embed=model.embed),
            Cut(mixed, norm=model.norm, mix=model.mix, drop=model.drop),
            Cut(lambda m, x: m.out(x), out=model.out)]


def make_layered_batchnorm():
    return job(Tied(batchnorm=True), layers=late_norm_layers)


def make_norm_last():
    """Two layers, the BatchNorm in the last: its running statistics would stay on a
    server computing it (fc-on-server)."""
    return job(Tied(batchnorm=True), layers=lambda model: [
        Cut(lambda m, x: m.embed(x), embed=model.embed),
        Cut(lambda m, x: m.out(mixed(m, x)), norm=model.norm, mix=model.mix, drop=model.drop,
            out=model.out)])


def make_bare_last():
    """The layers end in one that trains nothing (a function of its input)."""
    return job(Tied(), layers=lambda model: [*tied_layers(model), Cut(lambda m, x: x * 1.0)])


def make_keyed_labels():
    """Labels handed on in a mapping, the loss reading them from it."""
    made = job(Tied(), layers=tied_layers)
    ce = nn.CrossEntropyLoss()
    return hetbench.Job(model=made.model, loss=lambda out, t: ce(out, t["y"]),
                        reduction="mean", train=made.train, layers=tied_layers,
                        split=lambda batch: (batch[0], {"y": batch[1]}))


def skipped_layer():
    return job(Tied(), layers=lambda model: [tied_layers(model)[0], tied_layers(model)[2]])


def partial_optimizer():
    model = Tied()
    return job(model, optimizer=lambda params: torch.optim.SGD(model.out.parameters(), lr=0.1))


def raises():
    raise RuntimeError("the factory broke")


def wrong_type():
    return Tied()


def no_reduction():
    return job(Tied(), reduction="none")


def small():
    x, y = data()
    return hetbench.Job(model=Tied(), loss=nn.CrossEntropyLoss(), reduction="mean",
                        train=TensorDataset(x[:40], y[:40]))


class Ragged(Dataset):
    def __len__(self):
        return 100

    def __getitem__(self, i):
        return torch.zeros(1 + i % 3), torch.tensor(0)


def ragged():
    return hetbench.Job(model=Tied(), loss=nn.CrossEntropyLoss(), reduction="mean",
                        train=Ragged())


def two_devices():
    model = Tied()
    model.out.to("meta")
    return job(model)


def no_parameters():
    return job(nn.ReLU())


def frozen():
    model = Tied()
    model.requires_grad_(False)
    return job(model)


def network():
    import socket

    socket.create_connection(("198.18.0.1", 9), timeout=5)  # TEST-NET: no route here
'''


@pytest.fixture
def project(tmp_path: Path) -> Path:
    folder = tmp_path / "project"
    (folder / "userjob").mkdir(parents=True)
    (folder / "userjob" / "__init__.py").write_text("")
    (folder / "userjob" / "models.py").write_text(MODELS)
    (folder / "analysis").mkdir()  # the project's own package of a hetbench room's name
    (folder / "analysis" / "__init__.py").write_text("MINE = True\n")
    return folder


def suite(runs: str, defaults: str = "") -> str:
    return textwrap.dedent(f"""
        [suite]
        name = "mine"

        [defaults]
        steps = 20
        global_batch = 64
        lr = 0.2
        {defaults}
        """) + textwrap.dedent(runs)


PAIR = 'workers = [ { device = "cpu" }, { device = "cpu" } ]'


# -- the suite's keys ------------------------------------------------------------------------


def test_a_reference_is_a_module_or_a_file_and_a_name() -> None:
    assert parse_reference("userjob.models:make") == ("userjob.models", "make")
    assert parse_reference("models/net.py:build") == ("models/net.py", "build")
    for bad in ("userjob.models", "userjob.models:", ":make", "a b:make", "x:1make"):
        with pytest.raises(JobError, match="not a factory's import path"):
            parse_reference(bad)


def test_a_job_resolves_from_the_suite_folder_and_round_trips_as_a_table(project: Path) -> None:
    path = project / "suite.toml"
    path.write_text(suite(f"""
        [[runs]]
        name = "pair"
        workload = "userjob.models:make"
        loader = {{ workers = 2, prefetch = 2, pin_memory = true }}
        accumulate = 4
        {PAIR}

        [[runs]]
        name = "global-statistics"
        workload = "userjob.models:make_batchnorm"
        batchnorm = "global"
        {PAIR}
        """))
    run, global_statistics = load_suite(str(path)).runs
    assert parse_run(run_table(global_statistics), "runs[1]") == global_statistics
    assert run.accumulate == 4
    assert run.is_job and run.project == str(project.resolve()) and run.dataset == "job"
    assert run.loader is not None and run.loader.kind == "processes" and run.loader.pin_memory
    assert parse_run(run_table(run), "runs[0]") == run  # advise writes jobs as it reads them


@pytest.mark.parametrize("key, value, message", [
    ("dataset", '"digits"', "brings its data"),
    ("size", '"tiny"', "at the size it chooses"),
    ("framework", '"tensorflow"', "allowed: 'pytorch'"),
    ("project", '"nowhere"', "is not a folder"),
    ("loader", '{ kind = "threads" }', "torch's DataLoader workers"),
    ("loader", '{ augment = true }', "a job's own Dataset decodes"),
    ("accumulate", "0", "0 is below the minimum 1"),
    ("accumulate", '3\naggregator = "ddp"', "exchanges buckets during the backward"),
    ("accumulate", '3\nbatchnorm = "global"', "one forward a step: accumulate = 1"),
    ("accumulate", '2\naggregator = { name = "ps-sync", servers = 2 }\n'
                   'placement = "fc-on-server"', "compute micro-batches of their own"),
])
def test_what_a_job_cannot_do_is_refused_by_the_suite_check(project: Path, key: str,
                                                            value: str, message: str) -> None:
    path = project / "suite.toml"
    workers = ('workers = [ { framework = "tensorflow" }, { framework = "tensorflow" } ]'
               if key == "framework" else PAIR)
    path.write_text(suite(f"""
        [[runs]]
        name = "pair"
        workload = "userjob.models:make"
        {key} = {value}
        {workers}
        """))
    with pytest.raises(UsageError) as caught:
        load_suite(str(path))
    assert f"runs[0].{key}" in caught.value.where and message in caught.value.message


def test_accumulate_runs_beside_servers_that_compute_no_layer(project: Path) -> None:
    path = project / "suite.toml"
    path.write_text(suite(f"""
        [[runs]]
        name = "pair"
        workload = "userjob.models:make"
        accumulate = 2
        aggregator = {{ name = "ps-sync", servers = 2 }}
        placement = "sharded"
        {PAIR}
        """))
    (run,) = load_suite(str(path)).runs
    assert (run.accumulate, run.placement) == (2, "sharded")


@pytest.mark.parametrize("key", ['project = "."', 'batchnorm = "global"', "accumulate = 2"])
def test_a_jobs_keys_are_only_for_a_job(project: Path, key: str) -> None:
    path = project / "suite.toml"
    path.write_text(suite(f"""
        [[runs]]
        name = "pair"
        {key}
        {PAIR}
        """))
    with pytest.raises(UsageError, match="only for a workload named by import path"):
        load_suite(str(path))


@pytest.mark.parametrize("key, message", [
    ('partition = { policy = "profiled" }', "times each worker alone"),
    ("calibrate = true", "times each worker alone"),
    ('partition = { policy = "sizes", sizes = [0, 64] }', "no empty slice"),
    ('partition = { policy = "model", leave_out = true }', "no empty slice"),
    ('aggregator = "ssp"', "lets workers step apart"),
    ("virtual_workers = [[0, 1]]", "takes a micro-batch's statistics there"),
])
def test_global_batchnorm_refuses_what_times_a_worker_alone(project: Path, key: str,
                                                            message: str) -> None:
    path = project / "suite.toml"
    path.write_text(suite(f"""
        [[runs]]
        name = "pair"
        workload = "userjob.models:make_batchnorm"
        batchnorm = "global"
        {key}
        {PAIR}
        """))
    with pytest.raises(UsageError, match=message):
        load_suite(str(path))


# -- bad jobs, refused before anything runs ---------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("factory, message", [
    ("userjob.nothere:make", "cannot import 'userjob.nothere'"),
    ("userjob.models:absent", "has no function 'absent'"),
    ("userjob.models:raises", "raised RuntimeError: the factory broke"),
    ("userjob.models:wrong_type", "returned Tied, not a hetbench.Job"),
    ("userjob.models:no_reduction", "Job.reduction is 'none'"),
    ("userjob.models:small", "holds 40 samples, fewer than one global batch (64)"),
    ("userjob.models:ragged", "do not make a batch"),
    ("userjob.models:two_devices", "sit on several devices"),
    ("userjob.models:network", "raised OSError"),
    # it was refused as "runs[0].aggregator: 1 servers for ...'s 0 parameter tensors"
    ("userjob.models:no_parameters", "Job.model (ReLU) has no trained parameter"),
    ("userjob.models:frozen", "Job.model (Tied) has no trained parameter"),
    ("userjob.models:partial_optimizer", "Job.optimizer leaves out trained parameters "
     "(embed.weight, embed.bias, norm.weight, ...)"),
    ("userjob.models:skipped_layer", "Job.layers leaves trained parameters out of every "
     "layer (mix.weight, mix.bias): each must sit in exactly one layer"),
])
def test_a_bad_job_is_one_line_and_exit_2_before_anything_runs(
        project: Path, hetbench, factory: str, message: str) -> None:
    (project / "suite.toml").write_text(suite(f"""
        [[runs]]
        name = "pair"
        workload = "{factory}"
        {PAIR}
        """))
    done = hetbench(project, "run", "suite.toml", "--out", "out")
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hetbench: error: runs[0].workload"), lines
    assert message in lines[0]
    assert not (project / "out").exists()  # nothing created, nothing run


@pytest.mark.slow
@pytest.mark.parametrize("key, message", [
    ('aggregator = "ps-sync"', "runs[0].aggregator: the job's own optimizer (Job.optimizer) "
     "steps on the workers, which 'ps-sync' does not: allowed: torch, allreduce-host, "
     "allreduce-device, ddp"),
    ('optimizer = "momentum"', "runs[0].optimizer: the job brings its optimizer"),
])
def test_a_jobs_own_optimizer_refuses_what_it_cannot_step_under(project: Path, key: str,
                                                                 message: str) -> None:
    """Whether a job brings its optimizer is learnt by the job check (the suite check does
    not import it): what it cannot run with is refused there, before anything runs."""
    from hetbench.harness.run.jobcheck import check_jobs

    path = project / "suite.toml"
    path.write_text(suite(f"""
        [[runs]]
        name = "pair"
        workload = "userjob.models:make_adamw"
        {key}
        {PAIR}
        """))
    with pytest.raises(UsageError) as caught:
        check_jobs(load_suite(str(path)))
    assert f"{caught.value.where}: {caught.value.message}".startswith(message)


def cut_layers(models: Any, model: Any, how: str) -> list[Any]:
    """The Tied model's three layers (userjob.models.tied_layers), spoilt as `how` says."""
    embed, mix, out = models.tied_layers(model)
    if how == "forward":  # the middle layer's work left out of the composition
        mix = models.Cut(lambda m, x: m.drop(x + models.torch.tanh(m.mix(x))), mix=model.mix,
                         drop=model.drop)
    if how == "tied":  # the output layer reusing the middle one's weights
        out = models.Cut(lambda m, x: m.out(m.mix(x)), out=model.out, mix=model.mix)
    if how == "order":
        return [mix, embed, out]
    return [embed, mix, out]


@pytest.mark.parametrize("how, message", [
    ("forward", "the layers composed differ from the model's forward by"),
    ("tied", "puts parameters in more than one layer (mix.bias, mix.weight)"),
    ("order", "the layers' parameters must come in the model's order"),
])
def test_layers_that_are_not_the_models_forward_are_named(project: Path, how: str,
                                                          message: str) -> None:
    from hetbench.workloads import job as jobs

    sys.path.insert(0, str(project))
    try:
        models = importlib.import_module("userjob.models")
        job = models.job(models.Tied(), layers=functools.partial(cut_layers, models, how=how))
        with pytest.raises(jobs.JobError, match=re.escape(message)):
            jobs.check_layers(job)
        jobs.check_layers(models.make_layered())  # the model's own cut passes
    finally:
        sys.path.remove(str(project))
        for name in [m for m in sys.modules if m == "userjob" or m.startswith("userjob.")]:
            del sys.modules[name]


@pytest.mark.slow
@pytest.mark.parametrize("factory, key, message", [
    ("make", "virtual_workers = [[0, 1]]", "runs[0].virtual_workers: a pipeline cuts the "
     "model into stages between its layers, and userjob.models:make gives none (Job.layers)"),
    ("make_layered", "virtual_workers = [[0, 1, 2, 3]]", "runs[0].virtual_workers: 4 "
     "stages exceed the 3 layers of userjob.models:make_layered"),
    ("make_layered", "virtual_workers = [[0, 1]]\npipeline = { split = [1, 1] }",
     "runs[0].pipeline.split: [1, 1] covers 2 layers; userjob.models:make_layered has 3"),
])
def test_a_pipeline_needs_the_jobs_layers(project: Path, factory: str, key: str,
                                          message: str) -> None:
    """How many layers a job gives (Job.layers) is learnt by the job check: a pipeline
    over a job without them, or over more stages than layers, is refused there."""
    from hetbench.harness.run.jobcheck import check_jobs

    path = project / "suite.toml"
    path.write_text(suite(f"""
        [[runs]]
        name = "pipe"
        workload = "userjob.models:{factory}"
        {PAIR if "0, 1, 2, 3" not in key else "workers = [{}, {}, {}, {}]"}
        """) + key + "\n")
    with pytest.raises(UsageError) as caught:
        check_jobs(load_suite(str(path)))
    assert f"{caught.value.where}: {caught.value.message}".startswith(message)


FOUR = "workers = [ { device = 'cpu', slowdown = 3.0 }, {}, { slowdown = 3.0 }, {} ]"


@pytest.mark.slow
def test_advise_times_a_jobs_layers_and_refuses_what_its_job_check_would(project: Path) -> None:
    """`hetbench advise` times a job's layers where the job check makes it (Job.layers,
    on the micro-batch a virtual worker of two stages takes in 4), so it proposes pipelines
    for a job; each remedy is refused as the job check would refuse it (a job's own
    optimizer, a wave bound over buffers with eval_every)."""
    from hetbench.analysis.advice import advisor
    from hetbench.analysis.models.pipeline_model import LayerShape
    from hetbench.analysis.models.simulate import Scheme
    from hetbench.harness.cli.advise import job_now, job_refusal, layer_shape

    path = project / "suite.toml"
    path.write_text(suite(f"""
        [[runs]]
        name = "four"
        workload = "userjob.models:make_layered"
        eval_every = 10
        {FOUR}
        [[runs]]
        name = "plain"
        workload = "userjob.models:make"
        {FOUR}
        """))
    layered, plain = load_suite(str(path)).runs
    shape = layer_shape(layered)
    assert isinstance(shape, LayerShape), shape
    assert len(shape.fractions) == 3 and sum(shape.fractions) == pytest.approx(1.0)
    assert all(0 < f < 1 for f in shape.forward)
    # per sample, each layer's output in float32: 16, 16 and 4 features
    assert shape.activation_bytes == (64.0, 64.0, 16.0)
    # embed (12x16 + 16) with the LayerNorm (2 x 16); mix (16x16 + 16); out (16x4 + 4)
    assert shape.parameter_bytes == (4.0 * 240, 4.0 * 272, 4.0 * 68)
    assert layer_shape(plain) == ("'userjob.models:make' gives no layers to pipeline "
                                  "(Job.layers)")
    moved = dataclasses.replace(layered, project=str(project / "elsewhere"))  # results copied
    assert job_now(moved) == ("the job could not be made to time its layers: its project "
                              f"{project / 'elsewhere'} is not a folder here")

    names = ["slow", "fast", "slow", "fast"]
    described = {"layers": 3, "last_layer_parameters": 68, "last_layer_buffers": 0,
                 "tensor_targets": True}
    found, refused = advisor.remedies(layered, Scheme("bsp"), None, names, shape, None,
                                      job_refusal(layered, {"job": described}))
    pipes = sorted(r.name for r in found if r.kind == "pipeline")
    assert pipes == ["pipe-same-kind2-d0", "pipe-same-kind2-d2", "pipe-spread2-d0",
                     "pipe-spread2-d2"]
    # the last layer on a server: the activations entering it, its share of the parameters
    tailed = next(r for r in found if r.kind == "fc-on-server")
    assert tailed.tail.activation_bytes == 64.0
    assert tailed.tail.parameter_share == pytest.approx(68 / (240 + 272 + 68))
    # BatchNorm's running statistics stay on their stages under a wave bound, and on the
    # server in a last layer
    buffers = {**described, "buffers": 32, "last_layer_buffers": 32}
    _, refused = advisor.remedies(layered, Scheme("bsp"), None, names, shape, None,
                                  job_refusal(layered, {"job": buffers}))
    reasons = {r.label: r.reason for r in refused}
    assert "last layer holds buffers" in reasons["ps-sync, 2 servers, fc-on-server"]
    # a manifest recorded before the job check learnt the last layer: not guessed
    _, refused = advisor.remedies(layered, Scheme("bsp"), None, names, shape, None,
                                  job_refusal(layered, {"job": {"layers": 3}}))
    assert "could not make the job now" in {r.label: r.reason for r in refused}[
        "ps-sync, 2 servers, fc-on-server"]
    bounded = [label for label in reasons if label.startswith("pipeline") and "D = 2" in label]
    assert len(bounded) == 2 and all(reasons[b].startswith("eval_every: under a wave bound")
                                     for b in bounded)
    assert not any(label.startswith("pipeline") and "D = 0" in label for label in reasons)
    # the job's own optimizer: no pipeline, no parameter server
    own = {**described, "optimizer": {"type": "torch.optim.adamw.AdamW", "lr": 0.01}}
    found, refused = advisor.remedies(layered, Scheme("bsp"), None, names, shape, None,
                                      job_refusal(layered, {"job": own}))
    assert not [r for r in found if r.kind == "pipeline" or r.run.aggregator.name == "ps-sync"]
    reasons = {r.label: r.reason for r in refused}
    assert "the job's own optimizer (Job.optimizer)" in reasons["ps-sync"]
    assert "not the job's (Job.optimizer)" in next(
        reason for label, reason in reasons.items() if label.startswith("pipeline"))
    builtin = dataclasses.replace(layered, workload="mlp", project=None)
    assert job_refusal(builtin, {"job": own}) is None


@pytest.mark.slow
@pytest.mark.parametrize("factory, message", [
    ("make", "runs[0].placement: 'fc-on-server' computes the model's last layer on a server, "
     "and userjob.models:make gives no layers (Job.layers)"),
    ("make_norm_last", "runs[0].placement: userjob.models:make_norm_last's last layer holds "
     "buffers (BatchNorm's running statistics)"),
    ("make_bare_last", "runs[0].placement: userjob.models:make_bare_last's last layer trains "
     "no parameter"),
    ("make_keyed_labels", "runs[0].placement: 'fc-on-server' sends the server a batch's labels "
     "as one tensor, and userjob.models:make_keyed_labels's batches give them otherwise"),
])
def test_fc_on_server_needs_a_last_layer_the_server_can_hold(project: Path, factory: str,
                                                              message: str) -> None:
    """A job's tail on the server is its last layer (Job.layers): a job without layers, or
    whose last layer keeps buffers the workers would never read back, is refused by the job
    check; the suite check lets fc-on-server through for a job (make_layered runs it: the
    `uneven` fixture)."""
    from hetbench.harness.run.jobcheck import check_jobs

    path = project / "suite.toml"
    path.write_text(suite(f"""
        [[runs]]
        name = "tail"
        workload = "userjob.models:{factory}"
        aggregator = {{ name = "ps-sync", servers = 2 }}
        placement = "fc-on-server"
        {PAIR}
        """))
    with pytest.raises(UsageError) as caught:
        check_jobs(load_suite(str(path)))
    assert f"{caught.value.where}: {caught.value.message}".startswith(message)


def test_more_servers_than_the_jobs_tensors_are_refused(project: Path) -> None:
    """Every parameter server holds at least one of the job's tensors (which the job check
    counts): more servers are refused before anything runs, not in the workers."""
    from hetbench.harness.run.jobcheck import refuse_for_job

    path = project / "suite.toml"
    path.write_text(suite(f"""
        [[runs]]
        name = "many"
        workload = "userjob.models:make"
        aggregator = {{ name = "ps-sync", servers = 3 }}
        {PAIR}
        """))
    run = load_suite(str(path)).runs[0]
    refuse_for_job(run, {"tensors": [192, 16, 4]}, "runs[0].{}".format)  # one each
    with pytest.raises(UsageError) as caught:
        refuse_for_job(run, {"tensors": [192, 16]}, "runs[0].{}".format)
    assert caught.value.where == "runs[0].aggregator"
    assert caught.value.message == ("3 servers for userjob.models:make's 2 parameter tensors: "
                                    "every server holds at least one")


@pytest.mark.slow
def test_a_one_sample_slice_of_a_batchnorm_model_is_refused_by_name(project: Path,
                                                                  hetbench) -> None:
    """torch cannot take BatchNorm statistics of one sample: sizes that give a slice of 1
    are refused by the job check; the measured and adaptive policies keep to 2 instead."""
    (project / "suite.toml").write_text(suite(f"""
        [[runs]]
        name = "pair"
        workload = "userjob.models:make_batchnorm"
        partition = {{ policy = "sizes", sizes = [63, 1] }}
        {PAIR}
        """))
    done = hetbench(project, "run", "suite.toml", "--out", "out")
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "hetbench: error: runs[0].partition.sizes: a slice of 1 sample, which "
        "userjob.models:make_batchnorm's BatchNorm layers (norm) cannot take statistics of: "
        "at least 2 (or batchnorm = 'global')"]
    assert not (project / "out").exists()


def test_an_adaptive_policy_keeps_to_the_models_smallest_slice() -> None:
    from hetbench.harness.loop.worker import make_repartitioner
    from hetbench.harness.spec.suite import parse_suite

    (run,) = parse_suite({"runs": [{
        "name": "r", "workers": [{"device": "cpu"}, {"device": "cpu"}],
        "partition": {"policy": "model", "min_slice": 1}}]}).runs
    for model_minimum, kept in ((1, 1), (2, 2)):
        repartitioner = make_repartitioner(run, None, model_minimum)
        assert repartitioner is not None and repartitioner.damping.min_slice == kept


@pytest.mark.slow
def test_a_project_shadowing_what_hetbench_imports_is_named(project: Path, hetbench) -> None:
    (project / "numpy").mkdir()
    (project / "numpy" / "__init__.py").write_text("")
    (project / "suite.toml").write_text(suite(f"""
        [[runs]]
        name = "pair"
        workload = "userjob.models:make"
        {PAIR}
        """))
    # from outside the folder: `python -m` would put the working directory's numpy first
    done = hetbench(project.parent, "run", "project/suite.toml", "--out", "out")
    assert done.returncode == 2, done.stderr
    assert "holds numpy, which would shadow what hetbench imports" in done.stderr


# -- training on uneven slices is the full-batch loop ------------------------------------------


def textbook_sgd(project: Path, factory: str, steps: int, global_batch: int, lr: float,
                 seed: int) -> dict[str, np.ndarray]:
    """The user's model trained as a textbook loop on one process: each step the whole
    global batch (a seeded permutation per epoch, cut in order), its mean loss, SGD (or the
    job's own optimizer)."""
    model, _ = textbook_model(project, factory, steps, global_batch, lr, seed)
    return {name: p.detach().numpy() for name, p in model.named_parameters()}


def textbook_model(project: Path, factory: str, steps: int, global_batch: int, lr: float,
                   seed: int, micro_batches: int = 1) -> tuple[Any, Any]:
    """textbook_sgd's model and job, its global batch forwarded in `micro_batches`
    consecutive parts (BatchNorm's statistics and running statistics a part's at a time),
    their mean losses weighted into the batch's."""

    import torch

    sys.path.insert(0, str(project))
    try:
        module = importlib.import_module("userjob.models")
        torch.manual_seed(seed)
        job = getattr(module, factory)()
    finally:
        sys.path.remove(str(project))
        for name in [m for m in sys.modules if m == "userjob" or m.startswith("userjob.")]:
            del sys.modules[name]
    model, train = job.model, job.train
    optimizer = (job.optimizer(list(model.parameters())) if job.optimizer is not None
                 else torch.optim.SGD(model.parameters(), lr=lr))
    per_epoch = len(train) // global_batch
    for step in range(steps):
        epoch, offset = divmod(step, per_epoch)
        order = np.random.default_rng([seed, epoch]).permutation(len(train))
        x, y = train[order[offset * global_batch:(offset + 1) * global_batch]]
        optimizer.zero_grad()
        for xs, ys in zip(x.chunk(micro_batches), y.chunk(micro_batches), strict=True):
            (job.loss(model(xs), ys) * len(ys) / global_batch).backward()
        optimizer.step()
    return model, job


@pytest.fixture(scope="module")
def uneven(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("uneven")
    (folder / "userjob").mkdir()
    (folder / "userjob" / "__init__.py").write_text("")
    (folder / "userjob" / "models.py").write_text(MODELS)
    three = 'workers = [ { device = "cpu" }, { device = "cpu" }, { device = "cpu" } ]'
    uneven_sizes = 'partition = { policy = "sizes", sizes = [7, 40, 17] }'
    return completed_runs(folder, suite(f"""
        [[runs]]
        name = "allreduce"
        {uneven_sizes}
        {three}

        [[runs]]
        name = "ddp"
        aggregator = "ddp"
        {uneven_sizes}
        {three}

        [[runs]]
        name = "ps-sync"
        aggregator = {{ name = "ps-sync", servers = 2 }}
        {uneven_sizes}
        {three}

        [[runs]]
        name = "adamw"
        workload = "userjob.models:make_adamw"
        aggregator = "ddp"
        {uneven_sizes}
        {three}

        [[runs]]
        name = "left-out"
        partition = {{ policy = "sizes", sizes = [0, 40, 24] }}
        {three}

        [[runs]]
        name = "fc-on-server"
        workload = "userjob.models:make_layered"
        aggregator = {{ name = "ps-sync", servers = 2 }}
        placement = "fc-on-server"
        {uneven_sizes}
        {three}

        [[runs]]
        name = "ssp"
        aggregator = {{ name = "ssp", staleness = 1 }}
        {uneven_sizes}
        {three}

        [[runs]]
        name = "sum-loaded"
        workload = "userjob.models:make_sum"
        loader = {{ workers = 2, prefetch = 2 }}
        {uneven_sizes}
        workers = [ {{ device = "cpu" }}, {{ device = "cpu", loader_workers = 0 }},
                    {{ device = "cpu", loader_workers = 1 }} ]

        [[runs]]
        name = "batchnorm"
        workload = "userjob.models:make_batchnorm"
        steps = 2
        {uneven_sizes}
        {three}

        [[runs]]
        name = "dropout"
        workload = "userjob.models:make_dropout"
        steps = 2
        {uneven_sizes}
        {three}

        [[runs]]
        name = "batchnorm-profiled"
        workload = "userjob.models:make_batchnorm"
        aggregator = "ddp"
        steps = 2
        partition = {{ policy = "profiled" }}
        workers = [ {{ device = "cpu", slowdown = 3.0 }}, {{ device = "cpu" }},
                    {{ device = "cpu" }} ]

        [[runs]]
        name = "pipelined"
        workload = "userjob.models:make_layered"
        workers = [ {{}}, {{}}, {{}}, {{}} ]
        virtual_workers = [[0, 1], [2, 3]]
        pipeline = {{ micro_batches = 2 }}
        partition = {{ policy = "sizes", sizes = [24, 40] }}
        loader = {{ workers = 1, prefetch = 2 }}

        [[runs]]
        name = "pipelined-batchnorm"
        workload = "userjob.models:make_layered_batchnorm"
        workers = [ {{}}, {{}} ]
        virtual_workers = [[0, 1]]
        pipeline = {{ micro_batches = 2, split = [1, 2] }}

        [[runs]]
        name = "batchnorm-global"
        workload = "userjob.models:make_batchnorm"
        batchnorm = "global"
        {uneven_sizes}
        {three}

        [[runs]]
        name = "accumulated"
        accumulate = 3
        {uneven_sizes}
        workers = [ {{ device = "cpu" }}, {{ device = "cpu", slowdown = 2.0 }},
                    {{ device = "cpu" }} ]

        [[runs]]
        name = "accumulated-bare"
        accumulate = 3
        instrument = false
        {uneven_sizes}
        {three}

        # worker 0 20x slower: left out at the first update; from step 10 worker 1 is 60x
        # slower, and worker 0 is taken back, with the AdamW state the other kept
        [[runs]]
        name = "adamw-out-and-back"
        workload = "userjob.models:make_adamw"
        partition = {{ policy = "model", every = 3, leave_out = true }}
        workers = [ {{ device = "cpu", slowdown = 20.0 }},
                    {{ device = "cpu", slowdown_at = [[9, 1.0], [10, 60.0]] }} ]

        [[runs]]
        name = "accumulated-batchnorm"
        workload = "userjob.models:make_batchnorm"
        accumulate = 2
        workers = [ {{ device = "cpu" }}, {{ device = "cpu" }} ]
        """, defaults='workload = "userjob.models:make"\neval_every = 10'))


def final_parameters(run_dir: Path) -> dict[str, np.ndarray]:
    with np.load(run_dir / "params.npz") as saved:
        return {name: saved[name] for name in saved.files}


@pytest.mark.slow
@pytest.mark.parametrize("run, factory, tolerance", [
    ("allreduce", "make", 1e-6), ("ddp", "make", 1e-6), ("sum-loaded", "make_sum", 1e-6),
    # the servers' update (two shards) and a worker left out of every step
    ("ps-sync", "make", 1e-6), ("left-out", "make", 1e-6),
    # the last layer (Job.layers') computed and updated on the second server
    ("fc-on-server", "make_layered", 1e-6),
    # the job's own optimizer (AdamW) stepped on DDP's overlapped sums
    ("adamw", "make_adamw", 1e-6),
    # and on a worker left out, then taken back with the torch optimizer's state dict
    ("adamw-out-and-back", "make_adamw", 1e-6),
    # two virtual workers of two stages each, cut where Job.layers cuts, 2 micro-batches,
    # each stage's slice read through a DataLoader process
    ("pipelined", "make_layered", 1e-6),
    # BatchNorm's statistics gathered over the workers: a sum of squares less exact
    ("batchnorm-global", "make_batchnorm", 1e-5),
    # each slice in 3 micro-batches (7 samples: 3, 2, 2), gradients summed before the
    # exchange, on a slowed worker too
    ("accumulated", "make", 1e-6),
    ("accumulated-bare", "make", 1e-6)])  # the same without phase timing (instrument off)
def test_uneven_slices_train_as_the_full_batch_loop(uneven: dict[str, Path], run: str,
                                                    factory: str, tolerance: float) -> None:
    """3 workers on 7, 40 and 17 samples of each 64 (0, 40 and 24 on one run): after 20
    steps the parameters are the textbook loop's (through torch's DataLoader with 2, 0
    and 1 processes on one run, a loss summed instead of averaged on it: both weighted
    exactly; BatchNorm with the global batch's statistics on another; the servers' update;
    the job's own AdamW; two virtual workers of two stages cut where Job.layers cuts, on
    24 and 40 samples in 2 micro-batches, read through torch's DataLoader)."""
    expected = textbook_sgd(uneven[run].parent.parent.parent, factory, 20, 64,
                            0.2 / (64 if factory == "make_sum" else 1), 0)
    got = final_parameters(uneven[run])
    assert set(got) == set(expected)  # the tied weight once
    worst = max(float(np.abs(got[k] - expected[k]).max()) for k in expected)
    assert worst < tolerance, worst


@pytest.mark.slow
def test_a_jobs_last_layer_is_computed_on_the_server(uneven: dict[str, Path]) -> None:
    """fc-on-server over a job: the second server holds and computes the last layer of
    Job.layers (the job's own parameter names), the first the rest; the activations and
    labels cross to it, and its parameters come back for each evaluation."""
    manifest = json.loads((uneven["fc-on-server"] / "manifest.json").read_text())
    first, tail = manifest["aggregator"]["placement"]
    assert tail["computes"] == ["out.weight", "out.bias"]
    assert tail["computed_elements"] == 16 * 4 + 4
    assert first["parameters"] == ["embed.weight", "embed.bias", "norm.weight", "norm.bias",
                                   "mix.weight", "mix.bias"]
    workers = sorted(manifest["workers"], key=lambda w: int(w["rank"]))
    # each worker sent the second server 20 steps of its slice's activations (16 float32 a
    # sample) and labels (int64), and no shard
    sent = [w["traffic"]["sent"]["ps1"] for w in workers]
    assert sent == [20 * n * (16 * 4 + 8) for n in (7, 40, 17)], sent
    held = pd.read_parquet(uneven["fc-on-server"] / "eval.parquet").sort_values("step")
    assert held["loss"].iloc[-1] < held["loss"].iloc[0]


@pytest.mark.slow
def test_the_manifest_says_how_exact_the_slices_are_and_why(uneven: dict[str, Path]) -> None:
    plain = json.loads((uneven["allreduce"] / "manifest.json").read_text())
    assert plain["exactness"]["sizes"] == [7, 40, 17]
    assert plain["exactness"]["max_relative_difference"] < 1e-6
    assert plain["exactness"]["reason"] == "exact up to float rounding"
    norm = json.loads((uneven["batchnorm"] / "manifest.json").read_text())["exactness"]
    assert norm["max_relative_difference"] > 1e-3
    assert norm["reason"].startswith("BatchNorm statistics taken per slice (norm)")
    dropped = json.loads((uneven["dropout"] / "manifest.json").read_text())["exactness"]
    assert dropped["max_relative_difference"] > 1e-3 and dropped["without_dropout"] < 1e-6
    assert dropped["reason"].startswith("dropout draws other masks per slice (drop); without "
                                        "dropout exact up to float rounding")
    assert norm["without_dropout"] is None  # nothing to switch off
    fixed = json.loads((uneven["batchnorm-global"] / "manifest.json").read_text())["exactness"]
    assert fixed["max_relative_difference"] < 1e-5
    assert fixed["reason"] == ("exact up to float rounding (BatchNorm statistics of the "
                               "global batch)")
    # a pipeline's micro-batches (2 of each virtual worker's 24 and 40 samples; one
    # virtual worker's 64 in 2 over BatchNorm), measured on rank 0's whole model
    piped = json.loads((uneven["pipelined"] / "manifest.json").read_text())["exactness"]
    assert piped["sizes"] == [12, 12, 20, 20] and piped["micro_batches"]
    assert piped["max_relative_difference"] < 1e-6
    assert piped["reason"] == "exact up to float rounding"
    staged = json.loads((uneven["pipelined-batchnorm"] / "manifest.json").read_text())
    assert staged["exactness"]["sizes"] == [32, 32]
    assert staged["exactness"]["max_relative_difference"] > 1e-3
    assert staged["exactness"]["reason"].startswith(
        "BatchNorm statistics taken per micro-batch (")
    from hetbench.analysis.render.report import job_lines

    assert "the micro-batches [32, 32] of step 0's global batch" in job_lines(staged)[2]
    job = plain["job"]
    assert job["factory"] == "userjob.models:make" and job["reduction"] == "mean"
    # the flat buffer's tensors in order: embed, norm, mix, out (weight, bias each)
    assert job["tensors"] == [192, 16, 16, 16, 256, 16, 64, 4] and job["parameters"] == 580
    assert job["optimizer"] is None  # the suite's
    own = json.loads((uneven["adamw"] / "manifest.json").read_text())
    assert own["job"]["optimizer"]["type"] == "torch.optim.adamw.AdamW"
    assert own["job"]["optimizer"]["lr"] == 0.01
    assert own["job"]["optimizer"]["weight_decay"] == 0.05
    assert "its own optimizer AdamW (lr 0.01)" in job_lines(own)[0]
    assert job["train"]["samples"] == 416 and len(job["train"]["fingerprint"]) == 16
    assert job["project"]["package"] == "userjob"
    evaluated = json.loads((uneven["allreduce"] / "manifest.json").read_text())
    assert evaluated["status"] == "completed"
    loaded = json.loads((uneven["sum-loaded"] / "manifest.json").read_text())
    assert [w["label"] for w in loaded["workers"]] == [
        "pytorch cpu x1", "pytorch cpu x1 loader 0", "pytorch cpu x1 loader 1"]


@pytest.mark.slow
def test_a_pipelined_batchnorm_model_is_evaluated_on_every_stages_statistics(
        uneven: dict[str, Path]) -> None:
    """Rank 0 evaluates the whole model: the other stage's BatchNorm running statistics
    are gathered with its parameters, and no stage's were fed the uninitialised tensors of
    torch's own shape inference (stage.stage_activations; on the classifier example they
    took a running mean to -1e25 and the held-out loss from 2.31 to 2.44 in 60 waves while
    the training loss fell from 2.40 to 1.64)."""
    import torch

    run_dir = uneven["pipelined-batchnorm"]
    assert json.loads((run_dir / "manifest.json").read_text())["job"]["batchnorm"]
    rows = pd.read_parquet(run_dir / "eval.parquet").sort_values("step")
    assert list(rows["step"]) == [0, 10, 20]
    model, job = textbook_model(run_dir.parent.parent.parent, "make_layered_batchnorm", 20,
                                64, 0.2, 0, micro_batches=2)
    model.eval()
    with torch.no_grad():
        x, y = job.heldout[:]
        expected = float(job.loss(model(x), y))
    assert abs(rows["loss"].iloc[-1] - expected) < 1e-4 * expected, (rows["loss"], expected)


@pytest.mark.slow
def test_a_jobs_own_optimizer_follows_a_worker_left_out_and_taken_back(
        uneven: dict[str, Path]) -> None:
    manifest = json.loads((uneven["adamw-out-and-back"] / "manifest.json").read_text())
    history = manifest["partition_history"]
    out = [h for h in history if "left out worker(s) [0]" in h["reason"]]
    back = [h for h in history if "took back worker(s) [0]" in h["reason"]]
    assert out and back and out[0]["step"] < back[0]["step"], [h["reason"] for h in history]


@pytest.mark.slow
def test_a_jobs_accumulated_micro_batches_are_what_batchnorm_sees(
        uneven: dict[str, Path]) -> None:
    """Two workers on 32 samples each, in 2 micro-batches: BatchNorm takes the statistics
    of each 16 consecutive samples of the global batch, as a textbook loop forwarding the
    batch in 4 parts and summing their gradients does (and not of each 32, which a slice
    forwarded whole would take)."""
    run_dir = uneven["accumulated-batchnorm"]
    project = run_dir.parent.parent.parent
    assert json.loads((run_dir / "manifest.json").read_text())["run"]["accumulate"] == 2
    got = final_parameters(run_dir)
    in_parts, _ = textbook_model(project, "make_batchnorm", 20, 64, 0.2, 0, micro_batches=4)
    whole_slices, _ = textbook_model(project, "make_batchnorm", 20, 64, 0.2, 0,
                                     micro_batches=2)

    def worst(model: Any) -> float:
        return max(float(np.abs(got[name] - p.detach().numpy()).max())
                   for name, p in model.named_parameters())

    assert worst(in_parts) < 1e-5 < 1e-3 < worst(whole_slices), (worst(in_parts),
                                                                  worst(whole_slices))


@pytest.mark.slow
def test_a_job_trains_under_a_stale_synchronous_parameter_server(
        uneven: dict[str, Path]) -> None:
    """ssp with a job: every push applied at once within the bound, its staleness recorded,
    and the held-out loss falls as under the all-reduce."""
    import pandas as pd

    steps = pd.read_parquet(uneven["ssp"] / "steps.parquet")
    assert steps["asynchronous"].all() and steps["staleness"].max() > 0
    held = pd.read_parquet(uneven["ssp"] / "eval.parquet").sort_values("step")
    assert held["loss"].iloc[-1] < 0.8 * held["loss"].iloc[0]
    served = json.loads((uneven["ssp"] / "manifest.json").read_text())["aggregator"]
    assert served["placement"][0]["parameters"][0] == "embed.weight"  # the job's own names


@pytest.mark.slow
def test_timing_a_worker_alone_leaves_its_batchnorm_statistics_alone(
        uneven: dict[str, Path]) -> None:
    """The profiled policy's solo passes run the model in training mode: its running
    statistics (and random draws) are put back, so the evaluation before the first step
    reads the same model as a run that profiled nothing."""
    import pandas as pd

    first = {run: pd.read_parquet(uneven[run] / "eval.parquet").iloc[0]
             for run in ("batchnorm", "batchnorm-profiled")}
    assert first["batchnorm"]["step"] == first["batchnorm-profiled"]["step"] == 0
    assert first["batchnorm"]["loss"] == first["batchnorm-profiled"]["loss"]
    # each worker was timed at two slices (half and one and a half its equal share of 64)
    # and the slices were solved from the fitted lines
    start = json.loads((uneven["batchnorm-profiled"] / "manifest.json").read_text())[
        "partition_history"][0]
    assert "solo compute at 11 and 32 samples, fitted a + b*n" in start["reason"]
    assert sum(start["sizes"]) == 64 and min(start["sizes"]) >= 1
    # its exactness measured on those slices, after the timing (under DDP, whose hooks
    # exchange nothing for rank 0's pass over the whole batch), not on the equal ones
    exact = json.loads((uneven["batchnorm-profiled"] / "manifest.json").read_text())[
        "exactness"]
    assert exact["sizes"] == start["sizes"] and start["sizes"][0] < 21, (exact, start)


def test_a_jobs_batches_follow_the_slice_and_the_step_asked_for() -> None:
    """torch's DataLoader over the job's data yields step s's slice [lo, hi) of the seeded
    global batch; a moved slice, a skipped step or a step past the run's count starts it
    again where asked."""
    import torch
    from torch.utils.data import TensorDataset

    from hetbench.harness.training.job_loader import JobBatches
    from hetbench.workloads.data import BatchOrder
    from hetbench.workloads.job import Job

    samples, batch, seed = 40, 8, 5
    data = TensorDataset(torch.arange(samples), torch.arange(samples) * 10)
    job = Job(model=torch.nn.Linear(1, 1), loss=torch.nn.MSELoss(), reduction="mean",
              train=data)
    batches = JobBatches(job, BatchOrder(samples, batch, seed), 3, None, 10.0)

    def expected(step: int, lo: int, hi: int) -> list[int]:
        epoch, offset = divmod(step, samples // batch)
        order = np.random.default_rng([seed, epoch]).permutation(samples)
        return order[offset * batch:(offset + 1) * batch][lo:hi].tolist()

    try:
        for step, lo, hi in [(0, 0, 3), (1, 0, 3), (2, 3, 8), (1, 0, 8), (7, 2, 5), (8, 2, 5)]:
            inputs, targets = batches.get(step, lo, hi)
            assert inputs.tolist() == expected(step, lo, hi), (step, lo, hi)
            assert targets.tolist() == [10 * i for i in expected(step, lo, hi)]
    finally:
        batches.close()
