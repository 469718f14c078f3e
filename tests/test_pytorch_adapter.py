"""The PyTorch adapter in one process: gradient sums over slices add up to the full-batch
gradient for every workload, and an SGD step matches torch.optim.SGD on the mean loss."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hetbench.adapters.pytorch import TorchAdapter
from hetbench.workloads import build_spec
from hetbench.workloads.data import BatchOrder, load_dataset

CASES = [("mlp", "digits"), ("cnn", "digits"), ("lstm", "text"), ("mlp", "synthetic"),
         ("cnn", "synthetic"), ("lstm", "synthetic")]


def make(workload: str, dataset: str, seed: int = 0):
    data = load_dataset(dataset, workload, seed)
    spec = build_spec(workload, data.sample_shape, data.num_classes)
    adapter = TorchAdapter(spec, "cpu", 1)
    adapter.load_parameters(spec.initial_parameters(seed))
    return data, spec, adapter


def grad_sum(adapter: TorchAdapter, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    adapter.zero_grad()
    loss = adapter.forward(adapter.to_device(x, y))
    adapter.backward(loss)
    adapter.pack(loss)
    return adapter.comm_buffer(False).clone().numpy()


@pytest.mark.parametrize(("workload", "dataset"), CASES)
def test_slice_gradients_add_up_to_full_batch(workload: str, dataset: str) -> None:
    data, spec, adapter = make(workload, dataset)
    idx = BatchOrder(len(data), 24, 0).indices(0)
    full = grad_sum(adapter, data.inputs[idx], data.targets[idx])
    parts = sum(grad_sum(adapter, data.inputs[idx[a:b]], data.targets[idx[a:b]])
                for a, b in ((0, 3), (3, 13), (13, 24)))
    assert full.shape == (spec.num_elements + 1,)
    assert np.abs(full[:-1]).max() > 0
    np.testing.assert_allclose(parts, full, rtol=1e-4, atol=1e-5)


def test_gradients_accumulate_into_the_communication_buffer() -> None:
    _, _, adapter = make("mlp", "digits")
    buffer = adapter.comm_buffer(False)
    for param in adapter.model.parameters():
        assert param.grad is not None
        assert buffer.data_ptr() <= param.grad.data_ptr() < buffer.data_ptr() + 4 * buffer.numel()
    before = [p.grad.data_ptr() for p in adapter.model.parameters()]
    data, _, _ = make("mlp", "digits")
    grad_sum(adapter, data.inputs[:8], data.targets[:8])
    assert [p.grad.data_ptr() for p in adapter.model.parameters()] == before


@pytest.mark.parametrize(("workload", "dataset"), [("cnn", "digits"), ("lstm", "text")])
def test_sgd_step_matches_torch_optimizer(workload: str, dataset: str) -> None:
    data, spec, adapter = make(workload, dataset)
    _, _, reference = make(workload, dataset)
    x, y = data.inputs[:16], data.targets[:16]
    lr = 0.05

    grad_sum(adapter, x, y)
    adapter.apply(lr / 16)

    optimizer = torch.optim.SGD(reference.model.parameters(), lr=lr)
    for p in reference.model.parameters():
        p.grad = None
    loss = reference.forward(reference.to_device(x, y)) / 16  # mean over samples
    loss.backward()
    optimizer.step()
    ours, theirs = adapter.parameters(), reference.parameters()
    for name in ours:
        np.testing.assert_allclose(ours[name], theirs[name], rtol=1e-5, atol=1e-6, err_msg=name)
    assert any(not np.allclose(ours[n], spec.initial_parameters(0)[n]) for n in ours)


def test_initial_parameters_depend_only_on_seed_and_name() -> None:
    spec = build_spec("mlp", (1, 8, 8), 10)
    a, b = spec.initial_parameters(1), spec.initial_parameters(1)
    assert all(np.array_equal(a[k], b[k]) and a[k].dtype == np.float32 for k in a)
    assert not np.array_equal(a["fc1.weight"], spec.initial_parameters(2)["fc1.weight"])
    # Same name in another model with the same shape gets the same values.
    other = build_spec("mlp", (1, 8, 8), 10)
    assert np.array_equal(other.initial_parameters(1)["fc2.weight"], a["fc2.weight"])
