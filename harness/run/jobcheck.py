"""A suite's jobs named by import path, checked before any run starts.

Each distinct job (factory, project folder, global batch, seed) is made once in a process
of its own, `python -m hetbench.harness.run.jobcheck`: importing a user's model loads torch,
which the CLI never does, and a factory that hangs or crashes must not take the launcher
with it. The child is alone in a network namespace with only `lo` (a run's workers are
too), so a factory or data set that reaches for the network fails here, before anything
runs, with its own error; everything the factory starts lives in that namespace and is
ended with it, whatever happens to the check (done, timed out, hetbench interrupted), and a
daemon it forked with hetbench's pipes cannot keep hetbench waiting. What is wrong comes
back as one line naming the suite key (`runs[i].workload`), and `hetbench run` exits with
status 2.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from hetbench.harness.spec import jobs as jobs_spec
from hetbench.harness.spec.errors import UsageError
from hetbench.harness.spec.fields import At
from hetbench.harness.spec.optimizers import OptimizerSpec
from hetbench.harness.spec.pipelines import check_layer_count
from hetbench.harness.spec.suite import RunSpec, SuiteSpec
from hetbench.harness.system import netns, orphans, signals
from hetbench.harness.system.capped_log import CappedLog
from hetbench.harness.system.exits import exit_after

CHECK_TIMEOUT_S = 300.0  # a factory's import and its data's first samples
STDERR_TAIL_BYTES = 64 * 1024  # of the check's stderr: its verdict is the last line


def check_jobs(suite: SuiteSpec, timeout_s: float = CHECK_TIMEOUT_S) -> dict[str, Any]:
    """Each distinct job of the suite made and checked once; returns what each said of
    itself by workload. Raises UsageError naming the first run whose job is wrong."""
    seen: dict[tuple[Any, ...], dict[str, Any]] = {}
    for i, run in enumerate(suite.runs):
        if not run.is_job:
            continue
        key = (run.workload, run.project, run.global_batch, run.seed)
        if key not in seen:
            seen[key] = check_job(run.workload, str(run.project), run.global_batch, run.seed,
                                  f"runs[{i}].workload", timeout_s)
        refuse_for_job(run, seen[key], functools.partial("runs[{}].{}".format, i))
    return {key[0]: described for key, described in seen.items()}


def refuse_for_job(run: RunSpec, described: dict[str, Any], at: At) -> None:
    """What the suite check could not refuse without the job (`described`, as the job
    check made it): raises UsageError naming the run's key. `hetbench advise` asks the
    same of each remedy it would suggest for a job."""
    refuse_one_sample_slices(run, described, at("partition"))
    tensors = described.get("tensors")
    if tensors is not None and run.aggregator.servers > len(tensors):
        raise UsageError(at("aggregator"), f"{run.aggregator.servers} servers for "
                         f"{run.workload}'s {len(tensors)} parameter tensors: every server "
                         "holds at least one")
    if run.pipeline is not None:
        refuse_unpipelined(run, described, at)
    if run.placement == "fc-on-server":
        refuse_unplaced(run, described, at("placement"))
    if described.get("optimizer") is not None:
        jobs_spec.refuse_with_own_optimizer(run.aggregator.name,
                                            run.optimizer != OptimizerSpec(), at)


def refuse_unpipelined(run: RunSpec, described: dict[str, Any], at: At) -> None:
    """A pipeline cuts the model between the layers the job gives (Job.layers), its stages
    stepped by the suite's optimizer on their own parameters."""
    assert run.pipeline is not None
    if described.get("layers") is None:
        raise UsageError(at("virtual_workers"), f"a pipeline cuts the model into stages "
                         f"between its layers, and {run.workload} gives none (Job.layers)")
    check_layer_count(run.pipeline, described["layers"], run.workload, at)
    if run.pipeline.wave_bound and run.eval_every and described.get("buffers"):
        raise UsageError(at("eval_every"), "under a wave bound worker 0 evaluates alone, on "
                         "the servers' parameters, and the other stages' buffers (BatchNorm's "
                         f"running statistics) stay on their workers: {run.workload}'s model "
                         "has buffers, so no eval_every with wave_bound > 0")
    if described.get("optimizer") is not None:
        raise UsageError(at("virtual_workers"), "a pipeline's stages step their own "
                         "parameters with the suite's optimizer, not the job's "
                         "(Job.optimizer): give the job no optimizer for a pipeline")


