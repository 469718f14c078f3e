"""The step's phase timer (harness/loop/timer.py) and the record it feeds (collector)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from hetbench.harness.loop.counters import COMPUTE_FIELDS, UNMEASURED_COMPUTE
from hetbench.harness.loop.timer import RULES, CudaEventTimer, HostTimer, StepTimer
from hetbench.harness.records import collector, fields
from hetbench.harness.records.collector import PHASES, RECORD_DTYPE, Phase
from hetbench.harness.spec import emulation
from hetbench.harness.spec.emulation import Stretcher

COMPUTE = [p for p in PHASES if RULES[p].stretched]


def run_phases(timer: StepTimer | HostTimer, work_s: float = 0.0) -> None:
    """A step as the loop marks it: the host clock read at each phase's end, in order."""
    timer.begin()
    for _ in PHASES:
        if work_s:
            time.sleep(work_s)
        timer.end(time.perf_counter_ns())


def test_marks_follow_the_phases_and_the_device_is_waited_for_where_it_may_be_busy() -> None:
    waited: list[int] = []
    timer = StepTimer(Stretcher(1.0), lambda: waited.append(len(timer.marks)))
    run_phases(timer)
    assert len(timer.marks) == len(PHASES) + 1
    assert timer.marks == sorted(timer.marks)
    assert timer.durations() == [b - a for a, b in zip(timer.marks, timer.marks[1:],
                                                       strict=False)]
    # waited before marking each phase but load (the host's own work)
    assert [PHASES[n - 1] for n in waited] == [p for p in PHASES if p is not Phase.LOAD]
    host_only = StepTimer(Stretcher(1.0))  # PyTorch on CPU: nothing to wait for
    run_phases(host_only)
    assert len(host_only.marks) == len(PHASES) + 1


def test_a_phase_beyond_the_last_is_refused_and_one_ended_at_an_instant_out_of_order_too(
        ) -> None:
    timer = StepTimer(Stretcher(1.0))
    run_phases(timer)
    with pytest.raises(RuntimeError, match="a step marked more than its 8 phases"):
        timer.end(time.perf_counter_ns())
    timer.begin()
    timer.end(time.perf_counter_ns())  # load
    with pytest.raises(RuntimeError, match="phase backward ended where to_device was due"):
        timer.end_at(Phase.BACKWARD, time.perf_counter_ns())


def test_the_host_timer_keeps_the_loops_instants_and_a_record_missing_one_is_refused(
        ) -> None:
    timer = HostTimer()
    timer.begin()
    instants = [timer.marks[0] + 10 * (i + 1) for i in range(len(PHASES))]
    for instant in instants:
        timer.end(instant)
    assert timer.marks[1:] == instants
    timer.begin()
    first = timer.marks
    timer.end(first[0] + 5)
    timer.begin()  # a new list: the last step's record still holds its own
    assert first == [first[0], first[0] + 5] and timer.marks is not first
    with pytest.raises(RuntimeError, match="a step marked 0 phase ends, not 8"):
        collector.timed_record(0, 0, 1, 0, timer.marks, (0, 0, 0), UNMEASURED_COMPUTE, 0.0, 0.0,
                               (-1,) * 7, Exchanged())


def test_the_slowdown_stretches_the_compute_phases_only() -> None:
    stretch = Stretcher(3.0)
    stretched: list[Phase] = []

    def recording(start: int, end: int) -> int:
        stretched.append(PHASES[len(timer.marks) - 1])
        return stretch(start, end)

    timer = StepTimer(recording)
    run_phases(timer, work_s=0.002)
    assert stretched == COMPUTE == list(collector.COMPUTE_PHASES)
    durations = dict(zip(PHASES, timer.durations(), strict=True))
    # the compute phases last 3x their own 2 ms together (a sleep's overshoot comes off
    # the next phase's stretch); the others are not stretched
    assert sum(durations[p] for p in COMPUTE) >= 3 * len(COMPUTE) * 2_000_000
    assert all(durations[p] < 3 * 2_000_000 for p in PHASES if p not in COMPUTE)
    assert stretch.take()[0] >= len(COMPUTE) * 2 * 2_000_000
    assert stretch.take() == (0, 0, 0)  # taken once


