"""What takes a straggler cause away: for each cause the attribution names
(analysis/measures/stragglers.py), the variants of a recorded run whose keys remove it, or
why no key can. `hetbench explain` runs them beside the recorded configuration and sets
what removing each cause measured against the share the attribution gave it."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from hetbench.harness.spec.fields import MAX_LOADER_WORKERS
from hetbench.harness.spec.suite import RunSpec

LEAST_SHARE = 0.05  # a cause below this share of the excess is not worth a variant


@dataclass(frozen=True)
class Intervention:
    """A variant of the recorded run without a cause: `name` is its run name's suffix."""

    cause: str
    name: str
    what: str  # a sentence: what the variant changes
    run: RunSpec


@dataclass(frozen=True)
class Unremovable:
    """A named cause no run key takes away, and why."""

    cause: str
    why: str


Plan = list[Intervention | Unremovable]

NO_KEY = {
    "interference": "processes outside the run held the cores: no run key stops them (run "
                    "on a quiet host, or stop them)",
    "on_cpu": "more CPU time in the step than usual that no counter explains (caches, "
              "memory, the data): no run key takes it away",
    "frequency": "the cores' clock ran slower: the host's power settings, not a run key",
    "emulation": "the emulated device's own timer overshot: hetbench's emulation, not a "
                 "run key",
    "network": "a slower link between the hosts: explain reruns on this host only",
    "off_cpu": "recorded before the wait for a CPU was measured: rerun it to split it",
    "unexplained": "the main thread's CPU time was not recorded: nothing to take away",
}


def plan(run: RunSpec, shares: dict[str, float], cores: Sequence[int], top: int) -> Plan:
    """For the `top` largest causes in `shares` (each cause's share of the straggler
    excess, `noise` never: it is no cause) of at least LEAST_SHARE, largest first: the
    variants that remove each, or why none can; `cores`: the CPUs the variants run on."""
    causes = sorted((c for c, s in shares.items() if c != "noise" and s >= LEAST_SHARE),
                    key=lambda c: -shares[c])[:top]
    out: Plan = []
    for cause in causes:
        found = [Intervention(cause, name, what, variant)
                 for name, what, variant in _variants(cause, run, cores)]
        out.extend(found or [Unremovable(cause, _why_not(cause, run, cores))])
    return out


def _variants(cause: str, run: RunSpec, cores: Sequence[int]
              ) -> list[tuple[str, str, RunSpec]]:
    makers: dict[str, list[Callable[[RunSpec, Sequence[int]], tuple[str, str, RunSpec] | None]]]
    makers = {"gc": [_gc_off], "page_faults": [_keep_freed_memory],
              "preempted": [_pinned_apart, _one_thread], "blocked": [_one_thread],
              "load": [_more_loader_processes], "jitter": [_no_jitter]}
    made = (make(run, cores) for make in makers.get(cause, []))
    return [m for m in made if m is not None]


def _why_not(cause: str, run: RunSpec, cores: Sequence[int]) -> str:
    if cause == "gc" and run.is_loop:
        return "a script's run keeps its own collector (`gc` is not a key of it)"
    if cause == "page_faults":
        return ("the run already keeps freed memory: the faults are the step's own first "
                "touches of new memory")
    if cause in ("preempted", "blocked"):
        return (f"the workers already run one thread each and cannot be pinned apart on "
                f"{len(cores)} CPUs: the run's own processes outnumber the cores")
    if cause == "load":
        return "the input pipeline already has the most processes a suite allows"
    return NO_KEY.get(cause, "no run key takes it away")


def _gc_off(run: RunSpec, cores: Sequence[int]) -> tuple[str, str, RunSpec] | None:
    if run.is_loop or run.gc == "off":
        return None
    return ("gc-off", "Python's cyclic collector off over the steps (gc = \"off\")",
            dataclasses.replace(run, gc="off"))


def _keep_freed_memory(run: RunSpec, cores: Sequence[int]) -> tuple[str, str, RunSpec] | None:
    if run.is_loop or run.keep_freed_memory:
        return None
    return ("keep-freed", "glibc keeps what a step frees (keep_freed_memory = true)",
            dataclasses.replace(run, keep_freed_memory=True))


def _pinned_apart(run: RunSpec, cores: Sequence[int]) -> tuple[str, str, RunSpec] | None:
    """Each worker on cores of its own (as many as its threads), where there are enough
    and the run pins none."""
    if any(w.cores for w in run.workers):
        return None
    wanted = [w.threads for w in run.workers]
    if sum(wanted) > len(cores):
        return None
    given, at = [], 0
    for count in wanted:
        given.append(tuple(cores[at:at + count]))
        at += count
    workers = tuple(dataclasses.replace(w, cores=c) for w, c in zip(run.workers, given,
                                                                     strict=True))
    return ("pinned", "each worker pinned to cores of its own (`cores`: "
            + ", ".join(str(list(c)) for c in given) + ")",
            dataclasses.replace(run, workers=workers))


def _one_thread(run: RunSpec, cores: Sequence[int]) -> tuple[str, str, RunSpec] | None:
    if all(w.threads == 1 for w in run.workers):
        return None
    workers = tuple(dataclasses.replace(w, threads=1) for w in run.workers)
    return ("one-thread", "every worker's intra-op threads cut to one (threads = 1)",
            dataclasses.replace(run, workers=workers))


def _more_loader_processes(run: RunSpec, cores: Sequence[int]
                           ) -> tuple[str, str, RunSpec] | None:
    """A worker starved by a loader of its own (`loader_workers`) given the run's; the
    run's loader given twice the processes (two where it loads in line)."""
    loader = run.loader
    if loader is None or run.is_loop:
        return None
    starved = [w.loader_workers is not None and w.loader_workers < max(loader.workers, 1)
               for w in run.workers]
    if any(starved):
        workers = tuple(dataclasses.replace(w, loader_workers=None) if s else w
                        for w, s in zip(run.workers, starved, strict=True))
        return ("fed", "every worker loads with the run's DataLoader processes "
                f"({loader.workers}; no worker's own `loader_workers` below it)",
                dataclasses.replace(run, workers=workers))
    more = min(max(2, 2 * loader.workers), MAX_LOADER_WORKERS)
    if more == loader.workers:
        return None
    return ("more-loaders", f"the DataLoader's processes {loader.workers} -> {more} "
            "(loader.workers)",
            dataclasses.replace(run, loader=dataclasses.replace(loader, workers=more)))


def _no_jitter(run: RunSpec, cores: Sequence[int]) -> tuple[str, str, RunSpec] | None:
    if not any(w.jitter for w in run.workers):
        return None
    workers = tuple(dataclasses.replace(w, jitter=None) for w in run.workers)
    return ("no-jitter", "no worker's emulated jitter (`jitter` removed)",
            dataclasses.replace(run, workers=workers))
