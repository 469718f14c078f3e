"""Aggregation as the worker does it (adapter pack + all-reduce + unpack) against a raw
dist.all_reduce of a buffer of the same size, on an in-process gloo group of world size 1:
what hetbench adds around the collective. Two processes: benchmarks/aggregation.py."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist

from hetbench.adapters.pytorch import TorchAdapter
from hetbench.harness.exchange import comm
from hetbench.workloads import build_spec

MODELS = {"mlp-digits": ((1, 8, 8), 10), "mlp-9.9M": ((1, 196, 196), 10)}


@pytest.fixture(params=list(MODELS), scope="module")
def model(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_hetbench_aggregation(benchmark: Any, gloo_world_of_one: None, model: str) -> None:
    torch.set_num_threads(1)
    adapter = TorchAdapter(build_spec("mlp", *MODELS[model]), "cpu", 1)
    buffer = adapter.comm_buffer(on_device=False)
    loss = torch.tensor(1.0)

    def aggregate() -> None:
        adapter.pack(loss)
        comm.allreduce_sum(buffer)
        adapter.unpack()

    benchmark.group = f"aggregation {model} ({buffer.numel():,} floats)"
    benchmark(aggregate)


def test_raw_all_reduce(benchmark: Any, gloo_world_of_one: None, model: str) -> None:
    torch.set_num_threads(1)
    raw = torch.ones(build_spec("mlp", *MODELS[model]).num_elements + 1)
    benchmark.group = f"aggregation {model} ({raw.numel():,} floats)"
    benchmark(dist.all_reduce, raw)
