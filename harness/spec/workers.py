"""A run's workers: what each is (device, threads, cores, framework) and how it is slowed
(hetbench.harness.spec.emulation), checked."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hetbench.harness.spec import emulation
from hetbench.harness.spec.errors import UsageError
from hetbench.harness.spec.fields import (
    MAX_CORE,
    MAX_LOADER_WORKERS,
    MAX_NODES,
    MAX_SLOWDOWN,
    MAX_STEPS,
    MAX_THREADS,
    MAX_WORKERS,
    check_keys,
    choice,
    integer,
    number,
    table,
    text,
)
from hetbench.harness.spec.frameworks import FRAMEWORKS

# Used with fullmatch: '$' alone would also accept a trailing newline.
DEVICE_PATTERN = re.compile(r"cpu|cuda:\d+")


@dataclass(frozen=True)
class WorkerSpec:
    device: str = "cpu"
    threads: int = 1
    cores: tuple[int, ...] | None = None
    slowdown: float = 1.0
    framework: str = "pytorch"
    # Emulated heterogeneity that changes during the run: (step, factor) points, linear in
    # between, held before the first and after the last. Overrides `slowdown`.
    slowdown_at: tuple[tuple[int, float], ...] | None = None
    # Noisy per-step slowdowns on top: (probability, factor), e.g. OS interference; drawn
    # from (seed, rank, step), so every repeat and every scheme sees the same steps slowed.
    jitter: tuple[float, float] | None = None
    # which host runs it, in a run across hosts (`hetbench run --nnodes N`): node 0 hosts
    # rank 0, which writes the run directory
    node: int = 0
    # its input pipeline's processes (threads), in place of the run's `loader.workers`; 0
    # loads in the training process: one worker's pipeline starved against the others'
    loader_workers: int | None = None

    @property
    def is_cuda(self) -> bool:
        return self.device.startswith("cuda")

    @property
    def emulated(self) -> bool:
        return self.slowdown != 1.0 or bool(self.slowdown_at) or bool(self.jitter)

    @property
    def varies(self) -> bool:
        """The slowdown changes from step to step (a schedule or jitter)."""
        return bool(self.slowdown_at) or bool(self.jitter)

    def factor_at(self, step: int, seed: int, rank: int) -> float:
        """The slowdown of this worker's step `step` (hetbench.harness.spec.emulation)."""
        return emulation.factor_at(self, step, seed, rank)

    @property
    def core_share(self) -> float:
        """The cores its compute keeps busy at most: its threads, or on a CPU worker
        slowed s times (which sleeps all but 1/s of its compute: emulation.Stretcher)
        threads / s. An estimate of the compute's demand: the loop's own time and the
        exchange's are not in it."""
        least = emulation.least(self)
        return self.threads / least if self.device == "cpu" and least > 1.0 else \
            float(self.threads)

    def slowdown_for(self, step: int) -> float:
        """The schedule's slowdown at `step`, without jitter (hetbench.harness.spec.emulation)."""
        return emulation.scheduled(self, step)

    @property
    def label(self) -> str:
        """How the records and figures name this worker."""
        label = f"{self.framework} {self.device} x{self.threads}"
        if self.cores:
            label += f" cores {','.join(map(str, self.cores))}"
        if self.slowdown_at:
            label += " slowdown " + ",".join(f"{f:g}@{s}" for s, f in self.slowdown_at)
        elif self.slowdown != 1.0:
            label += f" slowdown {self.slowdown:g}"
        if self.jitter:
            label += f" jitter {self.jitter[1]:g}x p{self.jitter[0]:g}"
        if self.loader_workers is not None:
            label += f" loader {self.loader_workers}"
        return label


WORKER_KEYS = {"device", "threads", "cores", "slowdown", "slowdown_at", "jitter", "framework",
               "node", "loader_workers"}


