"""Scale-out simulation: N workers built from fitted device classes
(hetbench.analysis.models.deviceclass) under one synchronisation scheme, in vectorised numpy (one
pass per step over all workers, or none), giving the same timestamps a real run records.

Per worker i and step k, compute = line_i(n_ik) x slowdown_i(k) x residual_ik, where the
residuals are a circular block bootstrap of one recorded worker's series (blocks of
BLOCK steps keep its autocorrelation and tails; each simulated worker keeps to one
recorded worker, and so to its level). The time after the exchange (unpack, apply) and
the loop's gap before the next step come from the same blocks.

Schemes (names as the aggregators'):
- bsp, bsp-profiled, bsp-adaptive: all-reduce every step with equal slices, slices in
  proportion to each class's typical throughput (the `profiled` policy), or the `model`
  policy of hetbench.harness.partition.policies run on the simulated compute times (the code a real
  run runs);
- ps-sync: every worker pushes its gradient to the parameter servers, which update once
  every push of the step is in (backup with no backup worker); the workers step together;
  with a `Tail` (the fc-on-server placement), one server computes the model's fully
  connected tail for every worker in turn, in the middle of each worker's step;
- backup:B: each round ends when N - B gradients have arrived; a late worker's gradient is
  dropped and it starts its next step from the parameters of the moment it arrives;
- ssp:S: pushes served first come first served; a worker's push of clock c is answered
  once every worker has pushed c - S; the run ends as ps-async's does;
- ps-async: every push answered at once; the run ends when K global batches of samples
  have been applied, so fast workers take more steps;
- local-sgd:H: H local steps, then an all-reduce average.
Parameter server schemes send the gradient and take the parameters back side by side
with the other workers (server_model) and queue at the servers, which apply pushes one at
a time (first come first served): at large N the servers, not the workers, set the pace.
"""

from __future__ import annotations

import dataclasses
import heapq
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hetbench.analysis.models.deviceclass import CommModel, DeviceClass, Source, typical_slowdown
from hetbench.analysis.models.simulated import SCHEME_FORMS, SIMULATED, Simulated
from hetbench.harness.partition.policies import (
    ADAPTIVE,
    MEASURED,
    Damping,
    Repartitioner,
    WindowStats,
    equal_sizes,
    profiled_sizes,
    update_ends,
)

BLOCK = 32
SCHEMES = tuple(SIMULATED)
PARAMETERISED = {name: s.letter for name, s in SIMULATED.items() if s.key is not None}


@dataclass(frozen=True)
class Scheme:
    name: str  # a name of SIMULATED
    value: int = 0  # its option's value: backup's B, ssp's S, local-sgd's H

    @property
    def label(self) -> str:
        return f"{self.name}:{self.value}" if self.name in PARAMETERISED else self.name

    @property
    def simulated(self) -> Simulated:
        return SIMULATED[self.name]

    @property
    def policy(self) -> str | None:
        """The partition policy the scheme runs (None: equal, or the slices given)."""
        return self.simulated.policy

    @property
    def lockstep(self) -> bool:
        """Simulated as an all-reduce every step, every worker waiting for all."""
        return MODELS[self.simulated.model].lockstep

    @property
    def exact(self) -> bool:
        """Whether every step applies BSP's gradient of the whole global batch."""
        return self.simulated.exact


def parse_scheme(text: str) -> Scheme:
    name, _, value = text.partition(":")
    if name not in SCHEMES:
        raise ValueError(f"{text!r} is not a scheme (allowed: {SCHEME_FORMS})")
    if name in PARAMETERISED:
        if not value.isdigit():
            raise ValueError(f"{text!r}: {name} takes {name}:{PARAMETERISED[name]} with "
                             f"{PARAMETERISED[name]} a whole number")
        return Scheme(name, int(value))
    if value:
        raise ValueError(f"{text!r}: {name} takes no value")
    return Scheme(name)


@dataclass(frozen=True)
class Tail:
    """fc-on-server (harness/exchange/placement.py): the last server holds the model's fully
    connected tail and computes it for every worker in turn, first come first served. Each
    worker computes the layers before it (their forward and backward: these shares of its
    whole model's compute), sends the activations entering the tail (`activation_bytes` a
    sample) and gets their gradient back, of the same size, inside its forward phase, which
    its emulated slowdown stretches, wait included; it pushes and pulls the other layers'
    parameters only (1 - `parameter_share` of them), held by the other servers."""

    head_forward: float
    head_backward: float
    activation_bytes: float
    parameter_share: float

    @property
    def compute_share(self) -> float:
        """The tail's share of a worker's compute of the whole model."""
        return 1.0 - self.head_forward - self.head_backward


