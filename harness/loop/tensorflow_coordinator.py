"""The coordinator of a tensorflow-ps run: TensorFlow's ParameterServerStrategy training an
all-TensorFlow job, recorded as hetbench records every worker's steps.

Started by node 0's launcher as a service (harness/exchange/tensorflow_ps.py) beside the
ps servers; it serves the store the run's tasks meet in, waits until every server listens
(on any host), connects as the cluster's chief, places the model's variables on the ps
servers (TensorFlow's own placement: round-robin, recorded) and schedules one step
function per step on whichever worker is free (ClusterCoordinator), until the servers
have applied the samples of `steps` global batches, as hetbench's ps-async does: a fast
worker takes more steps than a slow one.

One step on worker r, its k-th: read the version counter and the parameters from the ps
(the pull), take slice r of global batch k (the data is a tf.data pipeline on the worker,
the same batches as hetbench's own ps-async), forward, backward, stretch by the worker's
emulated slowdown, then apply the gradient sum over the global batch to every variable
on its ps with TensorFlow's own SGD kernel, and add 1 to the version (the push). Each
instant comes from tf.timestamp on the worker (wall clock), mapped onto the coordinator's
host's monotonic clock, in which all of the run's records are then: across hosts as
exactly as the hosts' wall clocks agree (NTP's error; the testbed's hosts share one wall
clock, their time namespaces shift only the monotonic one).

The record of a worker's step k is hetbench's ps-async's: compute from the slice's load to
the gradients (and the stretch), then the exchange: the push, the wait until the
coordinator hands the worker its next function (its idle: `wait_ns`), and that function's
pull. Staleness: the version after this update minus the version read at its pull minus
1 (the updates applied in between). TensorFlow applies neither the update with its version
increment nor the reads of the version and the parameters atomically, so with several
workers a concurrent update can shift an update's staleness by one; with one worker it is
exact (0).

Emulated slowdown (tensorflow_ps_graph.py): TensorFlow has no sleep op for a function, so
the stretch naps on a per-worker tf.data iterator each of whose elements sleeps QUANTUM_US
(SleepDataset), and spins on tf.timestamp through the last quantum: at most ~1 ms of a core
per step.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import traceback
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from hetbench.harness.exchange import Exchange, Holds
from hetbench.harness.exchange import tensorflow_ps as served
from hetbench.harness.exchange.tensorflow_ps import COORDINATOR, TIMES
from hetbench.harness.loop import engine
from hetbench.harness.loop.counters import UNMEASURED_COMPUTE
from hetbench.harness.loop.engine import Record, Turn
from hetbench.harness.partition.policies import equal_sizes, largest_remainder, slice_bounds
from hetbench.harness.records import collector, rundir
from hetbench.harness.spec.suite import RunSpec, run_from_dict
from hetbench.harness.system import clocks
from hetbench.workloads import build_spec, get_workload
from hetbench.workloads.data import BatchOrder, load_dataset

if TYPE_CHECKING:
    from hetbench.harness.training.evaluation import Evaluator

POLL_S = 0.1
NO_COUNTERS = (0,) * 7  # context switches, CPU, rss, gc: of a TF server, not measured


class Stopped(BaseException):
    pass


def static_sizes(run: RunSpec) -> tuple[int, ...]:
    """The slices: fixed before the run (config refuses the policies that measure)."""
    policy = run.partition
    if policy.policy == "sizes":
        return tuple(policy.sizes or ())
    if policy.policy == "weights":
        return largest_remainder(run.global_batch, policy.weights or ())
    return equal_sizes(run.global_batch, run.world_size)


def wait_for_servers(store: Any, run: RunSpec) -> None:
    """Until every worker and ps server listens (says so in the store), wherever it runs."""
    ready = [served.READY_KEY.format(job=job, index=i)
             for job in ("worker", "ps") for i in range(served.tasks(run)[job])]
    served.wait_for(store, ready, "the TensorFlow servers did not all start",
                    served.meet_timeout_s(run))


def worker_infos(store: Any, run: RunSpec) -> list[dict[str, Any]]:
    """What each worker server said of itself. Its records are in this process's clock
    (Recorder maps them here): that is their clock domain; the worker's host's is kept."""
    infos = [json.loads(bytes(text).decode()) for text in store.multi_get(
        [served.INFO_KEY.format(rank=r) for r in range(run.world_size)])]
    return [{**i, "clock_domain": clocks.domain(), "host_clock_domain": i["clock_domain"]}
            for i in infos]


def let_servers_go(store: Any, run: RunSpec) -> None:
    """Say the run is closed, and keep the store up until every server saw it (at most
    LEAVE_S: the launchers stop the rest)."""
    store.set(served.SERVED_KEY, "1")
    deadline = time.monotonic() + served.LEAVE_S
    everyone = run.world_size + run.aggregator.servers
    while store.add(served.LEFT_KEY, 0) < everyone and time.monotonic() < deadline:
        time.sleep(POLL_S)


def wall_to_monotonic_ns() -> int:
    """wall clock ns minus perf_counter ns (CLOCK_MONOTONIC, every record's clock) on this
    host: from the tightest of a few paired reads."""
    best = None
    for _ in range(16):
        before = time.time_ns()
        mono = time.perf_counter_ns()
        after = time.time_ns()
        if best is None or after - before < best[0]:
            best = (after - before, (before + after) // 2 - mono)
    assert best is not None
    return best[1]


class Recorder:
    """Turns the step functions' outputs into hetbench records. A worker's step is released
    once its next step arrived: its exchange ends with the next step's pull.

    Outputs are fetched in the order their functions were scheduled, which is not always
    the order a worker ran them: the outputs of a worker stopped for 15 s (SIGSTOP, then the
    launcher's SIGCONT as it ended the run) came as its k = 53, 57, 54, 55, 56, and pairing
    by arrival gave step 57 an exchange of -66 ms. So each worker's outputs wait,
    ordered by k (the worker's own step count, in the order it ran them), until k + 1 has
    come; a gap (a function lost with its worker) waits at most as many outputs as can be
    in flight, then pairs with the next one there is."""

    def __init__(self, bounds: list[tuple[int, int]]) -> None:
        self.bounds = bounds
        self.offset = wall_to_monotonic_ns()
        self.held: dict[int, dict[int, dict[str, Any]]] = {}  # rank -> k -> output
        self.samples = 0
        # RemoteSteps keeps up to 2 x world size functions scheduled, and one is fetched
        self.in_flight = 2 * len(bounds) + 1

    def add(self, out: dict[str, Any]) -> list[Record]:
        """The records `out` (one remote step's outputs) completes: its worker's earlier
        steps whose next step is now here."""
        rank = int(out["rank"])
        out["ns"] = {name: int(round(float(t) * 1e9)) - self.offset
                     for name, t in zip(TIMES, out["times"], strict=True)}
        self.samples += int(out["samples"])
        held = self.held.setdefault(rank, {})
        held[int(out["step"])] = out
        done = []
        while len(held) > 1:
            first = min(held)
            if first + 1 not in held and len(held) <= self.in_flight:
                break
            cur = held.pop(first)
            done.append(self._record(cur, held[min(held)]))
        return done

    def release(self) -> list[Record]:
        """The records of the steps still held: each with the next one held, if any; every
        worker's last with no next pull."""
        done = []
        for rank in sorted(self.held):
            outs = [self.held[rank][k] for k in sorted(self.held[rank])]
            done += [self._record(cur, nxt)
                     for cur, nxt in zip(outs, [*outs[1:], None], strict=True)]
        self.held.clear()
        return done

    def _record(self, cur: dict[str, Any], nxt: dict[str, Any] | None) -> Record:
        rank, n, t = int(cur["rank"]), int(cur["samples"]), cur["ns"]
        reduced = nxt["ns"]["pulled"] if nxt else t["pushed"]
        wait = nxt["ns"]["t0"] - t["pushed"] if nxt else 0
        pull = nxt["ns"]["pulled"] - nxt["ns"]["t0"] if nxt else 0
        # begin, then each phase's end: load, to_device (none: the data is on the
        # worker), forward, backward, pack (the stretch), exchange, unpack, apply
        marks = [t["pulled"], t["loaded"], t["loaded"], t["forward"], t["backward"],
                 t["ready"], reduced, reduced, reduced]
        exchange = Exchange(Holds.PARAMETERS, n, None, staleness=int(cur["staleness"]),
                            push_ns=t["pushed"] - t["ready"], wait_ns=wait, pull_ns=pull,
                            asynchronous=True)
        loss = float(cur["loss"]) / n
        return collector.timed_record(
            rank, int(cur["step"]), n, self.bounds[rank][0], marks,
            (t["ready"] - t["backward"], 0, 0), UNMEASURED_COMPUTE, loss, loss, NO_COUNTERS,
            exchange)


class RemoteSteps:
    """The workers' steps as the step engine takes them (harness/loop/engine.py): each turn
    collects the next step function to finish, keeping enough scheduled that no worker
    waits for the coordinator, no more than the budget needs; once the servers have applied
    the samples of `steps` global batches, the last turn collects those still in flight
    (they are applied too) and every worker's last step."""

    def __init__(self, coordinator: Any, step: Any, args: tuple[Any, ...], recorder: Recorder,
                 run: RunSpec) -> None:
        self.coordinator, self.step, self.args, self.recorder = coordinator, step, args, recorder
        self.batch, self.world_size = run.global_batch, run.world_size
        self.budget = run.steps * run.global_batch
        self.pending: deque[Any] = deque()

    def take(self, turn: int) -> Turn:
        recorder, pending = self.recorder, self.pending
        if recorder.samples < self.budget:
            mean_slice = self.batch / self.world_size
            while len(pending) < 2 * self.world_size and \
                    recorder.samples + len(pending) * mean_slice < self.budget:
                pending.append(self.coordinator.schedule(self.step, args=self.args))
            records = recorder.add(pending.popleft().fetch())
            return Turn(records, turn + 1, recorder.samples // self.batch)
        self.coordinator.join()
        records = []
        while pending:
            records += recorder.add(pending.popleft().fetch())
        records += recorder.release()
        return Turn(records, None, recorder.samples // self.batch)

    def between(self, step: int, turn: Turn) -> None:
        pass


@dataclass
class ServedEvaluation:
    """The coordinator evaluates the servers' parameters, as worker 0 of hetbench's
    asynchronous schemes evaluates its own (harness/training/evaluation.py); training
    goes on meanwhile."""

    evaluator: Evaluator
    model: Any  # tensorflow_ps_graph.Model

    def due(self, progress: int) -> bool:
        return self.evaluator.due(progress)

    def __call__(self, progress: int) -> None:
        self.model.pull()
        self.evaluator(progress)


def batch_tables(run: RunSpec, samples: int) -> tuple[np.ndarray, np.ndarray]:
    """Global batch k's sample indices (rows[k], hetbench's BatchOrder) and worker r's
    emulated slowdown at its k-th step (factors[r, k]), for k below the most steps a worker
    takes with equal slices (its pipeline repeats them after)."""

    most = run.steps * run.world_size
    order = BatchOrder(samples, run.global_batch, run.seed)
    rows = np.stack([order.indices(k) for k in range(most)]).astype(np.int64)
    factors = np.array([[w.factor_at(k, run.seed, r) for k in range(most)]
                        for r, w in enumerate(run.workers)], dtype=np.float64)
    return rows, factors


def train(run: RunSpec, run_dir: Path, store: Any) -> None:
    """Connect, train, write the run's results (steps, parameters, evaluations, manifest)."""
    from hetbench.adapters.tensorflow import configure_threads

    configure_threads(1)  # before TensorFlow's runtime starts
    from hetbench.harness.exchange import tensorflow_ps_graph as graph
    from hetbench.harness.training.evaluation import Evaluator

    served.say_where(store, "chief", 0)  # its runtime serves the chief task there
    cluster = served.cluster_spec(store, run)
    (run_dir / collector.PARTS_DIR / f"{COORDINATOR}.json").write_text(
        json.dumps({"pid": os.getpid(), "cluster": cluster}))
    wait_for_servers(store, run)
    coordinator = graph.connect(json.dumps(cluster))
    data = load_dataset(run.dataset, run.workload, run.seed)
    spec = build_spec(run.workload, data.sample_shape, data.num_classes, run.size)
    model = graph.Model(coordinator, spec, spec.initial_parameters(run.seed))
    sizes = static_sizes(run)
    bounds = slice_bounds(sizes)
    rows, factors = batch_tables(run, len(data))
    step = graph.step_function(model, run.lr / run.global_batch, factors)
    batches = iter(coordinator.create_per_worker_dataset(graph.batches_fn(
        data.inputs, data.targets.astype(np.int64), rows, bounds, model.workload.NHWC)))
    sleepers = iter(coordinator.create_per_worker_dataset(graph.sleeper_fn))
    evaluator = None if not run.eval_every else Evaluator.alone(
        run.eval_every, run.steps, run.global_batch, get_workload(run.workload).metric,
        model.local, load_dataset(run.dataset, run.workload, run.seed, "heldout"), run_dir)
    evaluation = None if evaluator is None else ServedEvaluation(evaluator, model)
    if evaluator is not None and evaluation is not None:
        evaluation(0)
        evaluator.start_clock()
    writers = [collector.RecordWriter(collector.part_path(run_dir, r))
               for r in range(run.world_size)]

    def write(record: Record) -> None:
        writers[record[collector.RANK_FIELD]].append(record)

    recorder = Recorder(bounds)
    try:
        engine.run_steps(RemoteSteps(coordinator, step, (batches, sleepers), recorder, run),
                         write, evaluation, gc_mode=run.gc)
    finally:
        for record in recorder.release():  # stopped early: what it holds is recorded
            write(record)
        arrays = [w.records() for w in writers]
        for w in writers:
            w.close()
    close(run, run_dir, arrays, model.pull().parameters(), sizes, model.placement(),
          worker_infos(store, run), cluster)


def close(run: RunSpec, run_dir: Path, arrays: list[np.ndarray],
          parameters: dict[str, np.ndarray], sizes: tuple[int, ...],
          placement: dict[str, str], infos: list[dict[str, Any]],
          cluster: dict[str, list[str]]) -> None:
    """What rank 0 writes at the end of any other run (hetbench.harness.loop.lifecycle.finish)."""
    rundir.complete(
        run_dir, arrays, infos, parameters, {},
        "grpc", {"partition_history": [{"step": 0, "sizes": list(sizes),
                                        "reason": f"policy {run.partition.policy}"}],
                 "standalone": [],
                 "aggregator": {"servers": run.aggregator.servers,
                                "mode": "ParameterServerStrategy", "placement": placement,
                                "cluster": cluster}})


def _raise_stopped(signum: int, frame: Any) -> None:
    raise Stopped(signal.Signals(signum).name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {__name__}")
    parser.add_argument("--run-dir", type=Path, required=True)
    run_dir = parser.parse_args(argv).run_dir.resolve()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _raise_stopped)
    run = run_from_dict(json.loads((run_dir / rundir.RUN_FILE).read_text())["run"])
    (run_dir / collector.PARTS_DIR / f"{COORDINATOR}.json").write_text(
        json.dumps({"pid": os.getpid()}))
    try:
        store = served.meeting(run, serve=True)
        train(run, run_dir, store)
    except Stopped:
        return 130
    except Exception as exc:  # noqa: BLE001 - its last line is the launcher's reason
        traceback.print_exc()
        first = str(exc).splitlines()[0] if str(exc) else ""
        print(f"hetbench coordinator: error: {type(exc).__name__}: {first}", file=sys.stderr,
              flush=True)
        return 1
    try:
        let_servers_go(store, run)
    except Stopped:  # the run is closed already; the launcher stops the servers
        pass
    return 0


if __name__ == "__main__":
    from hetbench.harness.system.exits import exit_after

    # without TensorFlow's teardown, which would call the servers as they leave
    exit_after(main)
