"""The simulator's schemes in a real run's terms: for each name `hetbench simulate --scheme`
takes, the aggregator and partition policy of the registries (harness/spec/aggregators.py,
harness/partition/policies.py) it models, and the aggregator option its value sets. The
simulator (analysis/models/simulate.py) implements the models; what a simulated run records, and
which model reproduces a recorded run (analysis/models/deviceclass.py), come from here."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Simulated:
    """What a simulated scheme is in a real run's terms (the registries' names): its
    aggregator (harness/spec/aggregators.py), its partition policy (None: equal, or the
    recorded slices), and the aggregator's key its value sets, with its letter in the
    scheme's name (ssp:S), and whether every step applies the gradient of the whole
    global batch (BSP's: such a scheme needs BSP's steps to reach a target)."""

    aggregator: str
    policy: str | None = None
    key: str | None = None
    letter: str = ""
    exact: bool = False


# The simulator's models, by the name `hetbench simulate --scheme` takes.
SIMULATED = {
    "bsp": Simulated("torch", exact=True),
    "bsp-profiled": Simulated("torch", "profiled", exact=True),
    "bsp-adaptive": Simulated("torch", "model", exact=True),
    "ps-sync": Simulated("ps-sync", exact=True),
    "backup": Simulated("backup", key="backup", letter="B"),
    "ssp": Simulated("ssp", key="staleness", letter="S"),
    "ps-async": Simulated("ps-async"),
    "local-sgd": Simulated("local-sgd", key="local_steps", letter="H"),
}
