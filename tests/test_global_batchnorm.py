"""GlobalBatchNorm (harness/training/batchnorm.py): data-parallel training with BatchNorm on
unequal slices of a global batch is full-batch training.

Real processes over gloo (world sizes 1, 2 and 3, one slice empty) train four small models,
one per input rank ((N, C), (N, C, L), (N, C, H, W), (N, C, D, H, W); momentum=None and
affine=False among them), converted by convert_to_global, for two SGD steps: loss a sum
over the slice, parameter gradients summed over the ranks. One process with torch's own
BatchNorm on the whole batch is the reference for every rank's outputs, the global loss,
the gradients, and the parameters and buffers after each step. Each forward and each
backward of a layer makes exactly one all_reduce.

Tolerances: float64 |d| <= 1e-10 (1 + max|ref|); float32 |d| <= 2e-5 max(1, max|ref|).
"""

from __future__ import annotations

import multiprocessing as mp
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from hetbench.harness.run.launcher import free_port
from hetbench.harness.training.batchnorm import (
    CollectiveClock,
    GlobalBatchNorm,
    batchnorm_layers,
    convert_to_global,
)

CLASSES = 5
STEPS = 2
CASES = {  # name -> the shape of one sample
    "linear-bn1d": (7,),
    "conv1d-bn1d": (3, 8),
    "conv2d-bn2d": (3, 5, 5),
    "conv3d-bn3d": (2, 3, 3, 3),
}
DTYPES = (torch.float64, torch.float32)
TOLERANCE = {torch.float64: 1e-10, torch.float32: 2e-5}
WORKERS_TIMEOUT_S = 90.0

Records = list[dict[str, torch.Tensor]]


def build(case: str, dtype: torch.dtype) -> nn.Module:
    """The case's model with torch's BatchNorm, the same weights wherever it is built."""
    torch.manual_seed(7)
    layers: dict[str, list[nn.Module]] = {
        "linear-bn1d": [nn.Linear(7, 6), nn.BatchNorm1d(6)],
        "conv1d-bn1d": [nn.Conv1d(3, 4, 3), nn.BatchNorm1d(4, momentum=None)],
        "conv2d-bn2d": [nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4, eps=1e-3)],
        "conv3d-bn3d": [nn.Conv3d(2, 3, 2), nn.BatchNorm3d(3, affine=False, momentum=0.3)],
    }
    features = {"linear-bn1d": 6, "conv1d-bn1d": 4 * 6, "conv2d-bn2d": 4 * 25,
                "conv3d-bn3d": 3 * 8}
    model = nn.Sequential(*layers[case], nn.ReLU(), nn.Flatten(),
                          nn.Linear(features[case], CLASSES)).to(dtype)
    with torch.no_grad():  # not the identity BatchNorm starts as
        for layer in model:
            if isinstance(layer, nn.modules.batchnorm._BatchNorm) and layer.affine:
                layer.weight.uniform_(0.5, 1.5)
                layer.bias.uniform_(-0.5, 0.5)
    return model


def global_batch(case: str, size: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1234)
    x = torch.randn((size, *CASES[case]), generator=generator, dtype=torch.float64) * 2 + 1
    return x.to(dtype), torch.randint(0, CLASSES, (size,), generator=generator)


def train(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
          reduce: Callable[[torch.Tensor], None] = lambda t: None,
          count: Callable[[], int] = lambda: 0) -> Records:
    """STEPS steps of SGD with momentum on (x, y). Per step: outputs, the loss and gradients
    (summed by `reduce`), the state dict after the step, and (`count`) the all_reduces made
    by the forward and by the backward. (SGD by hand: torch.optim's first use imports
    torch._dynamo, seconds in every process.)"""
    params = dict(model.named_parameters())
    velocity: dict[str, torch.Tensor] = {}
    records: Records = []
    for _ in range(STEPS):
        for param in params.values():
            param.grad = None
        before = count()
        out = model(x)
        loss = F.cross_entropy(out, y, reduction="sum")
        in_forward = count() - before
        loss.backward()
        in_backward = count() - before - in_forward
        loss = loss.detach().clone()
        reduce(loss)
        record = {"out": out.detach().clone(), "loss": loss,
                  "collectives": torch.tensor([in_forward, in_backward])}
        with torch.no_grad():
            for name, param in params.items():
                if param.grad is None:  # unused on this rank: a zero contribution
                    param.grad = torch.zeros_like(param)
                reduce(param.grad)
                record[f"grad.{name}"] = param.grad.clone()
                v = velocity[name] = velocity.get(name, torch.zeros_like(param)) * 0.9 + param.grad
                param.sub_(0.1 * v)
        record.update({f"state.{k}": t.clone() for k, t in model.state_dict().items()})
        records.append(record)
    return records


