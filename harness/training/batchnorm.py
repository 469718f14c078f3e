"""BatchNorm over the global batch when workers hold slices of unequal sizes.

torch's nn.SyncBatchNorm refuses CPU tensors, and hetbench's workers are CPUs (gloo) as well
as GPUs (nccl). GlobalBatchNorm normalises each worker's slice with the statistics of the
whole global batch, each worker weighted by its sample count, so that data-parallel training
with BatchNorm on uneven slices is full-batch training:

- forward (training): one all_reduce (SUM) of [count, per-channel sums, sums of squares];
- backward: one all_reduce (SUM) of the per-channel sums of dy and dy * (x - mean), needed
  by the input's gradient; the weight's and bias's gradients are this worker's LOCAL sums
  (the data-parallel exchange adds them up, like any other parameter's gradient).

Every worker of the group must run forward AND backward for every step, a worker with an
empty slice (0 samples) included: it contributes zeros and gets an empty output. In eval
mode nothing is communicated (as nn.SyncBatchNorm): the running statistics are used, or,
without them (track_running_stats=False), the local batch's.

Each worker reduces its slice with float64 sums (its mean, then its spread about that mean;
the elements are read in their own precision, no float64 copy is made); the per-channel
statistics then meet in float64, combined as
Chan et al. combine partial variances (the slices' within-spread plus their means' spread
about the global mean), so no sum of squares about zero cancels, and every worker sends
the same dtype whatever its device or precision. The elementwise passes stay in the input's
precision: float64 copies of the activations cost a CPU worker more than the collectives
(docs/measurements.md, "A user's job").

A faster worker waits inside its forward and backward, in these collectives, for the
slower ones: not its compute. Layers given a `CollectiveClock` (`clock`) add the host
time they spend there to it, so that the emulated slowdown does not stretch it and the adaptive
policy does not fit it as the worker's cost (harness/loop/job.py). On a GPU the forward's
wait is measured (it reads the count back), the backward's collective only as queued.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable
from torch.nn.modules.batchnorm import _BatchNorm

__all__ = ["CollectiveClock", "GlobalBatchNorm", "batchnorm_layers", "convert_to_global"]

# The layers convert_to_global replaces (subclasses included, as convert_sync_batchnorm does).
REPLACED: tuple[type[_BatchNorm], ...] = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d,
                                           nn.SyncBatchNorm)


def _reduce_dims(x: torch.Tensor) -> list[int]:
    return [0, *range(2, x.dim())]


def _per_channel(v: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Channel vector `v` shaped to broadcast over `x` (N, C, *)."""
    return v.view(1, -1, *([1] * (x.dim() - 2)))


class CollectiveClock:
    """The host time this process has spent in GlobalBatchNorm's collectives, in all."""

    def __init__(self) -> None:
        self.total_ns = 0

    def reader(self) -> Callable[[], int]:
        """A reading of the time spent since the reader's previous call (its first: since
        it was made); each consumer keeps its own."""
        seen = self.total_ns

        def since() -> int:
            nonlocal seen
            waited, seen = self.total_ns - seen, self.total_ns
            return waited

        return since

    def outside(self, stretch: Callable[[int, int], int]) -> Callable[[int, int], int]:
        """`stretch(start, end)` of a phase (the emulated slowdown) over the phase's time
        less what it spent in the collectives: a slower device computes slower, it does not
        wait longer."""
        since = self.reader()

        def stretched(start: int, end: int) -> int:
            return stretch(min(start + since(), end), end)

        return stretched


def _all_reduce(packed: torch.Tensor, communicate: bool, group: Any,
                clock: CollectiveClock | None) -> None:
    if communicate:
        start = time.perf_counter_ns()
        dist.all_reduce(packed, op=dist.ReduceOp.SUM, group=group)
        if clock is not None:
            if packed.is_cuda:  # the forward reads the count back at once: wait here
                torch.cuda.current_stream(packed.device).synchronize()
            clock.total_ns += time.perf_counter_ns() - start


