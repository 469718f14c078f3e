"""`hetbench advise`: the remedies a recorded job could run, each predicted by the
simulator from the job's own fitted devices, ranked, and explained.

The remedies, each a real run (the recorded RunSpec changed where the remedy says), kept
only where the suite loader accepts it (hetbench.harness.spec.suite.parse_run: the refusal's
message is the reason given):
- the partition policies the simulator models: equal, profiled, model (bsp-adaptive);
- leaving devices out: every proper subset of the workers up to MAX_SUBSET_WORKERS, the
  global batch shared by those kept (Sailor's question: which of the given devices
  finish fastest), else each worker alone and the slowest ones in turn;
- the schemes: ps-sync, ps-async, ssp with bounds SSP_BOUNDS, backup with b up to
  MAX_BACKUP, local SGD with periods LOCAL_PERIODS;
- layer placements: ps-sync on PLACEMENT_SERVERS servers with the parameters `sharded` and
  dealt round-robin (`data-parallel`), cut as the servers cut them
  (hetbench.harness.partition.shards): the busiest server's share of the parameters sets its part
  of the update (hetbench.analysis.models.simulate.server_model); and `fc-on-server`, the model's
  fully connected tail computed by a server for every worker in turn
  (hetbench.analysis.models.simulate.Tail, from the model's layer shares, which the CLI times on
  this host), ranked last and not advised (UNVALIDATED);
- pipelines (HetPipe): virtual workers of every size that divides the workers (up to the
  model's layers), allocated `spread` and `same-kind` (analysis/models/pipeline_model.py predicts
  them op by op from the model's layer shares, which the CLI times on this host), 1F1B over
  PIPE_MICRO_BATCHES micro-batches (the most that divide the slice), wave bound D in
  PIPE_WAVE_BOUNDS; ranked last and not advised (UNVALIDATED: docs/howto/advise.md).

Where the recorded job's workers contended for the host's cores (more computing threads
than cores, as the manifest's `load` records them), each remedy's workers are given the
compute they would have among the workers it keeps (remedy_workers,
hetbench.analysis.models.contention): leaving a worker out of an oversubscribed job also gives the
others their cores back.

Each remedy is simulated `repeats` times (each repeat its own bootstrap draws and recorded
workers); its interval is the range over the repeats. The ranking is by the predicted time
of the recorded run's work (its steps after warm-up, each of the global batch): exact
remedies (BSP's gradient: the partitions and leave-outs) reach a target in the recorded
number of steps, so for them it is also the time to target (predicted from the recorded
runs' steps to target when a target is given); the others change the gradient (stale,
dropped, averaged), and their steps to target come from the statistical model fitted on
recorded runs of the job's schemes (hetbench.analysis.tables.statistical), where there is one.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from hetbench.analysis.measures.costmodel import Line
from hetbench.analysis.models import contention
from hetbench.analysis.models.deviceclass import CommModel, DeviceClass
from hetbench.analysis.models.pipeline_model import LayerShape, Pipeline, simulate_pipeline
from hetbench.analysis.models.simulate import Scheme, Tail, simulate, static_sizes, summarise
from hetbench.analysis.models.simulated import SIMULATED, baseline_model, with_policy
from hetbench.analysis.tables.statistical import StepsModel
from hetbench.harness.partition.policies import ADAPTIVE, equal_sizes
from hetbench.harness.partition.shards import busiest_share
from hetbench.harness.partition.virtual import allocate
from hetbench.harness.spec.aggregators import AggregatorSpec, places_layers
from hetbench.harness.spec.errors import UsageError
from hetbench.harness.spec.partitions import PartitionSpec
from hetbench.harness.spec.pipelines import PipelineSpec, exchange_of
from hetbench.harness.spec.suite import RunSpec, parse_run
from hetbench.harness.spec.tables import run_table
from hetbench.workloads import get_workload

SSP_BOUNDS = (1, 2, 4)
PIPE_ALLOCATIONS = ("spread", "same-kind")
PIPE_MICRO_BATCHES = (4, 2, 1)  # the first that divides a virtual worker's slice
PIPE_WAVE_BOUNDS = (0, 2)
MAX_BACKUP = 2
LOCAL_PERIODS = (2, 4, 8)
# the placements' servers (the recorded job's where it has more) and the placements modelled
PLACEMENT_SERVERS = 2
PLACED = ("sharded", "data-parallel")
PLACEMENTS = "layer placements (sharded, data-parallel)"
FC_ON_SERVER = "placement fc-on-server"
MAX_SUBSET_WORKERS = 8  # every proper subset below this many workers (2^8 - 2 = 254)
# the simulator's partition schemes (bsp, bsp-profiled, bsp-adaptive), by the policy a real
# run names
POLICY_SCHEMES = {policy: with_policy(baseline_model(), None if policy == "equal" else policy)
                  for policy in ("equal", "profiled", "model")}
PIPELINES = "pipelines (virtual workers, allocation, split, D)"
# remedies predicted and shown, but ranked after the rest and never advised: their model
# has not met its runs within a usable error yet (the kind -> why)
UNVALIDATED = {
    "pipeline": "predicted op by op (analysis/models/pipeline_model.py), ranked last and not "
                "advised: the `pipeline` suite's pipelined runs came out 41-62% faster "
                "than they ran (median; the stages' waits for their inputs are not "
                "modelled: docs/howto/advise.md)",
    "fc-on-server": "predicted step by step (hetbench.analysis.models.simulate.Tail), ranked "
                    "last and not "
                    "advised: its runs came out 19-24% slower than predicted, where the "
                    "other placements' came within 4-11% (the slow workers' forward, the "
                    "wait for the tail's server stretched by their slowdown, longer than "
                    "modelled: docs/howto/advise.md)"}


@dataclass(frozen=True)
class Remedy:
    name: str  # the run's name in the advised suite
    label: str  # what the ranking shows
    kind: str  # recorded, partition, leave-out or scheme
    scheme: Scheme
    ranks: tuple[int, ...]  # the recorded workers it keeps
    run: RunSpec
    sizes: tuple[int, ...] | None = None  # bsp's static slices (the recorded ones)
    pipeline: Pipeline | None = None  # a pipelined remedy's virtual workers (by rank)
    servers: int = 1  # a parameter-server scheme's servers
    busiest: float | None = None  # the busiest server's share of the parameters (placement)
    tail: Tail | None = None  # fc-on-server's tail on a server

    @property
    def exact(self) -> bool:
        """Whether every step applies BSP's gradient of the whole global batch."""
        if self.pipeline is not None:
            return self.pipeline.wave_bound == 0
        return self.scheme.exact