def worker(rank: int, sizes: list[int], port: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=len(sizes), timeout=timedelta(seconds=60))
    calls = [0]
    all_reduce = dist.all_reduce

    def counted(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return all_reduce(tensor, *args, **kwargs)

    dist.all_reduce = counted  # what GlobalBatchNorm calls: counted in this process only
    try:
        start, stop = sum(sizes[:rank]), sum(sizes[:rank + 1])
        # float64: a group given explicitly; float32: the default group (None)
        groups = {torch.float64: dist.new_group(list(range(len(sizes)))), torch.float32: None}
        results = {}
        for case in CASES:
            for dtype in DTYPES:
                x, y = global_batch(case, sum(sizes), dtype)
                model = convert_to_global(build(case, dtype), groups[dtype])
                results[f"{case}/{dtype}"] = train(model, x[start:stop], y[start:stop],
                                                   reduce=all_reduce, count=lambda: calls[0])
        if len(sizes) == 2:
            results["clock"] = clocked_pass(rank, sizes)
        torch.save(results, Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


LATE_S = 0.3  # how late rank 1 comes to each collective of the clocked pass


def clocked_pass(rank: int, sizes: list[int]) -> dict[str, int]:
    """A forward and backward with a CollectiveClock, rank 1 sleeping LATE_S before each
    (its forward and the backward's first collective): rank 0 waits there, and its clock
    says so."""
    clock = CollectiveClock()
    model = convert_to_global(build("linear-bn1d", torch.float32), None)
    for layer in model.modules():
        if isinstance(layer, GlobalBatchNorm):
            layer.clock = clock
    x, y = global_batch("linear-bn1d", sum(sizes), torch.float32)
    start, stop = sum(sizes[:rank]), sum(sizes[:rank + 1])
    if rank == 1:
        time.sleep(LATE_S)
    out = model(x[start:stop])
    after_forward = clock.total_ns
    if rank == 1:
        time.sleep(LATE_S)
    F.cross_entropy(out, y[start:stop], reduction="sum").backward()
    return {"forward": after_forward, "total": clock.total_ns}


def run_workers(sizes: list[int], out: Path) -> list[dict[str, Records]]:
    """One process per slice; every one is ended before this returns, pass or fail.

    A forkserver, not spawn: the server (started clean, like a spawned process) imports
    torch once and forks each worker from it, where spawn would import torch in each of
    them (seconds of CPU apiece, most of this file's time on two cores)."""
    context = mp.get_context("forkserver")
    context.set_forkserver_preload(["torch", "torch.distributed", worker.__module__])
    port = free_port()
    procs = [context.Process(target=worker, args=(rank, sizes, port, str(out)))
             for rank in range(len(sizes))]
    try:
        for proc in procs:
            proc.start()
        deadline = time.monotonic() + WORKERS_TIMEOUT_S
        # A rank that failed leaves the others waiting in a collective: stop at once.
        while any(p.is_alive() for p in procs) and not any(p.exitcode for p in procs):
            assert time.monotonic() < deadline, f"workers still running after {WORKERS_TIMEOUT_S} s"
            time.sleep(0.05)
        assert [p.exitcode for p in procs] == [0] * len(procs), "a worker failed (stderr)"
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
                proc.join(5)
            if proc.is_alive():
                proc.kill()
            proc.join()
    return [torch.load(out / f"rank{rank}.pt") for rank in range(len(sizes))]


def assert_matches(got: torch.Tensor, want: torch.Tensor, what: str,
                   worst: dict[str, float] | None = None) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, what
    if not want.is_floating_point():
        assert torch.equal(got, want), what
        return
    scale = want.abs().max().item() if want.numel() else 0.0
    diff = (got - want).abs().max().item() if want.numel() else 0.0
    if want.dtype == torch.float64:
        bound = TOLERANCE[want.dtype] * (1 + scale)
    else:
        bound = TOLERANCE[want.dtype] * max(1.0, scale)
    if worst is not None:  # relative to the tensor's largest value; not for ~0 tensors
        key = str(want.dtype)
        worst[f"{key} abs"] = max(worst.get(f"{key} abs", 0.0), diff)
        if scale > 1e-3:
            worst[f"{key} rel"] = max(worst.get(f"{key} rel", 0.0), diff / scale)
    assert diff <= bound, f"{what}: max |difference| {diff:.3g} > {bound:.3g}"


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("sizes", [[16], [5, 11], [3, 0, 13]], ids=["1", "2", "3-one-empty"])
def test_uneven_slices_train_as_the_whole_batch(tmp_path: Path, sizes: list[int]) -> None:
    ranks = run_workers(sizes, tmp_path)
    if len(sizes) == 2:
        # rank 0 waited LATE_S in each collective for rank 1 (at least: it cannot leave
        # before rank 1 joins), and rank 1, always the later, far less
        first, second = (ranks[r].pop("clock") for r in (0, 1))
        assert first["forward"] >= 0.8 * LATE_S * 1e9, first
        assert first["total"] - first["forward"] >= 0.8 * LATE_S * 1e9, first
        assert first["total"] - second["total"] >= LATE_S * 1e9, (first, second)
    worst: dict[str, float] = {}
    for case in CASES:
        for dtype in DTYPES:
            x, y = global_batch(case, sum(sizes), dtype)
            reference = train(build(case, dtype), x, y)
            for rank, results in enumerate(ranks):
                start, stop = sum(sizes[:rank]), sum(sizes[:rank + 1])
                for step, (got, want) in enumerate(zip(results[f"{case}/{dtype}"], reference,
                                                       strict=True)):
                    where = f"{case} {dtype} rank {rank} step {step}"
                    # one all_reduce in forward, one in backward (the layer's input needs
                    # a gradient in every case)
                    assert got.pop("collectives").tolist() == [1, 1], where
                    want = {**want, "out": want["out"][start:stop]}
                    want.pop("collectives")
                    assert got.keys() == want.keys(), where
                    for key in want:
                        assert_matches(got[key], want[key], f"{where} {key}", worst)
    print(f"sizes {sizes}: worst differences {worst}")


# -- one process, no process group ----------------------------------------------------------


def test_a_slowdown_stretches_a_phase_less_what_it_waited_in_collectives() -> None:
    """CollectiveClock.outside: each call stretches its phase over the phase's time less
    the collectives' time since the previous call; a reader counts from its own last call."""
    clock = CollectiveClock()
    asked: list[tuple[int, int]] = []

    def stretch(start: int, end: int) -> int:
        asked.append((start, end))
        return end

    stretched, reader = clock.outside(stretch), clock.reader()
    clock.total_ns += 30
    assert stretched(100, 200) == 200
    assert stretched(200, 300) == 300  # nothing waited since
    clock.total_ns += 500  # more than the phase: no stretch at all, not a negative one
    assert stretched(300, 400) == 400
    assert asked == [(130, 200), (200, 300), (400, 400)]
    assert reader() == 530 and reader() == 0


@pytest.fixture
def no_collectives(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("GlobalBatchNorm communicated")

    monkeypatch.setattr(dist, "all_reduce", refuse)


class NoGroup:
    """A process group that cannot be used."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the process group was used ({name})")


def bn_like(shape: tuple[int, ...], **options: Any) -> nn.Module:
    kind = {2: nn.BatchNorm1d, 3: nn.BatchNorm1d, 4: nn.BatchNorm2d, 5: nn.BatchNorm3d}
    layer = kind[len(shape)](shape[1], **options).double()
    if layer.affine:
        with torch.no_grad():
            layer.weight.uniform_(0.5, 1.5)
            layer.bias.uniform_(-0.5, 0.5)
    return layer


SHAPES = [(6, 3), (6, 3, 4), (6, 3, 4, 5), (6, 3, 2, 3, 4)]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("shape", SHAPES)
def test_eval_uses_the_running_statistics_without_communicating(
        shape: tuple[int, ...], no_collectives: None) -> None:
    torch.manual_seed(0)
    plain = bn_like(shape)
    for _ in range(3):  # running statistics away from their start
        plain(torch.randn(shape, dtype=torch.float64) * 3 + 2)
    converted = convert_to_global(bn_like(shape), process_group=NoGroup())
    converted.load_state_dict(plain.state_dict())
    plain.eval()
    converted.eval()
    x = torch.randn(shape, dtype=torch.float64)
    assert torch.equal(converted(x), plain(x))
    empty = x[:0]
    assert converted(empty).shape == empty.shape
    # without running statistics, eval normalises with the local batch's, as BatchNorm
    untracked = bn_like(shape, track_running_stats=False).eval()
    converted = convert_to_global(untracked, process_group=NoGroup())
    assert isinstance(converted, GlobalBatchNorm) and not converted.training
    assert torch.equal(converted(x), untracked(x))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("momentum", [0.1, None])
def test_without_a_process_group_it_is_an_ordinary_batchnorm(
        shape: tuple[int, ...], momentum: float | None, no_collectives: None) -> None:
    assert not dist.is_initialized()
    torch.manual_seed(0)
    plain = bn_like(shape, momentum=momentum)
    converted = GlobalBatchNorm(shape[1], momentum=momentum).double()
    converted.load_state_dict(plain.state_dict())
    for _ in range(3):
        x = torch.randn(shape, dtype=torch.float64) * 3 + 2
        dy = torch.randn(shape, dtype=torch.float64)
        outputs = []
        for layer in (plain, converted):
            layer.zero_grad()
            xi = x.clone().requires_grad_()
            out = layer(xi)
            out.backward(dy)
            outputs.append((out, xi.grad, layer.weight.grad, layer.bias.grad))
        for got, want in zip(outputs[1], outputs[0], strict=True):
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
        for key, want in plain.state_dict().items():
            torch.testing.assert_close(converted.state_dict()[key], want, rtol=1e-12,
                                       atol=1e-12)


@pytest.mark.timeout(120)
def test_gradients_pass_gradcheck() -> None:
    layer = GlobalBatchNorm(3).double()
    with torch.no_grad():
        layer.weight.uniform_(0.5, 1.5)
        layer.bias.uniform_(-0.5, 0.5)
    x = torch.randn(5, 3, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w, b: torch.func.functional_call(
        layer, {"weight": w, "bias": b}, (x,)), (x, layer.weight, layer.bias))


@pytest.mark.timeout(120)
def test_one_value_per_channel_is_refused_in_training() -> None:
    layer = GlobalBatchNorm(3)
    for x in (torch.randn(1, 3), torch.randn(0, 3, 2, 2)):
        with pytest.raises(ValueError, match="more than 1 value per channel"):
            layer(x)
    with pytest.raises(ValueError, match="at least 2D"):
        layer(torch.randn(3))


# -- conversion -----------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_convert_keeps_the_state_dict_and_shares_its_tensors() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4, eps=1e-3, momentum=None),
        nn.Sequential(nn.Flatten(), nn.Linear(4, 6), nn.BatchNorm1d(6, affine=False)),
        nn.ModuleDict({"deep": nn.Sequential(nn.BatchNorm3d(2, track_running_stats=False)),
                       "sync": nn.SyncBatchNorm(5), "nobias": nn.BatchNorm1d(2, bias=False)}),
    ).double()
    for _ in range(2):  # buffers away from their start
        model[1](torch.randn(4, 4, 3, 3, dtype=torch.float64))
    model[2].eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    pointers = {k: v.data_ptr() for k, v in model.state_dict().items()}
    names = ["1", "2.2", "3.deep.0", "3.sync", "3.nobias"]
    assert batchnorm_layers(model) == names

    converted = convert_to_global(model)
    assert converted is model
    assert batchnorm_layers(converted) == names
    layers = dict(converted.named_modules())
    assert all(type(layers[name]) is GlobalBatchNorm for name in names)
    assert (layers["1"].eps, layers["1"].momentum) == (1e-3, None)
    assert not layers["2.2"].affine and not layers["2.2"].training
    assert not layers["3.deep.0"].track_running_stats
    assert layers["3.nobias"].bias is None and layers["3.nobias"].weight is not None
    after = converted.state_dict()
    assert after.keys() == before.keys()
    for key, value in before.items():
        assert torch.equal(after[key], value) and after[key].dtype == value.dtype, key
        assert after[key].data_ptr() == pointers[key], key

    root = nn.BatchNorm1d(3)
    group = NoGroup()
    new = convert_to_global(root, group)
    assert isinstance(new, GlobalBatchNorm) and new.process_group is group
    assert new.weight is root.weight and new.running_var is root.running_var
    assert batchnorm_layers(new) == [""]
    assert batchnorm_layers(nn.Linear(2, 2)) == []