class _GlobalBatchNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        weight: torch.Tensor | None,
        bias: torch.Tensor | None,
        running_mean: torch.Tensor | None,
        running_var: torch.Tensor | None,
        eps: float,
        factor: float,
        communicate: bool,
        group: Any,
        clock: CollectiveClock | None,
    ) -> torch.Tensor:
        channels = x.shape[1]
        dims = _reduce_dims(x)
        local = x.numel() // channels
        if local:  # two passes, each summed in float64 (no float64 copy of x is made)
            mean_local = x.detach().sum(dims, dtype=torch.float64) / local
            centred = x.detach() - _per_channel(mean_local.to(x.dtype), x)
            var_local = (centred * centred).sum(dims, dtype=torch.float64) / local
        else:  # an empty slice: zeros, but it takes part in the collective all the same
            mean_local = var_local = torch.zeros(channels, dtype=torch.float64,
                                                 device=x.device)
        count = torch.full((1,), float(local), dtype=torch.float64, device=x.device)
        # per worker: n_i, n_i mean_i, n_i var_i, n_i mean_i^2 (Chan et al.'s combination)
        packed = torch.cat([count, local * mean_local, local * var_local,
                            local * mean_local * mean_local])
        _all_reduce(packed, communicate, group, clock)
        n = float(packed[0].item())
        if n <= 1:  # torch's BatchNorm refuses this too; n is the same on every worker
            raise ValueError("Expected more than 1 value per channel when training, got "
                             f"{n:.0f} over the group (input size {tuple(x.shape)} here)")
        total, within, squares = packed[1:].split(channels)
        mean = total / n
        # the within-slice spread plus the slices' means' spread about the global mean
        var = ((within + squares) / n - mean * mean).clamp_min(0.0)  # biased, as normalising
        invstd = torch.rsqrt(var + eps)

        if running_mean is not None:
            running_mean.copy_(factor * mean + (1.0 - factor) * running_mean.to(torch.float64))
        if running_var is not None:
            unbiased = var * (n / (n - 1.0))
            running_var.copy_(factor * unbiased + (1.0 - factor) * running_var.to(torch.float64))

        scale = invstd if weight is None else invstd * weight.detach().to(torch.float64)
        shift = -mean * scale
        if bias is not None:
            shift = shift + bias.detach().to(torch.float64)
        # the elementwise pass in the input's own precision: float64 copies of activations
        # cost more than the collectives on a CPU worker
        y = torch.addcmul(_per_channel(shift.to(x.dtype), x), x,
                          _per_channel(scale.to(x.dtype), x))

        ctx.save_for_backward(x, weight, mean, invstd)
        ctx.count = n
        ctx.communicate = communicate
        ctx.group = group
        ctx.clock = clock
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight, mean, invstd = ctx.saved_tensors
        channels = x.shape[1]
        dims = _reduce_dims(x)
        xmu = x - _per_channel(mean.to(x.dtype), x)
        sum_dy = dy.sum(dims, dtype=torch.float64)
        sum_dy_xmu = (dy * xmu).sum(dims, dtype=torch.float64)

        grad_input = None
        # needs_input_grad follows from the model, so it is the same on every worker: all
        # of them communicate here, or none does (as torch's sync_batch_norm).
        if ctx.needs_input_grad[0]:
            packed = torch.cat([sum_dy, sum_dy_xmu])
            clock = ctx.clock if not packed.is_cuda else None  # queued, not waited for
            _all_reduce(packed, ctx.communicate, ctx.group, clock)
            mean_dy, mean_dy_xmu = (packed / ctx.count).split(channels)
            scale = invstd if weight is None else invstd * weight.to(torch.float64)
            grad_input = ((dy - _per_channel(mean_dy.to(dy.dtype), x)
                           - xmu * _per_channel((mean_dy_xmu * invstd * invstd).to(dy.dtype),
                                                x))
                          * _per_channel(scale.to(dy.dtype), x))
        grad_weight = grad_bias = None
        if weight is not None and ctx.needs_input_grad[1]:
            grad_weight = (sum_dy_xmu * invstd).to(weight.dtype)
        if ctx.needs_input_grad[2]:
            grad_bias = sum_dy.to(dy.dtype if weight is None else weight.dtype)
        return grad_input, grad_weight, grad_bias, None, None, None, None, None, None, None


