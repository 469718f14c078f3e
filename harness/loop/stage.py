"""One stage of a virtual worker (HetPipe, issue 14), its waves run by the step engine.

A run with `virtual_workers` groups its ranks into virtual workers; rank i of a group runs
stage i, consecutive layers of the model (workloads/<name>/pytorch.py `layers`, a job's
`Job.layers`: harness/loop/sources.py builds either), and
torch.distributed.pipelining moves micro-batches through the stages under its GPipe or
1F1B schedule, over the group's own process group. Virtual workers are data parallel:
each takes its slice of the global batch per wave (Nm micro-batches), and with wave bound
D = 0 every wave's gradient sums are all-reduced among the ranks that hold the same layers
before the update, so D = 0, Nm = 1 is the all-reduce path's mathematics.

Where the layers go: every stage profiles each layer on its device (one rank at a time,
harness/partition/layerprofile.py) and the profiles of a virtual worker's devices choose the split
that minimises its slowest stage (harness/partition/stages.py), or a hand-given split is evaluated
against them; both, with predicted stage times, go into the manifest (`pipeline`).

What is recorded: per wave a step record (forward and backward: this stage's busy time;
pack: the rest of the schedule, the pipeline's bubble and its sends and receives;
allreduce, unpack and apply as in the plain loop), and per micro-batch its forward and
backward (collector.MICRO_DTYPE -> microbatches.parquet).
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from hetbench.adapters.base import TorchLayersAdapter
from hetbench.harness.exchange.waves import AllreduceWaves, ServerWaves, StageBuffers
from hetbench.harness.loop import engine, lifecycle
from hetbench.harness.loop.counters import Counters
from hetbench.harness.loop.profiling import step_profiler
from hetbench.harness.loop.sources import build_stage
from hetbench.harness.loop.training_source import StageSource
from hetbench.harness.partition.policies import slice_bounds
from hetbench.harness.partition.stages import Links, Profile, split_layers, stage_times
from hetbench.harness.partition.virtual import bounds_of, kind_of, micro_batch_bounds
from hetbench.harness.records import collector
from hetbench.harness.spec.emulation import Stretcher
from hetbench.harness.spec.pipelines import vw_slices
from hetbench.harness.spec.suite import RunSpec
from hetbench.harness.training.evaluation import Evaluator


@dataclass(frozen=True)
class Plan:
    """Where the layers go: per virtual worker its stage bounds and predicted stage times
    (ns per micro-batch), and whether all virtual workers cut the model alike (then the
    ranks holding the same layers all-reduce among themselves, else all ranks the whole
    buffer)."""

    bounds: list[tuple[int, ...]]
    predicted_ns: list[tuple[float, ...]]

    @property
    def aligned(self) -> bool:
        return len(set(self.bounds)) == 1


def alike_times(run: RunSpec, times: list[list[float]]) -> list[list[float]]:
    """Each rank's per-layer times averaged over the ranks whose workers are specified
    alike (device, threads, slowdown): one profile per kind of device, so that virtual
    workers of the same devices get the same split, not ones that differ by noise."""
    kinds = [kind_of(w) for w in run.workers]
    out = []
    for rank in range(len(times)):
        peers = [times[r] for r in range(len(times)) if kinds[r] == kinds[rank]]
        out.append([sum(column) / len(peers) for column in zip(*peers, strict=True)])
    return out


def plan_split(run: RunSpec, times: list[list[float]], activation_bytes: list[float],
               parameter_bytes: list[float]) -> Plan:
    """The split of every virtual worker from every rank's per-layer times (averaged over
    alike workers)."""
    pipe = run.pipeline
    assert pipe is not None
    times = alike_times(run, times)
    bounds, predicted = [], []
    for ranks in pipe.virtual_workers:
        profile = Profile([times[r] for r in ranks], activation_bytes, parameter_bytes)
        if isinstance(pipe.split, tuple):
            split = stage_times(profile, Links(), bounds_of(pipe.split))
        else:
            split = split_layers(profile, Links())
        bounds.append(split.bounds)
        predicted.append(split.stage_ns)
    if pipe.wave_bound and len(set(bounds)) > 1:
        # one server per stage needs one cut for all: of the virtual workers' own best
        # cuts, the one whose slowest stage over every virtual worker is fastest
        profiles = [Profile([times[r] for r in ranks], activation_bytes, parameter_bytes)
                    for ranks in pipe.virtual_workers]

        def worst(cut: tuple[int, ...]) -> float:
            return max(stage_times(p, Links(), cut).slowest_ns for p in profiles)

        chosen = min(dict.fromkeys(bounds), key=worst)
        bounds = [chosen] * len(profiles)
        predicted = [stage_times(p, Links(), chosen).stage_ns for p in profiles]
    return Plan(bounds, predicted)


class MicroTimer:
    """Wraps the stage's forward_one_chunk and backward_one_chunk (what every schedule of
    torch.distributed.pipelining calls per micro-batch): times each, stretches it by the
    worker's emulated slowdown, and keeps the wave's micro-batch records."""

    def __init__(self, stage: Any, rank: int, stretch: Stretcher) -> None:
        self.rank, self.stretch, self.wave = rank, stretch, 0
        self.records: list[tuple[Any, ...]] = []
        self.busy = [0, 0]  # forward, backward ns this wave
        forward, backward = stage.forward_one_chunk, stage.backward_one_chunk

        def timed_forward(chunk: int, *args: Any, **kwargs: Any) -> Any:
            return self._time(False, chunk, forward, args, kwargs)

        def timed_backward(chunk: int, *args: Any, **kwargs: Any) -> Any:
            return self._time(True, chunk, backward, args, kwargs)

        stage.forward_one_chunk, stage.backward_one_chunk = timed_forward, timed_backward

    def _time(self, backward: bool, chunk: int, call: Any, args: Any, kwargs: Any) -> Any:
        begin = time.perf_counter_ns()
        before = self.stretch.total_ns
        out = call(chunk, *args, **kwargs)
        end = self.stretch(begin, time.perf_counter_ns())
        self.busy[backward] += end - begin
        self.records.append((self.rank, self.wave, chunk, backward, begin, end,
                             self.stretch.total_ns - before))
        return out

    def take(self) -> tuple[list[tuple[Any, ...]], int, int]:
        out = (self.records, *self.busy)
        self.records, self.busy = [], [0, 0]
        return out  # type: ignore[return-value]


def stage_activations(layers: list[Any], sample: torch.Tensor, first: int, end: int
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """A micro-batch's activations entering and leaving layers [first, end), computed here
    with the layers in eval mode (no running statistics or random draws changed). Given to
    torch's PipelineStage, they spare it inferring them with a forward of its own, which on
    every stage but the first runs on uninitialised tensors: a BatchNorm layer there took
    them into its running statistics (measured: a running mean of -1e25 after 6 waves)."""
    modes = [layer.training for layer in layers]
    try:
        with torch.no_grad():
            x = sample
            for layer in layers[:end]:
                layer.eval()
                if layer is layers[first]:
                    entering = x
                x = layer(x)
    finally:
        for layer, mode in zip(layers, modes, strict=True):
            layer.train(mode)
    # what needs a gradient: torch sends one back to the previous stage only for an input
    # that requires it (every stage's but the first, whose input is the data)
    return entering.detach().requires_grad_(first > 0), x.detach().requires_grad_(True)


def start_server_waves(run: RunSpec, rank: int, vw: int, stage_index: int,
                       buffers: StageBuffers, source: StageSource, plan: Plan, samples: int,
                       pipeline_group: Any) -> ServerWaves:
    """Join the parameter servers' RPC group (one server per stage, started by the
    launcher); rank 0 gives each server its stage's initial parameters (the last one the
    loss slot too) before anyone pushes."""
    import torch.distributed as dist
    import torch.distributed.rpc as rpc

    from hetbench.harness.exchange.parameter_server import init_shard, rpc_options

    servers = run.aggregator.servers
    rpc.init_rpc(f"worker{rank}", rank=rank, world_size=run.world_size + servers,
                 rpc_backend_options=rpc_options(run.timeout_s))
    if rank == 0:
        bounds = plan.bounds[0]
        for s in range(servers):
            a, b = source.parameter_range(source.layers[bounds[s]:bounds[s + 1]])
            rpc.rpc_sync(f"ps{s}", init_shard, args=(
                source.adapter.flat_params[a:b].detach().clone(), s == servers - 1))
    dist.barrier()  # no stage pushes before every server has its parameters
    return ServerWaves(buffers, f"ps{stage_index}", vw, samples, pipeline_group)


def stop_rpc(run: RunSpec) -> None:
    import torch.distributed.rpc as rpc

    try:
        rpc.shutdown(graceful=True, timeout=run.timeout_s)
    except Exception:  # noqa: BLE001 - a peer already gone: leave without it
        rpc.shutdown(graceful=False)


def gather_parameters(flat_params: Any, lo: int, hi: int, virtual_worker: int,
                      device: Any) -> Any:
    """The whole model's flat parameters on rank 0 (None elsewhere): every rank sends its
    stage's [lo, hi), rank 0 keeps those of virtual worker 0's stages. Every rank calls it."""
    import numpy as np

    from hetbench.harness.exchange import comm

    mine = flat_params[lo:hi].detach().cpu().numpy().astype(np.float32)
    header = np.array([lo, hi, virtual_worker], dtype=np.int64).tobytes()
    pieces = comm.gather_bytes(header + mine.tobytes(), device)
    if pieces is None:
        return None
    full = flat_params.detach().cpu().numpy().copy()
    for piece in pieces:
        a, b, owner = np.frombuffer(piece[:24], dtype=np.int64)
        if owner == 0:
            full[a:b] = np.frombuffer(piece[24:], dtype=np.float32)
    return full


def make_evaluator(run: RunSpec, rank: int, source: StageSource, run_dir: Path
                   ) -> Evaluator | None:
    """Rank 0 evaluates the whole model alone (its adapter holds all of it, the other
    stages' parameters gathered first); None on the other ranks, without eval_every or
    without a held-out split."""
    if not run.eval_every or rank != 0 or source.heldout is None:
        return None
    return Evaluator.alone(run.eval_every, run.steps, run.global_batch, source.metric,
                           source.adapter, source.heldout(), run_dir)


def gather_buffers(buffers: list[Any], owned: list[int], virtual_worker: int,
                   device: Any) -> None:
    """The buffers (BatchNorm's running statistics) of every stage's layers into rank 0's
    model, as evaluating the whole model needs them: each rank sends those of its own
    layers (`owned`, indices into `buffers`), rank 0 keeps virtual worker 0's. Every rank
    calls it; a model without buffers (the built-in workloads) sends nothing."""
    import io

    import numpy as np

    from hetbench.harness.exchange import comm

    if not buffers:
        return
    mine = io.BytesIO()
    np.savez(mine, **{str(i): buffers[i].detach().cpu().numpy() for i in owned})
    pieces = comm.gather_bytes(np.int64(virtual_worker).tobytes() + mine.getvalue(), device)
    for piece in pieces or []:
        if int(np.frombuffer(piece[:8], dtype=np.int64)[0]) != 0:
            continue
        with np.load(io.BytesIO(piece[8:]), allow_pickle=False) as arrays:
            for key in arrays.files:
                buffers[int(key)].copy_(torch.from_numpy(arrays[key]))


def evaluate(evaluator: Any, progress: int, adapter: TorchLayersAdapter, lo: int, hi: int,
             virtual_worker: int, device: Any, owned_buffers: list[int]) -> None:
    """Between waves, every rank: the parameters and buffers to rank 0, its evaluation,
    then all line up again so the evaluation never shows in a wave's records. Rank 0's
    copies of the other stages' buffers are not its stage's: overwriting them is safe."""

    from hetbench.harness.exchange import comm

    gather_buffers(list(adapter.model.buffers()), owned_buffers, virtual_worker, device)
    full = gather_parameters(adapter.flat_params, lo, hi, virtual_worker, device)
    if evaluator is not None and full is not None:
        own = adapter.flat_params[lo:hi].clone()
        adapter.flat_params.copy_(torch.from_numpy(full))
        evaluator(progress)
        adapter.flat_params[lo:hi].copy_(own)
    comm.barrier()


def served_parameters(run: RunSpec) -> Any:
    """The whole model's flat parameters as the servers hold them now (wsp: server s holds
    stage s's layers, in order)."""
    import torch.distributed.rpc as rpc

    from hetbench.harness.exchange.parameter_server import pull

    shards = [rpc.rpc_async(f"ps{s}", pull) for s in range(run.aggregator.servers)]
    return torch.cat([shard.wait()[0] for shard in shards])


def evaluate_served(evaluator: Any, progress: int, adapter: TorchLayersAdapter,
                    run: RunSpec) -> None:
    """Worker 0 alone, between its waves (wsp: no collective can line the virtual workers
    up): the servers' parameters, evaluated; its own stage's put back after."""
    own = adapter.flat_params.clone()
    adapter.flat_params.copy_(served_parameters(run))
    evaluator(progress)
    adapter.flat_params.copy_(own)


@dataclass
class StageEvaluation:
    """The evaluation of a pipeline run whose virtual workers step together: at every
    multiple of eval_every waves and the last, every rank (a collective, evaluate())."""

    run: RunSpec
    evaluator: Any  # rank 0's, None elsewhere
    adapter: TorchLayersAdapter
    parameters: tuple[int, int]  # this stage's [lo, hi) of the flat parameters
    virtual_worker: int
    device: Any
    owned_buffers: list[int]  # this stage's buffers, indices into the model's buffers()

    def due(self, waves_done: int) -> bool:
        return bool(self.run.eval_every) and (waves_done % self.run.eval_every == 0
                                              or waves_done == self.run.steps)

    def __call__(self, waves_done: int) -> None:
        evaluate(self.evaluator, waves_done, self.adapter, *self.parameters,
                 self.virtual_worker, self.device, self.owned_buffers)


@dataclass
class ServedEvaluation:
    """The evaluation of a wsp run: worker 0 alone, on the servers' parameters."""

    evaluator: Any
    adapter: TorchLayersAdapter
    run: RunSpec

    def due(self, progress: int) -> bool:
        return bool(self.evaluator.due(progress))

    def __call__(self, progress: int) -> None:
        evaluate_served(self.evaluator, progress, self.adapter, self.run)


@dataclass
class WaveSteps:
    """One stage's waves as the step engine takes them (harness/loop/engine.py): per wave,
    its slice of the global batch through the schedule, the exchange of this stage's
    gradients, the update; one step record (the phases as the module's docstring says) and
    the micro-batch records. Nothing between waves."""

    rank: int
    batch: Any  # the source's (wave, lo, hi, inputs?, targets?) -> (inputs, targets)
    bounds: tuple[int, int]  # this virtual worker's slice of each global batch
    first: bool  # the stage that reads the inputs
    last: bool  # the stage that computes the loss
    device: Any
    sync: bool  # wait for the device at each mark (a GPU's work is asynchronous)
    schedule: Any  # torch.distributed.pipelining's schedule over this stage
    waves: AllreduceWaves | ServerWaves
    timer: MicroTimer
    stretch: Stretcher
    flat_grads: Any
    loss_slot: int  # the loss sum's index in flat_grads
    micro_writer: collector.RecordWriter
    most: int  # the waves no stage goes past
    counters: Counters

    def take(self, wave: int) -> engine.Turn:
        lo, hi = self.bounds
        device, sync, stretch, last, flat_grads = (self.device, self.sync, self.stretch,
                                                   self.last, self.flat_grads)
        now = time.perf_counter_ns
        self.timer.wave = wave
        counters = self.counters
        counters.start()
        begin = now()
        x, y = self.batch(wave, lo, hi, self.first, last)
        loaded = stretch(begin, now())
        xs = None if x is None else torch.as_tensor(x).to(device, non_blocking=True)
        ys = None if y is None else torch.as_tensor(y).to(device, non_blocking=True)
        if sync:
            torch.cuda.synchronize(device)
        moved = now()
        losses: list[Any] = []
        args = () if xs is None else (xs,)
        if last:
            self.schedule.step(*args, target=ys, losses=losses)
        else:
            self.schedule.step(*args)
        if sync:
            torch.cuda.synchronize(device)
        ready = now()
        compute = counters.compute()
        micro_records, forward_ns, backward_ns = self.timer.take()
        local_sum = float(sum(float(v) for v in losses)) if last else math.nan
        if last:
            flat_grads[self.loss_slot] = local_sum
        exchange = self.waves.exchange(wave)
        if sync:
            torch.cuda.synchronize(device)
        reduced = now()
        self.waves.take(wave)
        if sync:
            torch.cuda.synchronize(device)
        unpacked = now()
        self.waves.apply()
        loss = (float(flat_grads[self.loss_slot]) / exchange.loss_samples if last
                else math.nan)
        flat_grads.zero_()
        if sync:
            torch.cuda.synchronize(device)
        done = now()
        # the marks of a step's phases: this stage's forward and backward time, summed
        # over its micro-batches, then the rest of the schedule up to `ready` (the
        # pipeline's bubble, sends and receives) as the pack
        backward_end = min(moved + forward_ns + backward_ns, ready)
        marks = (begin, loaded, moved, min(moved + forward_ns, backward_end), backward_end,
                 ready, reduced, unpacked, done)
        stretched = stretch.take()
        record = collector.timed_record(
            self.rank, wave, hi - lo, lo, marks, stretched, compute, loss,
            local_sum / (hi - lo), counters.take(), exchange)
        for micro in micro_records:
            self.micro_writer.append(micro)
        if isinstance(self.waves, ServerWaves):  # wsp: the servers count the progress
            following = None if exchange.done or wave + 1 >= self.most else wave + 1
            return engine.Turn((record,), following, exchange.progress)
        return engine.Turn((record,), wave + 1 if wave + 1 < self.most else None, wave + 1)

    def between(self, wave: int, turn: engine.Turn) -> None:
        pass


def train_stage(run: RunSpec, run_dir: Path, rank: int, backend: str) -> None:
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    from hetbench.adapters.pytorch import TorchAdapter
    from hetbench.harness.exchange import comm
    from hetbench.harness.partition.layerprofile import profile_layers
    from hetbench.harness.training.optim import Optimizer

    pipe = run.pipeline
    assert pipe is not None
    vw, stage_index = pipe.place(rank)
    n_stages = pipe.stages(vw)
    worker = run.workers[rank]
    device = torch.device(worker.device)
    comm_device = torch.device(worker.device if backend == "nccl" else "cpu")
    source = build_stage(run, rank, backend)
    adapter, layers = source.adapter, source.layers
    timeout = timedelta(seconds=run.timeout_s)
    # every rank creates every group, in the same order (torch.distributed's rule)
    pipe_groups = [dist.new_group(list(g), timeout=timeout) for g in pipe.virtual_workers]

    sizes = vw_slices(run.partition, run.global_batch, len(pipe.virtual_workers))
    lo, hi = slice_bounds(sizes)[vw]
    micro = (hi - lo) // pipe.micro_batches
    order = source.order

    info = lifecycle.describe(run, rank, worker, TorchAdapter.versions(), source.data,
                              adapter.spec.num_elements, virtual_worker=vw, stage=stage_index)
    info["label"] += f" vw{vw} stage{stage_index}"
    clock_start = lifecycle.start(run_dir, info, comm_device)
    # rank 0 holds the whole model: it measures how exact the micro-batches are while the
    # others wait in the profile's first turn
    exact = None
    if rank == 0 and source.exactness is not None:
        exact = source.exactness(micro_batch_bounds(slice_bounds(sizes), pipe.micro_batches))

    # the profile: one rank at a time, the others wait in the barrier
    sample = torch.as_tensor(source.read(order.indices(0)[lo:lo + micro], True, False)[0]
                             ).to(device)
    mine = None
    for turn in range(run.world_size):
        if turn == rank:
            # a job's buffers (BatchNorm's running statistics) and random draws as they were
            with getattr(adapter, "state_kept", contextlib.nullcontext)():
                mine = profile_layers(layers, sample, pipe.profile_steps,
                                      worker.slowdown_for(0), synchronize=worker.is_cuda)
            adapter.zero_grad()
        comm.barrier()
    assert mine is not None
    times = comm.all_gather_vectors(mine.time_ns, comm_device)
    plan = plan_split(run, times, mine.activation_bytes, mine.parameter_bytes)
    stage_groups = ([dist.new_group([g[s] for g in pipe.virtual_workers], timeout=timeout)
                     for s in range(n_stages)] if plan.aligned else [])

    first, end = plan.bounds[vw][stage_index], plan.bounds[vw][stage_index + 1]
    stage_layers = layers[first:end]
    p_lo, p_hi = source.parameter_range(stage_layers)
    n = adapter.spec.num_elements
    last = stage_index == n_stages - 1
    flat_params, flat_grads = adapter.flat_params, adapter.flat_grads
    buffers = StageBuffers(flat_params, flat_grads, p_lo, p_hi, last)
    waves: AllreduceWaves | ServerWaves
    if pipe.wave_bound:
        waves = start_server_waves(run, rank, vw, stage_index, buffers, source, plan, hi - lo,
                                   pipe_groups[vw])
    else:
        optimizer = Optimizer(run.optimizer, run.lr, run.steps, run.global_batch,
                              p_hi - p_lo, flat_params[p_lo:p_hi].detach().clone(), device)
        waves = AllreduceWaves(buffers, stage_groups[stage_index] if plan.aligned else None,
                               optimizer, run.global_batch, whole=not plan.aligned)

    entering, leaving = stage_activations(layers, sample, first, end)
    stage = PipelineStage(nn.Sequential(*stage_layers), stage_index, n_stages, device,
                          input_args=entering, output_args=leaving, group=pipe_groups[vw])
    # torch finds a stage's peers by stage index, as the group's rank of that number, and
    # dist.new_group numbers a group's ranks in ascending order: where a virtual worker's
    # stages are not in rank order (its faster worker first, a higher rank), say which
    members = sorted(pipe.virtual_workers[vw])
    stage.stage_index_to_group_rank = {s: members.index(r)
                                       for s, r in enumerate(pipe.virtual_workers[vw])}
    schedule_cls = ScheduleGPipe if pipe.schedule == "gpipe" else Schedule1F1B
    schedule = schedule_cls(stage, pipe.micro_batches,
                            loss_fn=source.loss_sum, scale_grads=False)
    stretch = Stretcher(worker.slowdown_for(0))
    timer = MicroTimer(stage, rank, stretch)

    evaluator = make_evaluator(run, rank, source, run_dir)
    serving = isinstance(waves, ServerWaves)
    evaluation: engine.Evaluation | None = None
    if serving and evaluator is not None:
        evaluation = ServedEvaluation(evaluator, adapter, run)
    elif not serving and run.eval_every:  # every rank: a collective
        held = {id(b) for layer in stage_layers for b in layer.buffers()}
        owned = [i for i, b in enumerate(adapter.model.buffers()) if id(b) in held]
        evaluation = StageEvaluation(run, evaluator, adapter, (p_lo, p_hi), vw, comm_device,
                                     owned)
    if evaluation is not None:
        evaluation(0)
    profiler = step_profiler(run.profile, rank, worker.is_cuda)
    if evaluator is not None:
        evaluator.start_clock()
    comm.barrier()  # every stage starts training together
    writer = collector.RecordWriter(collector.part_path(run_dir, rank))
    micro_writer = collector.RecordWriter(collector.MICRO.part_path(run_dir, rank),
                                          dtype=collector.MICRO_DTYPE)
    steps = WaveSteps(
        rank=rank, batch=source.batch, bounds=(lo, hi),
        first=stage_index == 0, last=last, device=device, sync=worker.is_cuda,
        schedule=schedule, waves=waves, timer=timer, stretch=stretch,
        flat_grads=flat_grads, loss_slot=n, micro_writer=micro_writer,
        counters=Counters(run.counters_every),
        # under wsp a faster virtual worker runs more waves; none runs more than the budget
        most=pipe.most_waves(run.steps))
    try:
        engine.run_steps(steps, writer.append, evaluation,
                         engine.slowdown_schedule(worker, stretch, run.seed, rank),
                         profiler=profiler, gc_mode=run.gc)
        if profiler is not None:  # after the last wave: writing the trace delays none
            profiler.write(run_dir, rank)
        parameters = None
        if serving and rank == 0:  # the servers hold the latest of every layer
            adapter.flat_params.copy_(served_parameters(run))
            parameters = adapter.parameters()
    finally:
        source.close()
        writer.close()
        micro_writer.close()
        if serving:
            stop_rpc(run)

    if not serving and (full := gather_parameters(flat_params, p_lo, p_hi, vw,
                                                   comm_device)) is not None:
        adapter.flat_params.copy_(torch.from_numpy(full))
        parameters = adapter.parameters()
    closing = {"pipeline": {
        "virtual_workers": [list(g) for g in pipe.virtual_workers],
        "allocation": pipe.allocation, "schedule": pipe.schedule,
        "micro_batches": pipe.micro_batches, "micro_batch_size": micro,
        "wave_bound": pipe.wave_bound,
        # every micro-batch of a wave computes on the wave's parameters (the pipeline
        # flushes): the last is Nm - 1 updates behind sequential SGD
        "local_staleness": pipe.micro_batches - 1,
        "split": pipe.split if isinstance(pipe.split, str) else list(pipe.split),
        "sync": "stage" if plan.aligned else "world",
        "bounds": [list(b) for b in plan.bounds],
        "predicted_stage_ns": [list(p) for p in plan.predicted_ns],
        "profile": {"time_ns": times, "activation_bytes": mine.activation_bytes,
                    "parameter_bytes": mine.parameter_bytes},
        "slices": list(sizes)}, **source.closing,
        **({} if exact is None else {"exactness": exact})}
    if isinstance(waves, ServerWaves) and waves.clock.applied:
        info["server_clocks"] = [waves.clock.to_dict()]  # its server is on another host
    lifecycle.finish(run, run_dir, comm_device, info, clock_start, writer.records(), parameters,
                     backend, closing, {collector.MICRO: micro_writer.records()})
