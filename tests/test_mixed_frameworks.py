"""Frameworks side by side, end to end.

- A real mixed job (worker 0 PyTorch, worker 1 TensorFlow, worker 2 MXNet, unequal slices,
  one gloo all-reduce over loopback) ends with the parameters of a PyTorch-only run.
  Tolerance atol 2e-5 after 12 CNN steps, as in test_exactness (float32; the frameworks'
  kernels sum in different orders: the observed difference was 6e-8).
- A suite naming a framework that is not installed fails before any worker starts, with one
  line naming the extra to install.
- The native aggregation strategies, MXNet's kvstore (dist_sync) and TensorFlow's
  collective ring all-reduce, end where the torch.distributed path ends.
- `hetbench devices` reports every framework, each probed in its own process, and survives
  a framework that crashes or hangs on import.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from hetbench.adapters import FRAMEWORKS, REQUIREMENTS, install_hint, missing_framework
from hetbench.harness.spec.aggregators import AGGREGATORS
from tests.conftest import REPO
from tests.trace_check import check_trace

STEPS = 12
ATOL = 2e-5
TIMEOUT_S = 240

MIXED_SUITE = f"""
[suite]
name = "mixed"

[defaults]
workload = "cnn"
dataset = "digits"
steps = {STEPS}
global_batch = 96
lr = 0.1
seed = 5

[[runs]]
name = "pytorch-only"
workers = [ {{ device = "cpu" }} ]

[[runs]]
name = "mixed"
partition = {{ policy = "sizes", sizes = [20, 36, 40] }}
workers = [ {{ framework = "pytorch" }}, {{ framework = "tensorflow" }},
            {{ framework = "mxnet" }} ]
"""


def installed(framework: str) -> bool:
    return importlib.util.find_spec(REQUIREMENTS[framework][0]) is not None




@pytest.mark.slow
def test_mixed_job_ends_where_a_pytorch_job_ends(tmp_path: Path, write_suite) -> None:
    if not (installed("tensorflow") and installed("mxnet")):
        pytest.skip("needs TensorFlow and MXNet (pip install 'hetbench[all]')")
    from hetbench.harness.records.results import load_run
    from hetbench.harness.run.launcher import run_suite
    from hetbench.harness.spec.suite import load_suite

    suite = load_suite(str(write_suite(MIXED_SUITE)))
    results = run_suite(suite, tmp_path / "results")
    assert [r.status for r in results] == ["completed"] * 2, [r.reason for r in results]
    alone, mixed = (dict(np.load(r.run_dir / "params.npz")) for r in results)
    initial = suite.runs[0]
    from hetbench.workloads import build_spec

    start = build_spec("cnn", (1, 8, 8), 10).initial_parameters(initial.seed)
    for name, expected in alone.items():
        assert not np.allclose(expected, start[name], atol=1e-3), f"{name} did not train"
        np.testing.assert_allclose(mixed[name], expected, rtol=0, atol=ATOL, err_msg=name)

    run = load_run(results[1].run_dir)
    versions = [w["versions"] for w in sorted(run.manifest["workers"], key=lambda w: w["rank"])]
    assert "torch" in versions[0] and "tensorflow" in versions[1] and "mxnet" in versions[2]
    assert len(run.steps) == 3 * STEPS
    losses = run.steps.groupby("step")["loss"].agg(["min", "max"])
    np.testing.assert_allclose(losses["min"], losses["max"], rtol=1e-6)
    # MXNet's engine is asynchronous: the worker synchronises at its phase boundaries, so
    # its compute is in forward and backward, not in pack where the gradients are awaited
    mx_steps = run.steps[run.steps["rank"] == 2].iloc[2:]
    assert mx_steps["backward_ns"].median() > mx_steps["pack_ns"].median()
    assert mx_steps["forward_ns"].median() > mx_steps["to_device_ns"].median()


NATIVE_SUITE = """
[suite]
name = "native"

[defaults]
framework = "{framework}"
workload = "mlp"
dataset = "digits"
steps = 10
global_batch = 96
lr = 0.1
seed = 2
partition = {{ policy = "sizes", sizes = [40, 56] }}
workers = [ {{ device = "cpu" }}, {{ device = "cpu" }} ]

[[runs]]
name = "torch-distributed"

