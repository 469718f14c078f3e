"""The harness optimizer (harness/training/optim.py) against torch.optim and torch's LR schedulers:
the reference is torch's own implementation, not ours. The harness path is what the worker
does: global gradient sums in the buffer, update() in place, then params -= scale * buffer.
"""

from __future__ import annotations

import math

import pytest
import torch

from hetbench.harness.spec.optimizers import OptimizerSpec
from hetbench.harness.training.optim import Optimizer, learning_rate

STEPS, BATCH, LR, N = 12, 32, 0.05, 200


def torch_reference(spec: OptimizerSpec, initial: torch.Tensor, sums: list[torch.Tensor]
                    ) -> torch.Tensor:
    param = torch.nn.Parameter(initial.clone())
    if spec.name == "adamw":
        opt: torch.optim.Optimizer = torch.optim.AdamW(
            [param], lr=LR, betas=(spec.beta1, spec.beta2), eps=spec.eps,
            weight_decay=spec.weight_decay)
    else:
        opt = torch.optim.SGD([param], lr=LR, weight_decay=spec.weight_decay,
                              momentum=spec.momentum if spec.name == "momentum" else 0.0,
                              nesterov=spec.nesterov)
    schedulers: list[torch.optim.lr_scheduler.LRScheduler] = []
    if spec.warmup_steps:
        schedulers.append(torch.optim.lr_scheduler.LinearLR(
            opt, start_factor=1 / spec.warmup_steps, end_factor=1.0,
            total_iters=spec.warmup_steps - 1))
    decay_steps = STEPS - spec.warmup_steps - 1
    if spec.decay == "cosine":
        schedulers.append(torch.optim.lr_scheduler.CosineAnnealingLR(
            opt, T_max=decay_steps, eta_min=spec.min_lr))
    elif spec.decay == "linear":
        schedulers.append(torch.optim.lr_scheduler.LinearLR(
            opt, start_factor=1.0, end_factor=spec.min_lr / LR, total_iters=decay_steps))
    schedule = (torch.optim.lr_scheduler.SequentialLR(opt, schedulers, [spec.warmup_steps])
                if len(schedulers) == 2 else schedulers[0] if schedulers else None)
    for total in sums:
        param.grad = total / BATCH  # the mean loss's gradient
        opt.step()
        if schedule is not None:
            schedule.step()
    return param.detach()


def harness_path(spec: OptimizerSpec, initial: torch.Tensor, sums: list[torch.Tensor]
                 ) -> torch.Tensor:
    params = initial.clone()
    optimizer = Optimizer(spec, LR, STEPS, BATCH, N, initial, torch.device("cpu"))
    for step, total in enumerate(sums):
        buffer = total.clone()
        scale = optimizer.update(step, buffer)
        params.add_(buffer, alpha=-scale)  # what every adapter's apply() does
    return params


CASES = {
    "sgd": OptimizerSpec(),
    "sgd weight decay, warm-up, cosine": OptimizerSpec(weight_decay=0.1, warmup_steps=3,
                                                        decay="cosine", min_lr=0.001),
    "momentum": OptimizerSpec(name="momentum", momentum=0.9),
    "nesterov, weight decay, linear decay": OptimizerSpec(
        name="momentum", momentum=0.8, nesterov=True, weight_decay=0.01, decay="linear",
        min_lr=0.005),
    "adamw": OptimizerSpec(name="adamw"),
    "adamw weight decay, warm-up, cosine": OptimizerSpec(
        name="adamw", beta1=0.8, beta2=0.99, weight_decay=0.05, warmup_steps=4,
        decay="cosine"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_update_equals_torch_optim(case: str) -> None:
    spec = CASES[case]
    gen = torch.Generator().manual_seed(0)
    initial = torch.randn(N, generator=gen)
    sums = [torch.randn(N, generator=gen) * BATCH for _ in range(STEPS)]
    expected = torch_reference(spec, initial, sums)
    ours = harness_path(spec, initial, sums)
    assert (expected - initial).abs().max() > 1e-2  # it moved
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=2e-6)


def test_schedule_values() -> None:
    warm = OptimizerSpec(warmup_steps=4, decay="cosine", min_lr=0.0)
    assert [learning_rate(warm, 1.0, s, 9) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert learning_rate(warm, 1.0, 8, 9) == pytest.approx(0.0, abs=1e-12)  # the last step
    assert learning_rate(warm, 1.0, 6, 9) == pytest.approx(0.5 * (1 + math.cos(math.pi / 2)))
    linear = OptimizerSpec(decay="linear", min_lr=0.1)
    assert learning_rate(linear, 1.0, 0, 11) == 1.0
    assert learning_rate(linear, 1.0, 5, 11) == pytest.approx(0.55)
    assert learning_rate(OptimizerSpec(), 0.3, 99, 10) == 0.3


def test_plain_sgd_leaves_the_buffer_alone() -> None:
    """The default path costs nothing: no state, no write, scale = lr / global batch."""
    optimizer = Optimizer(OptimizerSpec(), LR, STEPS, BATCH, N, torch.zeros(N),
                          torch.device("cpu"))
    buffer = torch.arange(N, dtype=torch.float32)
    assert optimizer.update(0, buffer) == LR / BATCH
    assert torch.equal(buffer, torch.arange(N, dtype=torch.float32))
