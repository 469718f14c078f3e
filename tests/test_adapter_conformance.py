"""One conformance suite for every installed adapter (DESIGN.md: tests).

For the same framework-neutral weights and batch, each adapter's loss and gradient sums
match the PyTorch adapter's; one SGD step through pack -> unpack -> apply matches; gradient
sums over slices add up to the full-batch gradient, and a few synchronous steps give the
same parameters for 1 worker, 2 equal and 3 unequal slices (partition invariance, in one
process: the all-reduce is a sum of the slices' communication buffers).

Tolerances (float32; summation order and kernels differ between frameworks): loss sums
rtol 1e-5; gradients per parameter |g - g_torch| <= 1e-3 |g_torch| + 1e-4 max|g_torch|;
parameters after SGD steps (lr 0.5) atol 1e-6. Observed over the six cases at batch 32:
loss sums within 1e-7 (TensorFlow) and 6e-7 (MXNet) relative; gradients within 2.5e-6
and 6e-6 of each parameter's largest gradient; parameters after one step within 3e-8
and 1.2e-7.

Frameworks that are not installed are skipped, so the suite passes in a torch-only venv.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from hetbench.adapters import FRAMEWORKS, load_adapter
from hetbench.harness.spec.optimizers import OptimizerSpec
from hetbench.harness.training.optim import Optimizer
from hetbench.workloads import WORKLOADS, build_spec, get_workload
from hetbench.workloads.data import BatchOrder, Dataset, load_dataset
from hetbench.workloads.models import ModelSpec

# framework -> the module whose absence skips its tests
MODULES = {"pytorch": "torch", "tensorflow": "tensorflow", "mxnet": "mxnet"}
# Every registered workload on its default data set (a new workload is tested without
# editing this file), plus the generated data sets where a workload takes them.
DEFAULTS = [(name, get_workload(name).default_dataset) for name in WORKLOADS]
CASES = DEFAULTS + [(name, "synthetic") for name in WORKLOADS
                    if "synthetic" in get_workload(name).datasets[1:]]
SIZE = "tiny"  # every workload's smallest size: the mathematics is the same at every size
SEED = 0
LOSS_RTOL = 1e-5
GRAD_RTOL = 1e-3
GRAD_ATOL_OF_MAX = 1e-4
GRAD_FLOOR_OF_GLOBAL_MAX = 1e-6
PARAM_ATOL = 1e-6  # after steps of lr 0.1: parameters move by ~1e-2, rounding stays ~1e-7

_cache: dict[tuple[Any, ...], tuple[ModelSpec, Any]] = {}


def installed(framework: str) -> bool:
    return importlib.util.find_spec(MODULES[framework]) is not None


@pytest.fixture(params=sorted(FRAMEWORKS))
def framework(request: pytest.FixtureRequest) -> str:
    if not installed(request.param):
        pytest.skip(f"{request.param} is not installed (pip install 'hetbench[{request.param}]')")
    return str(request.param)


def adapter_for(framework: str, workload: str, dataset: str) -> tuple[Dataset, ModelSpec, Any]:
    """One adapter per (framework, model shape) for the whole module, reset to the initial
    weights: building and tracing a model costs seconds in TensorFlow."""
    data = loaded(dataset, workload)
    prepare = get_workload(workload).prepare_heldout
    if prepare is not None:  # BERT's masking: the targets the model really trains on
        inputs, targets = prepare(data.inputs, data.targets, data.num_classes)
        data = dataclasses.replace(data, inputs=inputs, targets=targets)
    key = (framework, workload, data.sample_shape, data.num_classes)
    if key not in _cache:
        spec = build_spec(workload, data.sample_shape, data.num_classes, SIZE)
        _cache[key] = (spec, load_adapter(framework)(spec, "cpu", 1))
    spec, adapter = _cache[key]
    adapter.load_parameters(start_values(spec))
    adapter.zero_grad()
    return data, spec, adapter


@functools.cache
def loaded(dataset: str, workload: str) -> Dataset:
    """The data set, loaded once for the module (generating the scenes takes ~1 s), read-only
    so that no test changes another's."""
    data = load_dataset(dataset, workload, SEED)
    data.inputs.setflags(write=False)
    data.targets.setflags(write=False)
    return data


