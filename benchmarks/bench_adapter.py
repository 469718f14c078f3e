"""The PyTorch adapter's pack and unpack: per step, gradients into the communication buffer
and back. On a host worker the gradient buffer is the communication buffer, so both should
cost next to nothing whatever the model size; with a GPU they copy through a pinned buffer."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from hetbench.adapters.pytorch import TorchAdapter
from hetbench.workloads import build_spec

# (sample shape, classes): the MLP on digits (85k floats) and one of 9.9M floats
MODELS = {"mlp-digits": ((1, 8, 8), 10), "mlp-9.9M": ((1, 196, 196), 10)}
DEVICES = ["cpu"] + (["cuda:0"] if torch.cuda.is_available() else [])


@pytest.fixture(params=list(MODELS), scope="module")
def model(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.mark.parametrize("device", DEVICES)
def test_pack(benchmark: Any, model: str, device: str) -> None:
    torch.set_num_threads(1)
    adapter = TorchAdapter(build_spec("mlp", *MODELS[model]), device, 1)
    adapter.comm_buffer(on_device=False)
    loss = torch.tensor(1.0, device=device)

    def pack() -> None:
        adapter.pack(loss)
        adapter.synchronize()

    benchmark.group = f"adapter pack/unpack {model} {device}"
    benchmark(pack)


@pytest.mark.parametrize("device", DEVICES)
def test_unpack(benchmark: Any, model: str, device: str) -> None:
    torch.set_num_threads(1)
    adapter = TorchAdapter(build_spec("mlp", *MODELS[model]), device, 1)
    adapter.comm_buffer(on_device=False)

    def unpack() -> None:
        adapter.unpack()
        adapter.synchronize()

    benchmark.group = f"adapter pack/unpack {model} {device}"
    benchmark(unpack)