@dataclass(frozen=True)
class Refused:
    label: str
    reason: str


def remedies(recorded: RunSpec, scheme: Scheme, sizes: tuple[int, ...] | None,
             names: Sequence[str], shape: LayerShape | str = "no layer profile",
             tensors: Sequence[int] | None = None,
             refusal: Callable[[RunSpec], str] | None = None
             ) -> tuple[list[Remedy], list[Refused]]:
    """The recorded job first, then every remedy it can run; the refused ones with why.
    `scheme` and `sizes` reproduce the recorded run (deviceclass.recorded_scheme);
    `names` are the workers' class names in rank order; `shape` the model's layers (for
    the pipelines), or why there is none; `tensors` the model's parameter tensors' sizes
    in elements (for the placements; None: not known); `refusal`, where given, why else a
    remedy's run cannot run ('' where it can: a job's own checks, which need the job)."""
    # a profiler window perturbs the steps it records: no advised run profiles
    recorded = dataclasses.replace(recorded, profile=None)
    n = len(recorded.workers)
    everyone = tuple(range(n))
    found = [Remedy("recorded", f"recorded ({scheme.label}, {recorded.partition.policy})",
                    "recorded", scheme, everyone, _changed(recorded, "recorded"), sizes)]
    refused: list[Refused] = []
    # partitions and leave-outs keep a lockstep job's own exchange (ddp stays ddp)
    exchange = recorded.aggregator if scheme.lockstep else AggregatorSpec()
    candidates: list[Remedy] = []
    for policy, simulated in POLICY_SCHEMES.items():
        run = _changed(recorded, f"partition-{policy}", partition=PartitionSpec(policy=policy),
                       aggregator=exchange)
        candidates.append(Remedy(run.name, f"partition {policy}", "partition",
                                 Scheme(simulated), everyone, run))
    if n == 1:
        refused.append(Refused("leave a device out", "one worker: none to leave out"))
    for kept in _subsets(n):
        left = [r for r in everyone if r not in kept]
        policy = recorded.partition.policy if recorded.partition.policy in POLICY_SCHEMES \
            else "profiled"
        run = _changed(recorded, "leave-out-" + "-".join(map(str, left)),
                       workers=tuple(recorded.workers[r] for r in kept),
                       partition=PartitionSpec(policy=policy), aggregator=exchange)
        who = ", ".join(f"{r} ({names[r]})" for r in left)
        candidates.append(Remedy(run.name, f"leave out worker{'s' * (len(left) > 1)} {who}",
                                 "leave-out", Scheme(POLICY_SCHEMES[policy]), kept, run))
    for text in ("ps-sync", "ps-async", *(f"ssp:{s}" for s in SSP_BOUNDS),
                 *(f"backup:{b}" for b in range(1, min(MAX_BACKUP, n - 1) + 1)),
                 *(f"local-sgd:{h}" for h in LOCAL_PERIODS)):
        name, _, value = text.partition(":")
        aggregator = _aggregator(name, int(value or 0))
        run = _changed(recorded, text.replace(":", ""), aggregator=aggregator,
                       partition=PartitionSpec(), placement=None)
        candidates.append(Remedy(run.name, text, "scheme", Scheme(name, int(value or 0)),
                                 everyone, run))
    placed, why = _placements(recorded, tensors)
    candidates += placed
    if why:
        refused.append(Refused(PLACEMENTS, why))
    tailed = _fc_on_server(recorded, shape,
                           max((r.servers for r in placed), default=PLACEMENT_SERVERS))
    if isinstance(tailed, str):
        refused.append(Refused(FC_ON_SERVER, tailed))
    else:
        candidates.append(tailed)
    if isinstance(shape, str):
        refused.append(Refused(PIPELINES, shape))
    else:
        found_pipes = _pipelines(recorded, shape.layers)
        candidates += found_pipes
        if not found_pipes:
            refused.append(Refused(PIPELINES, f"{n} worker(s), {shape.layers} layers: no "
                                   "virtual worker of 2 or more stages"))
    for remedy in candidates:
        if _same_as_recorded(remedy, found[0]):
            continue
        # an imported job is predicted, never run: no suite check to pass
        checked = "" if remedy.run.is_imported else why_not(remedy.run)
        reason = checked or (refusal(remedy.run) if refusal else "")
        if reason:
            refused.append(Refused(remedy.label, reason))
        else:
            found.append(remedy)
    return found, refused