def start_values(spec: ModelSpec) -> dict[str, np.ndarray]:
    """The initial weights, except that parameters initialised to zero (ResNet's SkipInit
    scales) get random values: at zero they would hide the gradients behind them."""
    values = spec.initial_parameters(SEED)
    rng = np.random.default_rng(1)
    for p in spec.params:
        if p.init_bound == 0:
            values[p.name] = rng.uniform(0.2, 0.6, p.shape).astype(np.float32)
    return values


def packed(adapter: Any, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Gradient sums and loss sum, as the worker would all-reduce them (a copy)."""
    adapter.zero_grad()
    loss = adapter.forward(adapter.to_device(x, y))
    adapter.synchronize()
    adapter.backward(loss)
    adapter.pack(loss)
    adapter.synchronize()
    return adapter.comm_buffer(False).numpy().copy()


def by_parameter(spec: ModelSpec, flat: np.ndarray) -> dict[str, np.ndarray]:
    out, offset = {}, 0
    for p in spec.params:
        out[p.name] = flat[offset: offset + p.size].reshape(p.shape)
        offset += p.size
    return out


def assert_gradients_match(spec: ModelSpec, ours: np.ndarray, reference: np.ndarray) -> None:
    np.testing.assert_allclose(ours[-1], reference[-1], rtol=LOSS_RTOL, err_msg="loss sum")
    theirs = by_parameter(spec, reference[:-1])
    # a floor from the whole gradient: some parameters' true gradient is exactly zero
    # (attention's key bias: softmax ignores what it adds to every score), leaving only
    # rounding, which their own largest value cannot scale
    floor = GRAD_FLOOR_OF_GLOBAL_MAX * float(np.abs(reference[:-1]).max())
    for name, grad in by_parameter(spec, ours[:-1]).items():
        atol = GRAD_ATOL_OF_MAX * float(np.abs(theirs[name]).max()) + floor
        np.testing.assert_allclose(grad, theirs[name], rtol=GRAD_RTOL, atol=atol, err_msg=name)


def sgd_steps(adapter: Any, data: Dataset, sizes: tuple[int, ...], steps: int, lr: float,
              global_batch: int, optimizer: OptimizerSpec | None = None
              ) -> dict[str, np.ndarray]:
    """Synchronous training as the worker does it, with the all-reduce done in process: each
    slice's buffer is computed in turn and summed, the harness optimizer turns the sums into
    the update (plain SGD when none is given), then unpack and apply."""
    order = BatchOrder(len(data), global_batch, SEED)
    bounds = np.cumsum((0, *sizes))
    buffer = adapter.comm_buffer(False)
    flat = torch.from_numpy(np.concatenate([v.ravel() for v in adapter.parameters().values()]))
    harness_optimizer = Optimizer(optimizer or OptimizerSpec(), lr, steps, global_batch,
                                  adapter.spec.num_elements, flat, torch.device("cpu"))
    for step in range(steps):
        idx = order.indices(step)
        total = sum(packed(adapter, data.inputs[idx[a:b]], data.targets[idx[a:b]])
                    for a, b in zip(bounds, bounds[1:], strict=False))
        buffer.copy_(torch.from_numpy(total))  # what all-reduce leaves in every buffer
        scale = harness_optimizer.update(step, buffer[:-1])
        adapter.unpack()
        adapter.apply(scale)
        adapter.zero_grad()
        adapter.synchronize()
    return adapter.parameters()


@pytest.fixture(scope="module")
def reference() -> Callable[[str, str], tuple[Dataset, ModelSpec, Any]]:
    return lambda workload, dataset: adapter_for("pytorch", workload, dataset)


@pytest.mark.parametrize(("workload", "dataset"), CASES)
def test_loss_and_gradients_match_pytorch(framework: str, workload: str, dataset: str,
                                          reference: Any) -> None:
    data, spec, adapter = adapter_for(framework, workload, dataset)
    idx = BatchOrder(len(data), 32, SEED).indices(0)
    x, y = data.inputs[idx], data.targets[idx]
    ours = packed(adapter, x, y)
    assert ours.shape == (spec.num_elements + 1,) and ours.dtype == np.float32
    _, _, torch_adapter = reference(workload, dataset)
    expected = packed(torch_adapter, x, y)
    assert np.abs(expected[:-1]).max() > 0
    assert_gradients_match(spec, ours, expected)


@pytest.mark.parametrize(("workload", "dataset"), DEFAULTS)
def test_sgd_step_matches_pytorch(framework: str, workload: str, dataset: str,
                                  reference: Any) -> None:
    data, spec, adapter = adapter_for(framework, workload, dataset)
    ours = sgd_steps(adapter, data, (16,), steps=1, lr=0.5, global_batch=16)
    _, _, torch_adapter = reference(workload, dataset)
    expected = sgd_steps(torch_adapter, data, (16,), steps=1, lr=0.5, global_batch=16)
    initial = start_values(spec)
    for name, value in ours.items():
        assert value.shape == spec.params[[p.name for p in spec.params].index(name)].shape
        np.testing.assert_allclose(value, expected[name], rtol=0, atol=PARAM_ATOL, err_msg=name)
    assert any(not np.allclose(ours[n], initial[n], rtol=0, atol=1e-4) for n in ours)


@pytest.mark.parametrize(("workload", "dataset"), CASES)
def test_slice_gradients_add_up_to_full_batch(framework: str, workload: str,
                                              dataset: str) -> None:
    data, spec, adapter = adapter_for(framework, workload, dataset)
    idx = BatchOrder(len(data), 24, SEED).indices(1)
    full = packed(adapter, data.inputs[idx], data.targets[idx])
    parts = sum(packed(adapter, data.inputs[idx[a:b]], data.targets[idx[a:b]])
                for a, b in ((0, 3), (3, 13), (13, 24)))
    assert np.abs(full[:-1]).max() > 0
    np.testing.assert_allclose(parts, full, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("workload", "dataset"), DEFAULTS)
def test_partition_does_not_change_parameters(framework: str, workload: str,
                                              dataset: str) -> None:
    """1 worker = 2 equal = 3 unequal workers after a few steps, in every framework, with
    the harness optimizer (momentum with weight decay and a warm-up) between the steps."""
    data, spec, adapter = adapter_for(framework, workload, dataset)
    momentum = OptimizerSpec(name="momentum", momentum=0.9, weight_decay=0.01, warmup_steps=2)
    results = {}
    for sizes in ((48,), (24, 24), (5, 17, 26)):
        adapter.load_parameters(start_values(spec))
        # lr 0.05: with momentum 0.9 the effective step is 0.5, as plain SGD's tests use
        results[sizes] = sgd_steps(adapter, data, sizes, steps=3, lr=0.05, global_batch=48,
                                   optimizer=momentum)
    one = results[(48,)]
    initial = start_values(spec)
    assert any(not np.allclose(one[n], initial[n], rtol=0, atol=1e-4) for n in one)
    for sizes, params in results.items():
        for name, value in params.items():
            # rounding differences between slicings grow with how far the steps moved the
            # parameter (VGG at lr 0.5: up to 2e-5 after 3 steps)
            moved = float(np.abs(one[name] - initial[name]).max())
            np.testing.assert_allclose(value, one[name], rtol=0,
                                       atol=max(PARAM_ATOL, 1e-4 * moved),
                                       err_msg=f"{sizes}: {name}")


@pytest.mark.parametrize(("workload", "dataset"), DEFAULTS)
def test_parameters_round_trip_exactly(framework: str, workload: str, dataset: str) -> None:
    """Layout conversions (TF: transposes, HWIO, the NHWC flatten order) lose nothing."""
    _, spec, adapter = adapter_for(framework, workload, dataset)
    values = spec.initial_parameters(seed=7)
    adapter.load_parameters(values)
    out = adapter.parameters()
    assert list(out) == [p.name for p in spec.params]
    for name, value in values.items():
        assert out[name].dtype == np.float32
        np.testing.assert_array_equal(out[name], value, err_msg=name)


def test_buffer_is_stable_and_versions_are_reported(framework: str) -> None:
    """The worker registers the buffer once: it must stay the same memory every step."""
    data, spec, adapter = adapter_for(framework, "mlp", "digits")
    buffer = adapter.comm_buffer(False)
    assert buffer.dtype == torch.float32 and buffer.device.type == "cpu"
    assert buffer.shape == (spec.num_elements + 1,)
    pointer = buffer.data_ptr()
    sgd_steps(adapter, data, (8, 8), steps=2, lr=0.1, global_batch=16)
    assert adapter.comm_buffer(False).data_ptr() == pointer
    versions = type(adapter).versions()
    assert {MODULES[framework], "numpy"} <= set(versions)
    assert versions["numpy"] == np.__version__
    assert isinstance(type(adapter).synchronize_on_host, bool)


def test_mixed_framework_slices_sum_to_the_pytorch_step() -> None:
    """A mixed job in one process: each installed framework computes one slice, the sums
    meet in the buffer; every framework's step then equals PyTorch's full-batch step."""
    frameworks = [f for f in sorted(FRAMEWORKS) if installed(f)]
    if len(frameworks) < 2:
        pytest.skip("needs a second framework (pip install 'hetbench[all]')")
    workload, dataset = "cnn", "digits"
    adapters = [adapter_for(f, workload, dataset)[2] for f in frameworks]
    data, spec, torch_adapter = adapter_for("pytorch", workload, dataset)
    idx = BatchOrder(len(data), 30, SEED).indices(0)
    bounds = np.linspace(0, 30, len(adapters) + 1).astype(int)
    total = sum(packed(a, data.inputs[idx[lo:hi]], data.targets[idx[lo:hi]])
                for a, lo, hi in zip(adapters, bounds, bounds[1:], strict=False))
    assert_gradients_match(spec, total, packed(torch_adapter, data.inputs[idx],
                                               data.targets[idx]))
    expected = sgd_steps(torch_adapter, data, (30,), steps=1, lr=0.5, global_batch=30)
    for framework, adapter in zip(frameworks, adapters, strict=True):
        adapter.load_parameters(start_values(spec))
        adapter.comm_buffer(False).copy_(torch.from_numpy(total))
        adapter.unpack()
        adapter.apply(0.5 / 30)
        adapter.synchronize()
        for name, value in adapter.parameters().items():
            np.testing.assert_allclose(value, expected[name], rtol=0, atol=PARAM_ATOL,
                                       err_msg=f"{framework}: {name}")


def per_sample_reference(spec: ModelSpec, values: dict[str, np.ndarray], x: np.ndarray,
                         y: np.ndarray) -> np.ndarray:
    """Gradient sums and loss sum from a loop over single samples, written here and not in
    any adapter: the workload's torch module with the values loaded by name, each sample's
    loss computed by this test (cross-entropy; for token workloads the mean over the tokens
    that count), its gradient taken alone, and the gradients summed."""
    from hetbench.workloads.models import IGNORE, builder

    module = builder(spec.workload, "pytorch")
    model = module.build(spec).double()
    names = getattr(module, "PARAMETER_NAMES", {})
    params = dict(model.named_parameters())
    with torch.no_grad():
        for p in spec.params:
            params[names.get(p.name, p.name)].copy_(torch.from_numpy(values[p.name]))
    total = [torch.zeros(p.shape, dtype=torch.float64) for p in spec.params]
    loss_total = 0.0
    inputs = torch.from_numpy(x if x.dtype == np.int64 else x.astype(np.float64))
    for i in range(len(x)):
        logits = model(inputs[i: i + 1])[0]
        target = torch.from_numpy(np.asarray(y[i]))
        if spec.loss == "classify":
            loss = -torch.log_softmax(logits, -1)[target]
        else:
            counted = target != IGNORE
            picked = torch.log_softmax(logits, -1).gather(1, target.clamp(min=0)[:, None])[:, 0]
            loss = -(picked * counted).sum() / counted.sum()
        grads = torch.autograd.grad(loss, [params[names.get(p.name, p.name)]
                                           for p in spec.params])
        for acc, g in zip(total, grads, strict=True):
            acc += g
        loss_total += float(loss)
    flat = torch.cat([g.reshape(-1) for g in total]).numpy()
    return np.append(flat, loss_total).astype(np.float32)


@pytest.mark.parametrize(("workload", "dataset"), DEFAULTS)
def test_gradients_match_a_per_sample_loop(framework: str, workload: str, dataset: str) -> None:
    """Every adapter, PyTorch's included, against a reference that shares no code with the
    adapters' loss, flat buffers or layouts (float64, one sample at a time)."""
    data, spec, adapter = adapter_for(framework, workload, dataset)
    idx = BatchOrder(len(data), 6, SEED).indices(2)
    x, y = data.inputs[idx], data.targets[idx]
    expected = per_sample_reference(spec, start_values(spec), x, y)
    assert np.abs(expected[:-1]).max() > 0
    assert_gradients_match(spec, packed(adapter, x, y), expected)


def test_ignored_tokens_do_not_count(framework: str) -> None:
    """The token loss's IGNORE targets (padding, unmasked positions of the workloads to come)
    in every framework: a sample's loss is the mean over its counted tokens."""
    from hetbench.workloads.models import IGNORE

    data, spec, adapter = adapter_for(framework, "lstm", "text")
    idx = BatchOrder(len(data), 5, SEED).indices(3)
    x, y = data.inputs[idx], data.targets[idx].copy()
    last = y[0, -1]
    rng = np.random.default_rng(0)
    y[rng.random(y.shape) < 0.6] = IGNORE
    y[0, :-1], y[0, -1] = IGNORE, last  # one sample with a single counted token
    assert (y == IGNORE).any(axis=1).all() and (y != IGNORE).any(axis=1).all()
    expected = per_sample_reference(spec, start_values(spec), x, y)
    assert_gradients_match(spec, packed(adapter, x, y), expected)


@pytest.mark.parametrize(("workload", "dataset"), CASES)
def test_evaluate_matches_pytorch_and_leaves_parameters_alone(framework: str, workload: str,
                                                              dataset: str) -> None:
    """The held-out evaluation path (no gradient) gives PyTorch's loss sum and counts, and
    changes no parameter (MXNet's inference mode once reordered conv weights in place)."""
    data, spec, adapter = adapter_for(framework, workload, dataset)
    x, y = data.inputs[:20], data.targets[:20]
    before = adapter.parameters()
    loss, correct, counted = adapter.evaluate(x, y)
    after = adapter.parameters()
    for name, value in before.items():
        np.testing.assert_array_equal(after[name], value, err_msg=name)
    _, _, torch_adapter = adapter_for("pytorch", workload, dataset)
    expected = torch_adapter.evaluate(x, y)
    assert loss == pytest.approx(expected[0], rel=1e-5)
    assert (correct, counted) == expected[1:]
    assert counted == (float((y >= 0).sum()) if spec.loss == "tokens" else len(y))
