"""A run's `partition`: the policy that slices the global batch and its options, checked.
The policies themselves are harness/partition/policies.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hetbench.harness.partition.policies import ADAPTIVE, POLICIES
from hetbench.harness.spec.errors import UsageError
from hetbench.harness.spec.fields import (
    MAX_SLICE_RATIO,
    MAX_STEPS,
    MAX_TOLERANCE,
    MAX_WEIGHT,
    boolean,
    check_keys,
    choice,
    int_list,
    integer,
    number,
    table,
)


@dataclass(frozen=True)
class PartitionSpec:
    policy: str = "equal"
    sizes: tuple[int, ...] | None = None
    weights: tuple[float, ...] | None = None
    profile_steps: int = 5
    # adaptive policies (proportional, model): see hetbench.harness.partition.policies.Damping
    initial: str = "equal"
    every: int = 10
    dead_band: float = 0.05
    max_move: float = 0.25
    min_slice: int = 1
    smoothing: float = 0.5
    max_ratio: float = 2.0
    reset: float = 0.3
    # 'model' only: a worker whose slice does not pay for its cost and the exchange gets
    # none (hetbench.harness.partition.policies.Repartitioner.membership)
    leave_out: bool = False

    @property
    def adaptive(self) -> bool:
        return self.policy in ADAPTIVE

    @property
    def may_leave_out(self) -> bool:
        """Some worker may compute nothing: an empty slice given, or decided at run time."""
        return self.leave_out or 0 in (self.sizes or ())


ADAPTIVE_KEYS = {"initial", "every", "dead_band", "max_move", "min_slice", "smoothing",
                 "max_ratio", "reset", "leave_out"}


PARTITION_KEYS = {"policy", "sizes", "weights", "profile_steps"} | ADAPTIVE_KEYS


def parse_partition(raw: Any, n_workers: int, global_batch: int, where: str) -> PartitionSpec:
    raw = table(raw, where)
    default = PartitionSpec  # the fields' defaults, written once there
    check_keys(raw, PARTITION_KEYS, where)
    policy = choice(raw.get("policy", default.policy), POLICIES, f"{where}.policy")
    sizes = weights = None
    if policy == "sizes":
        if "sizes" not in raw:
            raise UsageError(f"{where}.sizes", "required for policy 'sizes'")
        # 0 leaves a worker out: it computes nothing and takes no part in the exchange
        sizes = int_list(raw["sizes"], f"{where}.sizes", n_workers, minimum=0,
                         maximum=global_batch)
        if sum(sizes) != global_batch:
            raise UsageError(
                f"{where}.sizes", f"sum {sum(sizes)} must equal global_batch {global_batch}"
            )
    elif "sizes" in raw:
        raise UsageError(f"{where}.sizes", f"only allowed with policy 'sizes', not {policy!r}")
    if policy == "weights":
        if "weights" not in raw:
            raise UsageError(f"{where}.weights", "required for policy 'weights'")
        raw_weights = raw["weights"]
        if not isinstance(raw_weights, list) or len(raw_weights) != n_workers:
            raise UsageError(f"{where}.weights", f"must be a list of {n_workers} numbers")
        weights = tuple(
            number(v, f"{where}.weights", minimum=0.0, maximum=MAX_WEIGHT, strict=True)
            for v in raw_weights
        )
    elif "weights" in raw:
        raise UsageError(f"{where}.weights", f"only allowed with policy 'weights', not {policy!r}")
    profile_steps = integer(raw.get("profile_steps", default.profile_steps),
                            f"{where}.profile_steps", minimum=1, maximum=MAX_STEPS)
    if policy not in ADAPTIVE:
        for key in sorted(ADAPTIVE_KEYS & set(raw)):
            raise UsageError(f"{where}.{key}",
                             f"only allowed with an adaptive policy ({', '.join(ADAPTIVE)})")
        return PartitionSpec(policy=policy, sizes=sizes, weights=weights,
                             profile_steps=profile_steps)
    leave_out = boolean(raw.get("leave_out", default.leave_out), f"{where}.leave_out")
    if leave_out and policy != "model":
        raise UsageError(f"{where}.leave_out", f"needs policy 'model' (fitted lines predict "
                         f"the step with and without a worker), not {policy!r}")
    min_slice = integer(raw.get("min_slice", default.min_slice), f"{where}.min_slice", minimum=1,
                        maximum=global_batch)
    if min_slice * n_workers > global_batch:
        raise UsageError(f"{where}.min_slice", f"{min_slice} x {n_workers} workers exceeds "
                         f"global_batch {global_batch}")
    return PartitionSpec(
        policy=policy, profile_steps=profile_steps,
        initial=choice(raw.get("initial", default.initial), ("equal", "profiled"),
                       f"{where}.initial"),
        every=integer(raw.get("every", default.every), f"{where}.every", minimum=1,
                      maximum=MAX_STEPS),
        dead_band=number(raw.get("dead_band", default.dead_band), f"{where}.dead_band", minimum=0.0,
                         maximum=MAX_TOLERANCE),
        # a fraction of the global batch
        max_move=number(raw.get("max_move", default.max_move), f"{where}.max_move", minimum=0.0,
                        maximum=1.0, strict=True),
        min_slice=min_slice,
        smoothing=number(raw.get("smoothing", default.smoothing), f"{where}.smoothing", minimum=0.0,
                         maximum=1.0, strict=True),
        max_ratio=number(raw.get("max_ratio", default.max_ratio), f"{where}.max_ratio", minimum=1.0,
                         maximum=MAX_SLICE_RATIO, strict=True),
        reset=number(raw.get("reset", default.reset), f"{where}.reset", minimum=0.0,
                     maximum=MAX_TOLERANCE, strict=True),
        leave_out=leave_out,
    )
