"""Batch partitioning: which contiguous slice of the global batch each worker computes.

A partition is a tuple of slice sizes in rank order that sums to the global batch, each at
least 1. It never changes the mathematics (DESIGN.md principle 4), only who computes what.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

# name -> description; the policies themselves are the functions below (issue 5 adds
# adaptive ones behind the same names-to-sizes contract).
POLICIES: dict[str, str] = {
    "equal": "global batch split as evenly as possible",
    "sizes": "explicit slice sizes, one per worker",
    "weights": "sizes in proportion to given weights",
    "profiled": "each worker timed alone, sizes in proportion to measured throughput",
}


def largest_remainder(total: int, weights: Sequence[float], minimum: int = 1) -> tuple[int, ...]:
    """Integer sizes summing exactly to total, proportional to weights, each >= minimum.

    Quotas are rounded by the largest-remainder (Hamilton) method, ties going to the lower
    rank so every rank computes the same answer; a slice below the minimum is then topped
    up one sample at a time from the largest slice.
    """
    n = len(weights)
    if n == 0:
        raise ValueError("no workers")
    if total < n * minimum:
        raise ValueError(f"total {total} cannot give {n} workers at least {minimum} each")
    if not all(math.isfinite(w) and w >= 0 for w in weights) or sum(weights) <= 0:
        raise ValueError(
            f"weights must be finite and non-negative with a positive sum: {list(weights)}"
        )
    weight_sum = float(sum(weights))
    quotas = [total * w / weight_sum for w in weights]
    sizes = [int(q) for q in quotas]
    leftover = total - sum(sizes)
    by_remainder = sorted(range(n), key=lambda i: (-(quotas[i] - sizes[i]), i))
    for i in by_remainder[:leftover]:
        sizes[i] += 1
    for i in range(n):
        while sizes[i] < minimum:
            donor = max(range(n), key=lambda j: (sizes[j], -j))
            sizes[donor] -= 1
            sizes[i] += 1
    return tuple(sizes)


def equal_sizes(total: int, n: int) -> tuple[int, ...]:
    return largest_remainder(total, [1.0] * n)


def throughput_sizes(total: int, samples_per_s: Sequence[float]) -> tuple[int, ...]:
    """The 'profiled' policy: sizes in proportion to each worker's measured throughput."""
    return largest_remainder(total, samples_per_s)


def slice_bounds(sizes: Sequence[int]) -> list[tuple[int, int]]:
    bounds, start = [], 0
    for size in sizes:
        bounds.append((start, start + size))
        start += size
    return bounds
