"""Stage partitioning for pipelined virtual workers on unequal devices (HetPipe, issue 14).

A virtual worker pipelines a model over its devices in a fixed order: stage s holds the
consecutive layers [bounds[s], bounds[s+1]) on device s. With a per-layer profile of each
device (forward + backward time of every layer on it) the split that makes the slowest
stage fastest sets the pipeline's pace; a stage also pays for sending its last layer's
activations to the next stage (and their gradients back) over the link between them. A
device with a memory capacity holds only the layers whose parameters (with optimizer state)
and in-flight activations fit.

`split_layers` finds the optimal split by dynamic programming over (layers placed, stages
used): O(layers^2 x devices). `stage_times` evaluates any split, hand-given ones too, so
the chosen split and its predicted stage times can be recorded and compared with the
measured ones.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Profile:
    """Per-layer costs: `time_ns[d][l]` forward + backward of layer l on device d (one
    micro-batch); `activation_bytes[l]` what layer l sends onward; `parameter_bytes[l]`."""

    time_ns: Sequence[Sequence[float]]
    activation_bytes: Sequence[float]
    parameter_bytes: Sequence[float]

    @property
    def layers(self) -> int:
        return len(self.activation_bytes)

    @property
    def devices(self) -> int:
        return len(self.time_ns)


@dataclass(frozen=True)
class Links:
    """Between consecutive stages: ns per byte of activation sent (and its gradient back,
    the same size), and the fixed cost of one send. Memory per device: parameter bytes
    times `state_factor` (weights, gradients, optimizer state) plus `in_flight` micro-
    batches of the stage's activations, at most `capacity_bytes[d]` (None: unlimited)."""

    ns_per_byte: float = 0.0
    latency_ns: float = 0.0
    state_factor: float = 4.0
    in_flight: int = 1
    capacity_bytes: Sequence[float | None] | None = None


@dataclass(frozen=True)
class Split:
    bounds: tuple[int, ...]  # stage s holds layers bounds[s] .. bounds[s+1] - 1
    stage_ns: tuple[float, ...]  # predicted time of each stage per micro-batch

    @property
    def slowest_ns(self) -> float:
        return max(self.stage_ns)


def stage_cost(profile: Profile, links: Links, device: int, first: int, end: int,
               last_stage: bool) -> float:
    """One stage's time per micro-batch: its layers on its device, plus sending the last
    layer's activations forward and their gradients back unless it is the last stage; inf
    when the layers do not fit the device's memory."""
    if end <= first:
        return math.inf
    capacity = (links.capacity_bytes or [None] * profile.devices)[device]
    if capacity is not None:
        params = sum(profile.parameter_bytes[first:end]) * links.state_factor
        activations = sum(profile.activation_bytes[first:end]) * links.in_flight
        if params + activations > capacity:
            return math.inf
    compute = sum(profile.time_ns[device][first:end])
    if last_stage:
        return compute
    sent = profile.activation_bytes[end - 1]
    return compute + 2 * (links.latency_ns + sent * links.ns_per_byte)


def stage_times(profile: Profile, links: Links, bounds: Sequence[int]) -> Split:
    """The predicted stage times of a given split (bounds from 0 to the layer count, one
    stage per device, in order); ValueError for a split that is not one."""
    bounds = tuple(bounds)
    if (len(bounds) != profile.devices + 1 or bounds[0] != 0 or bounds[-1] != profile.layers
            or any(b >= c for b, c in zip(bounds, bounds[1:], strict=False))):
        raise ValueError(f"split {list(bounds)} is not 0 < ... < {profile.layers} with one "
                         f"non-empty stage for each of the {profile.devices} devices")
    last = profile.devices - 1
    return Split(bounds, tuple(stage_cost(profile, links, d, bounds[d], bounds[d + 1], d == last)
                               for d in range(profile.devices)))


def split_layers(profile: Profile, links: Links | None = None) -> Split:
    """The split of the layers over the devices, in order, one non-empty stage each, that
    minimises the slowest stage (ties: the first found, favouring earlier cuts)."""
    links = links or Links()
    layers, devices = profile.layers, profile.devices
    if devices < 1 or layers < devices:
        raise ValueError(f"{layers} layers cannot fill {devices} stages")
    # best[d][l]: the slowest stage of the best split of layers 0..l-1 over devices 0..d
    best = [[math.inf] * (layers + 1) for _ in range(devices)]
    cut = [[0] * (layers + 1) for _ in range(devices)]
    for end in range(1, layers + 1):
        best[0][end] = stage_cost(profile, links, 0, 0, end, devices == 1)
    for d in range(1, devices):
        last = d == devices - 1
        for end in range(d + 1, layers + 1):
            for start in range(d, end):
                slowest = max(best[d - 1][start],
                              stage_cost(profile, links, d, start, end, last))
                if slowest < best[d][end]:
                    best[d][end], cut[d][end] = slowest, start
    if math.isinf(best[devices - 1][layers]):
        raise ValueError("no split fits the devices' memory")
    bounds = [layers]
    for d in range(devices - 1, 0, -1):
        bounds.append(cut[d][bounds[-1]])
    bounds.append(0)
    return stage_times(profile, links, bounds[::-1])
