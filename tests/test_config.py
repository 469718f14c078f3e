"""Suite specs (hetbench.harness.spec.suite): every bad input is one UsageError naming the field
and what is allowed; good input becomes frozen dataclasses. Framework-free: no torch is imported
here."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path
from typing import Any

import pytest

from hetbench.harness.spec.errors import UsageError
from hetbench.harness.spec.partitions import PartitionSpec
from hetbench.harness.spec.suite import (
    Overrides,
    RunSpec,
    SuiteSpec,
    builtin_suites,
    load_suite,
    parse_suite,
)
from hetbench.harness.spec.workers import WorkerSpec

TWO_CPUS = [{"device": "cpu"}, {"device": "cpu"}]


def run(**overrides: Any) -> dict[str, Any]:
    """A valid two-worker run table, with overrides (None removes a key)."""
    table: dict[str, Any] = {"name": "r", "workers": [dict(w) for w in TWO_CPUS]}
    table.update(overrides)
    return {k: v for k, v in table.items() if v is not None}


def worker(**overrides: Any) -> dict[str, Any]:
    return run(workers=[{"device": "cpu", **overrides}, {"device": "cpu"}])


def suite(*runs: dict[str, Any], **top: Any) -> dict[str, Any]:
    return {"runs": list(runs) if runs else [run()], **top}


def usage_error(data: dict[str, Any]) -> UsageError:
    with pytest.raises(UsageError) as info:
        parse_suite(data, "test.toml")
    return info.value


# -- bad input: (suite data, field named, fragments the message must hold) --------------------

BAD = {
    # unknown keys, each listing what is allowed
    "top-level key": (
        suite(bogus=1), "bogus", ["unknown key", "allowed: defaults, nodes, runs, suite"]),
    "suite key": (suite(suite={"nme": "x"}), "suite.nme", ["unknown key", "description, name"]),
    "defaults key": (suite(defaults={"stpes": 3}), "defaults.stpes", ["unknown key", "steps"]),
    "run key": (suite(run(stpes=3)), "runs[0].stpes", ["unknown key", "allowed:", "steps"]),
    "worker key": (
        suite(worker(thread=2)), "runs[0].workers[0].thread",
        ["unknown key",
         "allowed: cores, device, framework, jitter, loader_workers, node, slowdown, "
         "slowdown_at, threads"]),
    "partition key": (
        suite(run(partition={"policy": "sizes", "size": [64, 64]})), "runs[0].partition.size",
        ["unknown key", "policy", "profile_steps", "sizes", "weights"]),
    # wrong types
    "string for steps": (suite(run(steps="30")), "runs[0].steps", ["integer", "not a string"]),
    "bool for threads": (
        suite(worker(threads=True)), "runs[0].workers[0].threads", ["integer", "not a boolean"]),
    "bool for steps": (suite(run(steps=True)), "runs[0].steps", ["integer", "not a boolean"]),
    "float for global_batch": (
        suite(run(global_batch=128.0)), "runs[0].global_batch", ["integer", "not a float"]),
    "float in sizes": (
        suite(run(partition={"policy": "sizes", "sizes": [64.0, 64]})),
        "runs[0].partition.sizes", ["integer", "not a float"]),
    "string for lr": (suite(run(lr="0.1")), "runs[0].lr", ["number", "not a string"]),
    "bool for slowdown": (
        suite(worker(slowdown=False)), "runs[0].workers[0].slowdown", ["number", "not a boolean"]),
    "string for instrument": (
        suite(run(instrument="yes")), "runs[0].instrument", ["true or false", "not a string"]),
    "int for device": (suite(worker(device=0)), "runs[0].workers[0].device", ["string"]),
    "run not a table": (suite(3), "runs[0]", ["must be a table", "not an integer"]),
    "worker not a table": (
        suite(run(workers=["cpu"])), "runs[0].workers[0]", ["must be a table", "not a string"]),
    "partition not a table": (
        suite(run(partition="equal")), "runs[0].partition", ["must be a table"]),
    "suite not a table": (suite(suite="quick"), "suite", ["must be a table"]),
    # unknown names list the allowed ones
    "framework": (
        suite(run(framework="tensorflw")), "runs[0].framework",
        ["unknown 'tensorflw'", "allowed: ", "pytorch"]),
    "worker framework": (
        suite(worker(framework="jax")), "runs[0].workers[0].framework",
        ["unknown 'jax'", "allowed: ", "pytorch"]),
    "workload": (
        suite(run(workload="resnet50")), "runs[0].workload",
        ["unknown 'resnet50'",
         "allowed: bert, captioning, cnn, lstm, mlp, resnet, transformer, vgg"]),
    "size": (
        suite(run(size="huge")), "runs[0].size", ["unknown 'huge'", "allowed: base, small, tiny"]),
    "workload on a data set it cannot train on": (
        suite(run(workload="resnet", dataset="digits")), "runs[0].dataset",
        ["'digits' does not fit workload 'resnet'", "allowed: scenes, synthetic"]),
    "eval_every zero": (suite(run(eval_every=0)), "runs[0].eval_every", ["minimum 1"]),
    "target without eval_every": (
        suite(run(target={"value": 0.5})), "runs[0].target", ["needs eval_every"]),
    "target metric": (
        suite(run(eval_every=5, target={"metric": "bleu", "value": 0.5})),
        "runs[0].target.metric", ["unknown 'bleu'", "allowed: accuracy, loss"]),
    "target accuracy above 1": (
        suite(run(eval_every=5, target={"value": 80})), "runs[0].target.value",
        ["accuracy is 0 to 1"]),
    "optimizer": (
        suite(run(optimizer="adam")), "runs[0].optimizer.name",
        ["unknown 'adam'", "allowed: adamw, momentum, sgd"]),
    "optimizer key of another optimizer": (
        suite(run(optimizer={"name": "sgd", "beta1": 0.9})), "runs[0].optimizer.beta1",
        ["only allowed with optimizer 'adamw'"]),
    "momentum of 1": (
        suite(run(optimizer={"name": "momentum", "momentum": 1.0})),
        "runs[0].optimizer.momentum", ["1.0 is not allowed (at least 0, below 1)"]),
    "warm-up longer than the run": (
        suite(run(steps=10, optimizer={"name": "adamw", "warmup_steps": 11})),
        "runs[0].optimizer.warmup_steps", ["11 exceeds steps (10)"]),
    "decay": (
        suite(run(optimizer={"name": "sgd", "decay": "exp"})), "runs[0].optimizer.decay",
        ["unknown 'exp'", "allowed: cosine, linear, none"]),
    "loader workers": (
        suite(run(loader={"workers": 64})), "runs[0].loader.workers", ["1 to 32"]),
    "loader kind": (
        suite(run(loader={"kind": "fibers"})), "runs[0].loader.kind",
        ["unknown 'fibers'", "allowed: processes, threads"]),
    "augment text": (
        suite(run(workload="lstm", loader={"augment": True})), "runs[0].loader.augment",
        ["only for image classification workloads"]),
    "loader key": (
        suite(run(loader={"threads": 2})), "runs[0].loader.threads", ["unknown key"]),
    "dataset": (
        suite(run(dataset="mnist")), "runs[0].dataset",
        ["unknown 'mnist'", "allowed: digits, numbers, scenes, synthetic, text"]),
    "policy": (
        suite(run(partition={"policy": "random"})), "runs[0].partition.policy",
        ["unknown 'random'", "allowed: equal, model, profiled, proportional, sizes, weights"]),
    # partition sizes and weights
    "sizes do not sum to global_batch": (
        suite(run(global_batch=128, partition={"policy": "sizes", "sizes": [32, 64]})),
        "runs[0].partition.sizes", ["sum 96 must equal global_batch 128"]),
    "sizes too short": (
        suite(run(partition={"policy": "sizes", "sizes": [128]})),
        "runs[0].partition.sizes", ["list of 2 integers, one per worker"]),
    "sizes too long": (
        suite(run(partition={"policy": "sizes", "sizes": [64, 32, 32]})),
        "runs[0].partition.sizes", ["list of 2 integers, one per worker"]),
    "size negative": (
        suite(run(partition={"policy": "sizes", "sizes": [-1, 129]})),
        "runs[0].partition.sizes", ["-1 is below the minimum 0"]),
    "sizes missing for policy sizes": (
        suite(run(partition={"policy": "sizes"})),
        "runs[0].partition.sizes", ["required for policy 'sizes'"]),
    "sizes with policy equal": (
        suite(run(partition={"policy": "equal", "sizes": [64, 64]})),
        "runs[0].partition.sizes", ["only allowed with policy 'sizes', not 'equal'"]),
    "sizes with default policy": (
        suite(run(partition={"sizes": [64, 64]})),
        "runs[0].partition.sizes", ["only allowed with policy 'sizes'"]),
    "weights missing for policy weights": (
        suite(run(partition={"policy": "weights"})),
        "runs[0].partition.weights", ["required for policy 'weights'"]),
    "weights wrong length": (
        suite(run(partition={"policy": "weights", "weights": [1.0]})),
        "runs[0].partition.weights", ["list of 2 numbers"]),
    "weight zero": (
        suite(run(partition={"policy": "weights", "weights": [1.0, 0.0]})),
        "runs[0].partition.weights", ["must be above 0.0"]),
    "weights with policy profiled": (
        suite(run(partition={"policy": "profiled", "weights": [1.0, 2.0]})),
        "runs[0].partition.weights", ["only allowed with policy 'weights', not 'profiled'"]),
    "profile_steps zero": (
        suite(run(partition={"policy": "profiled", "profile_steps": 0})),
        "runs[0].partition.profile_steps", ["below the minimum 1"]),
    # numeric ranges
    "global_batch below workers": (
        suite(run(global_batch=1)), "runs[0].global_batch",
        ["1 is smaller than the number of workers (2)"]),
    "global_batch zero": (suite(run(global_batch=0)), "runs[0].global_batch", ["minimum 1"]),
    "global_batch beyond the data set": (
        suite(run(global_batch=2000)), "runs[0].global_batch",
        ["2000 exceeds the 1500 samples of dataset 'digits'", "allowed: 2 to 1500"]),
    "slowdown below 1": (
        suite(worker(slowdown=0.5)), "runs[0].workers[0].slowdown",
        ["0.5 is not allowed", "at least 1.0"]),
    "threads zero": (
        suite(worker(threads=0)), "runs[0].workers[0].threads", ["0 is below the minimum 1"]),
    "cores empty": (suite(worker(cores=[])), "runs[0].workers[0].cores", ["non-empty list"]),
    "cores negative": (
        suite(worker(cores=[0, -1])), "runs[0].workers[0].cores", ["-1 is below the minimum 0"]),
    "steps zero": (suite(run(steps=0)), "runs[0].steps", ["minimum 1"]),
    "warmup equal to steps": (
        suite(run(steps=10, warmup_steps=10)), "runs[0].warmup_steps",
        ["10 must be below steps (10)"]),
    "warmup above steps": (
        suite(run(steps=10, warmup_steps=20)), "runs[0].warmup_steps",
        ["20 must be below steps (10)"]),
    "negative warmup": (suite(run(warmup_steps=-1)), "runs[0].warmup_steps", ["minimum 0"]),
    "lr zero": (suite(run(lr=0)), "runs[0].lr", ["must be above 0.0"]),
    "negative seed": (suite(run(seed=-1)), "runs[0].seed", ["minimum 0"]),
    "timeout below 1 s": (suite(run(timeout_s=0.5)), "runs[0].timeout_s", ["at least 1.0"]),
    "repeats zero": (suite(suite={"repeats": 0}), "suite.repeats", ["minimum 1"]),
    # workers, names, runs
    "no workers": (suite(run(workers=[])), "runs[0].workers", ["list of 1 to 1024 worker"]),
    "workers not a list": (
        suite(run(workers={"device": "cpu"})), "runs[0].workers", ["list of 1 to 1024 worker"]),
    "run without name": (suite(run(name=None)), "runs[0].name", ["required"]),
    "run name with a space": (
        suite(run(name="my run")), "runs[0].name", ["'my run' is not a name"]),
    "suite name with a slash": (
        suite(suite={"name": "a/b"}), "suite.name", ["'a/b' is not a name"]),
    "duplicated run names": (
        suite(run(name="a"), run(name="b"), run(name="a")), "runs[2].name",
        ["'a' is used twice", "unique"]),
    "lstm on digits": (
        suite(run(workload="lstm", dataset="digits")), "runs[0].dataset",
        ["'digits' does not fit workload 'lstm'", "allowed: text, synthetic"]),
    "cnn on text": (
        suite(run(workload="cnn", dataset="text")), "runs[0].dataset",
        ["'text' does not fit workload 'cnn'", "allowed: digits, synthetic"]),
    "error in a later run": (suite(run(name="a"), run(name="b", steps="x")), "runs[1].steps", []),
    "empty runs list": ({"runs": []}, "runs", ["at least one [[runs]] table"]),
    "no runs at all": ({"suite": {"name": "s"}}, "runs", ["at least one [[runs]] table"]),
    "runs not a list": ({"runs": {"name": "r"}}, "runs", ["at least one [[runs]] table"]),
}


@pytest.mark.parametrize(("data", "where", "fragments"), BAD.values(), ids=BAD.keys())
def test_bad_input_names_the_field_and_what_is_allowed(
    data: dict[str, Any], where: str, fragments: list[str]
) -> None:
    exc = usage_error(data)
    assert exc.where == where
    for fragment in fragments:
        assert fragment in exc.message
    assert str(exc) == f"{where}: {exc.message}"
    assert "\n" not in str(exc)


@pytest.mark.parametrize("device", ["gpu", "cuda", "cuda:", "CPU", "cpu:0", "cuda:x", "cuda:-1",
                                    " cpu", "cuda:0 ", ""])
def test_device_must_be_cpu_or_cuda_with_index(device: str) -> None:
    exc = usage_error(suite(run(workers=[{"device": "cpu"}, {"device": device}])))
    assert exc.where == "runs[0].workers[1].device"
    assert f"{device!r} is not a device (cpu, cuda:N)" in exc.message


@pytest.mark.parametrize(("data", "where"), [
    (suite(run(workers=[{"device": "cpu"}, {"device": "cpu\n"}])), "runs[0].workers[1].device"),
    (suite(run(name="r\n")), "runs[0].name"),
], ids=["device", "run name"])
def test_trailing_newline_is_rejected(data: dict[str, Any], where: str) -> None:
    assert usage_error(data).where == where


@pytest.mark.parametrize(("data", "where"), [
    (suite(worker(slowdown=float("nan"))), "runs[0].workers[0].slowdown"),
    (suite(run(lr=float("nan"))), "runs[0].lr"),
    (suite(run(partition={"policy": "weights", "weights": [float("nan"), 1.0]})),
     "runs[0].partition.weights"),
    (suite(run(partition={"policy": "weights", "weights": [float("inf"), 1.0]})),
     "runs[0].partition.weights"),
], ids=["nan slowdown", "nan lr", "nan weight", "inf weight"])
def test_non_finite_numbers_are_rejected(data: dict[str, Any], where: str) -> None:
    assert usage_error(data).where == where


def test_a_bad_default_is_reported_where_it_was_written() -> None:
    exc = usage_error(suite(defaults={"steps": "x"}))
    assert exc.where == "defaults.steps"
    overridden = parse_suite(suite(defaults={"steps": 5}, runs=[{"name": "r", "steps": 7}]))
    assert overridden.runs[0].steps == 7


def test_unknown_key_error_stays_on_one_line() -> None:
    exc = usage_error(suite(run(**{"bad\nkey": 1})))
    assert "\n" not in str(exc)


# -- load_suite: files and built-in names ------------------------------------------------------


def test_invalid_toml_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.toml"
    path.write_text('[[runs]]\nname = "r\nsteps = 3\n')
    with pytest.raises(UsageError) as info:
        load_suite(str(path))
    assert info.value.where == str(path)
    assert info.value.message.startswith("invalid TOML:")
    assert "\n" not in str(info.value)


def test_missing_file_names_the_path(tmp_path: Path) -> None:
    path = tmp_path / "missing.toml"
    with pytest.raises(UsageError) as info:
        load_suite(str(path))
    assert info.value.where == str(path)
    assert info.value.message == "no such file"


def test_missing_file_in_a_folder_without_suffix_names_the_path(tmp_path: Path) -> None:
    path = tmp_path / "missing"
    with pytest.raises(UsageError) as info:
        load_suite(str(path))
    assert info.value.where == str(path)


def test_unreadable_file_names_the_path(tmp_path: Path) -> None:
    path = tmp_path / "binary.toml"
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(UsageError) as info:
        load_suite(str(path))
    assert info.value.where == str(path)
    assert info.value.message.startswith("cannot read")


def test_unknown_builtin_suite_lists_the_builtins() -> None:
    with pytest.raises(UsageError) as info:
        load_suite("no-such-suite")
    assert info.value.where == "suite"
    assert "'no-such-suite' is neither a file nor a built-in suite" in info.value.message
    for name in builtin_suites():
        assert name in info.value.message


def test_errors_in_a_file_name_the_field(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text('[[runs]]\nname = "r"\nworkers = [ { device = "gpu" } ]\n')
    with pytest.raises(UsageError) as info:
        load_suite(str(path))
    assert info.value.where == "runs[0].workers[0].device"


def test_file_without_suite_table_is_named_after_the_file(tmp_path: Path) -> None:
    path = tmp_path / "my-suite.toml"
    path.write_text('[[runs]]\nname = "r"\n')
    spec = load_suite(str(path))
    assert spec.name == "my-suite"
    assert spec.source == str(path)
    assert spec.repeats == 1


# -- good input ------------------------------------------------------------------------------

FULL = """
[suite]
name = "full"
repeats = 3
description = "every field"

