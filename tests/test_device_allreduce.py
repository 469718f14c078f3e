"""Choi's strategy 2, `allreduce-device` (harness/exchange/device.py).

Without a GPU: the routing (which CPU worker's gradients go through which GPU worker) and
the relay itself in real processes over gloo, with gloo standing in for NCCL among the
"GPU" ranks: every rank must end with the sum of every rank's buffer, as an all-reduce.
With a GPU: a CPU+GPU job under allreduce-device ends with the parameters of the same job
under allreduce-host (strategy 1), within float rounding.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from hetbench.harness.exchange.device import Relay, routes


def test_cpu_workers_are_dealt_round_robin_over_the_gpu_workers() -> None:
    assert routes([True, False, False, True, False]) == {0: [1, 4], 3: [2]}
    assert routes([False, True, False]) == {1: [0, 2]}
    assert routes([True, True]) == {0: [], 1: []}
    with pytest.raises(ValueError, match="at least one worker on a cuda device"):
        routes([False, False])


def buffer_of(rank: int) -> torch.Tensor:
    """Rank r's gradient sums: distinct per rank, reproducible in the parent."""
    return torch.from_numpy(np.random.default_rng(rank).standard_normal(1001).astype(np.float32))


def relay_rank(rank: int, world: int, port: int, routing: dict[int, list[int]],
               out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        buffer = buffer_of(rank)
        relay = Relay(buffer, rank, routing, "gloo", timeout_s=30)
        for _ in range(2):  # twice: buffers reused from one step to the next
            buffer.copy_(buffer_of(rank))
            relay.exchange()
        np.save(Path(out) / f"rank{rank}.npy", buffer.numpy())
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("is_cuda", [
    [True, False, False, True, False],  # two "GPUs", one carrying two CPU workers
    [False, True, False],  # one "GPU": no all-reduce among GPUs at all
    [True, True, False],
])
def test_every_rank_ends_with_the_sum_of_every_buffer(tmp_path: Path,
                                                      is_cuda: list[bool]) -> None:
    world, routing = len(is_cuda), routes(is_cuda)
    mp.start_processes(relay_rank, args=(world, free_port(), routing, str(tmp_path)),
                       nprocs=world, start_method="spawn")
    expected = sum(buffer_of(rank).double() for rank in range(world))
    for rank in range(world):
        got = np.load(tmp_path / f"rank{rank}.npy")
        np.testing.assert_allclose(got, expected.numpy(), rtol=0, atol=1e-5,
                                   err_msg=f"rank {rank}")


GPU_SUITE = """
[suite]
name = "choi"

[defaults]
workload = "mlp"
dataset = "digits"
steps = 12
global_batch = 96
lr = 0.1
seed = 3
partition = { policy = "sizes", sizes = [48, 24, 24] }
workers = [ { device = "cuda:0" }, { device = "cpu" }, { device = "cpu" } ]

[[runs]]
name = "host"
aggregator = "allreduce-host"

[[runs]]
name = "device"
aggregator = "allreduce-device"
"""


@pytest.mark.slow
@pytest.mark.gpu
@pytest.mark.skipif(not dist.is_nccl_available(),
                    reason="allreduce-device needs NCCL; this torch has none")
def test_strategy_two_ends_with_the_parameters_of_strategy_one(tmp_path: Path,
                                                               write_suite) -> None:
    from hetbench.harness.records.results import load_run
    from hetbench.harness.run.launcher import run_suite
    from hetbench.harness.spec.suite import load_suite
    from tests.trace_check import check_trace

    results = run_suite(load_suite(str(write_suite(GPU_SUITE))), tmp_path / "out")
    assert [r.status for r in results] == ["completed"] * 2, [r.reason for r in results]
    for result in results:
        check_trace(result.run_dir / "trace.json", load_run(result.run_dir).steps)
    host, device = (dict(np.load(r.run_dir / "params.npz")) for r in results)
    for name, value in host.items():
        # float32 sums in another order, and a GPU's kernels: a looser bound than on CPUs
        np.testing.assert_allclose(device[name], value, rtol=0, atol=1e-4, err_msg=name)
