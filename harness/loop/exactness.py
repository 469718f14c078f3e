"""Is a step on slices the global batch's step? Measured, not assumed (issue 56).

Before training, every worker computes the gradient of its slice of step 0's global batch,
as the run cuts it, and the gradients are summed over the workers; rank 0 also computes the
gradient of the whole global batch alone, on the same parameters (broadcast from it). For
a model whose samples do not interact (no BatchNorm statistics taken per slice, no random
draws) the two agree to rounding; BatchNorm on slices normalises each slice by its own
statistics, and dropout draws other masks, so they differ, unless the BatchNorm layers take
the global batch's statistics (`batchnorm = "global"`). The largest difference relative to
the largest gradient goes into the manifest (`exactness`), with the layers that explain
it. The model's buffers (running statistics) and the random generators are put back
afterwards, so the run itself starts as it would have without the check.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hetbench.adapters.pytorch_job import TorchJobAdapter

# above this a difference is more than float32 rounding: sums over a batch in another order
# (a convolution picks another algorithm for another batch size) differed by up to 9e-6 of
# the largest gradient element here (the classifier example), BatchNorm's per-slice
# statistics by 0.23, dropout's masks by 0.32
ROUNDING = 1e-4
NOT_FINITE = ("not measured: the whole batch's gradient is not finite (NaN or inf in the "
              "inputs, the loss or the model's output)")


def measure(adapter: TorchJobAdapter, read: Callable[[int, int, int], tuple[Any, Any]],
            bounds: Sequence[tuple[int, int]], rank: int, described: dict[str, Any],
            alone: Callable[[], contextlib.AbstractContextManager[Any]],
            device: Any) -> dict[str, Any] | None:
    """`read(step, lo, hi)`: a slice's (inputs, targets); `bounds`: the run's slices of the
    global batch; `described`: the job as workloads.job.describe says it (its layers);
    `alone()`: what rank 0's pass over the whole batch runs within (its BatchNorm layers'
    group of one, where they gather over the workers); `device`: where the collective sums.
    Every rank calls it; rank 0 returns the measure, the others None."""
    import torch.distributed as dist

    def summed(gradient: Callable[[int, int], Any]) -> Any:
        mine = gradient(*bounds[rank]).to(device)
        dist.all_reduce(mine)
        return mine

    return _measured(adapter, read, bounds, described, rank == 0, alone, summed, "slice")


def measure_micro_batches(adapter: TorchJobAdapter,
                          read: Callable[[int, int, int], tuple[Any, Any]],
                          bounds: Sequence[tuple[int, int]], described: dict[str, Any]
                          ) -> dict[str, Any]:
    """A pipeline's measure, in one process that holds the whole model (a stage's adapter
    does): `bounds` are every micro-batch of the global batch (each virtual worker's slice
    cut as the schedule cuts it), their gradients computed one after the other and summed,
    against the whole batch's. The stages compute the same sums, a layer each, so the
    difference is the micro-batches' (BatchNorm takes a micro-batch's statistics)."""

    def summed(gradient: Callable[[int, int], Any]) -> Any:
        return sum(gradient(lo, hi) for lo, hi in bounds)

    measured = _measured(adapter, read, bounds, described, True, contextlib.nullcontext,
                         summed, "micro-batch")
    assert measured is not None
    return measured | {"micro_batches": True}


def _measured(adapter: TorchJobAdapter, read: Callable[[int, int, int], tuple[Any, Any]],
              bounds: Sequence[tuple[int, int]], described: dict[str, Any], whole_here: bool,
              alone: Callable[[], contextlib.AbstractContextManager[Any]],
              summed: Callable[[Callable[[int, int], Any]], Any], unit: str
              ) -> dict[str, Any] | None:
    """The whole batch's gradient (where `whole_here`) against `summed(gradient)`, the
    slices' gradients summed; with dropout also measured with it off. None where the whole
    batch's gradient is not computed here."""
    import torch

    grads, kept = adapter.flat_grads, adapter.state_kept
    total = bounds[-1][1]

    def gradient(lo: int, hi: int) -> torch.Tensor:
        with kept():
            adapter.zero_grad()
            if hi > lo:
                adapter.backward(adapter.forward(adapter.to_device(*read(0, lo, hi))))
                adapter.synchronize()
            return grads[:-1].detach().clone()

    def difference() -> float | None:
        """The slices' summed gradient against the whole batch's, relative."""
        whole = None
        try:
            if whole_here:
                with alone():
                    whole = gradient(0, total)
            sliced = summed(gradient)
        finally:
            adapter.zero_grad()
        if whole is None:
            return None
        scale = float(whole.abs().max())
        return float((whole - sliced.to(whole.device)).abs().max()) / scale if scale else 0.0

    measured = difference()
    # dropout's masks differ by construction: measured again with them off, what is left
    # is the rest of the model's (BatchNorm's statistics) alone. The whole model in eval
    # mode but its BatchNorm layers: a dropout inside another module's forward (attention's
    # dropout_p in Hugging Face's models) reads its module's `training`, not a Dropout's
    without = None
    if described.get("dropout"):
        model = adapter.model
        model.eval()
        for module in model.modules():
            if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
                module.train()
        try:
            without = difference()
        finally:
            model.train()
    if measured is None:
        return None
    if not math.isfinite(measured):  # NaN against NaN says nothing of the slices
        return {"step": 0, "sizes": [hi - lo for lo, hi in bounds],
                "max_relative_difference": None, "without_dropout": None,
                "reason": NOT_FINITE}
    return {"step": 0, "sizes": [hi - lo for lo, hi in bounds],
            "max_relative_difference": measured,
            "without_dropout": without,
            "reason": reason(measured, without, len(bounds), described, unit)}


def reason(difference: float, without_dropout: float | None, slices: int,
           described: dict[str, Any], unit: str = "slice") -> str:
    """Why the slices' sum is not the whole batch's gradient, from what the model holds and
    what is left with its dropout off; `unit`: what a slice is ("slice", "micro-batch")."""
    if slices < 2:
        return ("one slice: the whole batch on one worker" if unit == "slice"
                else f"one {unit}: the whole batch at once")
    global_statistics = described.get("batchnorm_statistics") == "global"
    if difference <= ROUNDING:
        return "exact up to float rounding" + (
            " (BatchNorm statistics of the global batch)"
            if global_statistics and described.get("batchnorm") else "")
    rest = difference if without_dropout is None else without_dropout
    causes = []
    if described.get("dropout"):
        causes.append(f"dropout draws other masks per {unit} ("
                      + ", ".join(described["dropout"][:4]) + ")")
    if rest > ROUNDING:
        if described.get("batchnorm") and not global_statistics:
            causes.append(f"BatchNorm statistics taken per {unit} ("
                          + ", ".join(described["batchnorm"][:4]) + ")")
        else:
            causes.append("not explained by the model's layers: a loss that is not a "
                          "per-sample mean or sum, or samples that interact in the forward")
    elif without_dropout is not None:
        causes[-1] += (f"; without dropout exact up to float rounding ({without_dropout:.1e}"
                       + (", BatchNorm statistics of the global batch)" if global_statistics
                          and described.get("batchnorm") else ")"))
    return "; ".join(causes)