class GlobalBatchNorm(_BatchNorm):
    """BatchNorm whose training statistics are those of the group's global batch.

    A drop-in for BatchNorm1d/2d/3d (same parameters, buffers and state dict), for inputs
    (N, C), (N, C, L), (N, C, H, W) or (N, C, D, H, W). `process_group`: the workers whose
    slices make up the global batch; None: the default group, or no communication at all
    where torch.distributed is not initialised (then it is an ordinary BatchNorm).
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1,
                 affine: bool = True, track_running_stats: bool = True,
                 process_group: Any = None, device: Any = None, dtype: Any = None, *,
                 bias: bool = True) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats,
                         device=device, dtype=dtype, bias=bias)
        self.process_group = process_group
        # where its collectives' time is added (harness/loop/job.py sets it), or None
        self.clock: CollectiveClock | None = None

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")
        if input.size(1) == 0:
            raise ValueError("GlobalBatchNorm number of input channels should be non-zero")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats:
            if self.num_batches_tracked is not None:
                self.num_batches_tracked.add_(1)
                if self.momentum is None:  # cumulative moving average
                    factor = 1.0 / float(self.num_batches_tracked)
        if not self.training:  # no communication: running statistics, else the local batch's
            use_batch = self.running_mean is None and self.running_var is None
            return F.batch_norm(input, self.running_mean, self.running_var, self.weight,
                                self.bias, use_batch, factor, self.eps)
        tracked = self.track_running_stats
        communicate = self.process_group is not None or (dist.is_available()
                                                         and dist.is_initialized())
        out: torch.Tensor = _GlobalBatchNormFunction.apply(
            input, self.weight, self.bias, self.running_mean if tracked else None,
            self.running_var if tracked else None, self.eps, factor, communicate,
            self.process_group, self.clock)
        return out

    def extra_repr(self) -> str:
        return super().extra_repr() + ", global"


def convert_to_global(module: nn.Module, process_group: Any = None) -> nn.Module:
    """Replace every BatchNorm1d/2d/3d and SyncBatchNorm in `module` (recursively) by a
    GlobalBatchNorm over `process_group`, sharing the replaced layer's parameter and buffer
    tensors (the state dict keeps its keys and values). Returns `module`, or the new layer
    where `module` itself is one of them. A GlobalBatchNorm already there is kept as it is."""
    converted = module
    if isinstance(module, REPLACED) and not isinstance(module, GlobalBatchNorm):
        like = next((t for t in (module.weight, module.running_mean) if t is not None), None)
        converted = GlobalBatchNorm(
            module.num_features, module.eps, module.momentum, module.affine,
            module.track_running_stats, process_group,
            device=None if like is None else like.device,
            dtype=None if like is None else like.dtype, bias=module.bias is not None)
        if module.affine:
            converted.weight = module.weight
            converted.bias = module.bias
        converted.running_mean = module.running_mean
        converted.running_var = module.running_var
        converted.num_batches_tracked = module.num_batches_tracked
        converted.train(module.training)
        if hasattr(module, "qconfig"):
            converted.qconfig = module.qconfig
    for name, child in module.named_children():
        converted.add_module(name, convert_to_global(child, process_group))
    return converted


def batchnorm_layers(module: nn.Module) -> list[str]:
    """Qualified names of the BatchNorm layers (BatchNorm1d/2d/3d, SyncBatchNorm,
    GlobalBatchNorm) in `module`, in named_modules order; "" is `module` itself."""
    return [name for name, layer in module.named_modules()
            if isinstance(layer, (*REPLACED, GlobalBatchNorm))]