@dataclass
class Simulation:
    """Arrays of shape (steps, workers), ns from the simulated start. `kept` marks the
    (step, worker) cells the run did (ps-async stops when the samples are spent)."""

    scheme: Scheme
    workers: list[DeviceClass]
    comm: CommModel
    global_batch: int
    sizes: np.ndarray
    compute: np.ndarray
    slowdown: np.ndarray
    begin: np.ndarray
    ready: np.ndarray
    reduced: np.ndarray
    end: np.ndarray
    after: np.ndarray  # (unpack + apply) time
    # the held-out evaluation in each worker's gap after the step (part of the wall time,
    # not of the training clock: summarise's train_fraction)
    evaluation: np.ndarray = field(default_factory=lambda: np.zeros(0))
    push: np.ndarray = field(default_factory=lambda: np.zeros(0))
    wait: np.ndarray = field(default_factory=lambda: np.zeros(0))
    pull: np.ndarray = field(default_factory=lambda: np.zeros(0))
    staleness: np.ndarray = field(default_factory=lambda: np.zeros(0))
    asynchronous: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    dropped: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    kept: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    # the step number a real run records for the cell: its row, except under backup, whose
    # workers number their steps by the version they computed on (a dropped worker skips)
    step_number: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    partition_history: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        shape = self.begin.shape
        for name in ("push", "wait", "pull", "staleness", "evaluation"):
            if getattr(self, name).shape != shape:
                setattr(self, name, np.zeros(shape))
        for name in ("asynchronous", "dropped"):
            if getattr(self, name).shape != shape:
                setattr(self, name, np.zeros(shape, bool))
        if self.kept.shape != shape:
            self.kept = np.ones(shape, bool)
        if self.step_number.shape != shape:
            self.step_number = np.repeat(np.arange(shape[0], dtype=np.int64)[:, None],
                                         shape[1], axis=1)


# -- drawing ------------------------------------------------------------------------------


def assigned_sources(workers: Sequence[DeviceClass], first: int = 0) -> list[int]:
    """Which of its class's recorded workers each simulated worker keeps to: in turn,
    from the `first`-th (simulated repeat r starts at r: repeats cycle through the
    recorded workers, and so through recorded repeats)."""
    turn: dict[str, int] = {}
    out = []
    for cls in workers:
        j = turn.get(cls.label, first)
        turn[cls.label] = j + 1
        out.append(j % len(cls.sources))
    return out


