"""Optimizers applied once, in torch, on the flat reduced gradient buffer (DESIGN.md: the
step, generalised), so every framework takes exactly the same update and a partition never
changes the parameters.

After the all-reduce the buffer holds the global gradient *sums* (spec order, loss last).
`Optimizer.update()` turns them in place into the update direction d and returns the scale
s; the adapter then applies `params -= s * d` with its own fused kernel (torch add_, MXNet
sgd_update, TensorFlow ResourceApplyGradientDescent). Plain SGD leaves the buffer alone and
folds the division by the global batch into s, so it costs nothing over the old loop.

Semantics follow torch.optim (tested against it): SGD with momentum (dampening 0, optional
Nesterov), AdamW with decoupled weight decay and bias correction; weight decay for SGD and
momentum is L2 added to the gradient. The learning rate follows a schedule: linear warm-up
from lr / warmup_steps, then constant, cosine or linear decay to min_lr at the last step.
"""

from __future__ import annotations

import math
from typing import Any

from hetbench.harness.spec.optimizers import OptimizerSpec


def learning_rate(spec: OptimizerSpec, lr: float, step: int, steps: int) -> float:
    """The rate of step `step` (0-based) of a run of `steps` steps."""
    if step < spec.warmup_steps:
        return lr * (step + 1) / spec.warmup_steps
    if spec.decay == "none":
        return lr
    span = max(steps - spec.warmup_steps - 1, 1)
    progress = min((step - spec.warmup_steps) / span, 1.0)
    if spec.decay == "cosine":
        return spec.min_lr + (lr - spec.min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))
    return lr - (lr - spec.min_lr) * progress


class Optimizer:
    """One worker's optimizer state (every worker keeps the same state and takes the same
    update: the inputs are the same reduced sums). `initial` are the parameters in spec
    order, needed only for weight decay: a shadow copy follows every update, so the
    optimizer never reads a framework's own (possibly re-laid-out) parameters."""

    def __init__(self, spec: OptimizerSpec, lr: float, steps: int, global_batch: int,
                 num_elements: int, initial: Any, device: Any) -> None:
        import torch

        self.spec, self.lr, self.steps, self.global_batch = spec, lr, steps, global_batch
        self._t = 0
        zeros = lambda: torch.zeros(num_elements, device=device)  # noqa: E731
        self._params = (initial.to(device=device, dtype=torch.float32).clone()
                        if spec.weight_decay > 0 else None)
        self._velocity = zeros() if spec.name == "momentum" else None
        self._m = zeros() if spec.name == "adamw" else None
        self._v = zeros() if spec.name == "adamw" else None
        self._work = zeros() if spec.name != "sgd" else None

    def update(self, step: int, grads: Any, samples: int | None = None) -> float:
        """`grads`: gradient sums over `samples` samples (default: the global batch; fewer
        for a local step or a backup worker's partial sum) -- for the all-reduce the
        reduced sums, the buffer without its loss slot -- turned in place into the
        direction; returns the scale the adapter applies it with."""
        lr = learning_rate(self.spec, self.lr, step, self.steps)
        spec, params = self.spec, self._params
        count = samples or self.global_batch
        if spec.name == "sgd":
            if params is None:
                return lr / count
            grads.div_(count).add_(params, alpha=spec.weight_decay)
            params.add_(grads, alpha=-lr)
            return lr
        grads.div_(count)
        if spec.name == "momentum":
            if params is not None:
                grads.add_(params, alpha=spec.weight_decay)
            velocity = self._velocity
            assert velocity is not None
            if self._t:
                velocity.mul_(spec.momentum).add_(grads)
            else:  # torch.optim.SGD starts the buffer at the first gradient
                velocity.copy_(grads)
            if spec.nesterov:
                grads.add_(velocity, alpha=spec.momentum)
            else:
                grads.copy_(velocity)
        else:  # adamw
            m, v, work = self._m, self._v, self._work
            assert m is not None and v is not None and work is not None
            t = self._t + 1
            m.mul_(spec.beta1).add_(grads, alpha=1.0 - spec.beta1)
            v.mul_(spec.beta2).addcmul_(grads, grads, value=1.0 - spec.beta2)
            # m_hat / (sqrt(v_hat) + eps), as torch.optim.AdamW
            work.copy_(v).div_(1.0 - spec.beta2 ** t).sqrt_().add_(spec.eps)
            grads.copy_(m).div_(1.0 - spec.beta1 ** t).div_(work)
            if params is not None:
                grads.add_(params, alpha=spec.weight_decay)
        self._t += 1
        if params is not None:
            params.add_(grads, alpha=-lr)
        return lr

    def state(self) -> list[Any]:
        """Every tensor of the state, and the step count as a one-element tensor: what a
        worker taken back into the run receives from one that kept training."""
        import torch

        tensors = [t for t in (self._params, self._velocity, self._m, self._v) if t is not None]
        device = tensors[0].device if tensors else "cpu"
        return [*tensors, torch.tensor([float(self._t)], dtype=torch.float64, device=device)]

    def load_state(self, values: list[Any]) -> None:
        """The state another worker's `state()` gave, in the same order."""
        tensors = [t for t in (self._params, self._velocity, self._m, self._v) if t is not None]
        for mine, theirs in zip(tensors, values[:-1], strict=True):
            mine.copy_(theirs)
        self._t = int(values[-1].item())

    def state_bytes(self) -> bytes:
        """What of the state is not in `state()`'s tensors: nothing."""
        return b""

    def load_state_bytes(self, payload: bytes) -> None:
        """`state_bytes()` of another worker: nothing to load."""

    def set_parameters(self, values: Any) -> None:
        """The parameters changed outside this optimizer (an average of workers' parameters):
        the shadow copy weight decay reads follows them."""
        if self._params is not None:
            self._params.copy_(values)


class OwnOptimizer:
    """A job's own torch optimizer (Job.optimizer) in the Optimizer's place: `update` makes
    the reduced sums the global batch's mean gradient, in place (the parameters' gradients
    are views of them), and the adapter's `apply` steps the torch optimizer on it
    (TorchJobAdapter), its learning rate and state its own."""

    def __init__(self, global_batch: int, stepped: Any = None) -> None:
        self.global_batch = global_batch
        self.stepped = stepped  # the torch optimizer the adapter steps

    def update(self, step: int, grads: Any, samples: int | None = None) -> float:
        grads.div_(samples or self.global_batch)
        return 1.0

    def state(self) -> list[Any]:
        """No tensors of fixed shapes: torch's state is made at its first step, its shape
        the optimizer's own (`state_bytes`)."""
        return []

    def load_state(self, values: list[Any]) -> None:
        """`state()` of another worker: nothing."""

    def state_bytes(self) -> bytes:
        """The torch optimizer's `state_dict()` (its per-parameter state, its groups'
        hyperparameters), serialized by torch: what a worker taken back into the run
        receives from one that kept training."""
        import io

        import torch

        assert self.stepped is not None
        buffer = io.BytesIO()
        torch.save(self.stepped.state_dict(), buffer)
        return buffer.getvalue()

    def load_state_bytes(self, payload: bytes) -> None:
        """Another worker's `state_bytes()`, loaded as torch loads a state dict: onto this
        worker's parameters, in the groups' order, on their devices."""
        import io

        import torch

        assert self.stepped is not None
        self.stepped.load_state_dict(torch.load(io.BytesIO(payload), weights_only=True))