[defaults]
steps = 50
warmup_steps = 5
global_batch = 96
lr = 0.05
timeout_s = 30

[[runs]]
name = "sized"
framework = "pytorch"
workload = "cnn"
dataset = "synthetic"
seed = 7
instrument = false
partition = { policy = "sizes", sizes = [64, 32] }
workers = [ { device = "cpu", threads = 2, cores = [0, 1] }, { device = "cpu", slowdown = 2.5 } ]

[[runs]]
name = "weighted.v2"
workload = "lstm"
dataset = "text"
steps = 20
partition = { policy = "weights", weights = [3, 1.5] }
workers = [ { device = "cpu" }, { device = "cuda:1", framework = "pytorch" } ]
"""


def test_full_suite_parses_into_frozen_dataclasses() -> None:
    spec = parse_suite(tomllib.loads(FULL), "full.toml")
    assert spec == SuiteSpec(
        name="full",
        repeats=3,
        source="full.toml",
        description="every field",
        runs=(
            RunSpec(
                name="sized", framework="pytorch", workload="cnn", dataset="synthetic",
                steps=50, warmup_steps=5, global_batch=96, lr=0.05, seed=7,
                partition=PartitionSpec(policy="sizes", sizes=(64, 32)),
                workers=(WorkerSpec(device="cpu", threads=2, cores=(0, 1)),
                         WorkerSpec(device="cpu", slowdown=2.5)),
                timeout_s=30.0, instrument=False,
            ),
            RunSpec(
                name="weighted.v2", framework="pytorch", workload="lstm", dataset="text",
                steps=20, warmup_steps=5, global_batch=96, lr=0.05, seed=0,
                partition=PartitionSpec(policy="weights", weights=(3.0, 1.5)),
                workers=(WorkerSpec(device="cpu"), WorkerSpec(device="cuda:1")),
                timeout_s=30.0, instrument=True,
            ),
        ),
    )
    first, second = spec.runs
    assert first.world_size == 2
    assert isinstance(first.timeout_s, float) and isinstance(second.partition.weights[0], float)
    assert not first.workers[0].is_cuda and second.workers[1].is_cuda
    hash(first)  # tuples all the way down: specs are hashable values
    for obj in (spec, first, first.partition, first.workers[0]):
        with pytest.raises(dataclasses.FrozenInstanceError):
            obj.name = "changed"  # type: ignore[misc]


def test_minimal_run_gets_the_documented_defaults() -> None:
    (spec,) = parse_suite({"runs": [{"name": "r"}]}).runs
    assert spec == RunSpec(
        name="r", framework="pytorch", workload="mlp", dataset="digits", steps=30,
        warmup_steps=0, global_batch=128, lr=0.1, seed=0, partition=PartitionSpec(),
        workers=(WorkerSpec(),), timeout_s=120.0, instrument=True,
    )


def test_defaults_apply_to_runs_and_runs_override_them() -> None:
    data = {
        "defaults": {"steps": 40, "seed": 3, "global_batch": 64,
                     "workers": [{"device": "cpu"}, {"device": "cpu", "slowdown": 2.0}],
                     "partition": {"policy": "sizes", "sizes": [48, 16]}},
        "runs": [
            {"name": "inherits"},
            {"name": "overrides", "steps": 10, "global_batch": 32,
             "workers": [{"device": "cpu"}] * 3, "partition": {"policy": "equal"}},
        ],
    }
    inherits, overrides = parse_suite(data).runs
    assert (inherits.steps, inherits.seed, inherits.global_batch) == (40, 3, 64)
    assert inherits.partition == PartitionSpec(policy="sizes", sizes=(48, 16))
    assert inherits.workers[1].slowdown == 2.0
    assert (overrides.steps, overrides.seed, overrides.global_batch) == (10, 3, 32)
    # a run's table replaces the default table whole (no merge of partition keys)
    assert overrides.partition == PartitionSpec(policy="equal")
    assert overrides.world_size == 3


def test_run_framework_is_the_default_worker_framework() -> None:
    (spec,) = parse_suite(suite(run(framework="pytorch"))).runs
    assert {w.framework for w in spec.workers} == {"pytorch"}


def test_builtin_suites_all_parse() -> None:
    names = builtin_suites()
    assert "quick" in names
    for name in names:
        spec = load_suite(name)
        assert spec.source == f"builtin:{name}"
        assert spec.runs
        assert len({r.name for r in spec.runs}) == len(spec.runs)


@pytest.mark.parametrize("path", sorted((Path(__file__).parent.parent / "benchmarks")
                                         .glob("*.toml")), ids=lambda p: p.name)
def test_benchmark_suites_parse(path: Path) -> None:
    """They run by hand (some only on a GPU machine): a typo must not wait for that."""
    spec = load_suite(str(path))
    assert spec.runs
    assert len({r.name for r in spec.runs}) == len(spec.runs)


def test_quick_suite_is_cpu_only() -> None:
    spec = load_suite("quick")
    assert all(w.device == "cpu" for r in spec.runs for w in r.workers)


@pytest.mark.parametrize(("workers", "expected"), [
    ([{"device": "cpu"}], "homogeneous"),
    ([{"device": "cpu", "threads": 2}, {"device": "cpu", "threads": 2}], "homogeneous"),
    ([{"device": "cuda:0"}, {"device": "cuda:1"}], "homogeneous"),
    ([{"device": "cpu"}, {"device": "cpu", "slowdown": 3.0}], "emulated"),
    ([{"device": "cpu", "threads": 1}, {"device": "cpu", "threads": 4}], "emulated"),
    ([{"device": "cpu", "cores": [0]}, {"device": "cpu", "cores": [1]}], "emulated"),
    ([{"device": "cpu"}, {"device": "cuda:0"}], "real"),
    ([{"device": "cpu"}, {"device": "cuda:0", "slowdown": 2.0}], "real"),
])
def test_heterogeneity(workers: list[dict[str, Any]], expected: str) -> None:
    (spec,) = parse_suite(suite(run(workers=workers))).runs
    assert spec.heterogeneity == expected


def test_to_dict_is_plain_data() -> None:
    (spec,) = parse_suite(suite(run(partition={"policy": "sizes", "sizes": [100, 28]}))).runs
    data = spec.to_dict()
    assert data["partition"] == {"policy": "sizes", "sizes": (100, 28), "weights": None,
                                 "profile_steps": 5, "initial": "equal", "every": 10,
                                 "dead_band": 0.05, "max_move": 0.25, "min_slice": 1,
                                 "smoothing": 0.5, "max_ratio": 2.0, "reset": 0.3,
                                 "leave_out": False}
    assert data["workers"][0]["device"] == "cpu"


def test_adaptive_partition_keys_and_slowdown_schedules() -> None:
    (spec,) = parse_suite(suite(run(
        partition={"policy": "model", "every": 5, "dead_band": 0.02, "initial": "profiled"},
        workers=[{"device": "cpu", "slowdown_at": [[0, 1.0], [100, 3.0]]}, {"device": "cpu"}],
    ))).runs
    assert spec.partition.adaptive and spec.partition.every == 5
    assert spec.heterogeneity == "emulated"
    first = spec.workers[0]
    assert [first.slowdown_for(s) for s in (0, 50, 100, 500)] == [1.0, 2.0, 3.0, 3.0]
    assert usage_error(suite(run(partition={"policy": "equal", "every": 5}))).where == \
        "runs[0].partition.every"
    assert usage_error(suite(run(partition={"policy": "model", "smoothing": 1.5}))).where == \
        "runs[0].partition.smoothing"
    assert usage_error(suite(run(instrument=False, partition={"policy": "proportional"}))
                       ).where == "runs[0].instrument"
    bad = usage_error(suite(worker(slowdown_at=[[10, 2.0], [5, 3.0]])))
    assert bad.where == "runs[0].workers[0].slowdown_at" and "increase" in bad.message
    assert usage_error(suite(worker(slowdown_at=[[0, 0.5]]))).where == \
        "runs[0].workers[0].slowdown_at"


def test_workload_keys_parse_and_survive_the_run_file() -> None:
    """size, optimizer, eval_every and target as the workloads issue names them; dataset
    left out takes the workload's default; the spec survives the JSON the launcher writes,
    and a run file written before keep_freed_memory or comm_hook reads as what its workers
    did."""
    import json

    from hetbench.harness.spec.optimizers import OptimizerSpec
    from hetbench.harness.spec.suite import run_from_dict

    table = run(workload="resnet", size="tiny", eval_every=5, target={"value": 0.5},
                optimizer={"name": "adamw", "weight_decay": 0.01, "warmup_steps": 3,
                           "decay": "cosine", "min_lr": 0.001})
    spec = parse_suite(suite(table)).runs[0]
    assert (spec.dataset, spec.size, spec.eval_every) == ("scenes", "tiny", 5)
    assert spec.target is not None and (spec.target.metric, spec.target.value) == ("accuracy", 0.5)
    assert spec.target.reached(0.5) and not spec.target.reached(0.49)
    assert spec.optimizer == OptimizerSpec(name="adamw", weight_decay=0.01, warmup_steps=3,
                                           decay="cosine", min_lr=0.001)
    assert run_from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    plain = parse_suite(suite(run())).runs[0]  # today's suites: SGD, no evaluation, small
    assert (plain.optimizer.name, plain.eval_every, plain.target, plain.size) == (
        "sgd", 0, None, "small")
    assert run_from_dict(json.loads(json.dumps(plain.to_dict()))) == plain
    # a run recorded before keep_freed_memory existed ran with glibc's own thresholds
    assert plain.keep_freed_memory is True
    older = {k: v for k, v in plain.to_dict().items() if k != "keep_freed_memory"}
    assert run_from_dict(older).keep_freed_memory is False
    # and a ddp run recorded before comm_hook existed went through the timed hook
    ddp = parse_suite(suite(run(aggregator={"name": "ddp"}))).runs[0]
    assert ddp.aggregator.comm_hook == "builtin"
    assert run_from_dict(json.loads(json.dumps(ddp.to_dict()))) == ddp
    recorded = ddp.to_dict()
    recorded["aggregator"] = {k: v for k, v in recorded["aggregator"].items()
                              if k != "comm_hook"}
    assert run_from_dict(recorded).aggregator.comm_hook == "timed"
    loss_target = parse_suite(suite(run(eval_every=2, target={"metric": "loss", "value": 0.3})))
    target = loss_target.runs[0].target
    assert target is not None and target.reached(0.3) and not target.reached(0.31)


def test_overrides_for_a_quick_study_are_checked_like_the_suite() -> None:
    spec = load_suite("quick", Overrides(repeats=2, steps=20, runs=("hetero-*",)))
    assert spec.repeats == 2
    assert [r.name for r in spec.runs] == ["hetero-equal", "hetero-sizes", "hetero-profiled"]
    assert {r.steps for r in spec.runs} == {20}
    assert [r.name for r in load_suite("quick", Overrides(runs=("profiled",))).runs] == [
        "hetero-profiled", "cnn-hetero-profiled"]  # no wildcard: a substring
    with pytest.raises(UsageError, match=r"^-k: no run matches 'gpu\*' \(runs: homogeneous, "):
        load_suite("quick", Overrides(runs=("gpu*",)))
    # -k repeated: every pattern's runs, in the suite's order (only the last was kept)
    both = load_suite("quick", Overrides(runs=("cnn-hetero-profiled", "homogeneous")))
    assert [r.name for r in both.runs] == ["homogeneous", "cnn-hetero-profiled"]
    with pytest.raises(UsageError, match=r"^-k: no run matches 'gpu' "):
        load_suite("quick", Overrides(runs=("homogeneous", "gpu")))
    from hetbench.harness.cli.main import build_parser

    for command in ("run", "launch", "advise", "simulate", "explain"):
        parsed = build_parser().parse_args([command, "-k", "a", "-k", "b", "--out", "o", "x",
                                            *(["--", "s.py"] if command == "launch" else [])])
        assert parsed.runs == ["a", "b"], command
    with pytest.raises(UsageError, match=r"warmup_steps: 10 must be below steps \(5\)"):
        load_suite("quick", Overrides(steps=5))


def test_the_readme_example_suite_parses_and_gives_the_slow_worker_the_small_slice() -> None:
    page = Path(__file__).resolve().parent.parent / "docs" / "reference" / "suites.md"
    text = page.read_text().split("## A suite file", 1)[1]
    block = text.split("```toml\n", 1)[1].split("```", 1)[0]
    (run,) = parse_suite(tomllib.loads(block)).runs
    slow = max(range(run.world_size), key=lambda r: run.workers[r].slowdown)
    sizes = run.partition.sizes
    assert sizes is not None and sizes[slow] == min(sizes)
    assert run.warmup_steps > 0
