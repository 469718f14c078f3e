"""Pipelined virtual workers predicted for `hetbench advise` (issue 29): HetPipe's remedy,
from the recorded data-parallel job's devices and the model's layers.

A virtual worker is a group of the recorded workers that pipelines the model: stage s
holds consecutive layers on its s-th worker, and the group takes an equal slice of the
global batch in M micro-batches (harness/partition/virtual.py). A worker's forward and
backward of each layer on a micro-batch of m samples, alone, are its fitted line at m (the
whole model, hetbench.analysis.models.deviceclass), made uncontended
(hetbench.analysis.models.contention: on a host with fewer cores than computing threads the recorded
lines hold the data-parallel job's wait for a core), shared out by the layers' shares of the time
and their forwards' shares of that (`LayerShape`, timed by the CLI on this host), times the step's
recorded residual (hetbench.analysis.models.simulate's draws); the emulated slowdown stretches each
op as the run does. The split is the one the run's partitioner picks from such per-layer times
(hetbench.harness.partition.stages.split_layers).

The waves run op by op (analysis/models/stage_sharing.py): each forward and backward of each
micro-batch in its schedule's order, after its input has come over the fitted link, its
real work sharing the host's cores with whatever else computes at that moment, then its
emulated stretch. Wave bound D = 0: after every wave each
stage's gradients are all-reduced among the virtual workers (a ring of the stage's bytes),
and a stage begins the next wave when its all-reduce is done; the idle is a stage's wait
for the other virtual workers. D > 0: each stage pushes its gradients to a server and
pulls the parameters (a round trip of the stage's bytes) and a virtual worker starts wave
k once every virtual worker has finished wave k - D - 1; its staleness is the other
virtual workers' updates applied between its pull and its push.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hetbench.analysis.models.deviceclass import CommModel, DeviceClass
from hetbench.analysis.models.simulate import draw, slowdowns
from hetbench.analysis.models.stage_sharing import Stage, WaveGate, run_waves
from hetbench.harness.partition.policies import equal_sizes
from hetbench.harness.partition.stages import Links, Profile, split_layers

# a layer's forward share of its forward + backward where it was not measured: the usual
# rule, the backward computes two products (the input's gradient and the weights') for
# the forward's one
FORWARD_SHARE = 1 / 3
# waves simulated at most, taken evenly over a longer run's steps (op by op in Python:
# 0.1-0.3 s for 150 waves of 4 stages, 2.9 s for 1,000 of 8; advise simulates each
# pipeline `--repeats` times)
MAX_WAVES = 300


@dataclass(frozen=True)
class LayerShape:
    """The model's layers: each one's share of a forward + backward (summing to 1), the
    bytes of its output per sample (what a stage sends on), and its parameter bytes."""

    fractions: tuple[float, ...]
    activation_bytes: tuple[float, ...]
    parameter_bytes: tuple[float, ...]
    forward: tuple[float, ...] = ()  # each layer's forward share of its time (FORWARD_SHARE)
    def __post_init__(self) -> None:
        if not self.forward:
            object.__setattr__(self, "forward", (FORWARD_SHARE,) * len(self.fractions))

    @property
    def layers(self) -> int:
        return len(self.fractions)


@dataclass(frozen=True)
class Pipeline:
    groups: tuple[tuple[int, ...], ...]  # the workers of each virtual worker, stage order
    micro_batches: int
    wave_bound: int
    schedule: str = "1f1b"  # or gpipe (hetbench.analysis.models.stage_sharing.schedule)


def stage_bounds(shape: LayerShape, layer_ns: Sequence[Sequence[float]]) -> tuple[int, ...]:
    """The split the run's partitioner picks: `layer_ns[s][i]` the s-th worker's time for
    layer i on one micro-batch (its per-layer profile, its emulated slowdown included)."""
    profile = Profile([list(t) for t in layer_ns], list(shape.activation_bytes),
                      list(shape.parameter_bytes))
    return split_layers(profile, Links()).bounds


def simulate_pipeline(workers: Sequence[DeviceClass], comm: CommModel, plan: Pipeline,
                      shape: LayerShape, steps: int, global_batch: int, cores: int | None,
                      threads: Sequence[int], alone: Sequence[float] | np.ndarray, seed: int = 0
                      ) -> dict[str, float]:
    """`steps` global steps (a wave of every virtual worker each) of the pipeline over the
    recorded `workers` (rank order); `alone[r]`: worker r's uncontended share of its
    recorded compute (1 without contention); `threads[r]` its threads on the `cores`.
    Returns the summary the advisor ranks by (hetbench.analysis.advice.advisor.METRICS' step
    measures)."""
    rng = np.random.default_rng(seed)
    residual, _, _, gap, evaluation, ratio = draw(workers, steps, rng, first=seed)
    factor = slowdowns(workers, steps, rng)
    if steps > MAX_WAVES:  # the measures are per step: waves spread over the run tell them
        taken = np.linspace(0, steps - 1, MAX_WAVES).round().astype(int)
        residual, gap, evaluation, ratio, factor = (
            a[taken] for a in (residual, gap, evaluation, ratio, factor))
        steps = MAX_WAVES
    slices = equal_sizes(global_batch, len(plan.groups))
    stages, ranks, forward, backward, link, stage_bytes = [], [], [], [], [], []
    for v, group in enumerate(plan.groups):
        micro = slices[v] // plan.micro_batches
        # each worker's forward and backward of each layer on one micro-batch, alone
        ops = [_layer_ops(shape, workers[r].line.at(micro) * alone[r]) for r in group]
        bounds = stage_bounds(shape, [[(f + b) * float(np.median(factor[:, r]))
                                       for f, b in layer_ops]
                                      for layer_ops, r in zip(ops, group, strict=True)])
        for s, r in enumerate(group):
            layers = range(bounds[s], bounds[s + 1])
            stages.append(Stage(v, s, len(group), threads[r] if cores is not None else 0))
            ranks.append(r)
            forward.append(sum(ops[s][i][0] for i in layers))
            backward.append(sum(ops[s][i][1] for i in layers))
            last = s == len(group) - 1
            sent = 0.0 if last else shape.activation_bytes[bounds[s + 1] - 1] * micro
            link.append(0.0 if last else comm.alpha_ns + sent * comm.beta_ns_per_byte)
            stage_bytes.append(sum(shape.parameter_bytes[i] for i in layers))
    column = np.array(ranks)
    work = np.stack([np.array(forward) * residual[:, column],
                     np.array(backward) * residual[:, column]], axis=2)
    per_stage = [dataclasses.replace(comm, bytes=int(b)) for b in stage_bytes]
    groups = len(plan.groups)
    if plan.wave_bound == 0:  # each stage's gradients all-reduced among the virtual workers
        exchange = np.array([c.allreduce_ns(groups) for c in per_stage])
    else:  # each virtual worker's stages push to a server and pull
        exchange = np.array([c.round_trip_ns() for c in per_stage])
    exchanged = exchange[None, :] * ratio[:, :1]  # (steps, stages)
    after = exchanged + (gap[:, :1] + evaluation[:, :1])
    gate = _gate(stages, plan.wave_bound, after)
    begin, end, busy = run_waves(stages, work, factor[:, column], link, plan.schedule,
                                 plan.micro_batches, cores, gate)
    # a stage's wait after its wave for the others (D = 0: their all-reduce; D > 0: the
    # wave bound), as a run records idle: the wait at the exchange, not the bubble
    idle = np.zeros_like(end)
    for k in range(steps - 1):
        idle[k] = [gate(p, k + 1, end) - after[k, p] - end[k, p] for p in range(len(stages))]
    return _summary(plan, begin, end, busy, idle.clip(min=0), exchanged.max(axis=1),
                    after, evaluation[:, 0], global_batch, stages)


def _layer_ops(shape: LayerShape, whole_ns: float) -> list[tuple[float, float]]:
    """Each layer's forward and backward for a worker whose whole model takes `whole_ns`."""
    return [(whole_ns * f * share, whole_ns * f * (1 - share))
            for f, share in zip(shape.fractions, shape.forward, strict=True)]