def parse_workers(raw: Any, framework: str, where: str) -> tuple[WorkerSpec, ...]:
    if raw is None:
        raw = [{}]
    if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_WORKERS:
        raise UsageError(where, f"must be a list of 1 to {MAX_WORKERS} worker tables")
    workers = []
    for i, item in enumerate(raw):
        w = f"{where}[{i}]"
        item = table(item, w)
        check_keys(item, WORKER_KEYS, w)
        device = text(item.get("device", "cpu"), f"{w}.device")
        if not DEVICE_PATTERN.fullmatch(device):
            raise UsageError(f"{w}.device", f"{device!r} is not a device (cpu, cuda:N)")
        workers.append(
            WorkerSpec(
                device=device,
                threads=integer(item.get("threads", 1), f"{w}.threads", minimum=1,
                                maximum=MAX_THREADS),
                cores=parse_cores(item.get("cores"), f"{w}.cores"),
                slowdown=number(item.get("slowdown", 1.0), f"{w}.slowdown", minimum=1.0,
                                maximum=MAX_SLOWDOWN),
                slowdown_at=parse_schedule(item.get("slowdown_at"), f"{w}.slowdown_at"),
                jitter=parse_jitter(item.get("jitter"), f"{w}.jitter"),
                framework=choice(item.get("framework", framework), FRAMEWORKS, f"{w}.framework"),
                node=integer(item.get("node", 0), f"{w}.node", minimum=0, maximum=MAX_NODES),
                loader_workers=None if item.get("loader_workers") is None else integer(
                    item["loader_workers"], f"{w}.loader_workers", minimum=0,
                    maximum=MAX_LOADER_WORKERS),
            )
        )
    if workers[0].node != 0:
        raise UsageError(f"{where}[0].node", f"{workers[0].node}, but rank 0 writes the run "
                         "directory on node 0: list a worker of node 0 first")
    return tuple(workers)


def worker_from_dict(data: dict[str, Any]) -> WorkerSpec:
    """The inverse of dataclasses.asdict(WorkerSpec) (JSON turns tuples into lists)."""
    cores, at, jitter = data.get("cores"), data.get("slowdown_at"), data.get("jitter")
    return WorkerSpec(**{**data, "cores": None if cores is None else tuple(cores),
                         "slowdown_at": tuple(tuple(p) for p in at) if at else None,
                         "jitter": tuple(jitter) if jitter else None})


def parse_cores(raw: Any, where: str) -> tuple[int, ...] | None:
    """Distinct CPU numbers. Whether this host has them is asked before a run starts
    (hetbench.harness.run.launcher.check_devices): the suite still parses on a smaller machine."""
    if raw is None:
        return None
    if not isinstance(raw, list) or not raw:
        raise UsageError(where, "must be a non-empty list of core numbers")
    cores = tuple(integer(c, where, minimum=0, maximum=MAX_CORE) for c in raw)
    seen: set[int] = set()
    for core in cores:
        if core in seen:
            raise UsageError(where, f"core {core} is listed twice (each core at most once)")
        seen.add(core)
    return cores


def cpu_list(cores: set[int] | Sequence[int]) -> str:
    """CPU numbers in the Linux cpu-list form (0-3,8,10-11): one short line on any host."""
    spans: list[list[int]] = []  # [first, last]
    for core in sorted(set(cores)):
        if spans and core == spans[-1][1] + 1:
            spans[-1][1] = core
        else:
            spans.append([core, core])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def parse_jitter(raw: Any, where: str) -> tuple[float, float] | None:
    """{ probability = 0.2, factor = 3.0 }: each step is slowed by `factor` with
    `probability`."""
    if raw is None:
        return None
    raw = table(raw, where)
    check_keys(raw, {"probability", "factor"}, where)
    for key in ("probability", "factor"):
        if key not in raw:
            raise UsageError(f"{where}.{key}", "required")
    return (number(raw["probability"], f"{where}.probability", minimum=0.0, maximum=1.0),
            number(raw["factor"], f"{where}.factor", minimum=1.0, maximum=MAX_SLOWDOWN))


def parse_schedule(raw: Any, where: str) -> tuple[tuple[int, float], ...] | None:
    """[[step, factor], ...] with steps increasing and factors >= 1."""
    if raw is None:
        return None
    if not isinstance(raw, list) or not raw or not all(
            isinstance(p, list) and len(p) == 2 for p in raw):
        raise UsageError(where, "must be a list of [step, factor] pairs")
    points = tuple((integer(p[0], where, minimum=0, maximum=MAX_STEPS),
                    number(p[1], where, minimum=1.0, maximum=MAX_SLOWDOWN)) for p in raw)
    if any(b[0] <= a[0] for a, b in zip(points, points[1:], strict=False)):
        raise UsageError(where, "steps must increase from one pair to the next")
    return points