class LateClock:
    """The clocks Stretcher reads, made exact: each read of the clock takes 1 us, each
    sleep wakes `late_ns` late (as when no core is free to wake it), the thread costs no
    CPU. A real clock beside other load makes the same test's bound a matter of luck."""

    def __init__(self, late_ns: int) -> None:
        self.now = 0
        self.late_ns = late_ns

    def perf_counter_ns(self) -> int:
        self.now += 1_000
        return self.now

    def thread_time_ns(self) -> int:
        return 0

    def sleep(self, seconds: float) -> None:
        self.now += round(seconds * 1e9) + self.late_ns


def test_a_sleep_that_overshoots_is_taken_off_the_next_stretch(monkeypatch) -> None:
    """Each sleep wakes 1 ms late: the phases' stretches add up to (factor - 1) x their
    compute but for the last sleep's overshoot, where a stretch that waited out each
    phase's own target overshot at every phase (8 x ~0.9 ms here)."""
    clock = LateClock(late_ns=1_000_000)
    monkeypatch.setattr(emulation, "time", clock)
    stretch = Stretcher(2.0)
    phase_ns, phases = 3_000_000, 8
    for _ in range(phases):
        start = clock.perf_counter_ns()
        clock.now = end = start + phase_ns
        assert stretch(start, end) == clock.now
    total, _, _ = stretch.take()
    asked = phases * phase_ns  # (2 - 1) x each phase's 3 ms
    assert asked <= total < asked + 1_000_000  # one overshoot, not eight


@dataclass
class HostEvent:
    """Stands in for torch.cuda.Event where no GPU is (tests/test_device_allreduce.py runs
    the real one): records the host's clock, elapsed_time in ms as CUDA's does."""

    at: int = -1

    def record(self) -> None:
        self.at = time.perf_counter_ns()

    def synchronize(self) -> None:
        assert self.at >= 0

    def elapsed_time(self, other: HostEvent) -> float:
        return (other.at - self.at) / 1e6


def test_cuda_events_mark_the_compute_phases_and_the_host_the_rest() -> None:
    waited: list[int] = []
    timer = CudaEventTimer(lambda: waited.append(len(timer.marks)), HostEvent)
    run_phases(timer, work_s=0.001)
    # one device wait per phase the host takes part in, none during compute
    assert [PHASES[n - 1] for n in waited] == [Phase.ALLREDUCE, Phase.UNPACK, Phase.APPLY]
    assert -1 not in timer.marks and timer.marks == sorted(timer.marks)
    events = timer.events
    for i in range(1, len(events)):  # begin + time since the begin event, to 1 us
        assert timer.marks[i] - timer.marks[0] == pytest.approx(events[i].at - events[0].at,
                                                                abs=1_000)


@dataclass
class Exchanged:
    staleness: int = 2
    push_ns: int = 11
    wait_ns: int = 12
    pull_ns: int = 13
    asynchronous: bool = True
    dropped: bool = False


def test_the_record_puts_each_value_in_its_named_field() -> None:
    marks = [1000 + 10 * i * i for i in range(len(PHASES) + 1)]
    counters = (1, 2, 300, 400, 5 << 20, 600, 7)
    compute = tuple(1234 + i for i in range(len(COMPUTE_FIELDS)))
    row = np.array([collector.timed_record(3, 42, 16, 32, marks, (99, 98, 97), compute, 0.5, 0.25,
                                           counters, Exchanged())], dtype=RECORD_DTYPE)[0]
    assert (row["rank"], row["step"], row["batch_size"], row["slice_start"]) == (3, 42, 16, 32)
    assert row["begin_ns"] == marks[0] and row["end_ns"] == marks[-1]
    assert row["ready_ns"] == marks[PHASES.index(Phase.PACK) + 1]
    assert row["reduced_ns"] == marks[PHASES.index(Phase.ALLREDUCE) + 1]
    for i, phase in enumerate(PHASES):
        assert row[f"{phase.value}_ns"] == marks[i + 1] - marks[i]
    assert (row["stretch_ns"], row["stretch_wait_ns"], row["stretch_cpu_ns"]) == (99, 98, 97)
    assert [row[f] for f in fields.written_by("cpu")] == list(compute)
    assert fields.written_by("cpu") == COMPUTE_FIELDS
    assert (row["loss"], row["local_loss"]) == (0.5, 0.25)
    assert [row[f] for f in fields.written_by("counters")] == list(counters)
    assert [row[f] for f in collector.EXCHANGE_FIELDS] == [2, 11, 12, 13, True, False]


