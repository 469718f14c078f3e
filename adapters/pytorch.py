"""PyTorch adapter.

Parameters and gradients live in two flat tensors; each module parameter is a view into
them. Autograd accumulates into the existing .grad views in place, so on a host worker the
gradient buffer *is* the communication buffer (pack costs one float for the loss) and the
SGD update is one fused add over all parameters. (DDP's own all-reduce, the `ddp`
aggregator's default, hands the gradients to its buckets instead and copies the sums into
the gradient buffer after the backward: harness/exchange/ddp.py.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import numpy as np
import torch
import torch.nn.functional as F

from hetbench.adapters.base import Batch, Loss
from hetbench.workloads.models import IGNORE, ModelSpec, builder


def loss_sum(spec: ModelSpec, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The loss summed over samples (hetbench.workloads.models: the two loss kinds)."""
    if spec.loss == "classify":
        return F.cross_entropy(logits, y, reduction="sum")
    per_token = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1),
                                reduction="none", ignore_index=IGNORE).view(y.shape)
    counted = (y != IGNORE).sum(1).clamp(min=1)
    return (per_token.sum(1) / counted).sum()


def hits(spec: ModelSpec, logits: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """(correct predictions, predictions counted): labels, or tokens that count."""
    correct = logits.argmax(-1) == y
    if spec.loss == "classify":
        return float(correct.sum()), float(y.numel())
    counted = y != IGNORE
    return float((correct & counted).sum()), float(counted.sum())


TailCompute = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


class RemoteTail(torch.autograd.Function):
    """The loss of a tail computed elsewhere, forward and backward at once: the backward
    hands on the gradient that came back with the loss."""

    @staticmethod
    def forward(ctx: Any, features: torch.Tensor, targets: torch.Tensor,
                compute: TailCompute) -> torch.Tensor:
        loss, grad = compute(features.detach(), targets)
        ctx.save_for_backward(grad)
        return loss

    @staticmethod
    def backward(ctx: Any, upstream: torch.Tensor) -> tuple[Any, None, None]:
        (grad,) = ctx.saved_tensors
        return grad * upstream, None, None


class TorchAdapter:
    framework = "pytorch"
    synchronize_on_host = False  # CPU kernels run in the calling thread

    def __init__(self, spec: ModelSpec, device: str, threads: int) -> None:
        torch.set_num_threads(threads)
        workload = builder(spec.workload, "pytorch")
        self.bind(spec, workload.build(spec), device, getattr(workload, "PARAMETER_NAMES", {}))

    def bind(self, spec: ModelSpec, model: torch.nn.Module, device: str,
             torch_names: dict[str, str]) -> None:
        """The model on the device, its parameters views of the flat buffers in spec order
        (`torch_names`: a spec name -> the module's name, where they differ)."""
        self.spec = spec
        self.torch_names = torch_names
        self.device = torch.device(device)
        self.model = model.to(self.device)
        # what the training forward runs: the model, or a wrapper of it that hooks its
        # backward (DDP: harness/exchange/ddp.py); evaluation always runs the model
        self.forward_module: torch.nn.Module = self.model
        # d(loss)/d(loss) the backward starts from; None: 1. An exchange that averages where
        # hetbench sums (DDP's own all-reduce) sets its number of workers.
        self.backward_seed: torch.Tensor | None = None
        n = spec.num_elements
        self.flat_params = torch.zeros(n, device=self.device)
        self.flat_grads = torch.zeros(n + 1, device=self.device)  # last element: loss sum
        named = {name: p for name, p in self.model.named_parameters() if p.requires_grad}
        if len(named) != len(spec.params):  # a parameter outside the spec would never train
            raise ValueError(f"{spec.workload}: the torch model has {len(named)} parameters, "
                             f"the spec {len(spec.params)}")
        offset = 0
        for p in spec.params:
            param = named[torch_names.get(p.name, p.name)]
            if tuple(param.shape) != p.shape:
                raise ValueError(f"{p.name}: torch shape {tuple(param.shape)} != spec {p.shape}")
            with torch.no_grad():  # the module's own values, where no spec draws them (a job)
                self.flat_params[offset : offset + p.size].copy_(param.detach().reshape(-1))
            param.data = self.flat_params[offset : offset + p.size].view(p.shape)
            param.grad = self.flat_grads[offset : offset + p.size].view(p.shape)
            offset += p.size
        self._host_buffer: torch.Tensor | None = None
        # fc-on-server (harness/exchange/placement.py): the layers before the tail, and
        # what computes the tail elsewhere
        self._head: torch.nn.Module | None = None
        self._tail: TailCompute | None = None

    @staticmethod
    def versions() -> dict[str, str]:
        return {"torch": torch.__version__, "numpy": np.__version__}

    @staticmethod
    def probe() -> dict[str, Any]:
        import torch.distributed as dist

        devices = ["cpu"] + [f"cuda:{i} ({torch.cuda.get_device_name(i)})"
                             for i in range(torch.cuda.device_count())]
        backends = [b for b, ok in (("gloo", dist.is_gloo_available()),
                                    ("nccl", dist.is_nccl_available()),
                                    ("mpi", dist.is_mpi_available()),
                                    ("ucc", getattr(dist, "is_ucc_available", lambda: False)()))
                    if ok]
        return {"version": torch.__version__, "devices": devices,
                "strategies": [f"torch.distributed {b}" for b in backends]}

    def load_parameters(self, values: dict[str, np.ndarray]) -> None:
        flat = np.concatenate([values[p.name].ravel() for p in self.spec.params])
        self.flat_params.copy_(torch.from_numpy(flat.astype(np.float32)))

    def parameters(self) -> dict[str, np.ndarray]:
        flat = self.flat_params.detach().cpu().numpy()
        out, offset = {}, 0
        for p in self.spec.params:
            out[p.name] = flat[offset : offset + p.size].reshape(p.shape).copy()
            offset += p.size
        return out

    def comm_buffer(self, on_device: bool) -> torch.Tensor:
        if on_device or self.device.type == "cpu":
            return self.flat_grads
        # gloo reduces host memory: a pinned staging buffer, copied in pack and out in unpack
        self._host_buffer = torch.zeros(self.flat_grads.numel(), pin_memory=True)
        return self._host_buffer

    def to_device(self, inputs: np.ndarray, targets: np.ndarray) -> Batch:
        return Batch(self._tensors(inputs, targets))

    def _tensors(self, inputs: np.ndarray, targets: np.ndarray
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.from_numpy(inputs).to(self.device, non_blocking=True)
        y = torch.from_numpy(targets).to(self.device, non_blocking=True)
        return x, y

    def forward(self, batch: Batch) -> Loss:
        x, y = cast("tuple[torch.Tensor, torch.Tensor]", batch)
        if self._tail is not None:
            assert self._head is not None
            return Loss(RemoteTail.apply(self._head(x), y, self._tail))
        return Loss(loss_sum(self.spec, self.forward_module(x), y))

    def layers(self) -> list[torch.nn.Module]:
        """The workload's layers (its builder's `layers`)."""
        return list(builder(self.spec.workload, "pytorch").layers(self.model))

    def place_tail(self, first_layer: int, compute: TailCompute) -> None:
        """Layers from `first_layer` on (`layers()`) are computed elsewhere: the forward
        phase runs the ones before and hands their output and the labels to `compute`,
        which returns the loss sum and the output's gradient."""
        self._head = torch.nn.Sequential(*self.layers()[:first_layer])
        self._tail = compute

    def evaluate(self, inputs: np.ndarray, targets: np.ndarray) -> tuple[float, float, float]:
        with torch.no_grad():
            x, y = self._tensors(inputs, targets)
            logits = self.model(x)
            return (float(loss_sum(self.spec, logits, y)), *hits(self.spec, logits, y))

    def backward(self, loss: Loss) -> None:
        cast("torch.Tensor", loss).backward(self.backward_seed)

    def pack(self, loss: Loss) -> None:
        self.flat_grads[-1:].copy_(cast("torch.Tensor", loss).detach().reshape(1))
        if self._host_buffer is not None:
            # Blocking: gloo reads this host buffer from the CPU as soon as pack returns,
            # also in the untimed loop, which does not synchronise the device.
            self._host_buffer.copy_(self.flat_grads)

    def unpack(self) -> None:
        if self._host_buffer is not None:
            self.flat_grads.copy_(self._host_buffer, non_blocking=True)

    def apply(self, scale: float) -> None:
        with torch.no_grad():
            self.flat_params.add_(self.flat_grads[:-1], alpha=-scale)

    def load_buffer(self) -> None:
        source = self._host_buffer if self._host_buffer is not None else self.flat_grads
        self.flat_params.copy_(source[:-1], non_blocking=True)

    def zero_grad(self) -> None:
        self.flat_grads.zero_()

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def cuda_event(self) -> torch.cuda.Event:
        """A timing event on the current stream of this worker's device (harness/loop/timer.py;
        the worker made the device current: hetbench.harness.exchange.comm.init)."""
        return torch.cuda.Event(enable_timing=True)