def refuse_unplaced(run: RunSpec, described: dict[str, Any], where: str) -> None:
    """fc-on-server with a job: its last layer (Job.layers) computed on the server, fed the
    activations entering it and the labels, its parameters read back for evaluations."""
    if described.get("layers") is None:
        raise UsageError(where, "'fc-on-server' computes the model's last layer on a server, "
                         f"and {run.workload} gives no layers (Job.layers)")
    if "tensor_targets" not in described:  # a manifest's description (hetbench advise)
        raise UsageError(where, f"what {run.workload}'s last layer and labels are is learnt "
                         "by the job check, which could not make the job now")
    if not described["last_layer_parameters"]:
        raise UsageError(where, f"{run.workload}'s last layer trains no parameter, so the "
                         "server would hold nothing: a last layer with the model's head")
    if described["last_layer_buffers"]:
        raise UsageError(where, f"{run.workload}'s last layer holds buffers (BatchNorm's "
                         "running statistics), which the server would update and the workers "
                         "never read back: 'sharded' or 'data-parallel', or a last layer "
                         "without them")
    if not described["tensor_targets"]:
        raise UsageError(where, "'fc-on-server' sends the server a batch's labels as one "
                         f"tensor, and {run.workload}'s batches give them otherwise")


def refuse_one_sample_slices(run: RunSpec, described: dict[str, Any], where: str) -> None:
    """A BatchNorm layer taking a slice's statistics cannot train on one sample (torch
    refuses: "Expected more than 1 value per channel"): slices of one the suite gives are
    refused (the measured and adaptive policies keep such a model's slices at two or more:
    Trainer.min_slice)."""
    layers = described.get("batchnorm") or []
    if not layers or run.batchnorm == "global":
        return
    named = ", ".join(layers[:3])
    partition = run.partition
    if partition.sizes is not None and 1 in partition.sizes:
        raise UsageError(f"{where}.sizes", f"a slice of 1 sample, which {run.workload}'s "
                         f"BatchNorm layers ({named}) cannot take statistics of: at least 2 "
                         "(or batchnorm = 'global')")


def check_job(workload: str, project: str, global_batch: int, seed: int, where: str,
              timeout_s: float, profile: LayerProfiling | None = None) -> dict[str, Any]:
    """The job made and checked in a child process (the module's docstring): what it says
    of itself (hetbench.workloads.job.describe), with, given `profile`, its layers timed
    (`layer_profile`: hetbench.harness.partition.layerprofile.LayerProfile's fields)."""
    with tempfile.TemporaryDirectory(prefix="hetbench-check-") as private:
        answer = Path(private) / "answer.json"
        # -P: the working directory is not put on the import path (a project's own numpy/
        # would shadow numpy before the check could name it); the project goes there after
        command = [sys.executable, "-P", "-m", __name__, str(answer), workload, project,
                   str(global_batch), str(seed),
                   *(() if profile is None else map(str, dataclasses.astuple(profile)))]
        holder = netns.start_holder(Path(private) / "netns.log")
        network = f"host's ({holder})" if isinstance(holder, str) else "loopback only"
        if not isinstance(holder, str):
            command = netns.join_command(holder.pid, command, safe_path=True)
        code, said = _run_check(command, project, timeout_s,
                                None if isinstance(holder, str) else holder)
        if code is None:
            raise UsageError(where, f"{workload}: making the job took more than "
                             f"{timeout_s:g} s (the factory, or reading its first samples)")
        if code == 0 and answer.is_file():
            described: dict[str, Any] = json.loads(answer.read_text())
            return described | {"network": network}
    if code == 2 and said:  # the check's own verdict: one line
        raise UsageError(where, said[-1])
    why = (f"died with {signal.Signals(-code).name}" if code < 0
           else f"exited with status {code}")
    raise UsageError(where, f"{workload}: checking the job {why}"
                     + (f": {said[-1].strip()}" if said else ""))


