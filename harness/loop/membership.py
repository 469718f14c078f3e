"""Who computes a step: the workers with a non-empty slice (the members).

A worker left out (slice 0, given in the suite or decided by the 'model' policy with
`leave_out`) computes nothing and takes no part in the exchange: the members all-reduce in
a process group of their own (a lone member skips the exchange: its sums are the whole
batch's), and gather their repartitioning windows among themselves.

The left-out worker costs the members nothing while it waits: it blocks in a receive from
the first member (the source), which tells it, point to point, only what it must act on:

- EVAL: an evaluation is due (every worker evaluates its shard): the parameters follow;
- CHANGE: the partition changed: the sizes and the reason follow, and, to a worker taken
  back, the parameters, the optimizer state (a job's torch optimizer's state dict as
  bytes) and the repartitioner's state, so that it
  computes the same updates and the same partitions as the others from then on;
- END: the last step is done: the parameters follow (rank 0 writes the model);
- ALIVE: nothing else was said for a second (or a quarter of the run's timeout, if less),
  so that the left-out worker's records, and the launcher's progress, follow the members'.

Every rank then meets the others in the collectives that follow (the evaluation's gather,
the new group's creation, the end of the run) as if it had trained along.

The word comes between the source's steps, so the left-out worker's receive cannot have
the run's timeout (how long a worker waits for a peer in a collective): one member step
longer than it (a lone member waits for no peer; an emulated slowdown stretches a host's
stall too) would end a run that is well. It waits as long as the launcher lets the run go
without a step (RunSpec.stall_limit_s), which stops a source that hangs; one that dies
closes the connection, which ends the receive at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from hetbench.adapters.base import Adapter
from hetbench.harness.training.optim import Optimizer, OwnOptimizer

EVAL, CHANGE, END, ALIVE = 1, 2, 3, 4
ALIVE_EVERY_S = 1.0  # a send of 24 bytes a second: nothing against the steps


def members_of(sizes: Sequence[int]) -> tuple[int, ...]:
    return tuple(i for i, size in enumerate(sizes) if size > 0)


@dataclass(frozen=True)
class Event:
    kind: int
    step: int  # the last step done when it was sent
    progress: int  # EVAL: the steps the evaluation is for


class Membership:
    def __init__(self, rank: int, world_size: int, sizes: Sequence[int],
                 timeout_s: float, device: Any,
                 stall_limit_s: Callable[[bool], float]) -> None:
        """`device`: where the job's collectives take their tensors (a GPU under nccl).
        `stall_limit_s(started)`: how long the launcher lets the run go without a step,
        before the first step or after it (RunSpec.stall_limit_s)."""
        self.rank, self.world_size, self.device = rank, world_size, device
        self.timeout_s, self.stall_limit_s = timeout_s, stall_limit_s
        self.members = members_of(sizes)
        self._groups: dict[tuple[int, ...], Any] = {}
        self._last_sent = time.monotonic()

    @property
    def computing(self) -> bool:
        return self.rank in self.members

    @property
    def partial(self) -> bool:
        return len(self.members) < self.world_size

    @property
    def lone(self) -> bool:
        return len(self.members) == 1

    @property
    def source(self) -> int:
        return self.members[0]

    def left_out(self) -> list[int]:
        return [r for r in range(self.world_size) if r not in self.members]

    def group(self) -> ProcessGroup | None:
        """The members' process group (None: the whole job's, or a lone member that needs
        none). Every rank calls this together after the members change:
        torch.distributed.new_group is collective."""
        if not self.partial or self.lone:
            return None
        if self.members not in self._groups:
            self._groups[self.members] = dist.new_group(
                list(self.members), timeout=timedelta(seconds=self.timeout_s))
        return self._groups[self.members]

    # -- the source's side ------------------------------------------------------------------

    def announce_evaluation(self, step: int, progress: int, adapter: Adapter) -> None:
        if self.rank == self.source:
            for r in self.left_out():
                self._send_event(r, EVAL, step, progress)
                dist.send(self._flat_parameters(adapter), dst=r)

    def announce_end(self, step: int, adapter: Adapter) -> None:
        if self.rank == self.source:
            for r in self.left_out():
                self._send_event(r, END, step)
                dist.send(self._flat_parameters(adapter), dst=r)

    def keep_alive(self, step: int) -> None:
        """Word to the left-out workers at least every second (a quarter of the run's
        timeout, if less), so that their records (and the launcher's progress, the slowest
        worker's) follow the members'."""
        if self.rank == self.source and self.partial \
                and time.monotonic() - self._last_sent > min(self.timeout_s / 4,
                                                             ALIVE_EVERY_S):
            for r in self.left_out():
                self._send_event(r, ALIVE, step)

    def announce_change(self, step: int, sizes: Sequence[int], reason: str, adapter: Adapter,
                        optimizer: Optimizer | OwnOptimizer, repartitioner: Any) -> None:
        """A member, after the partition changed at `step`: the source tells every left-out
        worker the new sizes and hands the workers taken back the state to compute with."""
        if self.rank == self.source:
            back = members_of(sizes)
            for r in self.left_out():
                self._send_event(r, CHANGE, step)
                dist.send(torch.tensor(list(sizes), dtype=torch.int64, device=self.device),
                          dst=r)
                self._send_bytes(r, reason.encode())
                if r in back:
                    for tensor in self._state(adapter, optimizer, repartitioner):
                        dist.send(tensor, dst=r)
                    self._send_bytes(r, optimizer.state_bytes())
        self.members = members_of(sizes)

    # -- the left-out worker's side ---------------------------------------------------------

    def wait(self, step: int) -> Event:
        """The source's next word, this worker's next step being `step`: waited for as long
        as the launcher lets the run go without a step, not the run's timeout (above)."""
        message = torch.zeros(3, dtype=torch.int64, device=self.device)
        patience = timedelta(seconds=self.stall_limit_s(step > 0))
        receive = dist.irecv(message, src=self.source)
        assert receive is not None  # None: not in the group, and every rank is
        receive.wait(timeout=patience)
        kind, step, progress = (int(v) for v in message.tolist())
        return Event(kind, step, progress)

    def receive_parameters(self, adapter: Adapter) -> None:
        flat = self._flat_parameters(adapter)
        dist.recv(flat, src=self.source)
        self._load_parameters(adapter, flat)

    def receive_change(self, adapter: Adapter, optimizer: Optimizer | OwnOptimizer,
                       repartitioner: Any) -> tuple[tuple[int, ...], str]:
        """After a CHANGE event: the new sizes and reason; taken back, the state too."""
        source = self.source
        sizes = torch.zeros(self.world_size, dtype=torch.int64, device=self.device)
        dist.recv(sizes, src=source)
        new = tuple(int(n) for n in sizes.tolist())
        reason = self._receive_bytes(source).decode()
        if self.rank in members_of(new):
            state = self._state(adapter, optimizer, repartitioner)
            for tensor in state:
                dist.recv(tensor, src=source)
            self._load_parameters(adapter, state[0])
            optimizer_state = state[1:len(optimizer.state()) + 1]
            optimizer.load_state([t.to(mine.device) for t, mine
                                  in zip(optimizer_state, optimizer.state(), strict=True)])
            if repartitioner is not None:
                repartitioner.load_state(state[-1].cpu().tolist())
            optimizer.load_state_bytes(self._receive_bytes(source))
        self.members = members_of(new)
        return new, reason

    # -- messages ---------------------------------------------------------------------------

    def _send_event(self, receiver: int, kind: int, step: int, progress: int = 0) -> None:
        dist.send(torch.tensor([kind, step, progress], dtype=torch.int64, device=self.device),
                  dst=receiver)
        self._last_sent = time.monotonic()

    def _send_bytes(self, receiver: int, payload: bytes) -> None:
        dist.send(torch.tensor([len(payload)], dtype=torch.int64, device=self.device),
                  dst=receiver)
        if payload:
            data = torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(self.device)
            dist.send(data, dst=receiver)

    def _receive_bytes(self, source: int) -> bytes:
        length = torch.zeros(1, dtype=torch.int64, device=self.device)
        dist.recv(length, src=source)
        if not int(length.item()):
            return b""
        data = torch.zeros(int(length.item()), dtype=torch.uint8, device=self.device)
        dist.recv(data, src=source)
        return bytes(data.cpu().numpy().tobytes())

    def _state(self, adapter: Adapter, optimizer: Optimizer | OwnOptimizer, repartitioner: Any
               ) -> list[torch.Tensor]:
        """Parameters, optimizer state and repartitioner state, as tensors to send or to
        receive into (the same shapes on every worker)."""
        state = [self._flat_parameters(adapter),
                 *(t.to(self.device) for t in optimizer.state())]
        if repartitioner is not None:
            state.append(torch.tensor(repartitioner.state(), dtype=torch.float64,
                                      device=self.device))
        return state

    def _flat_parameters(self, adapter: Adapter) -> torch.Tensor:
        values = adapter.parameters()
        return torch.from_numpy(np.concatenate(
            [values[p.name].ravel() for p in adapter.spec.params]).astype(np.float32)
        ).to(self.device)

    @staticmethod
    def _load_parameters(adapter: Adapter, flat: torch.Tensor) -> None:
        values, offset, array = {}, 0, flat.cpu().numpy()
        for p in adapter.spec.params:
            values[p.name] = array[offset:offset + p.size].reshape(p.shape)
            offset += p.size
        adapter.load_parameters(values)
