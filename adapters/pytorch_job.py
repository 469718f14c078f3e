"""PyTorch adapter for a user's own job (hetbench.workloads.job.Job).

The model and loss are the user's; the parameters become views of the flat buffers exactly
as a built-in workload's (TorchAdapter.bind), so every aggregator, the optimizer and the
records treat both alike. A batch is whatever the job's collate and split make of its
samples: nested tensors are moved to the device, and the model is called as `model(x)`, or
`model(**x)` where x is a mapping. The loss handed to the step is the slice's SUM: a mean
is multiplied by the slice's samples (the leading dimension of the batch), so that the
workers' gradients add up to the global batch's (DESIGN.md, principle 4).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any, cast

import numpy as np
import torch

from hetbench.adapters.base import Batch, Loss
from hetbench.adapters.pytorch import RemoteTail, TorchAdapter
from hetbench.workloads import job as jobs
from hetbench.workloads.job import Job
from hetbench.workloads.models import ModelSpec, ParamSpec


def job_spec(job: Job, workload: str) -> ModelSpec:
    """The job's trained parameters as a spec: names and shapes in the module's order (its
    values are the module's own: ParamSpec's bound is unused)."""
    params = tuple(ParamSpec(name, tuple(p.shape), 0.0)
                   for name, p in job.model.named_parameters() if p.requires_grad)
    return ModelSpec(workload=workload, sample_shape=(), num_classes=0, params=params,
                     loss="job")


def summed_loss(job: Job, outputs: Any, targets: Any, samples: int) -> torch.Tensor:
    """The job's loss over `samples` samples as their sum (a mean times the samples)."""
    loss = job.loss(outputs, targets)
    return loss * samples if job.reduction == "mean" else loss


def to_device(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device, non_blocking=True)
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value).to(device, non_blocking=True)
    if isinstance(value, Mapping):
        return type(value)({k: to_device(v, device) for k, v in value.items()})  # type: ignore[call-arg]
    if isinstance(value, list | tuple):
        return type(value)(to_device(v, device) for v in value)
    return value


def leading_size(value: Any) -> int:
    """Samples in a batch: the leading dimension of its first tensor."""
    if isinstance(value, torch.Tensor | np.ndarray):
        return int(value.shape[0])
    items = value.values() if isinstance(value, Mapping) else value
    if isinstance(items, list | tuple) or isinstance(value, Mapping):
        for item in items:
            try:
                return leading_size(item)
            except ValueError:
                continue
    raise ValueError(f"no tensor in a batch of {type(value).__name__} to count samples by")


def split_leading(value: Any, parts: int) -> list[Any]:
    """`value` cut in `parts` along the leading dimension of each tensor in it (mappings,
    lists and tuples kept as they are around them; anything else repeated in each part)."""
    if isinstance(value, torch.Tensor):
        return list(value.tensor_split(parts))
    if isinstance(value, Mapping):
        columns = {k: split_leading(v, parts) for k, v in value.items()}
        return [type(value)({k: c[i] for k, c in columns.items()})  # type: ignore[call-arg]
                for i in range(parts)]
    if isinstance(value, list | tuple):
        items = [split_leading(v, parts) for v in value]
        return [type(value)(item[i] for item in items) for i in range(parts)]
    return [value] * parts


class TorchJobAdapter(TorchAdapter):
    def __init__(self, job: Job, workload: str, device: str, threads: int) -> None:
        torch.set_num_threads(threads)
        self.job = job
        self.bind(job_spec(job, workload), job.model, device, {})
        self.model.train()
        # the job's own optimizer (Job.optimizer), stepped in `apply`; None: the suite's
        self.own_optimizer: torch.optim.Optimizer | None = None
        # each trained parameter with its gradient's view of the flat buffer, where the
        # reduced mean gradient is when the own optimizer steps
        self._grad_views = [(p, p.grad) for p in self.model.parameters() if p.requires_grad]

    def use_own_optimizer(self) -> None:
        """The job's optimizer over the bound parameters (views of the flat buffer)."""
        self.own_optimizer = jobs.own_optimizer(self.job)

    def apply(self, scale: float) -> None:
        if self.own_optimizer is None:
            super().apply(scale)
            return
        # the gradients as the exchange left them, the global batch's mean (OwnOptimizer);
        # an overlapped exchange (DDP's buckets) may have pointed them elsewhere
        for parameter, view in self._grad_views:
            parameter.grad = view
        self.own_optimizer.step()

    @contextlib.contextmanager
    def state_kept(self) -> Iterator[None]:
        """Passes that are not training steps (the exactness check, a worker timed alone for
        the profiled policy or calibration) leave the model's buffers (BatchNorm's running
        statistics) and the random generators (dropout) as they found them."""
        buffers = {name: b.detach().clone() for name, b in self.model.named_buffers()}
        rng = torch.random.get_rng_state()
        cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
        try:
            yield
        finally:
            with torch.no_grad():
                for name, value in buffers.items():
                    self.model.get_buffer(name).copy_(value)
            torch.random.set_rng_state(rng)
            if cuda_rng is not None:
                torch.cuda.set_rng_state_all(cuda_rng)

    def initial_parameters(self) -> dict[str, np.ndarray]:
        """The module's own values (the factory's initialisation, seeded)."""
        return self.parameters()

    def to_device(self, inputs: Any, targets: Any) -> Batch:
        n = leading_size(targets if targets is not None else inputs)
        return Batch((to_device(inputs, self.device), to_device(targets, self.device), n))

    def micro_batches(self, batch: Batch, parts: int) -> list[Batch]:
        """The slice's batch in `parts` micro-batches (fewer where it has fewer samples),
        each counted by its own samples, so that their summed losses are the slice's."""
        x, y, n = cast("tuple[Any, Any, int]", batch)
        parts = max(1, min(parts, n))
        sizes = [len(t) for t in torch.arange(n).tensor_split(parts)]
        return [Batch((xi, yi, size)) for xi, yi, size in
                zip(split_leading(x, parts), split_leading(y, parts), sizes, strict=True)]

    def loss_sum(self, module: torch.nn.Module, batch: Batch) -> tuple[Any, torch.Tensor]:
        x, y, n = cast("tuple[Any, Any, int]", batch)
        outputs = module(**x) if isinstance(x, Mapping) else module(x)
        return outputs, summed_loss(self.job, outputs, y, n)

    def forward(self, batch: Batch) -> Loss:
        if self._tail is not None:  # fc-on-server: the last layer's loss comes back summed
            assert self._head is not None
            x, y, _ = cast("tuple[torch.Tensor, torch.Tensor, int]", batch)
            return Loss(RemoteTail.apply(self._head(x), y, self._tail))
        return Loss(self.loss_sum(self.forward_module, batch)[1])

    def layers(self) -> list[torch.nn.Module]:
        """The job's layers (Job.layers, checked)."""
        return jobs.job_layers(self.job, self.model)

    def evaluate(self, inputs: Any, targets: Any) -> tuple[float, float, float]:
        self.model.eval()
        try:
            with torch.no_grad():
                outputs, loss = self.loss_sum(self.model, self.to_device(inputs, targets))
                if self.job.metric is None:
                    return float(loss), 0.0, 0.0
                correct, counted = self.job.metric(outputs, to_device(targets, self.device))
                return float(loss), float(correct), float(counted)
        finally:
            self.model.train()
