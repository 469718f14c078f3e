"""Pipelined virtual workers predicted for `hetbench advise` (issue 29): HetPipe's remedy,
from the recorded data-parallel job's devices and the model's layers.

A virtual worker is a group of the recorded workers that pipelines the model: stage s
holds consecutive layers on its s-th worker, and the group takes an equal slice of the
global batch in M micro-batches (harness/partition/virtual.py). Each worker's time for a
micro-batch of m samples through layers [a, b) is its class's line at m (the whole model's
forward + backward, analysis.deviceclass) times those layers' share of the model's time
(`LayerShape`, measured by the CLI on this host), times the step's emulated slowdown and
recorded residual (analysis.simulate's draws). The split is the one the run's partitioner
picks from such per-layer times (harness.partition.stages.split_layers).

A wave of one virtual worker, stage times t_s per micro-batch (each stage sends its last
layer's activations on, and their gradients back, over the fitted link):
    wave = sum_s t_s + (M - 1) x max_s t_s
(fill and drain, then the slowest stage's pace: GPipe's and 1F1B's makespan alike). Wave
bound D = 0: after every wave each stage's gradients are all-reduced among the virtual
workers (a ring of the stage's bytes), so a global step lasts the slowest wave plus the
largest stage's all-reduce; the idle is a worker's wait for the slowest wave. D > 0: each
virtual worker pushes its stage gradients to a server and pulls the parameters (a round
trip of the stage's bytes) and starts wave k once every virtual worker has finished wave
k - D - 1; its staleness is the other virtual workers' updates applied between its pull
and its push.

Contention: on a host with fewer cores than computing threads, the recorded lines hold the
data-parallel job's wait for a core (every worker computing at once); they are made
uncontended (analysis.contention) and stretched again by the pipeline's own demand, the
workers' real compute per wave over the cores' time in it (processor sharing on average:
pipelined stages do not all compute at once).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from analysis.deviceclass import CommModel, DeviceClass
from analysis.simulate import draw, slowdowns
from harness.partition.policies import equal_sizes
from harness.partition.stages import Links, Profile, split_layers

STRETCH_ITERATIONS = 8  # at most, to the contention's fixed point (2 in the tests' case)


@dataclass(frozen=True)
class LayerShape:
    """The model's layers: each one's share of a forward + backward (summing to 1), the
    bytes of its output per sample (what a stage sends on), and its parameter bytes."""

    fractions: tuple[float, ...]
    activation_bytes: tuple[float, ...]
    parameter_bytes: tuple[float, ...]

    @property
    def layers(self) -> int:
        return len(self.fractions)


@dataclass(frozen=True)
class Pipeline:
    groups: tuple[tuple[int, ...], ...]  # the workers of each virtual worker, stage order
    micro_batches: int
    wave_bound: int


def stage_bounds(shape: LayerShape, stage_ns: Sequence[float]) -> tuple[int, ...]:
    """The split the run's partitioner picks: `stage_ns[s]` the s-th worker's time for the
    whole model on one micro-batch (the layers' shares of it: its per-layer profile)."""
    times = [[f * t for f in shape.fractions] for t in stage_ns]
    profile = Profile(times, list(shape.activation_bytes), list(shape.parameter_bytes))
    return split_layers(profile, Links()).bounds


def wave_ns(stage_ns: np.ndarray, micro_batches: int) -> np.ndarray:
    """Fill and drain, then the slowest stage's pace; `stage_ns` (waves, stages)."""
    return stage_ns.sum(axis=1) + (micro_batches - 1) * stage_ns.max(axis=1)


def simulate_pipeline(workers: Sequence[DeviceClass], comm: CommModel, plan: Pipeline,
                      shape: LayerShape, steps: int, global_batch: int, cores: int | None,
                      threads: Sequence[int], alone: Sequence[float] | np.ndarray, seed: int = 0
                      ) -> dict[str, float]:
    """`steps` global steps (a wave of every virtual worker each) of the pipeline over the
    recorded `workers` (rank order); `alone[r]`: worker r's uncontended share of its
    recorded compute (1 without contention); `threads[r]` its threads on the `cores`.
    Returns the summary the advisor ranks by (analysis.advisor.METRICS' step measures)."""
    rng = np.random.default_rng(seed)
    residual, _, _, gap, evaluation, ratio = draw(workers, steps, rng, first=seed)
    factor = slowdowns(workers, steps, rng)
    slices = equal_sizes(global_batch, len(plan.groups))
    ranks, base, send, stage_bytes, group_of = [], [], [], [], []
    for v, group in enumerate(plan.groups):
        micro = slices[v] // plan.micro_batches
        whole = [workers[r].line.at(micro) * alone[r] for r in group]
        bounds = stage_bounds(shape, [w * float(np.median(factor[:, r]))
                                      for w, r in zip(whole, group, strict=True)])
        for s, r in enumerate(group):
            layers = slice(bounds[s], bounds[s + 1])
            ranks.append(r)
            group_of.append(v)
            base.append(whole[s] * sum(shape.fractions[layers]))
            last = s == len(group) - 1
            sent = 0.0 if last else shape.activation_bytes[bounds[s + 1] - 1] * micro
            send.append(0.0 if last else 2 * (comm.alpha_ns + sent * comm.beta_ns_per_byte))
            stage_bytes.append(sum(shape.parameter_bytes[layers]))
    ranks_a = np.array(ranks)
    real = np.array(base) * residual[:, ranks_a]  # (steps, workers in stage order)
    emulated = factor[:, ranks_a]
    stretch = 1.0
    for _ in range(STRETCH_ITERATIONS):
        stage_ns = real * stretch * emulated + np.array(send)
        timeline = _timeline(stage_ns, plan, group_of, stage_bytes, comm, ratio[:, 0],
                             gap[:, 0])
        if cores is None:
            break
        # processor sharing on average: the threads busy at once, s x W / P for the real
        # work W of a step (uncontended) stretched by s, share the cores: s = max(1, that
        # / cores), a fixed point (s = 1, or the cores busy all the time: W = cores x P)
        work = (real * plan.micro_batches * np.array([threads[r] for r in ranks])).sum()
        wanted = max(1.0, stretch * float(work / (cores * timeline["period"].sum())))
        if abs(wanted - stretch) < 1e-4:
            break
        stretch = wanted
    busy = stage_ns * plan.micro_batches  # each worker's wave, its own stages' part
    period = timeline["period"]
    step = period + evaluation[:, 0]
    total_s = step.sum() / 1e9
    return {"mean_step_ms": float(step.mean() / 1e6),
            "p99_step_ms": float(np.percentile(step, 99) / 1e6),
            "samples_per_s": steps * global_batch / total_s,
            "train_fraction": float(period.sum() / step.sum()),
            "compute_share": float((busy / period[:, None]).mean()),
            "idle_fraction": float((timeline["idle"] / period[:, None]).mean()),
            "comm_share": float((timeline["exchange"] / period).mean()),
            "mean_staleness": float(timeline["staleness"]), "dropped_fraction": 0.0,
            "contention_stretch": stretch}


def _timeline(stage_ns: np.ndarray, plan: Pipeline, group_of: Sequence[int],
              stage_bytes: Sequence[float], comm: CommModel, ratio: np.ndarray,
              gap: np.ndarray) -> dict[str, Any]:
    """Each global step's period, exchange, each worker's idle (waiting for the other
    virtual workers) and the mean staleness, from the stage times (steps, workers)."""
    steps = len(stage_ns)
    groups = len(plan.groups)
    column = np.array(group_of)
    waves = np.stack([wave_ns(stage_ns[:, column == v], plan.micro_batches)
                      for v in range(groups)], axis=1)  # (steps, virtual workers)
    per_stage = [dataclasses.replace(comm, bytes=int(b)) for b in stage_bytes]
    if plan.wave_bound == 0:
        exchange = max(c.allreduce_ns(groups) for c in per_stage) * ratio
        slowest = waves.max(axis=1)
        idle = slowest[:, None] - waves[:, column]
        return {"period": slowest + exchange + gap, "exchange": exchange, "idle": idle,
                "staleness": 0.0}
    trips = np.array([max(c.round_trip_ns() for c, g in zip(per_stage, group_of, strict=True)
                          if g == v) for v in range(groups)])
    start, end = np.zeros((steps, groups)), np.zeros((steps, groups))
    for k in range(steps):
        ready = end[k - 1] if k else np.zeros(groups)
        allowed = end[k - plan.wave_bound - 1].max() if k > plan.wave_bound else 0.0
        start[k] = np.maximum(ready, allowed)
        end[k] = start[k] + waves[k] + trips * ratio[k] + gap[k]
    finished = np.sort(end.ravel())
    # the others' updates applied while a wave computed, its versions behind at its push:
    # the ends in (its pull, its push], its own not counted (an end at the same instant as
    # its push is taken as before it: two alike virtual workers are 1 behind, as wsp's
    # runs of alike devices record, not 0)
    applied = np.searchsorted(finished, end, side="right") \
        - np.searchsorted(finished, start, side="right") - 1
    staleness = float(applied.mean())
    span = end[-1].max() / steps
    waited = (start - np.vstack([np.zeros(groups), end[:-1]])).clip(min=0)
    period = np.full(steps, span)
    return {"period": period, "exchange": (trips * ratio[:, None]).mean(axis=1),
            "idle": waited[:, column], "staleness": staleness}