[[runs]]
name = "native"
strategy = "{strategy}"
"""


@pytest.mark.slow
@pytest.mark.parametrize(("framework", "strategy", "logs"), [
    ("mxnet", "mxnet-kvstore", ["kvstore-scheduler.log", "kvstore-server.log"]),
    ("tensorflow", "tensorflow-collective", []),
])
def test_native_strategy_matches_torch_distributed(tmp_path: Path, write_suite, framework: str,
                                                   strategy: str, logs: list[str]) -> None:
    """A native strategy (MXNet: hetbench starts and stops ps-lite's scheduler and server;
    TensorFlow: ring all-reduce between the workers' TF servers) ends with the parameters
    of the torch.distributed path (two workers: the sums are the same two-term float
    additions, so they agree to rounding)."""
    if not installed(framework):
        pytest.skip(f"needs {framework} (pip install 'hetbench[{framework}]')")
    from hetbench.harness.records.results import load_run
    from hetbench.harness.run.launcher import run_suite
    from hetbench.harness.spec.suite import load_suite

    text = NATIVE_SUITE.format(framework=framework, strategy=strategy)
    results = run_suite(load_suite(str(write_suite(text))), tmp_path / "results")
    assert [r.status for r in results] == ["completed"] * 2, [r.reason for r in results]
    torch_params, native_params = (dict(np.load(r.run_dir / "params.npz")) for r in results)
    for name, expected in torch_params.items():
        np.testing.assert_allclose(native_params[name], expected, rtol=0, atol=1e-6,
                                   err_msg=name)
    run = load_run(results[1].run_dir)
    assert run.manifest["run"]["aggregator"]["name"] == strategy
    assert (run.steps["allreduce_ns"] > 0).all()
    check_trace(results[1].run_dir / "trace.json", run.steps)
    for log in logs:  # the strategy's own processes ran, and the launcher waited for them
        assert (results[1].run_dir / "logs" / log).is_file()


def test_native_strategy_needs_its_framework_on_every_worker() -> None:
    from hetbench.harness.spec.errors import UsageError
    from hetbench.harness.spec.suite import parse_suite

    with pytest.raises(UsageError) as info:
        parse_suite({"runs": [{"name": "r", "strategy": "mxnet-kvstore", "workers": [
            {"framework": "mxnet"}, {"framework": "pytorch"}]}]})
    assert info.value.where == "runs[0].strategy"
    assert "needs every worker on mxnet (worker 1 is pytorch)" in info.value.message
    with pytest.raises(UsageError) as info:
        parse_suite({"runs": [{"name": "r", "strategy": "horovod"}]})
    assert f"allowed: {', '.join(sorted(AGGREGATORS))}" in info.value.message
    run = parse_suite({"runs": [{"name": "r", "framework": "mxnet",
                                 "strategy": "mxnet-kvstore"}]}).runs[0]
    assert run.aggregator.name == "mxnet-kvstore"  # the older key names an aggregator
    assert parse_suite({"runs": [{"name": "r"}]}).runs[0].aggregator.name == "torch"


def test_missing_framework_fails_before_any_worker(tmp_path: Path, write_suite, hetbench) -> None:
    absent = [f for f in FRAMEWORKS if not installed(f)]
    if not absent:
        pytest.skip("every framework is installed here (the torch-only venv runs this)")
    framework = absent[0]
    suite = write_suite(f"""
[[runs]]
name = "first-ok"
steps = 2
global_batch = 8

[[runs]]
name = "needs-{framework}"
steps = 2
global_batch = 8
workers = [ {{ framework = "pytorch" }}, {{ framework = "{framework}" }} ]
""")
    result = hetbench(tmp_path, "run", str(suite), "--out", str(tmp_path / "out"))
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        f"hetbench: error: runs[1].workers[1].framework: {framework} is not installed "
        f"({install_hint(framework)})"]
    assert f"pip install 'hetbench[{framework}]'" in result.stderr
    assert not (tmp_path / "out").exists()  # not even the first run started


def test_devices_lists_every_framework(tmp_path: Path, hetbench) -> None:
    result = hetbench(tmp_path, "devices", "--json")
    assert result.returncode == 0, result.stderr
    infos = {i["framework"]: i for i in json.loads(result.stdout)}
    assert list(infos) == list(FRAMEWORKS)
    assert infos["pytorch"]["version"] == torch.__version__
    assert "cpu" in infos["pytorch"]["devices"]
    assert "torch.distributed gloo" in infos["pytorch"]["strategies"]
    for name, info in infos.items():
        if missing_framework(name):
            assert info["status"] == "not installed"
            assert install_hint(name) in info["reason"]
        else:
            assert info["status"] == "ok", info
            assert info["version"] and info["devices"] and info["strategies"]
    mixed = [n for n, k in AGGREGATORS.items() if k.framework is None]
    assert "torch" in mixed and "ps-async" in mixed
    assert infos["pytorch"]["hetbench_aggregators"] == [*mixed, "ddp"]
    assert infos["mxnet"]["hetbench_aggregators"] == [*mixed, "mxnet-kvstore", "mxnet-async"]
    if installed("mxnet"):
        assert "kvstore dist_sync" in infos["mxnet"]["strategies"]


@pytest.mark.parametrize(("body", "timeout", "reason"), [
    ("import os\nos.abort()\n", "120", "probe died with SIGABRT"),
    pytest.param("import threading\nthreading.Event().wait()\n", "10",
                 "probe timed out after 10 s", marks=pytest.mark.long),
], ids=["crash", "hang"])
def test_devices_survives_a_broken_framework(tmp_path: Path, body: str, timeout: str,
                                             reason: str, hetbench) -> None:
    """A package named mxnet that crashes or hangs on import shadows any real one (PYTHONPATH
    comes before site-packages): the CLI reports it, exits 1, and still lists the others."""
    fake = tmp_path / "fake" / "mxnet"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(body)
    env = {**os.environ, "PYTHONPATH": f"{fake.parent}:{REPO}"}
    result = hetbench(tmp_path, "devices", "--json", "--timeout", timeout, env=env)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    infos = {i["framework"]: i for i in json.loads(result.stdout)}
    assert list(infos) == list(FRAMEWORKS)
    assert infos["mxnet"]["status"] == "broken"
    assert infos["mxnet"]["reason"] == reason
    if timeout == "120":  # a short deadline could also cut a slow but healthy import
        assert infos["pytorch"]["status"] == "ok"
