"""A worker process: its setup, its slices and the data-parallel loop around `Trainer`'s step
(harness/loop/trainer.py), its model and batches from its source (harness/loop/sources.py).

Started by `hetbench run` (one process per worker on this host) or by torchrun on each node:

    python -m hetbench.harness.loop.worker --run-dir DIR       # prepared by hetbench run
    torchrun ... -m hetbench.harness.loop.worker --suite S --run-name NAME --out DIR
                                                              # env:// rendezvous

Rank and world size come from RANK and WORLD_SIZE. Core affinity and thread counts are set
before any framework is imported, so every framework thread inherits them.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import signal
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hetbench.adapters.base import Adapter
from hetbench.harness import exchange as aggregators
from hetbench.harness.exchange import (
    AlignsServerClocks,
    CountsTraffic,
    LeavesOut,
    Overlaps,
    RecordsBuckets,
)
from hetbench.harness.loop import engine, lifecycle, sources
from hetbench.harness.loop.counters import Counters
from hetbench.harness.loop.profiling import step_profiler
from hetbench.harness.loop.trainer import Trainer
from hetbench.harness.loop.training_source import Source
from hetbench.harness.partition.policies import (
    Damping,
    Repartitioner,
    initial_sizes,
    measures,
    probe_sizes,
    slice_bounds,
    solo_line,
)
from hetbench.harness.records import collector, rundir
from hetbench.harness.records.collector import RecordWriter
from hetbench.harness.spec.errors import UsageError
from hetbench.harness.spec.suite import RunSpec, load_suite, run_from_dict
from hetbench.harness.spec.workers import WorkerSpec
from hetbench.harness.system import allocator, interfaces, orphans, perf
from hetbench.harness.system.exits import exit_after

if TYPE_CHECKING:

    pass

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


class Stopped(BaseException):
    """Raised in the main thread by SIGTERM/SIGINT so records are flushed on the way out."""


def prepare_process(worker: WorkerSpec, keep_freed_memory: bool) -> None:
    """Affinity and thread limits first: threads started later inherit them; the allocator
    before the framework's first allocations."""
    if keep_freed_memory:
        allocator.keep_freed_memory()
    if worker.cores:
        os.sched_setaffinity(0, worker.cores)
    for name in THREAD_VARIABLES:
        os.environ[name] = str(worker.threads)
    # the kernel's counters on this thread before it starts any other: every thread and
    # process it starts after is counted with it (harness/system/perf.py)
    perf.open_process_counters()
    orphans.follow_launcher()  # no worker outlives a killed `hetbench run`


def initial_partition(trainer: Trainer, comm: Any, device: Any) -> tuple[int, ...]:
    run, policy = trainer.run, trainer.run.partition
    n, total = run.world_size, run.global_batch
    reason = f"policy {policy.policy}"
    lines = None
    if measures(policy):
        # each worker timed alone at two slices, one at a time, the others in the barrier
        probes = probe_sizes(total, n)
        mine = [0.0, 0.0]
        for turn in range(n):
            if turn == trainer.rank:
                mine = [probe / trainer.solo_throughput(probe, policy.profile_steps) * 1e9
                        for probe in probes]
            comm.barrier()
        lines = [solo_line(list(zip(probes, times, strict=True)))
                 for times in comm.all_gather_vectors(mine, device)]
        trainer.solo_lines = lines
        reason += (f": solo compute at {probes[0]} and {probes[1]} samples, fitted "
                   f"a + b*n (ms, ms/sample) "
                   f"{[(round(a / 1e6, 3), round(b / 1e6, 4)) for a, b in lines]}")
    sizes = initial_sizes(policy, total, n, lines, trainer.min_slice)
    if policy.adaptive:
        reason += f", then adaptive ({policy.policy})"
    trainer.partition_history.append({"step": 0, "sizes": list(sizes), "reason": reason})
    return sizes


def make_repartitioner(run: RunSpec, solo_lines: Sequence[tuple[float, float]] | None = None,
                       min_slice: int = 1) -> Repartitioner | None:
    """The adaptive policy's repartitioner; started from profiled lines, their intercepts
    are its prior (what a fit over slices too alike to tell them apart falls back to). Its
    smallest slice is the suite's `min_slice`, at least the model's `min_slice`."""
    p = run.partition
    if not p.adaptive:
        return None
    prior = [a for a, _ in solo_lines] if solo_lines else None
    damping = dataclasses.replace(Damping.of(p), min_slice=max(p.min_slice, min_slice))
    return Repartitioner(p.policy, run.global_batch, run.world_size, damping,
                         prior_intercepts_ns=prior, leave_out=p.leave_out)


