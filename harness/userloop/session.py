"""A rank's `Session` in a user's own loop (`hetbench.join` makes it:
harness/userloop/joining.py): it gives the loop what it uses (the model on its device
with rank 0's parameters, this rank's slices of each global batch) and takes what it must
(`Session.backward(loss)` in place of `loss.backward()`), recording every step into a
standard run directory.

The gradients are the global batch's, exactly, whatever the slices: rank i's loss over its
n_i samples is weighted by n_i / N (reduction 'mean') or 1 ('sum') before its backward, and
the weighted gradients are summed over the ranks in one all-reduce, the weighted loss with
them (the step's global loss at no extra collective). A rank left out (an empty slice)
runs the loop's body on a shadow slice weighted 0, so its optimizers and scheduler stay in
step with the others'. The ranks meet over gloo (any rank on the CPU), the exchange over
NCCL where every rank is a GPU.

A step's marks (collector.PHASES), none timed by the user: begin when the loop asks the
loader for a batch; load when torch's DataLoader gave it; to_device once on the rank's
device; forward when `backward(loss)` is called (the model's forward and the loss);
backward; pack (ready: the weighted gradients in the buffer); allreduce (reduced); unpack
(the gradients back in `.grad`); apply when the last optimizer's `step()` returned (what
the loop does in between, clipping say, is in it). What the loop does after its optimizers
and before the next batch (a scheduler, logging) is between steps, as the loop's gap.
Gradient accumulation (`no_sync()`, as DDP's): a step is a loader batch; one whose
backwards all ran inside `no_sync()` has no pack, exchange, unpack nor apply (each 0 long)
and no global loss; in one with several backwards, forward is the sum of their forwards,
backward of theirs.
A rank's emulated slowdown (`hetbench launch`'s workers) stretches its compute phases as in
hetbench's own loop.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from time import perf_counter_ns
from typing import TYPE_CHECKING, Any, TypeVar

from hetbench.harness.exchange import Exchange, Holds, comm
from hetbench.harness.loop import lifecycle
from hetbench.harness.loop.counters import Counters
from hetbench.harness.loop.job import JobData
from hetbench.harness.loop.timer import StepTimer
from hetbench.harness.records import collector, rundir
from hetbench.harness.records.collector import RecordWriter
from hetbench.harness.spec.emulation import Stretcher
from hetbench.harness.spec.errors import UsageError
from hetbench.harness.spec.suite import RunSpec
from hetbench.harness.spec.workers import WorkerSpec, worker_from_dict
from hetbench.harness.system.environment import git_commit
from hetbench.harness.userloop import config
from hetbench.harness.userloop.batches import SliceLoader, slice_batches, to_device
from hetbench.harness.userloop.slicing import Slicing

if TYPE_CHECKING:  # the user's border typed with torch's types, torch imported on use
    import torch
    from torch.utils.data import DataLoader, Dataset

ModelT = TypeVar("ModelT", bound="torch.nn.Module")
OptimizersT = TypeVar("OptimizersT",
                      bound="torch.optim.Optimizer | Sequence[torch.optim.Optimizer]")

BACKWARD = "Session.backward"
MARKS_BEFORE_FORWARD = 3  # begin, load, to_device
MARKS_EXCHANGED = 8  # ... forward, backward, pack, allreduce, unpack


class Session:
    """One rank's part of a user's loop: `prepare`, `backward` each step, `finish`. Used
    as a context manager, a loop that raises closes the run as failed (interrupted on
    Ctrl-C), its records kept. Where the rank stands, in place of torch.distributed's
    calls: `rank`, `world_size`, `is_main` (rank 0: its validation, logging and
    checkpoints) and `device` (the rank's torch.device)."""

    def __init__(self, loop: config.LoopConfig, place: config.Place, worker: WorkerSpec,
                 launched: tuple[RunSpec, Path] | None = None, owns_group: bool = True
                 ) -> None:
        import torch
        import torch.distributed as dist

        self.config, self.place = loop, place
        # a launch's run and the directory its launcher prepared (and closes if it fails)
        self.launched = launched
        self.owns_group = owns_group
        self.device = torch.device(worker.device)
        # collectives of the default group: on the host over gloo, on the GPU under NCCL
        self.host = torch.device("cpu") if dist.get_backend() == "gloo" else self.device
        self.workers = launched[0].workers if launched else self._every_worker(worker)
        self.worker = worker
        self.exchange_group: Any = None
        self.exchange_device = self.host
        if all(w.is_cuda for w in self.workers) and dist.get_backend() == "gloo" \
                and dist.is_nccl_available():
            self.exchange_group = dist.new_group(backend="nccl")
            self.exchange_device = self.device
        self.backend = "nccl" if self.exchange_device.type == "cuda" else "gloo"
        self.run: RunSpec | None = None
        self.run_dir: Path | None = None
        self.closed = False
        self._failing_together = False  # a failure every rank meets at once (close waits)
        self.steps_done = 0
        self._step: int | None = None  # the step open in the loop
        self._exchanged = False
        self._backwards = 0  # this step's backwards: several where the loop accumulates
        self._kept = False  # this step's gradients kept here for a later exchange (no_sync)
        self._syncing = True  # False inside no_sync(): a backward keeps its gradients here
        self._unsent_loss: Any = None  # the weighted losses not exchanged yet (a tensor)
        self._local_loss = float("nan")
        self._loss = float("nan")
        self._uncaught: tuple[type[BaseException], BaseException] | None = None
        atexit.register(self._at_exit)
        self._chain_excepthook()

    @property
    def rank(self) -> int:
        """This rank's number in the job, 0 to `world_size` - 1 (torchrun's RANK)."""
        return self.place.rank

    @property
    def world_size(self) -> int:
        """The ranks in the job (torchrun's WORLD_SIZE; 1 for a script started alone)."""
        return self.place.world_size

    @property
    def is_main(self) -> bool:
        """Whether this is rank 0: the one rank to validate, log or save a checkpoint. Work
        it does between steps delays its next step, and the other ranks wait for it in that
        step's all-reduce (recorded as their idle); after `finish`, nothing waits for it."""
        return self.place.rank == 0

    def _chain_excepthook(self) -> None:
        """What the script raised and did not catch, kept for the run's reason (the
        interpreter calls the hook, then the atexit functions): a loop outside `with
        session` ends with its exception named, not as one that never called finish."""
        previous = sys.excepthook

        def kept(kind: type[BaseException], exc: BaseException, traceback: Any) -> None:
            self._uncaught = kind, exc
            previous(kind, exc, traceback)

        sys.excepthook = kept

    def _every_worker(self, mine: WorkerSpec) -> tuple[WorkerSpec, ...]:
        """Every rank's worker, in rank order, on every rank (rank 0's gathered, as JSON)."""
        gathered = comm.gather_bytes(json.dumps(dataclasses.asdict(mine)).encode(), self.host)
        payload = json.dumps([json.loads(g) for g in gathered]) if gathered else ""
        tables = json.loads(comm.broadcast_bytes(payload.encode(), self.host))
        return tuple(worker_from_dict(t) for t in tables)

    # -- prepare -------------------------------------------------------------------------

    def prepare(self, model: ModelT, optimizer: OptimizersT,
                data: Dataset[Any] | DataLoader[Any]) -> tuple[ModelT, OptimizersT, SliceLoader]:
        """The model on this rank's device with rank 0's parameters and buffers, the
        optimizer (or list of optimizers) watched for its steps, and the loader of this
        rank's slices of `data` (a map-style Dataset, or a DataLoader over one). Returns
        (model, optimizer, loader) for the loop to use. `model` is a torch.nn.Module
        (ModelT), `optimizer` a torch.optim.Optimizer or a list of them (OptimizersT): each
        comes back as the type it was given."""
        import torch

        if self.run is not None:
            raise UsageError("Session.prepare", "called twice: one model, its optimizers "
                             "and one data set per session")
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            raise UsageError("Session.prepare(model)", "a DistributedDataParallel: give the "
                             "module itself (model.module); hetbench exchanges the weighted "
                             "gradients in Session.backward")
        if not isinstance(model, torch.nn.Module):
            raise UsageError("Session.prepare(model)", f"a {type(model).__name__}: give a "
                             "torch.nn.Module")
        optimizers: list[Any] = (list(optimizer) if isinstance(optimizer, list | tuple)
                                 else [optimizer])
        for opt in optimizers:
            if not isinstance(opt, torch.optim.Optimizer):
                raise UsageError("Session.prepare(optimizer)", f"a {type(opt).__name__}: "
                                 "give a torch.optim.Optimizer or a list of them")
        cfg = self.config
        batches, order, data_kind = slice_batches(data, cfg.global_batch, cfg.seed,
                                                  cfg.timeout_s)
        model.to(self.device)
        self._share_first_rank(model)
        self.model = model
        self.params = [p for p in model.parameters() if p.requires_grad]
        for opt in optimizers:
            opt.register_step_pre_hook(self._before_optimizer_step)
            opt.register_step_post_hook(self._after_optimizer_step)
        self.batches = batches
        lr = float(optimizers[0].param_groups[0].get("lr", 0.0)) if optimizers else 0.0
        if self.launched is not None:
            run, self.run_dir = dataclasses.replace(self.launched[0], lr=lr), self.launched[1]
        else:
            run = config.loop_run(cfg, self.workers, 0, lr)
            self.run_dir = self._prepare_run_dir(run)
        self.run = run
        from hetbench.adapters.pytorch import TorchAdapter
        from hetbench.workloads.job import fingerprint

        dataset = batches.dataset
        self.info = lifecycle.describe(
            run, self.rank, self.worker, TorchAdapter.versions(),
            JobData(data_kind, fingerprint(dataset)), sum(p.numel() for p in self.params))
        self.described = self._describe(model, optimizers, data, dataset, data_kind)
        self.clock_start = lifecycle.start(self.run_dir, self.info, self.host)
        # a slice's BatchNorm statistics need two samples: no slice (nor shadow) of one
        self.shadow = 2 if self.described["batchnorm"] else 1
        # the most batches any rank's DataLoader makes ahead: a new partition waits for them
        ahead = batches.workers * (batches.prefetch or 2) if batches.workers else 0
        most_ahead = int(max(v[0] for v in comm.all_gather_vectors([float(ahead)], self.host)))
        self.slicing = Slicing(run, self.rank, self.host, self.run_dir, self.shadow,
                               batches.announce, most_ahead)
        self.writer = RecordWriter(collector.part_path(self.run_dir, self.rank))
        self.counters = Counters(cfg.counters_every)
        self.stretch = Stretcher(self.worker.slowdown_for(0))
        synchronize = torch.cuda.synchronize if self.device.type == "cuda" else None
        self.timer = StepTimer(self.stretch, synchronize)
        self.exchange_record = Exchange(Holds.SUMS, cfg.global_batch, None)
        comm.barrier()  # every rank starts its first step together
        loader = SliceLoader(order.steps_per_epoch, self._next_batch,
                             lambda: self.steps_done, self._close_step)
        return model, optimizer, loader

    def _share_first_rank(self, model: Any) -> None:
        """Rank 0's parameters and buffers on every rank (a model built from a seed each
        rank did not share starts the same everywhere)."""
        import torch.distributed as dist

        for tensor in [*model.parameters(), *model.buffers()]:
            shared = tensor.detach() if tensor.device == self.host else tensor.detach().cpu()
            dist.broadcast(shared, src=0)
            if shared is not tensor:
                tensor.data.copy_(shared)

    def _prepare_run_dir(self, run: RunSpec) -> Path:
        """Rank 0 makes the run directory; every rank learns its path."""
        name = ""
        if self.rank == 0:
            suite_dir = self.config.out / self.config.suite
            name = str(rundir.prepare_run_dir(self.config.out, self.config.suite, run,
                                              rundir.next_repeat(suite_dir, run.name)))
        path = Path(comm.broadcast_bytes(name.encode(), self.host).decode())
        (path / collector.PARTS_DIR).mkdir(parents=True, exist_ok=True)
        return path

    def _describe(self, model: Any, optimizers: Sequence[Any], data: Any, dataset: Any,
                  data_kind: str) -> dict[str, Any]:
        """What the manifest's `loop` says of the user's job."""
        import torch

        script = config.script_path()
        norms = (torch.nn.modules.batchnorm._BatchNorm,)
        return {
            "script": str(script), "argv": sys.argv[1:], "git": git_commit(script.parent),
            "model": type(model).__qualname__,
            "parameters": sum(p.numel() for p in self.params),
            # each trained tensor's elements, in the exchange's order (advise's placements)
            "tensors": [p.numel() for p in self.params],
            "batchnorm": [n for n, m in model.named_modules() if isinstance(m, norms)],
            "dropout": [n for n, m in model.named_modules()
                        if isinstance(m, torch.nn.modules.dropout._DropoutNd)],
            "optimizers": [type(o).__qualname__ for o in optimizers],
            "loss_reduction": self.config.loss_reduction,
            "data": {"type": data_kind, "samples": len(dataset),
                     "loader_workers": getattr(data, "num_workers", 0)},
            "exchange": "weighted gradients all-reduced in Session.backward",
        }

    # -- each step ------------------------------------------------------------------------

    def _next_batch(self, step: int, last: int) -> Any:
        """The loop asks for step `step`'s batch: the previous step is recorded, this
        one's slices decided, and it begins."""
        self._close_step()
        self.slicing.before(step)
        self._step, self._exchanged, self._backwards, self._kept = step, False, 0, False
        self._local_loss = self._loss = float("nan")
        worker = self.worker
        if worker.varies:
            self.stretch.extra = worker.factor_at(step, self.config.seed, self.rank) - 1.0
        self.stretch.take()  # what was stretched between steps is no step's
        self.counters.start()
        timer = self.timer
        timer.begin()
        self._bounds = lo, hi = self.slicing.bounds()
        # a rank left out still runs the loop's body (its optimizers and scheduler keep it
        # in step): on a shadow slice, the global batch's first samples, weighted 0
        batch = self.batches.get(step, *((lo, hi) if hi > lo else (0, self.shadow)), last)
        timer.end(perf_counter_ns())
        batch = to_device(batch, self.device)
        timer.end(perf_counter_ns())
        return batch

    def backward(self, loss: torch.Tensor) -> None:
        """In place of `loss.backward()`: this rank's loss over its slice, weighted to the
        global batch's, backward, and the gradients summed over every rank. The
        parameters' `.grad` then hold the global batch's gradient, as a textbook loop over
        the whole batch would have it. Inside `no_sync()`, the gradients stay on this rank,
        summed into `.grad` by the next backwards until one outside it exchanges them all:
        gradient accumulation, over several loader batches or several backwards of one."""
        import torch

        marks = self.timer.marks if self._step is not None else []
        if len(marks) < MARKS_BEFORE_FORWARD or self._exchanged:
            if self._exchanged:
                raise UsageError(BACKWARD, f"called again after step {self._step}'s exchange: "
                                 "to accumulate gradients, run the backwards before the last "
                                 "inside `with session.no_sync():`")
            raise UsageError(BACKWARD, "outside a step: call it on the loss of a batch the "
                             "session's loader gave")
        if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
            shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
            raise UsageError(f"{BACKWARD}(loss)", f"{shape}: a scalar is needed, reduced "
                             f"over the slice as hetbench.join(loss_reduction="
                             f"{self.config.loss_reduction!r}) declares")
        timer = self.timer
        first = self._backwards == 0
        if first:
            timer.end(perf_counter_ns())  # forward: the model and the loss
        else:  # a later micro-batch's forward: forward grows, backward keeps its length
            end = self._stretched_to_now()
            marks[-2] += end - marks[-1]
            marks[-1] = end
        lo, hi = self._bounds
        weight = ((hi - lo) / self.config.global_batch
                  if self.config.loss_reduction == "mean" or hi == lo else 1.0)
        scaled = loss * weight
        scaled.backward()
        if first:
            timer.end(perf_counter_ns())
        else:
            marks[-1] = self._stretched_to_now()
        self._backwards += 1
        if hi > lo:
            local = float(loss.detach())
            self._local_loss = local if first else self._local_loss + local
        weighted = scaled.detach()
        self._unsent_loss = weighted if self._unsent_loss is None else \
            self._unsent_loss + weighted
        self._kept = not self._syncing
        if self._kept:
            return
        flat = self._pack(self._unsent_loss)
        timer.end(perf_counter_ns())  # ready
        self._compute = self.counters.compute()
        comm.allreduce_sum(flat) if self.exchange_group is None else \
            torch.distributed.all_reduce(flat, group=self.exchange_group)
        timer.end(perf_counter_ns())  # reduced
        self._loss = self._unpack(flat)
        timer.end(perf_counter_ns())
        self._exchanged = True
        self._unsent_loss = None

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """As DDP's `model.no_sync()`: the backwards inside keep their gradients on this
        rank (no exchange), for the first backward after it to exchange with the rest.
        Every rank must accumulate over the same steps; the optimizers step after the
        exchange."""
        syncing = self._syncing
        self._syncing = False
        try:
            yield
        finally:
            self._syncing = syncing

    def _stretched_to_now(self) -> int:
        """The time since the step's last mark, done on the device and stretched as a
        compute phase (a rank's emulated slowdown): the instant it ends."""
        timer = self.timer
        if timer.synchronize is not None:
            timer.synchronize()
        return self.stretch(timer.marks[-1], perf_counter_ns())

    def _pack(self, scaled_loss: Any) -> Any:
        """One buffer: every trained parameter's gradient (zeros where it has none), then
        whether it has one (so a parameter no rank's slice reached keeps no gradient, as in
        a textbook loop), then the step's count (`_agreement`), then the weighted loss."""
        import torch

        grads = [p.grad.reshape(-1) if p.grad is not None else torch.zeros(
            p.numel(), dtype=p.dtype, device=p.device) for p in self.params]
        has = torch.tensor([p.grad is not None for p in self.params], dtype=grads[0].dtype,
                           device=grads[0].device) if grads else torch.zeros(0)
        counted = torch.tensor([1.0, float(self._step or 0)], dtype=has.dtype,
                               device=has.device)
        flat = torch.cat([*grads, has, counted, scaled_loss.reshape(1).to(has.dtype)])
        return flat.to(self.exchange_device)

    def _unpack(self, flat: Any) -> float:
        """The summed gradients back in `.grad` (views of the buffer on the parameter's
        device); the global loss. A rank that met another's Session.finish() in its
        exchange raises (`_agreement`)."""
        count = len(self.params)
        world = self.place.world_size
        in_step, steps = (round(float(v)) for v in flat[-3:-1])
        if in_step != world:  # the others met this step's exchange with their finish
            finished = world - in_step
            raise UsageError("steps", "the ranks disagree on the step count: "
                             f"{finished} rank(s) called Session.finish() after "
                             f"{(steps - (self._step or 0) * in_step) / finished:.0f} steps, "
                             f"while rank {self.rank} took step {self._step} (every rank "
                             "must take the same steps)")
        if steps != (self._step or 0) * world:  # another rank kept this step's gradients
            self._failing_together = True  # every rank read the same sums: each raises
            raise UsageError("Session.no_sync", f"the ranks disagree on when to exchange: "
                             f"rank {self.rank} exchanged at step {self._step} where another "
                             "did not (every rank must accumulate over the same steps)")
        offset = 0
        has = flat[flat.numel() - 3 - count:flat.numel() - 3]
        for p, reached in zip(self.params, has.tolist(), strict=True):
            n = p.numel()
            if reached:
                grad = flat[offset:offset + n].view_as(p)
                p.grad = grad if grad.device == p.device and grad.dtype == p.dtype \
                    else grad.to(device=p.device, dtype=p.dtype)
            offset += n
        return float(flat[-1])

    def _agreement(self) -> None:
        """In finish, every rank: one exchange shaped as a step's, counting no step. Where
        all ranks finish, each sees no rank in a step; where one goes on (the ranks disagree
        on the step count), its step's exchange meets this one and both say so, at once,
        rather than waiting on each other until gloo's timeout. (A rank whose partition
        policy decides at that step meets it in another collective: that still times
        out.)"""
        import torch

        size = sum(p.numel() for p in self.params) + len(self.params) + 3
        flat = torch.zeros(size, dtype=self.params[0].dtype if self.params else torch.float32,
                           device=self.exchange_device)
        flat[-2] = float(self.steps_done)  # the steps this rank took, for the others to say
        comm.allreduce_sum(flat) if self.exchange_group is None else \
            torch.distributed.all_reduce(flat, group=self.exchange_group)
        world = self.place.world_size
        in_step, steps = (round(float(v)) for v in flat[-3:-1])
        if in_step:  # some rank met this finish with a step's exchange
            finished = world - in_step
            raise UsageError("steps", "the ranks disagree on the step count: Session.finish() "
                             f"after {self.steps_done} steps on rank {self.rank}, while "
                             f"{in_step} rank(s) took step "
                             f"{(steps - self.steps_done * finished) / in_step:.0f} (every "
                             "rank must take the same steps)")

    def _before_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._step is not None and not self._exchanged:
            kept = (" (its backwards ran inside session.no_sync(): their gradients are this "
                    "rank's alone until a backward outside it)") if self._backwards else ""
            raise UsageError(f"{type(optimizer).__name__}.step()", f"before the exchange of "
                             f"step {self._step}{kept}: call session.backward(loss) in place "
                             "of loss.backward(), so that the gradients are the global "
                             "batch's")

    def _after_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._step is None or not self._exchanged:
            return
        marks = self.timer.marks
        if len(marks) == MARKS_EXCHANGED:
            self.timer.end(perf_counter_ns())  # apply
        else:  # another optimizer of the same step: apply ends with the last one
            marks[-1] = perf_counter_ns()

    def _close_step(self) -> None:
        """The open step recorded; a step the loop left before its backward took no step
        and leaves no record."""
        step = self._step
        if step is None or self.closed:  # a pass the loop left after the run closed
            return
        self._step = None
        if not (self._exchanged or self._kept):  # no backward, or its exchange raised
            return
        marks = self.timer.marks
        if not self._exchanged:  # accumulated: no pack, exchange, unpack nor apply
            self._compute = self.counters.compute()
            marks.extend([marks[-1]] * (MARKS_EXCHANGED + 1 - len(marks)))
        elif len(marks) == MARKS_EXCHANGED:  # no optimizer stepped: nothing applied
            marks.append(marks[-1])
        lo, hi = self._bounds
        parts = (self.rank, step, hi - lo, lo, marks,
                 self.stretch.take(), self._compute,
                 self._loss, self._local_loss, self.counters.take(), self.exchange_record)
        self.writer.append(parts)
        self.steps_done = step + 1
        self.slicing.measured(step, hi - lo, parts)

    # -- the end --------------------------------------------------------------------------

    def finish(self) -> Path:
        """Every rank, after the loop: the records go to rank 0, which writes the completed
        run directory (steps.parquet, the trace, params.npz, the manifest with the loop's
        script, arguments and commit). Returns the run directory."""
        if self.run is None or self.run_dir is None:
            raise UsageError("Session.finish", "before Session.prepare: nothing was run")
        if self.closed:
            return self.run_dir
        self._close_step()
        self._agreement()
        self.writer.close()
        run = dataclasses.replace(self.run, steps=self.steps_done)
        parameters = ({name: p.detach().cpu().numpy() for name, p in
                       self.model.named_parameters()} if self.rank == 0 else None)
        closing = {"partition_history": self.slicing.state.partition_history,
                   "standalone": [], "aggregator": {}, "loop": self.described,
                   "run": run.to_dict()}
        lifecycle.finish(run, self.run_dir, self.host, self.info, self.clock_start,
                         self.writer.records(), parameters, self.backend, closing)
        # no rank leaves before rank 0 has written the run: a script's exit can abort in
        # torch's teardown (harness/system/exits.py), which this process cannot skip, and
        # torchrun then ends the other ranks, rank 0's writing with them (a CI run lost
        # one this way)
        comm.barrier()
        self.closed = True
        atexit.unregister(self._at_exit)
        self._end_group()
        return self.run_dir

    def _end_group(self) -> None:
        """The process groups join began, ended: gloo's threads left to the interpreter's
        exit can abort it (harness/system/exits.py). A group the script began stays."""
        import torch.distributed as dist

        if self.owns_group and dist.is_initialized():
            dist.destroy_process_group()

    def close(self, status: str, reason: str) -> None:
        """The run ended badly here: this rank's records flushed and its reason left, rank 0
        closes the run directory with every record flushed on this host."""
        if self.closed or self.run is None or self.run_dir is None:
            return
        self.closed = True
        atexit.unregister(self._at_exit)
        try:
            self.writer.close()
            collector.error_path(self.run_dir, self.rank).write_text(reason + "\n")
        except OSError:
            pass
        if self.rank == 0 and self.launched is None:  # a launch's run: its launcher closes it
            rundir.close_run(self.run_dir, dataclasses.replace(self.run, steps=self.steps_done),
                             status, reason)
        if self._failing_together:
            # every rank fails here: none leaves before rank 0 has closed the run (a rank
            # that exits first gets the others SIGTERMed by torchrun, and rank 0 cut while
            # it wrote left the run `running`: once on a loaded host)
            with contextlib.suppress(Exception):
                comm.barrier()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, kind: Any, exc: Any, traceback: Any) -> None:
        if kind is None:
            if self.run is not None:
                self.finish()
            return
        self._close_raised(kind, exc)

    def _close_raised(self, kind: type[BaseException], exc: BaseException) -> None:
        if issubclass(kind, KeyboardInterrupt):
            self.close("interrupted", f"interrupted by {exc.args[0] if exc.args else 'SIGINT'}")
        else:
            first = str(exc).splitlines()[0] if str(exc) else ""
            self.close("failed", f"worker {self.rank}: {kind.__name__}: {first}")

    def _at_exit(self) -> None:
        if self.run is None or self.closed:
            return
        if self._uncaught is not None:
            self._close_raised(*self._uncaught)
        else:
            self.close("failed", f"worker {self.rank}: the script ended without "
                       "Session.finish()")