def _pipelines(recorded: RunSpec, layers: int) -> list[Remedy]:
    """Virtual workers of each size k (2..layers) that divides the workers, as each
    allocation groups them (the same groups once), each D; 1F1B (GPipe's makespan is the
    same in the model: analysis/models/pipeline_model.py), the most micro-batches that divide."""
    n, out = len(recorded.workers), []
    seen: set[tuple[tuple[int, ...], ...]] = set()
    for size in range(2, min(n, layers) + 1):
        if n % size:
            continue
        slices = equal_sizes(recorded.global_batch, n // size)
        micro = next((m for m in PIPE_MICRO_BATCHES
                      if all(s % m == 0 and s >= m for s in slices)), 1)
        for allocation in PIPE_ALLOCATIONS:
            groups = allocate(recorded.workers, allocation, size)
            if groups in seen:
                continue
            seen.add(groups)
            for bound in PIPE_WAVE_BOUNDS if n // size > 1 else (0,):
                spec = PipelineSpec(groups, "1f1b", micro, bound, allocation=allocation)
                name = f"pipe-{allocation}{size}-d{bound}"
                run = _changed(recorded, name, pipeline=spec, partition=PartitionSpec(),
                               aggregator=exchange_of(spec) or AggregatorSpec())
                label = (f"pipeline: {n // size} virtual worker(s) of {size} ({allocation}: "
                         f"{', '.join('+'.join(map(str, g)) for g in groups)}), "
                         f"{micro} micro-batches, D = {bound}")
                out.append(Remedy(name, label, "pipeline", Scheme("bsp"), tuple(range(n)),
                                  run, pipeline=Pipeline(groups, micro, bound)))
    return out


def _placements(recorded: RunSpec, tensors: Sequence[int] | None
                ) -> tuple[list[Remedy], str]:
    """ps-sync on PLACEMENT_SERVERS servers (the recorded job's, where its parameter
    servers are more) with each placement of PLACED, each with its busiest server's share
    of the parameters; or why there is none."""
    if tensors is None:
        return [], "the model's parameter tensors are not known"
    own = recorded.aggregator.servers if recorded.aggregator.name in places_layers() else 1
    servers = max(PLACEMENT_SERVERS, own)
    if servers > len(tensors):
        return [], (f"{len(tensors)} parameter tensor(s): too few to place on "
                    f"{servers} servers")
    out = []
    for placement in PLACED:
        run = _changed(recorded, f"ps-sync-{servers}-{placement}", partition=PartitionSpec(),
                       aggregator=AggregatorSpec(name="ps-sync", servers=servers),
                       placement=placement)
        out.append(Remedy(run.name, f"ps-sync, {servers} servers, {placement}", "placement",
                          Scheme("ps-sync"), tuple(range(len(recorded.workers))), run,
                          servers=servers,
                          busiest=busiest_share(placement, list(tensors), servers)))
    return out, ""


def _fc_on_server(recorded: RunSpec, shape: LayerShape | str, servers: int) -> Remedy | str:
    """ps-sync on `servers` servers with the model's fully connected tail on the last
    (its layers' shares of the time, the activations entering it and its share of the
    parameters from `shape`), or why there is none."""
    if recorded.is_loop:
        return "a user's own loop exchanges its gradients by all-reduce (hetbench.join)"
    if recorded.is_imported:
        return "an imported job: its model's layers are not known"
    # a job's tail is its last layer (Job.layers; the job check refuses what cannot be)
    fc_layers = (lambda size: 1) if recorded.is_job else get_workload(recorded.workload).fc_layers
    if fc_layers is None:
        return f"{recorded.workload!r} has no fully connected tail to place on a server"
    if isinstance(shape, str):
        return shape
    first = shape.layers - fc_layers(recorded.size)
    head = range(first)
    tail = Tail(head_forward=sum(shape.fractions[i] * shape.forward[i] for i in head),
                head_backward=sum(shape.fractions[i] * (1 - shape.forward[i]) for i in head),
                activation_bytes=shape.activation_bytes[first - 1],
                parameter_share=sum(shape.parameter_bytes[first:])
                / sum(shape.parameter_bytes))
    run = _changed(recorded, f"ps-sync-{servers}-fc-on-server", partition=PartitionSpec(),
                   aggregator=AggregatorSpec(name="ps-sync", servers=servers),
                   placement="fc-on-server")
    return Remedy(run.name, f"ps-sync, {servers} servers, fc-on-server", "fc-on-server",
                  Scheme("ps-sync"), tuple(range(len(recorded.workers))), run,
                  servers=servers, tail=tail)


def _aggregator(scheme: str, value: int) -> AggregatorSpec:
    key = SIMULATED[scheme].key
    options: dict[str, Any] = {key: value} if key is not None else {}
    return dataclasses.replace(AggregatorSpec(name=SIMULATED[scheme].aggregator), **options)


def _changed(recorded: RunSpec, name: str, **changes: Any) -> RunSpec:
    return dataclasses.replace(recorded, name=name, **changes)


def _same_as_recorded(remedy: Remedy, recorded: Remedy) -> bool:
    return remedy.run.pipeline == recorded.run.pipeline and remedy.ranks == recorded.ranks and \
        remedy.run.partition.policy == recorded.run.partition.policy and \
        remedy.run.aggregator == recorded.run.aggregator and \
        (remedy.run.placement or "sharded") == (recorded.run.placement or "sharded")


def _subsets(n: int) -> list[tuple[int, ...]]:
    """The workers to keep: every proper non-empty subset up to MAX_SUBSET_WORKERS workers,
    largest first; above, every worker alone left out."""
    if n < 2:
        return []
    if n <= MAX_SUBSET_WORKERS:
        return [kept for size in range(n - 1, 0, -1)
                for kept in itertools.combinations(range(n), size)]
    return [tuple(r for r in range(n) if r != out) for out in range(n)]


def why_not(run: RunSpec) -> str:
    """Why the suite loader refuses this run ('' if it accepts it)."""
    try:
        parse_run(run_table(run), "remedy")
    except (UsageError, ValueError) as exc:
        return str(exc).removeprefix("remedy.").removeprefix("remedy: ")
    return ""


# -- prediction ----------------------------------------------------------------------------

METRICS = ("seconds", "train_seconds", "mean_step_ms", "idle_fraction", "p99_step_ms",
           "samples_per_s", "compute_ms", "idle_ms", "comm_ms", "mean_staleness",
           "dropped_fraction")


@dataclass(frozen=True)
class Host:
    """What the recorded job's workers shared: the host's cores (None: not recorded, no
    contention modelled), each worker's threads on them (0 for a GPU worker) and slice."""

    cores: int | None
    threads: tuple[int, ...]
    slices: tuple[int, ...]


def remedy_workers(remedy: Remedy, classes: Sequence[DeviceClass], host: Host,
                   global_batch: int) -> list[DeviceClass]:
    """The classes of the workers the remedy keeps, each line scaled by how much less (or
    more) its worker would wait for a core than in the recorded job
    (hetbench.analysis.models.contention: the recorded real compute made uncontended, then
    shared again among those kept, at the remedy's slices; bsp-adaptive's at the profiled
    ones it converges to)."""
    workers = [classes[r] for r in remedy.ranks]
    if host.cores is None:
        return workers
    threads = np.array(host.threads, float)
    alone = uncontended_shares(classes, host)
    kept = list(remedy.ranks)
    scheme = remedy.scheme
    if scheme.policy in ADAPTIVE:
        scheme = Scheme(with_policy(scheme.simulated.model, "profiled"))
    slices = static_sizes(scheme, workers, global_batch, remedy.sizes)
    work = np.array([c.line.at(n) for c, n in zip(workers, slices, strict=True)]) * alone[kept]
    shared = contention.finish_times(work, threads[kept], host.cores) / work
    return [dataclasses.replace(c, line=Line(c.line.a_ns * m, c.line.b_ns * m))
            for c, m in zip(workers, alone[kept] * shared, strict=True)]


def uncontended_shares(classes: Sequence[DeviceClass], host: Host) -> np.ndarray:
    """Each recorded worker's compute alone over its compute in the recorded job (1 where
    no contention is modelled: hetbench.analysis.models.contention)."""
    if host.cores is None:
        return np.ones(len(classes))
    recorded = np.array([c.line.at(n) for c, n in zip(classes, host.slices, strict=True)])
    return contention.uncontended_work(recorded, np.array(host.threads, float),
                                       host.cores) / recorded


def predict(remedy: Remedy, workers: Sequence[DeviceClass], comm: CommModel, steps: int,
            global_batch: int, repeats: int, seed: int = 0) -> dict[str, Any]:
    """The remedy's predicted metrics over its `workers` (remedy_workers): the median over
    `repeats` simulations and, for the time of the work (`seconds`: `steps` global batches
    of samples applied), the range. Per-step compute, idle and exchange are each worker's
    mean share of the step."""
    return _predicted(remedy, [summarise(simulate(
        workers, comm, remedy.scheme, steps, global_batch, seed=seed + repeat,
        sizes=remedy.sizes, servers=remedy.servers, busiest=remedy.busiest, tail=remedy.tail))
        for repeat in range(repeats)], steps, global_batch)


def predict_pipeline(remedy: Remedy, classes: Sequence[DeviceClass], host: Host,
                     comm: CommModel, shape: LayerShape, steps: int, global_batch: int,
                     repeats: int, seed: int = 0) -> dict[str, Any]:
    """A pipelined remedy's predicted metrics (analysis/models/pipeline_model.py) over the recorded
    workers `classes` (rank order), as predict's."""
    assert remedy.pipeline is not None
    alone = uncontended_shares(classes, host)
    return _predicted(remedy, [simulate_pipeline(
        classes, comm, remedy.pipeline, shape, steps, global_batch, host.cores, host.threads,
        alone, seed=seed + repeat) for repeat in range(repeats)], steps, global_batch)


def _predicted(remedy: Remedy, summaries: Sequence[dict[str, Any]], steps: int,
               global_batch: int) -> dict[str, Any]:
    rows = []
    for s in summaries:
        step = s["mean_step_ms"]
        seconds = steps * global_batch / s["samples_per_s"]
        rows.append({**s, "seconds": seconds,
                     # on the training clock (held-out evaluations left out), as the
                     # measured time to target is (evaluation's train_s)
                     "train_seconds": seconds * s["train_fraction"],
                     "compute_ms": s["compute_share"] * step,
                     "idle_ms": s["idle_fraction"] * step, "comm_ms": s["comm_share"] * step})
    table = pd.DataFrame(rows)
    pipe = remedy.pipeline
    scheme = remedy.scheme.label if pipe is None else \
        f"wsp:{pipe.wave_bound}" if pipe.wave_bound else "pipeline"
    out: dict[str, Any] = {"remedy": remedy.name, "label": remedy.label, "kind": remedy.kind,
                           "scheme": scheme, "workers": len(remedy.ranks),
                           "exact": remedy.exact, "steps": steps,
                           "period": remedy.scheme.value if remedy.scheme.simulated.averages
                           else 1,
                           "global_batch": global_batch}
    out.update({m: float(table[m].median()) for m in METRICS})
    out["seconds_low"], out["seconds_high"] = float(table["seconds"].min()), \
        float(table["seconds"].max())
    return out


def rank(predictions: Sequence[dict[str, Any]], steps_to_target: float | None,
         model: StepsModel | None = None) -> pd.DataFrame:
    """The predictions best first, by time to target where a target is given, else by the
    time of the work. Time to target: the recorded job's steps to target at the predicted
    time per global batch, for the remedies that keep BSP's gradient; for the others, those
    steps times the statistical model's multiplier for the remedy's simulated staleness,
    dropped share and period (hetbench.analysis.tables.statistical; without a model, or
    where it lacks a coefficient, not predicted: ranked after the rest by their time of the
    work). Adds `vs_recorded` (time of the work over the recorded job's, minus one)."""
    table = pd.DataFrame(list(predictions))
    base = table.loc[table["kind"] == "recorded", "seconds"].iloc[0]
    table["vs_recorded"] = table["seconds"] / base - 1
    table["advised"] = ~table["kind"].isin(list(UNVALIDATED))
    if steps_to_target is None:
        return _ranked(table.sort_values("seconds"))
    multiplier = table.apply(lambda r: 1.0 if r["exact"] else _multiplier(r, model), axis=1)
    table["steps_to_target"] = steps_to_target * multiplier
    table["time_to_target_s"] = table["train_seconds"] / table["steps"] \
        * table["steps_to_target"]
    return _ranked(table.sort_values(["time_to_target_s", "seconds"], na_position="last"))


def _multiplier(row: pd.Series, model: StepsModel | None) -> float:
    if model is None:
        return float("nan")
    return model.steps(row["mean_staleness"], row["dropped_fraction"], row["period"]) \
        / model.bsp_steps


def _ranked(table: pd.DataFrame) -> pd.DataFrame:
    """Numbered in order, the remedies not advised (UNVALIDATED) after the rest."""
    table = table.sort_values("advised", ascending=False, kind="stable")
    return table.reset_index(drop=True).assign(rank=lambda t: t.index + 1)


def explain(row: pd.Series, recorded: pd.Series) -> str:
    """One sentence on why a remedy lands where it does, against the recorded job."""
    parts = [f"{row['mean_step_ms']:.2f} ms per step against {recorded['mean_step_ms']:.2f} "
             f"recorded ({row['vs_recorded']:+.0%} time for the same work)"]
    changes = []
    for key, what in (("compute_ms", "compute"), ("idle_ms", "idle before the exchange"),
                      ("comm_ms", "exchange")):
        delta = row[key] - recorded[key]
        if abs(delta) >= 0.05 * recorded["mean_step_ms"]:
            changes.append(f"{what} {'+' if delta > 0 else '-'}{abs(delta):.2f} ms")
    if changes:
        parts.append("per worker and step: " + ", ".join(changes))
    if not row["exact"]:
        extra = []
        if row["mean_staleness"] > 0:
            extra.append(f"updates {row['mean_staleness']:.1f} steps stale on average")
        if row["dropped_fraction"] > 0:
            extra.append(f"{row['dropped_fraction']:.0%} of gradients dropped")
        scheme = SIMULATED.get(str(row["scheme"]).partition(":")[0])
        if scheme is not None and scheme.averages:  # parameters averaged (local SGD)
            extra.append(f"parameters averaged every {row['period']} steps")
        said = "not BSP's gradient (" + ", ".join(extra or ["asynchronous"]) + ")"
        if math.isfinite(row.get("steps_to_target", math.nan)):
            said += f": {row['steps_to_target']:.0f} steps to the target predicted"
        else:
            said += ": its time to target may be longer than its speed says"
        parts.append(said)
    return f"{row['label']}: " + "; ".join(parts) + "."
