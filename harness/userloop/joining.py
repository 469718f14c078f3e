"""`hetbench.join`: a rank of a user's torchrun job joins it, and gets its Session
(harness/userloop/session.py). Everything it is given is checked before anything starts
(harness/userloop/config.py); then the rank joins the job's default group over gloo from
torchrun's env:// rendezvous (a script run alone is a job of one), or, started by
hetbench's launcher (HETBENCH_RUN_DIR), takes its run, workers and slices from the run
directory and joins rank 0's store as hetbench's own workers do.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from hetbench.harness.exchange import comm
from hetbench.harness.records import rundir
from hetbench.harness.spec import loops
from hetbench.harness.spec.errors import UsageError
from hetbench.harness.spec.suite import run_from_dict
from hetbench.harness.system import orphans
from hetbench.harness.userloop import config
from hetbench.harness.userloop.session import Session


def join(*, global_batch: int, loss_reduction: str | None = None,
         partition: str | Sequence[int] | Mapping[str, Any] = "equal",
         device: str | None = None, suite: str | None = None,
         run: str | None = None, out: str | Path = "results", seed: int = 0,
         warmup_steps: int = 2, timeout_s: float = 120.0, counters_every: int = 8
         ) -> Session:
    """Join the torchrun job this process is a rank of (RANK, WORLD_SIZE, MASTER_ADDR and
    MASTER_PORT; a script started alone is a job of one) and return its Session.

    `global_batch`: the samples of one step over all ranks. `loss_reduction`: how the
    loss given to `Session.backward` reduces over a batch, 'mean' or 'sum'. `partition`:
    the slices, a policy's name ('equal', 'profiled', 'proportional', 'model'), a list of
    sizes, or a suite's partition table. `device`: this rank's (default: its LOCAL_RANK's
    GPU where torch sees one, else the CPU; `hetbench launch` sets each rank's). The run
    directory is `out/suite/run-r<repeat>-<time>/` (suite: the script's name, run: the
    policy's). Every wait has `timeout_s`."""
    environ = os.environ
    place = config.place(environ)
    _stop_on_sigterm()
    if (prepared := environ.get(loops.RUN_DIR_VARIABLE)) is not None:
        return _join_launch(Path(prepared), place, global_batch, loss_reduction, partition)
    checked = config.parse(place, global_batch, loss_reduction, partition, suite, run, out,
                           seed, warmup_steps, timeout_s, counters_every)
    launched = config.launched_workers(place, environ)
    import torch

    default = config.environment_device(place, torch.cuda.device_count())
    worker = config.own_worker(place, device, default, torch.get_num_threads(), launched)
    _check_device(worker.device, torch.cuda.device_count())
    if launched is not None:  # as hetbench's own workers are set up
        if worker.cores:
            os.sched_setaffinity(0, worker.cores)
        torch.set_num_threads(worker.threads)
    began = _join_group(place, checked.timeout_s, environ)
    return Session(checked, place, worker, owns_group=began)


def _stop_on_sigterm() -> None:
    """SIGTERM (how torchrun and hetbench's launcher stop the ranks when one failed) raised
    as KeyboardInterrupt, so that the session closes its run with its records, as Ctrl-C
    does; a handler the script installed is left alone."""
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _interrupt)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def _join_launch(run_dir: Path, place: config.Place, global_batch: Any,
                 loss_reduction: Any, partition: Any) -> Session:
    """A rank that hetbench's launcher started (a script's run: `hetbench launch`, or a
    suite's run with `script`): the run, its workers and its slices are the launch's (its
    run.json), the loss's reduction the script's; the rank joins the store rank 0 serves
    in the run's own network namespace, as hetbench's own workers do."""
    import torch

    data = json.loads((run_dir / rundir.RUN_FILE).read_text())
    run = run_from_dict(data["run"])
    checked = config.launched_config(run, data["suite"], run_dir.parent.parent, loss_reduction)
    if place.world_size != run.world_size:
        raise UsageError("WORLD_SIZE", f"{place.world_size}, but run {run.name!r} has "
                         f"{run.world_size} workers")
    if place.rank == 0 and (global_batch != run.global_batch or partition != "equal"):
        print(f"hetbench.join: run {run.name!r} of the launch sets global_batch "
              f"{run.global_batch} and partition {run.partition.policy!r} (the script's "
              f"{global_batch} and {partition!r} are not used)", file=sys.stderr, flush=True)
    worker = run.workers[place.rank]
    if worker.cores:
        os.sched_setaffinity(0, worker.cores)
    torch.set_num_threads(worker.threads)
    orphans.follow_launcher()  # no rank outlives its launcher
    try:
        comm.init(place.rank, place.world_size, "gloo", run.timeout_s, worker.device)
    except (RuntimeError, ValueError, TimeoutError) as exc:
        raise UsageError(config.JOIN, _not_met(place, run.timeout_s, os.environ, exc)) from None
    return Session(checked, place, worker, launched=(run, run_dir))


def _not_met(place: config.Place, timeout_s: float, environ: Any, exc: BaseException) -> str:
    address = f"{environ.get('MASTER_ADDR', '?')}:{environ.get('MASTER_PORT', '?')}"
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return (f"rank {place.rank} of {place.world_size} did not meet the others at {address} "
            f"within {timeout_s:g} s (timeout_s): {first}")


def _check_device(device: str, cuda_devices: int) -> None:
    if device.startswith("cuda") and int(device.split(":")[1]) >= cuda_devices:
        raise UsageError(f"{config.JOIN}(device)", f"{device!r}, but torch sees "
                         f"{cuda_devices} GPU(s) on this host")


def _join_group(place: config.Place, timeout_s: float, environ: Any) -> bool:
    """The job's default group, over gloo (a GPU rank's exchange gets an NCCL group of its
    own where every rank is a GPU); one the script made itself is used as it is. Whether
    it began one."""
    import torch.distributed as dist

    if dist.is_initialized():
        if dist.get_world_size() != place.world_size:
            raise UsageError(config.JOIN, f"the script's process group has "
                             f"{dist.get_world_size()} ranks, WORLD_SIZE={place.world_size}")
        return False
    timeout = timedelta(seconds=timeout_s)
    if place.world_size == 1 and "MASTER_ADDR" not in environ:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1,
                                timeout=timeout)
        return True
    try:
        dist.init_process_group("gloo", init_method="env://", rank=place.rank,
                                world_size=place.world_size, timeout=timeout)
    except (RuntimeError, ValueError, TimeoutError) as exc:
        raise UsageError(config.JOIN, _not_met(place, timeout_s, environ, exc)) from None
    return True