def _gate(stages: Sequence[Stage], wave_bound: int, after: np.ndarray) -> WaveGate:
    """When a stage may begin wave k (`after[k - 1, p]`: stage p's exchange, the loop's gap
    and any held-out evaluation after wave k - 1). D = 0: once every virtual worker's same
    stage has ended wave k - 1 and their all-reduce is done. D > 0: once its own stage has
    pushed and pulled after wave k - 1, and every virtual worker has ended wave
    k - D - 1."""
    same = [np.array([q for q, t in enumerate(stages) if t.index == s.index]) for s in stages]

    def gate(p: int, k: int, end: np.ndarray) -> float:
        if k == 0:
            return 0.0
        if wave_bound == 0:
            return float(end[k - 1, same[p]].max() + after[k - 1, p])
        # numpy's max: NaN (a wave not ended yet) stays NaN, where Python's max drops it
        bound = end[k - wave_bound - 1].max() if k > wave_bound else 0.0
        return float(np.maximum(end[k - 1, p] + after[k - 1, p], bound))

    return gate


def _summary(plan: Pipeline, begin: np.ndarray, end: np.ndarray, busy: np.ndarray,
             idle: np.ndarray, exchange: np.ndarray, after: np.ndarray,
             evaluation: np.ndarray, global_batch: int, stages: Sequence[Stage]
             ) -> dict[str, float]:
    """The advisor's step measures from the stages' waves (waves, stages): a step is a wave
    of every virtual worker, from the first stage's begin to the next step's (the last
    step: to its last exchange's end); at D > 0 the virtual workers drift apart, and a step
    is the run's time over its steps."""
    steps = len(begin)
    finish = float((end[-1] + after[-1]).max())
    if plan.wave_bound == 0:
        period = np.diff(np.append(begin.min(axis=1), finish))
    else:
        period = np.full(steps, (finish - float(begin[0].min())) / steps)
    total_s = period.sum() / 1e9
    return {"mean_step_ms": float(period.mean() / 1e6),
            "p99_step_ms": float(np.percentile(period, 99) / 1e6),
            "samples_per_s": steps * global_batch / total_s,
            "train_fraction": float(1 - evaluation.sum() / period.sum()),
            "compute_share": float((busy / period[:, None]).mean()),
            "idle_fraction": float((idle / period[:, None]).mean()),
            "comm_share": float((exchange / period).clip(max=1).mean()),
            "mean_staleness": 0.0 if plan.wave_bound == 0 else _staleness(stages, begin, end),
            "dropped_fraction": 0.0}


def _staleness(stages: Sequence[Stage], begin: np.ndarray, end: np.ndarray) -> float:
    """The other virtual workers' updates applied while a wave computed, its versions
    behind at its push: the wave ends in (its begin, its end], its own not counted (an end
    at the same instant as its push is taken as before it: two alike virtual workers are 1
    behind, as wsp's runs of alike devices record, not 0)."""
    groups = max(s.group for s in stages) + 1
    column = np.array([s.group for s in stages])
    starts = np.stack([begin[:, column == v].min(axis=1) for v in range(groups)], axis=1)
    ends = np.stack([end[:, column == v].max(axis=1) for v in range(groups)], axis=1)
    finished = np.sort(ends.ravel())
    applied = np.searchsorted(finished, ends, side="right") \
        - np.searchsorted(finished, starts, side="right") - 1
    return float(applied.mean())
