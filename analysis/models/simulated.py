"""The simulator's schemes in a real run's terms, read from the aggregator registry
(harness/spec/aggregators.py): each aggregator's `Kind.simulation` names the simulator's
model of it (analysis/models/simulate.py implements them), its option and whether it keeps
BSP's gradient; this module turns those declarations into the scheme names `hetbench
simulate --scheme` takes, each with the aggregator and partition policy a simulated run
records and the recorded runs it reproduces (`recorded`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hetbench.harness.partition.policies import ADAPTIVE, MEASURED
from hetbench.harness.spec.aggregators import AGGREGATORS, Kind, recorded_name


@dataclass(frozen=True)
class Simulated:
    """What a simulated scheme is in a real run's terms (the registries' names): the
    simulator's `model`, its aggregator (the first in the registry the model simulates),
    its partition policy (None: equal, or the recorded slices), and the aggregator's key
    its value sets, with its letter in the scheme's name (ssp:S), and whether every step
    applies the gradient of the whole global batch (BSP's: such a scheme needs BSP's steps
    to reach a target)."""

    model: str
    aggregator: str
    policy: str | None = None
    key: str | None = None
    letter: str = ""
    exact: bool = False

    @property
    def kind(self) -> Kind:
        return AGGREGATORS[self.aggregator]

    @property
    def takes_sizes(self) -> bool:
        """Its slices are equal or given (bsp's): a model that also runs partition policies,
        under none of them."""
        simulation = self.kind.simulation
        return self.policy is None and simulation is not None and bool(simulation.policies)

    @property
    def averages(self) -> bool:
        """Its exchange averages parameters every `value` steps (local SGD's period)."""
        return self.kind.moves == "parameters"


def _schemes() -> dict[str, Simulated]:
    out: dict[str, Simulated] = {}
    for name, kind in AGGREGATORS.items():
        s = kind.simulation
        if s is None or s.model in out:
            continue
        out[s.model] = Simulated(s.model, name, None, s.option, s.letter, s.exact)
        for suffix, policy in s.policies:
            out[f"{s.model}-{suffix}"] = Simulated(s.model, name, policy, exact=s.exact)
    return out


# The simulator's schemes, by the name `hetbench simulate --scheme` takes.
SIMULATED = _schemes()
# ... as `--scheme` writes them (ssp:S)
SCHEME_FORMS = ", ".join(f"{name}:{s.letter}" if s.key is not None else name
                         for name, s in SIMULATED.items())


def baseline_model() -> str:
    """The model of the registry's baseline aggregator (the plain all-reduce: bsp)."""
    simulation = next(k for k in AGGREGATORS.values() if k.baseline).simulation
    assert simulation is not None, "the baseline aggregator declares its simulation"
    return simulation.model


def with_policy(model: str, policy: str | None) -> str:
    """The scheme name of `model` run under partition `policy` (None: equal or sizes),
    where the model runs that policy; else the model's own."""
    for name, s in SIMULATED.items():
        if s.model == model and s.policy == policy:
            return name
    return model


def recorded(run: dict[str, Any]) -> str:
    """The scheme (without its value) that reproduces a recorded run (its manifest's
    `run`): an aggregator the simulator models that has an option, or waits for no other
    worker, by the simulator's model of it; any other (a lockstep one, or one not
    simulated: wsp, tensorflow-ps) as BSP's all-reduce under the run's partition policy
    (the profiled policies' slices, the adaptive ones' moves), its exchange as recorded."""
    kind = AGGREGATORS.get(recorded_name(run))
    if kind is not None and kind.simulation is not None and \
            (kind.simulation.option is not None or not kind.lockstep):
        return kind.simulation.model
    policy = (run.get("partition") or {}).get("policy", "equal")
    if policy in ADAPTIVE:
        return with_policy(baseline_model(), "model")
    if policy in MEASURED:
        return with_policy(baseline_model(), "profiled")
    return baseline_model()