def test_a_timed_steps_parts_become_its_row_when_the_writer_flushes(tmp_path: Path) -> None:
    """A worker leaves a timed step's parts; the writer builds the row as it flushes, and
    writes the rows it was given whole (a step sat out) as they are, in order."""
    marks = [1000 + 10 * i * i for i in range(len(PHASES) + 1)]
    parts = (3, 42, 16, 32, marks, (99, 0, 0), UNMEASURED_COMPUTE, 0.5, 0.25,
             (1, 2, 300, 400, 5, 6, 7), Exchanged())
    assert len(parts) == collector.TIMED_STEP_PARTS and parts[collector.TIMED_MARKS] is marks
    path = tmp_path / "rank3.bin"
    writer = collector.RecordWriter(path, flush_every=2)
    writer.append(parts)
    writer.append(collector.left_out_record(3, 43))
    writer.append(parts)
    writer.close()
    written = collector.read_part(path)
    assert written["step"].tolist() == [42, 43, 42]
    made = np.array([collector.timed_record(*parts)], dtype=RECORD_DTYPE)[0]
    assert written[0].tobytes() == written[2].tobytes() == made.tobytes()
    assert written[1]["batch_size"] == 0


def test_an_untimed_record_has_its_instants_and_nothing_measured() -> None:
    row = np.array([collector.untimed_record(1, 7, 8, 0, 100, 900, Exchanged())],
                   dtype=RECORD_DTYPE)[0]
    assert (row["begin_ns"], row["ready_ns"], row["reduced_ns"], row["end_ns"]) == (100, 0, 0,
                                                                                    900)
    assert all(row[f"{p.value}_ns"] == 0 for p in PHASES)
    assert np.isnan(row["loss"]) and np.isnan(row["local_loss"])
    assert (row["staleness"], row["push_ns"], row["asynchronous"]) == (2, 0, True)


def compute_times(device: str, timers: dict[str, Callable[[Any], StepTimer]],
                  steps: int = 60) -> dict[str, list[int]]:
    """The worker's own compute (Trainer.compute) of a CNN on `device`, timed in turn by
    each of `timers` (each made from the worker's adapter): each timer's compute times
    (begin to ready) after 10 warm-up steps (cuDNN's choices, the allocator)."""
    from hetbench.adapters.pytorch import TorchAdapter
    from hetbench.harness.loop.sources import build_trainer
    from hetbench.harness.spec.suite import parse_suite

    run = parse_suite({"runs": [{"name": "timing", "workload": "cnn", "dataset": "digits",
                                 "global_batch": 64, "steps": steps,
                                 "workers": [{"device": device}]}]}).runs[0]
    trainer, _ = build_trainer(run, 0, "gloo", TorchAdapter)
    made = {name: make(trainer.adapter) for name, make in timers.items()}
    names = list(made)
    compute: dict[str, list[int]] = {name: [] for name in names}
    for step in range(steps):
        name = names[step % len(names)]
        trainer.timer = timer = made[name]
        timer.begin()
        trainer.compute(step, 0, 64)
        trainer.adapter.zero_grad()
        assert timer.marks == sorted(timer.marks) and -1 not in timer.marks
        if step >= 10:
            compute[name].append(timer.marks[collector.MARK_READY] - timer.marks[0])
    return compute