def calibrate(trainer: Trainer, comm: Any, device: Any, sizes: tuple[int, ...]
              ) -> list[dict[str, Any]]:
    """Each worker's standalone samples/s on its own slice, one worker at a time: the
    denominator of heterogeneous efficiency (DESIGN.md)."""
    steps = trainer.run.calibrate_steps
    rate = 0.0
    for turn in range(trainer.run.world_size):
        if turn == trainer.rank:
            rate = trainer.solo_throughput(sizes[trainer.rank], steps)
        comm.barrier()
    rates = comm.all_gather_floats(rate, device)
    return [{"rank": r, "batch_size": sizes[r], "samples_per_s": rates[r], "steps": steps}
            for r in range(len(rates))]



def train(run: RunSpec, run_dir: Path, rank: int, backend: str, adapter_cls: type[Adapter]) -> None:
    """Build the worker's source (its trainer and input pipeline), train it, stop the
    pipeline."""
    if run.pipeline is not None:  # a stage of a virtual worker: its own loop
        from hetbench.harness.loop.stage import train_stage

        train_stage(run, run_dir, rank, backend)
        return
    aggregators.prepare(run, rank)
    source = sources.build(run, rank, backend, adapter_cls)
    try:
        _attach_and_train(run, run_dir, rank, backend, adapter_cls, source)
    finally:
        source.close()


def _attach_and_train(run: RunSpec, run_dir: Path, rank: int, backend: str,
                      adapter_cls: type[Adapter], source: Source) -> None:
    """The aggregator attached to the source's trainer, then the training."""
    trainer = source.trainer
    trainer.aggregator = aggregators.create(aggregators.Context(
        run, rank, trainer.adapter, trainer.buffer, trainer.optimizer, trainer.initial,
        run_dir, trainer.stretch))
    if aggregators.kind(run.aggregator.name).overlaps:
        assert isinstance(trainer.aggregator, Overlaps)
        trainer.overlap = trainer.aggregator
    failed = True
    try:
        _train(run, run_dir, rank, backend, adapter_cls, source)
        failed = False
    finally:
        trainer.aggregator.close(failed)


def _train(run: RunSpec, run_dir: Path, rank: int, backend: str, adapter_cls: type[Adapter],
           source: Source) -> None:
    import torch

    from hetbench.harness.exchange import comm
    from hetbench.harness.loop.data_parallel import WorkerSteps
    from hetbench.harness.loop.membership import Membership
    from hetbench.harness.loop.repartitioning import Repartitioning

    worker = run.workers[rank]
    trainer = source.trainer
    adapter = trainer.adapter
    device = torch.device(worker.device if backend == "nccl" else "cpu")

    info = lifecycle.describe(run, rank, worker, adapter_cls.versions(), source.data,
                              adapter.spec.num_elements)
    clock_start = lifecycle.start(run_dir, info, device)
    sizes = initial_partition(trainer, comm, device)
    if source.exactness is not None and source.exactness_waits:  # on the timed slices
        if (measured := exactness_on(source, trainer, sizes)) is not None:
            source.closing["exactness"] = measured
    lo, hi = slice_bounds(sizes)[rank]
    standalone = calibrate(trainer, comm, device, sizes) if run.calibrate else []
    if rank == 0:
        collector.write_partition_log(run_dir, trainer.partition_history, standalone)
    trainer.stretch.take()
    membership = None
    if run.partition.may_leave_out:
        membership = Membership(rank, run.world_size, sizes, run.timeout_s, device,
                                run.stall_limit_s)
        assert isinstance(trainer.aggregator, LeavesOut)  # the spec allowed no other
        trainer.aggregator.set_members(membership.group(), len(membership.members))
    evaluator = sources.make_evaluator(run, rank, source, run_dir, device)
    if evaluator:
        evaluator(0)
    profiler = step_profiler(run.profile, rank, device.type == "cuda")
    comm.barrier()  # every worker starts training together, whoever evaluated
    writer = RecordWriter(collector.part_path(run_dir, rank))
    step_fn = trainer.timed_step if run.instrument else trainer.untimed_step
    repartitioner = make_repartitioner(run, trainer.solo_lines, trainer.min_slice)
    steps = WorkerSteps(run, step_fn, Counters(run.counters_every), (lo, hi), membership,
                        Repartitioning(run, rank, device, trainer, repartitioner,
                                       membership, run_dir, standalone), evaluator)
    try:
        if evaluator:
            evaluator.start_clock()
        engine.run_steps(steps, writer.append, steps.evaluation(adapter),
                         engine.slowdown_schedule(worker, trainer.stretch, run.seed, rank),
                         profiler=profiler, gc_mode=run.gc)
    finally:
        writer.close()
    if profiler is not None:  # after the last step: writing the trace delays none
        profiler.write(run_dir, rank)
    final = tuple(trainer.partition_history[-1]["sizes"])
    if source.exactness is not None and membership is None and final != sizes \
            and run.on_worker_failure != "continue":
        # an adaptive run moved the slices: measured again on those it ended with (a
        # collective: every rank is still here, none left out, none allowed to be gone)
        at_end = exactness_on(source, trainer, final)
        if at_end is not None and isinstance(source.closing.get("exactness"), dict):
            source.closing["exactness"]["at_end"] = at_end
    if membership is not None and membership.computing:
        membership.announce_end(run.steps - 1, adapter)  # rank 0 writes the members' model
    if run.on_worker_failure == "continue":
        # A peer may be gone: no collective after training. Each worker leaves what rank 0
        # would have written, and the launcher finishes the run directory from the parts.
        collector.write_survivor(run_dir, rank, adapter.parameters(),
                                 {"aggregator": trainer.aggregator.describe(),
                                  "partition_history": trainer.partition_history})
        return
    aggregator = trainer.aggregator
    if isinstance(aggregator, CountsTraffic):
        info["traffic"] = aggregator.traffic()  # bytes to and from each server
    if isinstance(aggregator, AlignsServerClocks) and (applied := aggregator.server_clocks()):
        info["server_clocks"] = applied  # the offsets applied to other hosts' servers' stamps
    side = ({collector.BUCKETS: aggregator.bucket_records()}
            if isinstance(aggregator, RecordsBuckets) else {})
    lifecycle.finish(run, run_dir, device, info, clock_start, writer.records(),
                     adapter.parameters(), backend,
                     {"partition_history": trainer.partition_history, "standalone": standalone,
                      "aggregator": trainer.aggregator.describe(), **source.closing}, side)