def _run_check(command: list[str], project: str, timeout_s: float,
               holder: subprocess.Popen[bytes] | None) -> tuple[int | None, list[str]]:
    """The check run to its end, or ended at `timeout_s` (status None), or by a signal to
    hetbench (raised again): its exit status and its stderr's last lines. However it ends,
    nothing it started lives on (its group killed, the namespace's holder stopped: what it
    forked out of its group ends with the namespace), and no wait is unbounded (what it left
    holding its stderr cannot hold hetbench: its output is read by a thread, in bounded
    memory; its stdout, what a factory prints, goes nowhere)."""
    stderr = CappedLog(None, head_bytes=0, tail_bytes=STDERR_TAIL_BYTES)
    try:
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr.writer,
                                stdin=subprocess.DEVNULL, cwd=project, start_new_session=True,
                                preexec_fn=orphans.die_with_parent,
                                env=dict(os.environ, PYTHONUNBUFFERED="1"))
    except BaseException:
        stderr.abandon()
        if holder is not None:
            netns.stop_holder(holder)
        raise
    stderr.started()
    code: int | None = None
    try:
        code = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        pass
    except BaseException:  # Ctrl-C or SIGTERM (KeyboardInterrupt): the check ends with us
        with signals.held():
            _end_check(proc, holder)
        raise
    with signals.held() as held:
        _end_check(proc, holder)
    if held:
        raise signals.as_interrupt(held[0])
    stderr.settle()
    return code, [ln for ln in stderr.text().splitlines() if ln.strip()]


def _end_check(proc: subprocess.Popen[bytes], holder: subprocess.Popen[bytes] | None) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # its own session: a DataLoader's children too
    except ProcessLookupError:
        pass
    proc.wait()
    if holder is not None:
        netns.stop_holder(holder)


def main(argv: list[str]) -> int:
    answer, workload, project = Path(argv[0]), argv[1], Path(argv[2])
    global_batch, seed = int(argv[3]), int(argv[4])
    profile = LayerProfiling(*map(int, argv[5:8])) if len(argv) > 5 else None
    from hetbench.workloads import job as jobs

    try:
        job = jobs.make_job(workload, project, seed)
        jobs.check_batches(job, global_batch)
        jobs.check_layers(job)
        described = jobs.describe(job, workload) | jobs.tail_facts(job)
        if profile is not None and job.layers is not None:
            described["layer_profile"] = profiled_layers(job, profile)
    except jobs.JobError as exc:
        print(exc, file=sys.stderr, flush=True)
        return 2
    answer.write_text(json.dumps(described))
    return 0


@dataclasses.dataclass(frozen=True)
class LayerProfiling:
    """How the job check times a job's layers for `hetbench advise`: on a micro-batch of
    `micro` training samples, `passes` timed passes each, on `threads` threads."""

    micro: int
    passes: int
    threads: int


def profiled_layers(job: Any, profiling: LayerProfiling) -> dict[str, list[float]]:
    """Job.layers timed in training mode as a pipeline stage computes them
    (hetbench.harness.partition.layerprofile; in the job check's own process, which ends
    after: its buffers are nobody's); the fields of its LayerProfile."""
    import torch

    from hetbench.harness.partition.layerprofile import profile_layers
    from hetbench.workloads import job as jobs

    inputs, _ = jobs.read_batch(job, job.train, range(profiling.micro))
    torch.set_num_threads(max(1, profiling.threads))  # as the recorded worker computed
    layers = jobs.job_layers(job, job.model)
    with torch.random.fork_rng():
        profile = profile_layers(layers, inputs, profiling.passes)
    return dataclasses.asdict(profile)


if __name__ == "__main__":
    exit_after(lambda: main(sys.argv[1:]))