def test_the_workers_compute_is_timed_by_whichever_timer_it_holds() -> None:
    """On the CPU: the plumbing of the GPU test below (no events here)."""
    waits: list[int] = []
    compute = compute_times("cpu", {
        "host": lambda adapter: StepTimer(Stretcher(1.0)),
        "waits": lambda adapter: StepTimer(Stretcher(1.0), lambda: waits.append(1))})
    assert [len(v) for v in compute.values()] == [25, 25]
    assert all(t > 0 for v in compute.values() for t in v)
    assert len(waits) == 30 * 4  # its 30 steps: to_device, forward, backward, pack


@pytest.mark.gpu  # CUDA events need a GPU (skipped without one: tests/conftest.py)
def test_on_a_gpu_events_and_synchronised_marks_agree_on_the_compute() -> None:
    """The worker's compute on cuda:0, timed alternately by events and by a device-wide
    wait per phase: both time the same kernels, so their compute medians are within a
    factor 2 (how much the waits add is what benchmarks/gpu_check.sh measures)."""
    torch.cuda.set_device(0)  # as hetbench.harness.exchange.comm.init does for a CUDA worker
    compute = compute_times("cuda:0", {
        "events": lambda adapter: CudaEventTimer(adapter.synchronize, adapter.cuda_event),
        "waits": lambda adapter: StepTimer(Stretcher(1.0), adapter.synchronize)})
    by_events, by_waits = (float(np.median(compute[k])) for k in ("events", "waits"))
    assert 0 < by_events and 0.5 * by_waits <= by_events <= 2 * by_waits


class Device:
    """What phase_timer reads of an adapter: whether its host calls return before the work
    is done, how to wait for it, and (PyTorch) how to make a CUDA event."""

    def __init__(self, synchronize_on_host: bool = False, events: bool = False) -> None:
        self.synchronize_on_host = synchronize_on_host
        if events:
            self.cuda_event = HostEvent

    def synchronize(self) -> None:
        pass


@pytest.mark.parametrize(("device", "slowdown", "adapter", "instrument", "expected"), [
    ("cuda:0", 1.0, Device(events=True), True, "events"),
    ("cuda:0", 3.0, Device(events=True), True, "waits"),  # stretching needs each duration
    ("cuda:0", 1.0, Device(), True, "waits"),  # a framework without events: MXNet, TF
    ("cpu", 1.0, Device(events=True), True, "host"),  # PyTorch on CPU: nothing queued
    ("cpu", 2.0, Device(events=True), True, "stretched"),  # no wait, but a stretch
    ("cpu", 1.0, Device(synchronize_on_host=True), True, "waits"),  # MXNet's engine
    ("cuda:0", 1.0, Device(events=True), False, "host"),  # instrument = false
])
def test_each_worker_gets_the_timer_its_device_needs(device: str, slowdown: float,
                                                     adapter: Device, instrument: bool,
                                                     expected: str) -> None:
    from hetbench.harness.loop.trainer import phase_timer
    from hetbench.harness.spec.workers import WorkerSpec

    timer = phase_timer(WorkerSpec(device=device, slowdown=slowdown), adapter,
                        Stretcher(slowdown), instrument)
    kind = "events" if isinstance(timer, CudaEventTimer) else \
        "host" if isinstance(timer, HostTimer) else \
        "waits" if timer.synchronize is not None else "stretched"
    assert kind == expected


def test_the_host_timer_marks_each_phase_and_an_instant_no_earlier_than_the_last() -> None:
    timer = HostTimer()
    timer.begin()
    for _ in PHASES[:3]:
        timer.end(time.perf_counter_ns())
    timer.end_at(PHASES[3], timer.marks[0])  # an instant before the last mark: clamped
    timer.end_at(PHASES[4], timer.marks[-1] + 5)
    for _ in PHASES[5:]:
        timer.end(time.perf_counter_ns())
    marks = timer.marks
    assert len(marks) == len(PHASES) + 1 and marks == sorted(marks)
    assert marks[4] == marks[3] and marks[5] == marks[4] + 5
    assert timer.durations() == [b - a for a, b in zip(marks, marks[1:], strict=False)]