def exactness_on(source: Source, trainer: Trainer, sizes: tuple[int, ...]
                 ) -> dict[str, Any] | None:
    """A job's exactness on these slices (rank 0's measure; the others' None), under an
    overlapping aggregator's `alone()`: rank 0's pass over the whole batch exchanges
    nothing."""
    assert source.exactness is not None
    alone = trainer.overlap.alone() if trainer.overlap is not None else contextlib.nullcontext()
    with alone:
        return source.exactness(sizes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hetbench.harness.loop.worker",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", type=Path, help="run directory prepared by hetbench run")
    parser.add_argument("--suite", help="suite file or built-in name (torchrun mode)")
    parser.add_argument("--run-name", help="run name within the suite (torchrun mode)")
    parser.add_argument("--repeat", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("results"))
    args = parser.parse_args(argv)

    rank = int(os.environ.get("RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _raise_stopped)
    try:
        run, suite_name = _load_run(args)
    except UsageError as exc:
        print(f"hetbench worker: error: {exc}", file=sys.stderr)
        return 2
    if world_size != run.world_size:
        print(f"hetbench worker: error: WORLD_SIZE={world_size} but run {run.name!r} has "
              f"{run.world_size} workers", file=sys.stderr)
        return 2
    if args.run_dir is None and (problem := _torchrun_problem(run)):
        print(f"hetbench worker: error: {problem}", file=sys.stderr)
        return 2
    if args.run_dir is None and run.interface is not None:
        if (missing := bind_interface(run.interface)) is not None:
            print(f"hetbench worker: error: interface: {missing}", file=sys.stderr)
            return 2
    worker = run.workers[rank]
    prepare_process(worker, run.keep_freed_memory)
    if aggregators.kind(run.aggregator.name).serves is not None:
        # the framework's server: a coordinator (one of the run's services) trains and
        # records (torchrun mode refuses such aggregators: _torchrun_problem)
        return _guarded(args.run_dir, run, rank, False,
                        lambda: aggregators.serve(run, args.run_dir, rank))

    from hetbench.adapters import load_adapter
    from hetbench.harness.exchange import comm as comm_module

    adapter_cls = load_adapter(worker.framework)
    backend = comm_module.choose_backend(
        all(w.is_cuda for w in run.workers)
        and aggregators.kind(run.aggregator.name).device_buffer)
    comm_module.init(rank, world_size, backend, run.timeout_s, worker.device)
    run_dir = args.run_dir or _torchrun_run_dir(run, suite_name, args, rank, backend)
    (run_dir / collector.PARTS_DIR).mkdir(parents=True, exist_ok=True)
    try:
        return _guarded(run_dir, run, rank, args.run_dir is None,
                        lambda: train(run, run_dir, rank, backend, adapter_cls))
    finally:
        _quiet_shutdown(comm_module)


def _guarded(run_dir: Path, run: RunSpec, rank: int, torchrun: bool,
             body: Callable[[], None]) -> int:
    """Run the worker's `body`; its exit status, with the reason it stopped recorded for
    whoever closes the run (under torchrun, rank 0 closes it)."""
    try:
        body()
        return 0
    except Stopped:
        _record_error(run_dir, rank, "interrupted")
        if torchrun:
            _close_torchrun_run(run_dir, run, rank, "interrupted", "interrupted by a signal")
        return 130
    except Exception as exc:  # noqa: BLE001 - reported to the launcher, then exit non-zero
        reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        _record_error(run_dir, rank, reason)
        traceback.print_exc()
        if torchrun:
            _close_torchrun_run(run_dir, run, rank, "failed", f"worker {rank}: {reason}")
        return 1


def bind_interface(name: str) -> str | None:
    """Make every library that listens bind interface `name` (torchrun mode, across hosts:
    the suite's `interface`); why not, when this host has no such interface."""
    if (why := interfaces.missing(name)) is not None:
        return why
    os.environ.update(interfaces.binding(name))
    return None


def _torchrun_problem(run: RunSpec) -> str | None:
    """What torchrun mode cannot do for this run: it has no launcher to start an
    aggregator's processes or to finish a run that went on without a dead worker."""
    if aggregators.kind(run.aggregator.name).services is not None:
        return (f"aggregator {run.aggregator.name!r} needs processes `hetbench run` starts "
                "(servers); under torchrun use 'torch', 'allreduce-host', 'local-sgd' or "
                "'ddp'")
    if run.on_worker_failure == "continue":
        return ("on_worker_failure = 'continue' needs `hetbench run` to finish the run "
                "directory; under torchrun use 'fail'")
    return None


def _raise_stopped(signum: int, frame: Any) -> None:
    raise Stopped(signal.Signals(signum).name)


def _record_error(run_dir: Path, rank: int, reason: str) -> None:
    try:
        collector.error_path(run_dir, rank).write_text(reason + "\n")
    except OSError:
        pass


def _close_torchrun_run(run_dir: Path, run: RunSpec, rank: int, status: str,
                        reason: str) -> None:
    """Under torchrun no hetbench launcher watches the workers: rank 0 marks a run that ends
    badly itself, with every record flushed on its node, as the launcher would."""
    if rank != 0:
        return

    # torchrun signals the surviving workers when one fails: finish the directory first.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    if status == "interrupted":  # stopped because another worker failed, if one says so
        for peer in range(1, run.world_size):
            text = collector.read_error(run_dir, peer)
            if text and text != "interrupted":
                status, reason = "failed", f"worker {peer}: {text}"
                break
    try:
        rundir.close_run(run_dir, run, status, reason)
    except Exception:  # noqa: BLE001 - the worker's own error is the one to report
        traceback.print_exc()


def _quiet_shutdown(comm_module: Any) -> None:
    try:
        comm_module.shutdown()
    except Exception:  # noqa: BLE001 - a broken group at exit must not mask the real error
        pass


def _load_run(args: argparse.Namespace) -> tuple[RunSpec, str]:
    if args.run_dir is not None:
        data = json.loads((args.run_dir / rundir.RUN_FILE).read_text())
        return run_from_dict(data["run"]), data["suite"]
    if not args.suite or not args.run_name:
        raise UsageError("arguments", "give --run-dir, or --suite and --run-name (torchrun mode)")

    suite = load_suite(args.suite)
    for run in suite.runs:
        if run.name == args.run_name:
            return run, suite.name
    names = ", ".join(r.name for r in suite.runs)
    raise UsageError("--run-name", f"no run {args.run_name!r} in suite {suite.name} ({names})")


def _torchrun_run_dir(run: RunSpec, suite_name: str, args: argparse.Namespace, rank: int,
                      backend: str) -> Path:
    """Rank 0 creates the run directory and manifest; every rank learns its name."""
    import torch

    from hetbench.harness.exchange import comm

    name = ""
    if rank == 0:
        name = str(rundir.prepare_run_dir(args.out, suite_name, run, args.repeat))
    device = torch.device(run.workers[rank].device if backend == "nccl" else "cpu")
    return Path(comm.broadcast_bytes(name.encode(), device).decode())


if __name__ == "__main__":
    exit_after(main)
