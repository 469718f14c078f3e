"""Where a parameter-server run puts the layers (the run's `placement`; issue 14, after
arXiv 1901.05803, which finds the parameter servers' network the bottleneck of CNN
training and moves the parameter-heavy, compute-light fully connected layers onto them):

- data-parallel: every layer computed on the workers; whole tensors dealt round-robin
  over the servers, as TensorFlow's replica_device_setter places variables (the busiest
  server is the one that drew the largest tensor);
- sharded (the default): every layer computed on the workers; contiguous shards cut on
  tensor boundaries, balanced by bytes (`hetbench.harness.partition.shards.balanced_cuts`);
- fc-on-server: the convolutional layers computed on the workers, their parameters
  sharded over the servers but the last; the fully connected tail (a job's last layer,
  Job.layers, its factory called in the server too) held *and computed* by the last
  server: a worker sends the activations entering it and the labels, the server runs the
  tail forward and backward and answers with the loss sum and the activations'
  gradient, so activations cross the network instead of the tail's weights. The server
  sums the tail's gradients over every worker's samples of the step and updates once all
  have come, with the run's optimizer: the all-reduce path's mathematics (tested).

`hetbench.harness.partition.shards.segments` gives each server its pieces of the flat buffer; the
RPC functions here run in the server processes (parameter_server.serve), called by the
workers' client.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from hetbench.harness.partition.shards import Segments
from hetbench.harness.spec.suite import RunSpec
from hetbench.workloads import build_spec, get_workload
from hetbench.workloads import job as jobs
from hetbench.workloads.models import builder


def gather(buffer: torch.Tensor, pieces: Segments) -> torch.Tensor:
    return torch.cat([buffer[lo:hi] for lo, hi in pieces])


def scatter(values: torch.Tensor, buffer: torch.Tensor, pieces: Segments) -> None:
    offset = 0
    for lo, hi in pieces:
        buffer[lo:hi].copy_(values[offset:offset + hi - lo])
        offset += hi - lo


# -- the tail on its server ------------------------------------------------------------------


class TailServer:
    """The fully connected tail of the model, computed for every worker on one server."""

    def __init__(self, run: RunSpec, sample_shape: tuple[int, ...], num_classes: int,
                 first_layer: int, values: torch.Tensor) -> None:
        from hetbench.harness.training.optim import Optimizer
        from hetbench.workloads.torch_layers import parameter_range

        spec, model, all_layers, names, self.loss = _tail_model(run, sample_shape,
                                                                 num_classes)
        layers = all_layers[first_layer:]
        lo, hi = parameter_range(spec, model, layers, names)
        self.params = values.to(torch.float32).clone()
        self.grads = torch.zeros_like(self.params)
        named, start, offset = dict(model.named_parameters()), 0, 0
        for p in spec.params:  # the tail's tensors, views into one flat tensor as sent
            if lo <= start < hi:
                param = named[names.get(p.name, p.name)]
                param.data = self.params[offset:offset + p.size].view(p.shape)
                param.grad = self.grads[offset:offset + p.size].view(p.shape)
                offset += p.size
            start += p.size
        if offset != len(self.params):
            raise ValueError(f"the tail holds {offset} elements, {len(self.params)} were sent")
        self.tail = torch.nn.Sequential(*layers).train()
        self.optimizer = Optimizer(run.optimizer, run.lr, run.steps, run.global_batch,
                                   len(self.params), self.params, torch.device("cpu"))
        self.workers = run.world_size
        self.lock = threading.Lock()
        self.arrived = self.samples = self.version = 0

    def step(self, features: torch.Tensor, targets: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """One worker's tail forward and backward: (loss sum, gradient of the features);
        the update once every worker's part of the step is in."""
        with self.lock:
            features = features.detach().requires_grad_(True)
            loss = self.loss(self.tail(features), targets)
            loss.backward()
            self.arrived += 1
            self.samples += len(targets)
            if self.arrived == self.workers:
                scale = self.optimizer.update(self.version, self.grads, self.samples)
                with torch.no_grad():
                    self.params.add_(self.grads, alpha=-scale)
                self.grads.zero_()
                self.arrived = self.samples = 0
                self.version += 1
            assert features.grad is not None
            return loss.detach(), features.grad


TailLoss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _tail_model(run: RunSpec, sample_shape: tuple[int, ...], num_classes: int
                ) -> tuple[Any, torch.nn.Module, list[torch.nn.Module], dict[str, str], TailLoss]:
    """The model a tail is cut from, built in the server as the workers build theirs: its
    spec, module, layers, spec -> module parameter names, and its loss as a sum. A job's
    (its factory called, seeded: Job.layers, Job.loss) or a built-in workload's."""
    if run.is_job:
        from hetbench.adapters.pytorch_job import job_spec, summed_loss

        job = jobs.make_job(run.workload, Path(str(run.project)), run.seed)
        return (job_spec(job, run.workload), job.model, jobs.job_layers(job, job.model), {},
                lambda out, y: summed_loss(job, out, y, len(y)))
    from hetbench.adapters.pytorch import loss_sum

    spec = build_spec(run.workload, sample_shape, num_classes, run.size)
    module = builder(run.workload, "pytorch")
    model = module.build(spec)
    return (spec, model, list(module.layers(model)), getattr(module, "PARAMETER_NAMES", {}),
            lambda out, y: loss_sum(spec, out, y))


def tail_start(run: RunSpec, layers: int) -> int:
    """The first of the model's `layers` layers that the server computes: a built-in
    workload's fully connected tail (its `fc_layers`), a job's last layer (Job.layers)."""
    if run.is_job:
        return layers - 1
    fc_layers = get_workload(run.workload).fc_layers
    assert fc_layers is not None  # the suite check refuses fc-on-server without a tail
    return layers - fc_layers(run.size)


_tail: TailServer | None = None
_run: Any = None  # the run this server process serves (parameter_server.serve sets it)


def serving(run: RunSpec) -> None:
    """The run of this server process, for the tail it may hold."""
    global _run
    _run = run


def init_tail(sample_shape: tuple[int, ...], num_classes: int, first_layer: int,
              values: torch.Tensor) -> int:
    """Called once by worker 0 before any step: the tail and its initial parameters."""
    global _tail
    _tail = TailServer(_run, sample_shape, num_classes, first_layer, values)
    return len(values)


def tail_step(features: torch.Tensor, targets: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor]:
    assert _tail is not None, "tail_step before init_tail"
    return _tail.step(features, targets)


def pull_tail() -> torch.Tensor:
    """The tail's parameters now (for an evaluation or the run's end)."""
    assert _tail is not None, "pull_tail before init_tail"
    with _tail.lock:
        return _tail.params.clone()
