"""Stage partitioning for pipelined virtual workers (harness/partition/stages.py), checked
against an exhaustive search written here."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from hetbench.harness.partition.stages import Links, Profile, split_layers, stage_times


def exhaustive(profile: Profile, links: Links) -> float:
    """The slowest stage of the best split, by trying every split (small cases only)."""
    best = math.inf
    layers, devices = profile.layers, profile.devices
    for cuts in itertools.combinations(range(1, layers), devices - 1):
        bounds = (0, *cuts, layers)
        slowest = 0.0
        for d in range(devices):
            first, end = bounds[d], bounds[d + 1]
            capacity = (links.capacity_bytes or [None] * devices)[d]
            memory = (sum(profile.parameter_bytes[first:end]) * links.state_factor
                      + sum(profile.activation_bytes[first:end]) * links.in_flight)
            if capacity is not None and memory > capacity:
                slowest = math.inf
                break
            t = sum(profile.time_ns[d][first:end])
            if d < devices - 1:
                t += 2 * (links.latency_ns + profile.activation_bytes[end - 1] * links.ns_per_byte)
            slowest = max(slowest, t)
        best = min(best, slowest)
    return best


@pytest.mark.parametrize("seed", range(30))
def test_the_split_is_as_good_as_every_split_tried(seed: int) -> None:
    rng = np.random.default_rng(seed)
    layers, devices = int(rng.integers(3, 9)), int(rng.integers(1, 4))
    devices = min(devices, layers)
    speed = rng.uniform(1, 4, devices)  # unequal devices
    base = rng.uniform(1, 10, layers)
    profile = Profile([list(base * s) for s in speed], list(rng.uniform(0, 5, layers)),
                      list(rng.uniform(0, 3, layers)))
    capacity = [float(rng.uniform(10, 40)) if rng.random() < 0.3 else None
                for _ in range(devices)]
    links = Links(ns_per_byte=float(rng.uniform(0, 2)), latency_ns=float(rng.uniform(0, 1)),
                  capacity_bytes=capacity)
    expected = exhaustive(profile, links)
    if math.isinf(expected):
        with pytest.raises(ValueError, match="memory"):
            split_layers(profile, links)
        return
    found = split_layers(profile, links)
    assert found.slowest_ns == pytest.approx(expected)
    assert stage_times(profile, links, found.bounds) == found


def test_a_device_twice_as_fast_takes_twice_the_layers() -> None:
    # 6 equal layers, device 0 twice as fast: 4 layers on it, 2 on the slow one
    profile = Profile([[1.0] * 6, [2.0] * 6], [0.0] * 6, [0.0] * 6)
    split = split_layers(profile)
    assert split.bounds == (0, 4, 6) and split.stage_ns == (4.0, 4.0)


def test_hand_given_splits_are_checked_and_evaluated() -> None:
    profile = Profile([[1.0] * 4, [1.0] * 4], [10.0] * 4, [0.0] * 4)
    links = Links(ns_per_byte=0.5)
    # stage 0 pays the activations of layer 1 both ways: 2 + 2 x 10 x 0.5
    assert stage_times(profile, links, [0, 2, 4]).stage_ns == (12.0, 2.0)
    for bad in ([0, 4], [0, 2, 2, 4], [1, 2, 4], [0, 3, 2]):
        with pytest.raises(ValueError, match="is not 0 <"):
            stage_times(profile, links, bad)
    with pytest.raises(ValueError, match="3 layers cannot fill 4 stages"):
        split_layers(Profile([[1.0] * 3] * 4, [0.0] * 3, [0.0] * 3))
