"""The adapter contract: framework primitives only.

An adapter never times itself and never talks to other workers: harness/loop/worker.py owns the
step and calls these in order, with synchronize() at every phase boundary:

    to_device -> forward -> backward -> pack  | all-reduce |  unpack -> apply

Gradients and the loss are *sums* over the worker's samples. pack() puts the gradient sums
(in spec order) and the loss sum (last element) into comm_buffer(); after the all-reduce,
unpack() takes the global sums back and apply() does params -= scale * grads with
scale = lr / global sample count. When the aggregator returns parameters instead of sums
(harness/exchange), load_buffer() takes them in place of unpack() and apply().

The worker calls synchronize() at phase boundaries when the device is a GPU, or when the
adapter sets `synchronize_on_host` (frameworks whose host operators run asynchronously,
like MXNet's engine), so that a phase ends only when its work has ended.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NewType, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    import torch

    from hetbench.workloads.models import ModelSpec

# What the loop hands from one primitive to the next without looking inside: the
# framework's own tensors, opaque to all but the adapter that made them (which casts them
# back). mypy keeps a batch from being passed where a loss is due.
Batch = NewType("Batch", object)
Loss = NewType("Loss", object)


class TimingEvent(Protocol):
    """A device event the phase timer records on the worker's stream (torch.cuda.Event)."""

    def record(self) -> None: ...

    def synchronize(self) -> None: ...

    def elapsed_time(self, end_event: TimingEvent, /) -> float:
        """Milliseconds from this event to `end_event` (both recorded)."""
        ...


class Adapter(Protocol):
    framework: str
    spec: ModelSpec
    # True when operators return before their work has run, even on the CPU
    synchronize_on_host: bool

    def __init__(self, spec: ModelSpec, device: str, threads: int) -> None: ...

    @staticmethod
    def versions() -> dict[str, str]:
        """Framework and library versions for the manifest (the framework's and numpy's)."""
        ...

    @staticmethod
    def probe() -> dict[str, Any]:
        """What `hetbench devices` shows of the framework here, asked in a process of its
        own (harness/run/probe.py): {"version", "devices", "strategies"}."""
        ...

    def load_parameters(self, values: dict[str, np.ndarray]) -> None: ...

    def parameters(self) -> dict[str, np.ndarray]:
        """Current parameters by spec name, float32 on the host."""
        ...

    def comm_buffer(self, on_device: bool) -> torch.Tensor:
        """The flat torch buffer (spec.num_elements + 1 floats) that is all-reduced."""
        ...

    def to_device(self, inputs: np.ndarray, targets: np.ndarray) -> Batch: ...

    def forward(self, batch: Batch) -> Loss:
        """Returns a handle on the loss sum over the batch."""
        ...

    def backward(self, loss: Loss) -> None: ...

    def pack(self, loss: Loss) -> None: ...

    def unpack(self) -> None: ...

    def apply(self, scale: float) -> None: ...

    def load_buffer(self) -> None:
        """The communication buffer (spec order, without its loss slot) becomes the
        parameters: for aggregators whose exchange returns parameters (a parameter
        server's pull, local SGD's average) instead of gradient sums."""
        ...

    def zero_grad(self) -> None: ...

    def synchronize(self) -> None: ...

    def evaluate(self, inputs: np.ndarray, targets: np.ndarray) -> tuple[float, float, float]:
        """Held-out evaluation of a shard, outside any timed step: (loss sum, hits, count)
        (harness/training/evaluation.py)."""
        ...


@runtime_checkable
class DeviceEvents(Protocol):
    """An adapter whose GPU work can be timed by events on its device's stream (the loop's
    CudaEventTimer) instead of a wait at every phase boundary."""

    def cuda_event(self) -> TimingEvent:
        """A timing event on the current stream of this worker's device."""
        ...


class TorchLayersAdapter(Adapter, Protocol):
    """An adapter whose model is a torch.nn.Module cut into layers (a framework with
    `torch_layers` in harness/spec/frameworks.py): what pipeline stages and a layer
    computed on a parameter server reach beyond the step's primitives."""

    model: torch.nn.Module
    flat_params: torch.Tensor  # the parameters, flat in spec order (views back the model's)
    flat_grads: torch.Tensor
    torch_names: dict[str, str]  # a spec parameter's name -> the module's, where they differ

    def layers(self) -> list[torch.nn.Module]:
        """The model's layers, in order: composed, they compute its forward."""
        ...

    def place_tail(self, first_layer: int,
                   compute: Callable[[torch.Tensor, torch.Tensor],
                                     tuple[torch.Tensor, torch.Tensor]]) -> None:
        """From layer `first_layer` on, the model's forward and backward are `compute`'s
        (features, targets) -> (loss sum, features' gradient): a parameter server's."""
        ...