def draw(workers: Sequence[DeviceClass], steps: int, rng: np.random.Generator,
         first: int = 0) -> tuple[np.ndarray, ...]:
    """Residual, after-exchange, apply, gap, evaluation and communication-ratio arrays
    (steps x workers).

    Each worker keeps to one of its class's recorded workers (in turn), whose series are
    block-bootstrapped together. Workers recorded in one run shared a host and its load:
    the c-th simulated copies of the workers of one run draw the same blocks, so that they
    keep their joint behaviour (slow together, the order in which they finish the
    exchange); different copies draw independently, as different hosts would. The
    exchange varies for all workers together (one draw per step, the first worker's) and
    each worker around it by its own recorded deviations."""
    n = len(workers)
    sources = [cls.sources[j] for cls, j in zip(workers, assigned_sources(workers, first),
                                                 strict=True)]
    copies: dict[int, int] = {}  # id(source) -> workers given it so far
    keys: dict[tuple[str, int], list[int]] = {}  # (run, copy) -> workers drawing alike
    for i, source in enumerate(sources):
        copy = copies.get(id(source), 0)
        copies[id(source)] = copy + 1
        keys.setdefault((source.run_id, copy), []).append(i)
    # one gather per series: every distinct source's series a row of a table (padded), and
    # each worker's (steps) indices into its source's row
    distinct = list({id(source): source for source in sources}.values())
    row_of = {id(source): r for r, source in enumerate(distinct)}
    width = max(len(source.residual) for source in distinct)
    position = np.empty((n, steps), dtype=np.int64)
    for columns in keys.values():
        length = min(len(sources[i].residual) for i in columns)
        block = min(BLOCK, length)
        starts = rng.integers(0, length, size=-(-steps // block))
        position[columns] = ((starts[:, None] + np.arange(block)) % length).ravel()[:steps]
    flat = (position + (np.array([row_of[id(s)] for s in sources]) * width)[:, None]).T.copy()

    def gathered(series: Callable[[Source], np.ndarray]) -> np.ndarray:
        table = np.zeros((len(distinct), width))
        for r, source in enumerate(distinct):
            values = series(source)
            table[r, :len(values)] = values
        return table.ravel()[flat]

    residual, after, gap = (gathered(operator.attrgetter(name))
                            for name in ("residual", "after_ns", "gap_ns"))
    ratio = sources[0].ratios()[position[0]][:, None]  # the exchange's draw: the first's
    return (residual, after, gathered(Source.applies), gap, gathered(Source.evaluations),
            ratio * gathered(Source.deviations))


def slowdowns(workers: Sequence[DeviceClass], steps: int, rng: np.random.Generator
              ) -> np.ndarray:
    """Each worker's emulated slowdown per step: its class's schedule, and its jitter drawn
    afresh per simulated worker."""
    out = np.ones((steps, len(workers)))
    k = np.arange(steps)
    for i, cls in enumerate(workers):
        s = cls.schedule
        if s.slowdown_at:
            points = np.array(s.slowdown_at, dtype=float)
            out[:, i] = np.interp(k, points[:, 0], points[:, 1])
        else:
            out[:, i] = s.slowdown
        if s.jitter:
            probability, extra = s.jitter
            out[:, i] *= np.where(rng.random(steps) < probability, extra, 1.0)
    return out


def lines(workers: Sequence[DeviceClass]) -> tuple[np.ndarray, np.ndarray]:
    return (np.array([c.line.a_ns for c in workers]), np.array([c.line.b_ns for c in workers]))


def static_sizes(scheme: Scheme, workers: Sequence[DeviceClass], total: int,
                 sizes: Sequence[int] | None = None, first: int = 0) -> np.ndarray:
    """`sizes` when given (bsp), equal, or (bsp-profiled) the slices that finish together on
    each worker's typical solo line a + b*n, as the `profiled` policy fits it from two
    solo timings (harness/partition/policies.py profiled_sizes)."""
    n = len(workers)
    if sizes is not None and scheme.simulated.takes_sizes:
        if len(sizes) != n or sum(sizes) != total:
            raise ValueError(f"sizes {list(sizes)} are not {n} slices summing to {total}")
        return np.array(sizes)
    if scheme.policy not in MEASURED:
        return np.array(equal_sizes(total, n))
    a, b = lines(workers)
    # each worker's own level: its class's typical slowdown, its recorded worker's residual
    level = [typical_slowdown(c) * float(np.median(c.sources[j].residual))
             for c, j in zip(workers, assigned_sources(workers, first), strict=True)]
    return np.array(profiled_sizes(total, [(a[i] * level[i], b[i] * level[i])
                                           for i in range(n)]))


# -- schemes ------------------------------------------------------------------------------


def simulate(workers: Sequence[DeviceClass], comm: CommModel, scheme: Scheme, steps: int,
             global_batch: int, seed: int = 0, damping: Damping | None = None,
             sizes: Sequence[int] | None = None, servers: int = 1,
             busiest: float | None = None, tail: Tail | None = None) -> Simulation:
    """Simulate `steps` steps (ps-async: global batches) of the workers under `scheme`
    (`sizes`: bsp's static slices, equal when None; `servers`: parameter servers sharing
    the parameters, for the schemes that use them; `busiest`: the largest share of the
    parameters one of them holds and updates, as the run's placement cuts them
    (hetbench.harness.partition.shards; None: 1 / servers); `tail`: ps-sync's fc-on-server, the
    tail on the last server and the rest shared by the others)."""
    workers = list(workers)
    if not workers:
        raise ValueError("no workers to simulate")
    if global_batch < len(workers):
        raise ValueError(f"global batch {global_batch} < {len(workers)} workers")
    model = MODELS[scheme.simulated.model]
    if tail is not None and (not model.takes_tail or servers < 2):
        raise ValueError("a tail on a server (fc-on-server) needs ps-sync on 2 servers or "
                         "more")
    rng = np.random.default_rng(seed)
    rows = model.rows(workers, steps, comm, scheme.value, tail is not None)
    residual, after, applied, gap, evaluation, ratio = draw(workers, rows, rng, first=seed)
    if model.served:  # the servers make the update; the worker loads it
        after = applied
    evaluation = evaluation_pauses(scheme, evaluation, workers, comm)
    gap = gap + evaluation
    factor = slowdowns(workers, rows, rng)
    a, b = lines(workers)
    slices = np.broadcast_to(static_sizes(scheme, workers, global_batch, sizes, seed),
                             (rows, len(workers))).copy()
    history = [{"step": 0, "sizes": slices[0].tolist(), "reason": f"{scheme.label}: initial"}]
    if scheme.policy in ADAPTIVE:
        compute = adapt(slices, a, b, factor * residual, global_batch, damping or Damping(),
                        history)
    else:
        compute = (a + b * slices) * factor * residual
    common = dict(scheme=scheme, workers=workers, comm=comm, global_batch=global_batch,
                  sizes=slices, compute=compute, slowdown=factor, after=after,
                  evaluation=evaluation, partition_history=history)
    # each worker's exchange: the model's, times its recorded worker's ratio that step
    allreduce = comm.allreduce_ns(len(workers)) * ratio
    if tail is not None:  # the other layers' parameters, on the other servers
        held = 1.0 - tail.parameter_share
        head = dataclasses.replace(comm, bytes=int(comm.bytes * held))
        return _fc_on_server(common, gap, server_model(workers, head, held / (servers - 1),
                                                       ratio), tail, comm, ratio)
    server = server_model(workers, comm, 1 / servers if busiest is None else busiest, ratio)
    return model.run(common, gap, Exchange(allreduce, server), scheme.value, steps)


def _async_rows(workers: Sequence[DeviceClass], steps: int, comm: CommModel) -> int:
    """Rows to draw for ps-async: the fastest worker's share of the pushes, with margin
    (it takes more steps than the slowest), at least the global steps."""
    share = _push_shares(workers, comm).max() * len(workers)
    return int(steps * max(share, 1.0) * 1.5) + 16


def _push_shares(workers: Sequence[DeviceClass], comm: CommModel) -> np.ndarray:
    """Each worker's expected share of ps-async's pushes, from its typical step."""
    a, b = lines(workers)
    typical = np.array([typical_slowdown(c) for c in workers]) * (a + b) + comm.round_trip_ns()
    return (1 / typical) / (1 / typical).sum()


def evaluation_pauses(scheme: Scheme, evaluation: np.ndarray, workers: Sequence[DeviceClass],
                      comm: CommModel) -> np.ndarray:
    """Where the held-out evaluations pause the workers (the loop's, harness/loop/worker.py
    make_evaluator): under a lockstep scheme (local SGD's too) every worker waits for each,
    worker 0's drawn pauses for all; otherwise worker 0 evaluates alone while the others go
    on, and under ps-async as often as the global steps reach the multiples, not its own:
    its recorded pauses (one per eval_every of its steps) scaled by its share of the
    pushes."""
    model = MODELS[scheme.simulated.model]
    if model.evaluations == "together":
        return np.repeat(evaluation[:, :1], evaluation.shape[1], axis=1)
    alone = np.zeros_like(evaluation)
    scale = 1.0
    if model.evaluations == "per-push":
        scale = 1.0 / (_push_shares(workers, comm)[0] * len(workers))
    alone[:, 0] = evaluation[:, 0] * scale
    return alone


def server_model(workers: Sequence[DeviceClass], comm: CommModel, busiest: float,
                 ratio: np.ndarray) -> Server:
    """The parameter servers as measured on this machine class. A push's transfers, the
    whole gradient up and the parameters back (alpha + bytes x beta each way), are the
    worker's, however many servers share them (benchmarks/placement_check.py: a VGG
    worker's push and pull took as long to two servers as to one), and run side by side
    with the other workers' (the ps-async runs of the `sync` suite waited 0.37 ms at the
    server, where transfers served one at a time would queue several milliseconds). What
    a server does one push at a time is the update, which the fitted workers apply after
    each all-reduce (their time after the exchange, the median), each server on its
    shard: the `busiest` one's share of it sets the pace. The exchange's per-step factor
    `ratio` scales the transfers."""
    classes = {id(c): c for c in workers}.values()  # thousands of workers, a few classes
    update = float(np.median(np.concatenate([s.after_ns for c in classes
                                             for s in c.sources])))
    one_way = comm.alpha_ns + comm.bytes * comm.beta_ns_per_byte
    return Server(one_way * ratio, np.full_like(ratio, update * busiest))


@dataclass(frozen=True)
class Server:
    """Per (step, worker): the one way to the servers (the latency and the transfer) and
    the servers' time for one push (server_model). The servers serve pushes one at a time,
    first come first served (their shards in parallel)."""

    latency: np.ndarray
    service: np.ndarray


def serve(arrive: np.ndarray, service: np.ndarray, free: float = -np.inf) -> np.ndarray:
    """When each push has been served, FIFO, the server idle from `free`: d_n = S_n +
    max(free, max_(m<=n) (a_m - S_(m-1))), S the cumulative service in arrival order."""
    order = np.argsort(arrive, kind="stable")
    a, service_sorted = arrive[order], service[order]
    total = np.cumsum(service_sorted)
    start = np.maximum.accumulate(np.maximum(a - (total - service_sorted), free))
    done = np.empty_like(arrive)
    done[order] = total + start
    return done


def serve_pushes(lead: np.ndarray, service: np.ndarray, size: np.ndarray, target: float
                 ) -> tuple[np.ndarray, np.ndarray]:
    """When each push (step k of worker i: [k, i]) was served, NaN for those never made,
    and the pushes in the order served (flat indices k * n + i): one push outstanding per
    worker, whose next arrives `lead` after its push was served, served first come first
    served (ties: the lower worker first), until the pushes served carry `target` samples
    (`size` each) or the rows run out.

    An exact event loop, taken in batches: the pending pushes (one a worker) are served in
    arrival order at once (serve's recurrence); the longest prefix of them that no push
    made by an earlier one of them would arrive before is kept, the rest wait for the next
    batch. Each batch keeps at least one push; with workers of a similar speed, a large
    share of them."""
    rows, n = lead.shape
    served = np.full((rows, n), np.nan)
    sequence = np.empty(rows * n, dtype=np.int64)
    made = 0
    step = np.zeros(n, dtype=np.int64)
    arrival = lead[0].astype(float)
    active = np.arange(n)
    free, samples = -np.inf, 0.0
    while active.size:
        order = active[np.lexsort((active, arrival[active]))]
        a, k = arrival[order], step[order]
        s = service[k, order]
        total = np.cumsum(s)
        done = total + np.maximum.accumulate(np.maximum(a - (total - s), free))
        after = k + 1
        more = after < rows
        upcoming = np.where(more, done + lead[np.minimum(after, rows - 1), order], np.inf)
        # push q keeps its place unless a push of an earlier one arrives before it
        overtaken = np.flatnonzero(a[1:] >= np.minimum.accumulate(upcoming)[:-1])
        count = int(overtaken[0]) + 1 if overtaken.size else order.size
        carried = samples + np.cumsum(size[k[:count], order[:count]])
        reached = int(np.searchsorted(carried, target))  # the first push at the target
        finished = reached < count
        count = reached + 1 if finished else count
        kept = order[:count]
        served[k[:count], kept] = done[:count]
        sequence[made:made + count] = k[:count] * n + kept
        made += count
        if finished:
            break
        samples, free = float(carried[count - 1]), float(done[count - 1])
        arrival[kept], step[kept] = upcoming[:count], after[:count]
        gone = kept[~more[:count]]
        if gone.size:
            active = np.setdiff1d(active, gone, assume_unique=True)
    return served, sequence[:made]


def adapt(sizes: np.ndarray, a: np.ndarray, b: np.ndarray, multiplier: np.ndarray,
          total: int, damping: Damping, history: list[dict[str, Any]]) -> np.ndarray:
    """bsp-adaptive: window by window, the model policy
    (hetbench.harness.partition.policies.Repartitioner) sees each worker's (slice, compute) sums and
    may move samples for the next window."""
    steps, n = sizes.shape
    policy = Repartitioner("model", total, n, damping)
    compute = np.empty_like(multiplier)
    current = sizes[0].copy()
    ends = update_ends(damping.every, steps)
    for start, stop in zip([0, *ends], [*ends, steps], strict=True):
        sizes[start:stop] = current
        window = (a + b * current) * multiplier[start:stop]
        compute[start:stop] = window
        count = stop - start
        spent = window.sum(axis=0).tolist()
        stats = [WindowStats(count, count * size, t, count * size * size, size * t)
                 for size, t in zip(current.tolist(), spent, strict=True)]
        change = policy.update(current.tolist(), stats)
        if change is not None:
            current = np.array(change[0])
            history.append({"step": stop, "sizes": current.tolist(), "reason": change[1]})
    return compute


def _bsp(common: dict[str, Any], gap: np.ndarray, allreduce: np.ndarray) -> Simulation:
    """All begin a step when their previous one ended; a worker's exchange ends its
    allreduce time after the last arrival. arrival_k = arrival_(k-1) + max_i(lead_ki +
    compute_ki), lead being the time from the last arrival to the worker's next begin."""
    compute, after = common["compute"], common["after"]
    lead = np.zeros_like(compute)
    lead[1:] = allreduce[:-1] + after[:-1] + gap[:-1]
    arrival = np.cumsum((lead + compute).max(axis=1))
    previous = np.concatenate([[0.0], arrival[:-1]])[:, None]
    begin = previous + lead
    reduced = arrival[:, None] + allreduce
    return Simulation(begin=begin, ready=begin + compute, reduced=reduced,
                      end=reduced + after, **common)


def _local_sgd(common: dict[str, Any], gap: np.ndarray, allreduce: np.ndarray, every: int
               ) -> Simulation:
    """Local steps back to back; every H-th step (and the last) all-reduces in lockstep."""
    compute, after = common["compute"], common["after"]
    steps, n = compute.shape
    begin, ready, reduced = (np.empty_like(compute) for _ in range(3))
    start = np.zeros(n)
    for first in range(0, steps, every):
        last = min(first + every, steps)
        span = compute[first:last] + after[first:last] + gap[first:last]
        offsets = np.cumsum(span, axis=0) - span  # local starts within the block
        begin[first:last] = start + offsets
        ready[first:last] = begin[first:last] + compute[first:last]
        reduced[first:last] = ready[first:last]  # local steps: no exchange
        reduced[last - 1] = ready[last - 1].max() + allreduce[last - 1]
        start = reduced[last - 1] + after[last - 1] + gap[last - 1]
    local = np.ones((steps, n), bool)
    local[every - 1::every] = False
    local[-1] = False
    return Simulation(begin=begin, ready=ready, reduced=reduced, end=reduced + after,
                      asynchronous=local, **common)


def _backup(common: dict[str, Any], gap: np.ndarray, server: Server, backups: int
            ) -> Simulation:
    """Version by version, as the parameter server does it: version v is made when the
    (N-B)-th push computed on v has been served; a push computed on an older version is
    dropped when it arrives (no work for the server) and its worker starts again at once
    from the current version, so a worker far behind keeps restarting until it is among
    the first N-B of some version. Rows are each worker's own steps."""
    compute, after = common["compute"], common["after"]
    rows, n = compute.shape
    counted = max(n - backups, 1)
    latency, service = server.latency, server.service
    begin, ready, reduced, wait = (np.zeros_like(compute) for _ in range(4))
    dropped, kept = np.zeros((rows, n), bool), np.zeros((rows, n), bool)
    computed_on = np.zeros((rows, n), np.int64)
    worker = np.arange(n)
    start, tag, step = np.zeros(n), np.zeros(n, int), np.zeros(n, int)
    arrive = compute[0] + latency[0]
    free = -np.inf

    def finish(who: np.ndarray, answered: np.ndarray, late: bool, version: int) -> None:
        """`who` end their current step, answered at `answered` (the reply leaves)."""
        k = step[who]
        begin[k, who], ready[k, who] = start[who], arrive[who] - latency[k, who]
        reduced[k, who] = answered + latency[k, who]
        wait[k, who] = answered - arrive[who] - (0 if late else service[k, who])
        dropped[k, who], kept[k, who] = late, True
        computed_on[k, who] = tag[who]
        start[who] = reduced[k, who] + after[k, who] + gap[k, who]
        step[who] = np.minimum(k + 1, rows - 1)
        tag[who] = version
        arrive[who] = start[who] + compute[step[who], who] + latency[step[who], who]

    for v in range(rows - 1):
        while True:
            candidates = worker[tag == v]
            served = serve(arrive[candidates], service[step[candidates], candidates], free)
            cut = np.partition(served, counted - 1)[counted - 1] \
                if len(candidates) >= counted else np.inf
            stale = (tag < v) & (arrive < cut)  # dropped on arrival; they start on v
            if not stale.any():
                break
            finish(worker[stale], arrive[stale], True, v)
        first = candidates[served <= cut][:counted]
        if (step[first] >= rows - 1).any():
            break
        free = cut
        finish(first, np.full(len(first), cut), False, v + 1)
    return Simulation(begin=begin, ready=ready, reduced=reduced, end=reduced + after,
                      push=latency, wait=wait, pull=latency + service, dropped=dropped,
                      kept=kept, asynchronous=np.ones_like(dropped), step_number=computed_on,
                      **common)


def _ps_sync(common: dict[str, Any], gap: np.ndarray, server: Server) -> Simulation:
    """ps-sync is backup without a backup worker: version v is made once every push
    computed on v has been served, and every worker starts the next step from it. Its
    workers step together and a real run records them so (not asynchronous): summarise
    reads idle as the wait for the last worker's gradient, as for bsp."""
    sim = _backup(common, gap, server, 0)
    made = sim.kept.all(axis=1)  # the versions made (backup draws a row more than it ends)
    rows = {f.name: value[made] for f in dataclasses.fields(sim)
            if isinstance(value := getattr(sim, f.name), np.ndarray) and value.ndim == 2}
    return dataclasses.replace(sim, **{**rows, "asynchronous": np.zeros_like(rows["kept"])})


def _fc_on_server(common: dict[str, Any], gap: np.ndarray, server: Server, tail: Tail,
                  comm: CommModel, ratio: np.ndarray) -> Simulation:
    """ps-sync with the tail on a server (Tail), step by step: each worker's real forward
    of its layers, its activations' way to the tail's server, served there first come
    first served (the tail's forward and backward at a CPU worker's line, unslowed: the
    server is an ordinary process), the gradient's way back, that elapsed time stretched by
    its slowdown, then its backward; then the push of its layers' gradient, the version
    made once all are served, and the parameters back."""
    compute, after, slowdown = common["compute"], common["after"], common["slowdown"]
    sizes, workers = common["sizes"], common["workers"]
    rows, n = compute.shape
    cpus = [c.line for c in workers if not c.schedule.is_cuda] or [c.line for c in workers]
    tail_ns = tail.compute_share * np.min([line.a_ns + line.b_ns * sizes for line in cpus],
                                          axis=0)
    way = (comm.alpha_ns + tail.activation_bytes * sizes * comm.beta_ns_per_byte) * ratio
    latency, service = server.latency, server.service
    begin, ready, reduced, wait = (np.zeros_like(compute) for _ in range(4))
    start, tail_free, free = np.zeros(n), -np.inf, -np.inf
    for k in range(rows):
        real_forward = compute[k] / slowdown[k] * tail.head_forward
        served = serve(start + real_forward + way[k], tail_ns[k], tail_free)
        tail_free = float(served.max())
        answered = served + way[k]
        begin[k] = start
        ready[k] = start + (answered - start) * slowdown[k] + compute[k] * tail.head_backward
        arrive = ready[k] + latency[k]
        free = float(serve(arrive, service[k], free).max())  # the version, once all are in
        wait[k] = free - arrive - service[k]
        reduced[k] = free + latency[k]
        start = reduced[k] + after[k] + gap[k]
    return Simulation(begin=begin, ready=ready, reduced=reduced, end=reduced + after,
                      push=latency, wait=wait, pull=latency + service, **common)


def _ssp(common: dict[str, Any], gap: np.ndarray, server: Server, bound: int,
         global_steps: int) -> Simulation:
    """As the parameter server runs ssp: every push is applied as it is served, first come
    first served whatever its clock (a fast worker's clock k+1 can be served before a slow
    one's clock k), and the push of clock c is answered once it is served and every worker
    has pushed clock c - S; the run ends once the pushes served carry `global_steps` global
    batches of samples (the pushes not made then are not kept). An exact event loop over
    the pushes, one outstanding a worker."""
    compute, after, sizes = common["compute"], common["after"], common["sizes"]
    rows, n = compute.shape
    latency, service = server.latency, server.service
    begin, arrive, served, answered = (np.zeros((rows, n)) for _ in range(4))
    arrive[0] = compute[0] + latency[0]
    pending = [(float(arrive[0, w]), w) for w in range(n)]  # (arrival, worker)
    heapq.heapify(pending)
    held: list[tuple[int, int, int]] = []  # (clock everyone must have pushed, clock, worker)
    at_clock = np.zeros(rows + 1, int)  # workers by pushes served
    at_clock[0] = n
    slowest, free, carried = 0, -np.inf, 0.0
    target = float(global_steps * common["global_batch"])
    clock = np.zeros(n, int)
    sequence: list[int] = []  # flat indices (clock * n + worker), in the order served

    def answer(c: int, w: int, when: float) -> None:
        answered[c, w] = when
        if c + 1 < rows:
            begin[c + 1, w] = when + latency[c, w] + after[c, w] + gap[c, w]
            arrive[c + 1, w] = begin[c + 1, w] + compute[c + 1, w] + latency[c + 1, w]
            heapq.heappush(pending, (float(arrive[c + 1, w]), w))

    while pending and carried < target:
        when, w = heapq.heappop(pending)
        c = int(clock[w])
        free = served[c, w] = max(when, free) + service[c, w]
        sequence.append(c * n + w)
        carried += sizes[c, w]
        clock[w] = c + 1
        at_clock[c] -= 1
        at_clock[c + 1] += 1
        while at_clock[slowest] == 0:
            slowest += 1
        heapq.heappush(held, (c + 1 - bound, c, w))
        while held and held[0][0] <= slowest:  # every worker has pushed c - S
            _, c_held, w_held = heapq.heappop(held)
            answer(c_held, w_held, free)
    kept = np.zeros((rows, n), bool)
    kept.ravel()[sequence] = True
    begin[~kept] = 0.0
    ready = begin + compute
    # a push held when the run ended is answered then (the servers say: done)
    answered = np.where(kept & (answered == 0), free, answered)
    done = np.where(kept, served, arrive + service)
    reduced = np.where(kept, answered, done) + latency
    return Simulation(begin=begin, ready=ready, reduced=reduced, end=reduced + after,
                      push=latency, wait=np.where(kept, answered - service - arrive, 0.0),
                      pull=latency + service,
                      staleness=_staleness_in_order(done, begin, np.array(sequence)),
                      kept=kept, asynchronous=np.ones((rows, n), bool), **common)


def _async(common: dict[str, Any], gap: np.ndarray, server: Server, global_steps: int
           ) -> Simulation:
    """Every worker on its own clock, one push outstanding each, the servers serving pushes
    first come first served (serve_pushes, exact), the rest vectorised. The run ends once
    the pushes served carry `global_steps` global batches of samples."""
    compute, after, sizes = common["compute"], common["after"], common["sizes"]
    rows, n = compute.shape
    latency, service = server.latency, server.service
    # from the previous push served to this one's arrival: the reply's way back, unpack
    # and apply, the loop's gap, the compute, the way to the server
    lead = compute + latency
    lead[1:] += latency[:-1] + after[:-1] + gap[:-1]
    served, sequence = serve_pushes(lead, service, sizes.astype(float),
                                    float(global_steps * common["global_batch"]))
    kept = ~np.isnan(served)
    # the rows drawn beyond the fastest worker's last push (a margin) are not kept
    rows = int(np.flatnonzero(kept.any(axis=1))[-1]) + 1
    common = {**common, **{name: common[name][:rows]
                           for name in ("sizes", "compute", "slowdown", "after",
                                        "evaluation")}}
    compute, after, latency, service, gap = (x[:rows] for x in (common["compute"],
                                                                 common["after"], latency,
                                                                 service, gap))
    kept = kept[:rows]
    begin = np.zeros((rows, n))  # after the previous push's reply came back
    begin[1:] = served[:rows - 1] + latency[:-1] + after[:-1] + gap[:-1]
    begin[~kept] = 0.0
    arrive = begin + compute + latency
    done = np.where(kept, served[:rows], arrive + service)
    reduced = done + latency
    return Simulation(begin=begin, ready=begin + compute, reduced=reduced,
                      end=reduced + after, push=latency, wait=done - service - arrive,
                      pull=latency + service,
                      staleness=_staleness_in_order(done, begin, sequence),
                      kept=kept, asynchronous=np.ones_like(kept), **common)


def _staleness_in_order(applied: np.ndarray, begin: np.ndarray, sequence: np.ndarray
                        ) -> np.ndarray:
    """Per push made (flat indices in the order served, `sequence`; 0 for the others): the
    updates applied before it minus those applied when its worker took the parameters it
    computed on (about its step's begin), the server's version at apply minus the version
    computed on, as the parameter server records it."""
    pushes = applied.ravel()[sequence]
    index = np.arange(pushes.size)
    # the pushes applied before each: the first of those applied at the same instant
    before = np.maximum.accumulate(np.where(np.r_[True, pushes[1:] != pushes[:-1]], index, 0))
    at_pull = np.searchsorted(pushes, begin.ravel()[sequence], side="right")
    out = np.zeros(applied.size)
    out[sequence] = np.maximum(before - at_pull, 0)
    return out.reshape(applied.shape)


@dataclass(frozen=True)
class Exchange:
    """A step's exchange as the models take it, per (step, worker): the all-reduce's time
    and the parameter servers' (server_model)."""

    allreduce: np.ndarray
    server: Server


@dataclass(frozen=True)
class Model:
    """One of the simulator's models, by the name an aggregator's `Kind.simulation` gives
    (harness/spec/aggregators.py): its steps from the common arrays, the gaps, the exchange,
    the scheme's value and the steps asked for; the rows of draws a run of `steps` needs
    (workers, steps, comm, value, whether a tail is on a server); whether the servers make
    the update (the workers load it); whether it is an all-reduce every step (partition
    policies and leave-outs keep the recorded exchange); how worker 0's held-out
    evaluations pause the others ("together": all wait; "alone": it evaluates while they go
    on; "per-push": alone, as often as the global steps reach the multiples); whether a
    tail on a server (fc-on-server) runs under it."""

    run: Callable[[dict[str, Any], np.ndarray, Exchange, int, int], Simulation]
    rows: Callable[[Sequence[DeviceClass], int, CommModel, int, bool], int] = \
        lambda workers, steps, comm, value, tail: steps
    served: bool = False
    lockstep: bool = False
    evaluations: str = "alone"
    takes_tail: bool = False


MODELS: dict[str, Model] = {
    "bsp": Model(lambda common, gap, x, value, steps: _bsp(common, gap, x.allreduce),
                 lockstep=True, evaluations="together"),
    "local-sgd": Model(lambda common, gap, x, value, steps:
                       _local_sgd(common, gap, x.allreduce, max(value, 1)),
                       evaluations="together"),
    "backup": Model(lambda common, gap, x, value, steps: _backup(common, gap, x.server, value),
                    lambda workers, steps, comm, value, tail: steps + 1, served=True),
    "ps-sync": Model(lambda common, gap, x, value, steps: _ps_sync(common, gap, x.server),
                     lambda workers, steps, comm, value, tail: steps if tail else steps + 1,
                     served=True, takes_tail=True),
    # the fastest can be S + 1 steps ahead of the slowest when the run ends
    "ssp": Model(lambda common, gap, x, value, steps: _ssp(common, gap, x.server, value, steps),
                 lambda workers, steps, comm, value, tail: steps + value + 2, served=True),
    # fast workers take more steps than K: enough rows for the fastest
    "ps-async": Model(lambda common, gap, x, value, steps: _async(common, gap, x.server, steps),
                      lambda workers, steps, comm, value, tail:
                      _async_rows(workers, steps, comm),
                      served=True, evaluations="per-push"),
}


# -- summary ------------------------------------------------------------------------------


def summarise(sim: Simulation) -> dict[str, float]:
    """What metrics.run_summary reports for a real run, by the same definitions (the test
    holds the two together on written records), with the p99 step time (per step when the
    workers step together, else per worker step), mean staleness and dropped share."""
    kept = sim.kept
    steps, n = sim.begin.shape
    lock = ~sim.asynchronous
    arrival = np.where(kept & lock, sim.ready, -np.inf).max(axis=1, keepdims=True)
    idle = np.where(lock, arrival - sim.ready, sim.wait)
    comm = np.where(lock, sim.reduced - arrival, sim.push + sim.pull)
    busy = np.where(kept, sim.end - sim.begin, 0).sum()
    wall = np.where(kept, sim.end, -np.inf).max() - np.where(kept, sim.begin, np.inf).min()
    used = np.where(kept & ~sim.dropped, sim.sizes, 0).sum()
    if sim.asynchronous[kept].any():  # run_summary's asynchronous branch
        global_batch = float(np.nanmedian(np.where(kept, sim.sizes, np.nan), axis=0).sum())
        mean_step = wall * global_batch / used if used else np.nan
        step_times = (sim.end - sim.begin)[kept]
    else:
        step_times = sim.end.max(axis=1) - sim.begin.min(axis=1)
        mean_step = float(step_times.mean())
    return {
        "workers": n, "steps": int(kept.any(axis=1).sum()),
        "samples_per_s": float(used / wall * 1e9) if wall > 0 else np.nan,
        "mean_step_ms": float(mean_step / 1e6),
        "p99_step_ms": float(np.percentile(step_times, 99) / 1e6),
        "idle_fraction": float(np.where(kept, idle, 0).sum() / busy) if busy else np.nan,
        "compute_share": float(np.where(kept, sim.ready - sim.begin, 0).sum() / busy)
        if busy else np.nan,
        "comm_share": float(np.where(kept, comm, 0).sum() / busy) if busy else np.nan,
        "mean_staleness": float(sim.staleness[kept].mean()),
        "dropped_fraction": float(sim.dropped[kept].mean()),
        # the training clock's share of the wall time: the evaluation's pauses of worker 0
        # (which keeps that clock, harness/training/evaluation.py) left out
        "train_fraction": float(1 - sim.evaluation[np.flatnonzero(kept[:, 0])[:-1], 0].sum()
                                / wall) if wall > 0 else np.nan,
    }


# -- records ------------------------------------------------------------------------------

ORIGIN_NS = 1_000_000_000  # simulated time starts at 1 s (a zero `ready` reads as untimed)


def records(sim: Simulation) -> np.ndarray:
    """The simulated steps as the rows a real run writes
    (hetbench.harness.records.collector.RECORD_DTYPE), step by step. Compute is split over its
    phases in each class's recorded shares; unpack and apply are one (apply_ns); losses and system
    counters are not simulated (NaN and 0)."""
    from hetbench.harness.records.collector import COMPUTE_PHASES, RECORD_DTYPE

    step, rank = np.nonzero(sim.kept)
    rows = np.zeros(len(step), dtype=RECORD_DTYPE)
    rows["rank"], rows["step"] = rank, sim.step_number[step, rank]
    sizes = sim.sizes
    rows["batch_size"] = sizes[step, rank]
    rows["slice_start"] = (np.cumsum(sizes, axis=1) - sizes)[step, rank]

    def at(values: np.ndarray) -> np.ndarray:
        return np.rint(values[step, rank]).astype(np.int64)

    begin, ready = at(sim.begin) + ORIGIN_NS, at(sim.ready) + ORIGIN_NS
    reduced = np.maximum(at(sim.reduced) + ORIGIN_NS, ready)
    end = np.maximum(at(sim.end) + ORIGIN_NS, reduced)
    rows["begin_ns"], rows["ready_ns"], rows["reduced_ns"], rows["end_ns"] = (
        begin, ready, reduced, end)
    compute = ready - begin
    shares = np.array([w.phase_shares for w in sim.workers])[rank]
    spent = np.zeros_like(compute)
    for j, phase in enumerate(COMPUTE_PHASES[:-1]):
        part = (compute * shares[:, j]).astype(np.int64)
        rows[f"{phase.value}_ns"] = part
        spent += part
    rows[f"{COMPUTE_PHASES[-1].value}_ns"] = compute - spent
    rows["allreduce_ns"] = reduced - ready
    rows["apply_ns"] = end - reduced
    slowdown = sim.slowdown[step, rank]
    rows["stretch_ns"] = (compute * (1 - 1 / slowdown)).astype(np.int64)
    rows["loss"] = rows["local_loss"] = np.nan
    rows["staleness"] = sim.staleness[step, rank].astype(np.int64)
    for name in ("push", "wait", "pull"):
        rows[f"{name}_ns"] = np.maximum(at(getattr(sim, name)), 0)
    rows["asynchronous"] = sim.asynchronous[step, rank]
    rows["dropped"] = sim.dropped[step, rank]
    return rows
