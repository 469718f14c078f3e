"""Device classes for the scale-out simulator: what one kind of worker does per step, fitted
from recorded runs (or read from a named profile), and the communication model.

A class is the cost model of hetbench.analysis.measures.costmodel (compute = (a + b n) x slowdown x
residual) with the recorded workers' residual series kept whole, in step order, so that
the simulator's block bootstrap keeps their tails, autocorrelation and each worker's own
level; beside them the time after the exchange (unpack and apply) and the loop's gap
before the next step, drawn with the same blocks.

Names a class answers to: `rank<R>` (the R-th worker of the first run given), its
recorded label ("pytorch cpu x1 slowdown 3") and a short name made of device and
slowdown ("cpu", "cpu-3x", "cpu-sched" for a schedule, "cpu-jitter"; "tensorflow-cpu" for
another framework, "-t4" for four threads).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from hetbench.analysis.measures import costmodel
from hetbench.analysis.measures.costmodel import Line
from hetbench.analysis.models import simulated
from hetbench.analysis.models.simulated import SIMULATED
from hetbench.analysis.view.metrics import after_warmup, complete_steps, lockstep, with_derived
from hetbench.harness.records.collector import COMPUTE_PHASES
from hetbench.harness.records.results import Run
from hetbench.harness.spec.aggregators import AGGREGATORS, recorded_name
from hetbench.harness.spec.errors import UsageError
from hetbench.harness.spec.workers import WorkerSpec

# Message latency of a gloo all-reduce step on loopback, used to split a communication time
# measured at one world size into latency and bandwidth (ring model) when the runs given
# hold only one (world size, bytes) point. Measured on this machine class (2 cores, two
# processes, 4-byte all-reduce after a barrier: medians 259, 276 and 327 us over three
# runs of `python benchmarks/simulate_check.py --comm`; alpha is half the middle one).
DEFAULT_ALPHA_NS = 138_000.0


@dataclass(frozen=True)
class Source:
    """One recorded worker's series after warm-up, in step order."""

    residual: np.ndarray  # compute / (line(n) x slowdown)
    after_ns: np.ndarray  # reduced -> end: unpack and apply
    gap_ns: np.ndarray  # end -> the next step's begin: the loop's own time
    run_id: str
    rank: int
    # the run's exchange after the last arrival, per step (the median over its workers),
    # over the typical exchange of all the runs fitted with its world size and bytes: what
    # varies for every worker together, from step to step and with the run's host (a
    # repeat whose exchange ran slow on a busy host keeps its level, as its compute does)
    comm_ratio: np.ndarray | None = None
    # this worker's own exchange over the step's median, per step: its place in the ring
    # and its own luck (one finishes earlier than another, and starts its next step earlier)
    comm_deviation: np.ndarray | None = None
    # the held-out evaluation after this step (the part of the gap it took; 0 on the steps
    # after which none ran): kept apart from the loop's gap, as only a lockstep run's
    # workers all wait for it (under an asynchronous scheme worker 0 evaluates alone and
    # the others go on), and the training clock (train_s) leaves it out
    eval_ns: np.ndarray | None = None
    # the apply phase alone (the update added to the model, the gradients zeroed): what is
    # left after the exchange where a parameter server makes the update (the worker loads
    # the server's parameters, a copy of the same size); None: the whole time after
    apply_ns: np.ndarray | None = None

    def ratios(self) -> np.ndarray:
        return self.comm_ratio if self.comm_ratio is not None else np.ones(len(self.residual))

    def deviations(self) -> np.ndarray:
        return self.comm_deviation if self.comm_deviation is not None else \
            np.ones(len(self.residual))

    def applies(self) -> np.ndarray:
        return self.apply_ns if self.apply_ns is not None else self.after_ns

    def evaluations(self) -> np.ndarray:
        return self.eval_ns if self.eval_ns is not None else np.zeros(len(self.residual))


@dataclass(frozen=True)
class DeviceClass:
    name: str
    label: str
    line: Line
    schedule: WorkerSpec  # its emulated slowdown (slowdown, slowdown_at, jitter)
    sources: tuple[Source, ...]
    phase_shares: tuple[float, ...]  # of compute: load, to_device, forward, backward, pack
    origin: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        s = self.schedule
        return {"name": self.name, "label": self.label, "a_ns": self.line.a_ns,
                "b_ns": self.line.b_ns, "slowdown": s.slowdown,
                "slowdown_at": [list(p) for p in s.slowdown_at] if s.slowdown_at else None,
                "jitter": list(s.jitter) if s.jitter else None,
                "residual_cv": float(np.std(self.residuals()) / np.mean(self.residuals())),
                "sources": [f"{src.run_id} rank {src.rank} ({len(src.residual)} steps)"
                            for src in self.sources], **self.origin}

    def residuals(self) -> np.ndarray:
        return np.concatenate([s.residual for s in self.sources])


@dataclass(frozen=True)
class CommModel:
    """All-reduce as a ring: 2(N-1) messages of latency alpha and 2(N-1)/N x bytes sent per
    worker at beta ns per byte. A parameter server round trip: the gradient up, the
    parameters back (2 alpha + 2 bytes beta), the update between (hetbench.analysis.models.simulate
    server_model)."""

    alpha_ns: float
    beta_ns_per_byte: float
    bytes: int
    origin: str

    def allreduce_ns(self, workers: int) -> float:
        if workers <= 1:
            return 0.0
        return 2 * (workers - 1) * (self.alpha_ns
                                    + self.bytes * self.beta_ns_per_byte / workers)

    def round_trip_ns(self) -> float:
        return 2 * self.alpha_ns + 2 * self.bytes * self.beta_ns_per_byte

    def describe(self) -> dict[str, Any]:
        return {"model": "ring all-reduce; server round trip", "alpha_ns": self.alpha_ns,
                "beta_ns_per_byte": self.beta_ns_per_byte, "bytes": self.bytes,
                "origin": self.origin}


def short_name(worker: dict[str, Any]) -> str:
    parts = [] if worker.get("framework", "pytorch") == "pytorch" else [worker["framework"]]
    parts.append(str(worker.get("device", "cpu")).split(":")[0])
    slowdown = float(worker.get("slowdown", 1.0))
    if worker.get("slowdown_at"):
        parts.append("sched")
    elif slowdown != 1.0:
        parts.append(f"{slowdown:g}x")
    if worker.get("jitter"):
        parts.append("jitter")
    if int(worker.get("threads", 1)) != 1:
        parts.append(f"t{worker['threads']}")
    return "-".join(parts)


def _spec(worker: dict[str, Any]) -> WorkerSpec:
    return costmodel.worker_specs({"run": {"workers": [worker]}})[0]


def _bytes(manifest: dict[str, Any]) -> int:
    """Bytes of the communication buffer: every parameter and the loss sum, float32."""
    workers = manifest.get("workers") or []
    parameters = workers[0].get("parameters") if workers else None
    if not isinstance(parameters, int):
        raise UsageError(f"run {manifest.get('run_id')}", "its manifest does not record the "
                         "model's parameters (recorded by hetbench since the sync schemes)")
    return 4 * (parameters + 1)


def loop_gaps(begins: np.ndarray, ends: np.ndarray, steps: np.ndarray, eval_every: int
              ) -> tuple[np.ndarray, np.ndarray]:
    """One lockstep worker's time from each step's end to the next one's begin, split into
    the loop's own gap and the held-out evaluation that ran there: after step s where
    s + 1 is a multiple of `eval_every` (hetbench.harness.training.evaluation.Evaluator.due), that
    gap less the median of the others. The last step's gap is the median of the loop's."""
    gaps = np.maximum(np.append(begins[1:] - ends[:-1], 0), 0).astype(float)
    evaluated = np.zeros(len(gaps), bool)
    if eval_every > 0:
        evaluated[:-1] = (steps[:-1] + 1) % eval_every == 0
    others = gaps[:-1][~evaluated[:-1]]
    typical = float(np.median(others)) if len(others) else 0.0
    evaluation = np.where(evaluated, np.maximum(gaps - typical, 0.0), 0.0)
    gaps = np.where(evaluated, typical, gaps)
    gaps[-1] = typical
    return gaps, evaluation


def fit_classes(runs: Sequence[Run]) -> tuple[dict[str, DeviceClass], dict[str, str]]:
    """Device classes from recorded runs (one per distinct worker label, pooled over the
    runs and repeats that have it), and the names each answers to (module docstring)."""
    if not runs:
        raise UsageError("RESULTS", "no runs to fit")
    workloads = {(run.spec.get("framework"), run.spec.get("workload"),
                  run.spec.get("dataset"), run.spec.get("size")) for run in runs}
    if len(workloads) > 1:
        shown = ", ".join(sorted("/".join(str(x) for x in w[1:3]) for w in workloads))
        raise UsageError("RESULTS", f"runs of more than one workload ({shown}): fit one "
                         "workload at a time")
    points: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
    sources: dict[str, list[Source]] = {}
    shares: dict[str, list[np.ndarray]] = {}
    workers_of: dict[str, dict[str, Any]] = {}
    names: dict[str, str] = {}
    for run in runs:
        problem = fit_problem(run)
        if problem:
            raise UsageError(f"run {run.manifest.get('run_id')}", problem)
    exchange = comm_points(runs)
    typical = exchange.groupby(["world", "bytes"])["comm_ns"].transform("median").clip(lower=1.0)
    for index, run in enumerate(runs):
        meta, steps, warmup = run.manifest, run.steps, run.warmup_steps
        fit = costmodel.fit(steps, meta, warmup)
        d = with_derived(complete_steps(after_warmup(steps, warmup))).sort_values(
            ["rank", "step"])
        for worker in meta["workers"]:
            rank = int(worker["rank"])
            label = str(worker.get("label") or f"rank {rank}")
            run_worker = meta["run"]["workers"][rank]
            workers_of.setdefault(label, run_worker)
            rows = fit.rows[fit.rows["rank"] == rank].sort_values("step")
            points.setdefault(label, []).append(
                (rows["batch_size"].to_numpy(float),
                 (rows["compute_ns"] / rows["slowdown"]).to_numpy(float)))
            mine = d[d["rank"] == rank]
            begins = mine["begin_ns"].to_numpy()
            ends = mine["end_ns"].to_numpy()
            gaps, evaluation = loop_gaps(begins, ends, mine["step"].to_numpy(),
                                         int(meta["run"].get("eval_every") or 0))
            per_step = d.groupby("step")["comm_ns"].median().clip(lower=1.0)
            step_comm = per_step.reindex(mine["step"]).to_numpy(float)
            sources.setdefault(label, []).append(Source(
                residual=rows["residual"].to_numpy(float),
                after_ns=(mine["end_ns"] - mine["reduced_ns"]).to_numpy(float),
                gap_ns=gaps, run_id=str(meta["run_id"]),
                rank=rank, comm_ratio=step_comm / float(typical.iloc[index]),
                comm_deviation=mine["comm_ns"].to_numpy(float) / step_comm,
                eval_ns=evaluation, apply_ns=mine["apply_ns"].to_numpy(float)))
            phases = mine[[f"{p.value}_ns" for p in COMPUTE_PHASES]].to_numpy(float)
            shares.setdefault(label, []).append(phases.sum(axis=0) / max(phases.sum(), 1.0))
            if index == 0:
                names[f"rank{rank}"] = label
    classes: dict[str, DeviceClass] = {}
    lines = _hardware_lines(points, workers_of)
    for label, pts in points.items():
        line = lines[label]
        # residuals against the class's line, so that each recorded worker keeps its level
        sources[label] = [dataclasses.replace(src, residual=base / line.at(slices))
                          for src, (slices, base) in zip(sources[label], pts, strict=True)]
        short = short_name(workers_of[label])
        if short in names and names[short] != label:
            short = label.replace(" ", "-")
        names.setdefault(short, label)
        names[label] = label
        classes[label] = DeviceClass(
            name=short, label=label, line=line,
            schedule=_spec(workers_of[label]), sources=tuple(sources[label]),
            phase_shares=tuple(np.mean(shares[label], axis=0)),
            origin={"from": sorted({s.run_id for s in sources[label]}),
                    "workload": workload_name(runs[0].manifest)})
    return classes, names


def _hardware_lines(points: dict[str, list[tuple[np.ndarray, np.ndarray]]],
                    workers_of: dict[str, dict[str, Any]]) -> dict[str, Line]:
    """Each class's line, fitted on every class of the same hardware (framework, device,
    threads, cores): an emulated slow worker's compute, its slowdown divided out, is the
    same hardware's on its slice, and an adaptive policy that starves it of samples (a
    slice of 1 or 2) leaves nothing to tell its intercept from its slope. Each recorded
    worker's level over the line stays in its residuals."""
    def hardware(label: str) -> tuple[Any, ...]:
        w = workers_of[label]
        cores = w.get("cores")
        return (w.get("framework"), w.get("device", "cpu"), w.get("threads", 1),
                tuple(cores) if cores else None)

    pooled: dict[tuple[Any, ...], list[tuple[np.ndarray, np.ndarray]]] = {}
    for label, pts in points.items():
        pooled.setdefault(hardware(label), []).extend(pts)
    fitted = {key: costmodel.fit_line(np.concatenate([p[0] for p in pts]),
                                      np.concatenate([p[1] for p in pts]))
              for key, pts in pooled.items()}
    return {label: fitted[hardware(label)] for label in points}


def fit_problem(run: Run) -> str:
    """Why a run cannot be fitted ('' if it can)."""
    meta, steps = run.manifest, run.steps
    if meta.get("status") != "completed":
        return f"status {meta.get('status')}: only completed runs are fitted"
    if not meta["run"].get("instrument", True):
        return "recorded with instrument = false: no compute times to fit"
    if not lockstep(steps):
        return "recorded under an asynchronous scheme: fit runs of an all-reduce scheme"
    left = complete_steps(after_warmup(steps, run.warmup_steps))
    if left["step"].nunique() < 8:
        return f"{left['step'].nunique()} complete steps after warm-up (8 or more are needed)"
    if len(meta.get("workers") or []) != left["rank"].nunique():
        return "its manifest and its records disagree on the workers"
    return ""


def comm_points(runs: Sequence[Run]) -> pd.DataFrame:
    """One row per run, in order: its world size, gradient bytes and exchange after the
    last arrival (the median over its steps after warm-up)."""
    rows = []
    for run in runs:
        d = with_derived(complete_steps(after_warmup(run.steps, run.warmup_steps)))
        rows.append((int(d["rank"].nunique()), _bytes(run.manifest),
                     float(d["comm_ns"].median())))
    return pd.DataFrame(rows, columns=["world", "bytes", "comm_ns"])


def fit_comm(runs: Sequence[Run]) -> CommModel:
    """The ring model from the runs' communication (comm_points): least squares over the
    distinct (world size, bytes) points, each the median of its runs, when there are two
    or more, else the one point split with DEFAULT_ALPHA_NS."""
    frame = comm_points(runs).groupby(["world", "bytes"], as_index=False)["comm_ns"].median()
    size = int(frame["bytes"].iloc[0])
    if len(frame) >= 2:
        from scipy.optimize import nnls

        w, b = frame["world"].to_numpy(float), frame["bytes"].to_numpy(float)
        design = np.column_stack([2 * (w - 1), 2 * (w - 1) / w * b])
        (alpha, beta), _ = nnls(design, frame["comm_ns"].to_numpy(float))
        return CommModel(float(alpha), float(beta), size,
                         f"fitted to {len(frame)} (world size, bytes) points")
    world, measured = int(frame["world"].iloc[0]), float(frame["comm_ns"].iloc[0])
    messages = 2 * (world - 1)
    alpha = min(DEFAULT_ALPHA_NS, measured / max(messages, 1))
    beta = max(measured - messages * alpha, 0.0) / (messages / world * size) if world > 1 \
        else 0.0
    return CommModel(alpha, beta, size, f"one point ({world} workers, {size} bytes: "
                     f"{measured / 1e6:.3f} ms), latency {alpha / 1e3:.0f} us assumed")


def parse_mix(text: str) -> list[tuple[str, int]]:
    """'cpu-3x:16,cpu:48' -> [('cpu-3x', 16), ('cpu', 48)]."""
    mix = []
    for item in text.split(","):
        name, sep, count = item.strip().rpartition(":")
        if not sep or not name:
            raise UsageError("--mix", f"{item.strip()!r} is not NAME:COUNT (e.g. "
                             "'cpu-3x:16,cpu:48')")
        try:
            number = int(count)
        except ValueError:
            raise UsageError("--mix", f"{item.strip()!r}: the count must be a whole number "
                             "of workers") from None
        if not 1 <= number <= MAX_WORKERS:
            raise UsageError("--mix", f"{item.strip()!r}: the count must be 1 to "
                             f"{MAX_WORKERS}")
        mix.append((name, number))
    total = sum(c for _, c in mix)
    if total > MAX_WORKERS:
        raise UsageError("--mix", f"{total} workers in all (at most {MAX_WORKERS})")
    return mix


MAX_WORKERS = 65_536


def resolve_mix(mix: Sequence[tuple[str, int]], classes: dict[str, DeviceClass],
                names: dict[str, str], profiles: dict[str, dict[str, Any]] | None = None
                ) -> tuple[list[DeviceClass], CommModel | None]:
    """The classes of the mix, one entry per simulated worker in mix order, and the
    communication model of the named profiles it used (None when it used none). A name is
    looked up among the fitted classes first, then the named profiles."""
    profiles = profiles or {}
    workers: list[DeviceClass] = []
    loaded: dict[str, tuple[DeviceClass, CommModel]] = {}
    for name, count in mix:
        if name in names:
            workers.extend([classes[names[name]]] * count)
        elif name in profiles:
            loaded.setdefault(name, from_profile(profiles[name]))
            workers.extend([loaded[name][0]] * count)
        else:
            known = sorted(n for n in names if not n.startswith("rank")) + sorted(
                n for n in names if n.startswith("rank"))
            listed = ", ".join(known) or "none: no RESULTS given"
            raise UsageError("--mix", f"no device class or profile {name!r} (classes of the "
                             f"runs: {listed}; profiles: {', '.join(profiles) or 'none'})")
    used = {str(p["workload"]) for n, p in profiles.items() if n in loaded}
    if classes and any(names.get(n) for n, _ in mix):
        used.add(_fitted_workload(classes))
    if len(used) > 1:
        raise UsageError("--mix", f"its classes come from more than one workload "
                         f"({', '.join(sorted(used))}): simulate one workload at a time")
    comm = next(iter(loaded.values()))[1] if loaded else None
    return workers, comm


def _fitted_workload(classes: dict[str, DeviceClass]) -> str:
    return str(next(iter(classes.values())).origin.get("workload", ""))


def recorded_mix(runs: Sequence[Run], names: dict[str, str]) -> list[tuple[str, int]]:
    """The first run's workers, in rank order: the configuration that was recorded."""
    return [(f"rank{w['rank']}", 1) for w in sorted(runs[0].workers, key=lambda w: w["rank"])]


def recorded_scheme(recorded: Run) -> tuple[str, tuple[int, ...] | None]:
    """The scheme (simulate's name) and bsp's static slices that reproduce a run: its
    aggregator and partition policy (simulated.recorded), the slices of its first step
    after warm-up."""
    steps, run = recorded.steps, recorded.manifest["run"]
    name = simulated.recorded(run)
    scheme = SIMULATED[name]
    if scheme.key is not None:  # the option as the recorded aggregator names it
        kind = AGGREGATORS[recorded_name(run)]
        key = kind.simulation.option if kind.simulation is not None else None
        value = (run.get("aggregator") or {}).get(key or scheme.key, 0)
        return f"{name}:{int(value)}", None
    if not scheme.takes_sizes:
        return name, None
    first = after_warmup(steps, recorded.warmup_steps)
    first = first[first["step"] == first["step"].min()].sort_values("rank")
    return name, tuple(int(n) for n in first["batch_size"])


def typical_slowdown(cls: DeviceClass) -> float:
    """The class's emulated slowdown on a typical step: its median over the schedule."""
    s = cls.schedule
    if s.slowdown_at:
        return float(np.median([f for _, f in s.slowdown_at]))
    return s.slowdown


# -- named profiles -------------------------------------------------------------------------

PROFILES_DIR = Path(__file__).parent / "profiles"


def workload_name(manifest: dict[str, Any]) -> str:
    """'mlp-digits' ('tensorflow-...' for another framework, '-medium' for another size)."""
    run = manifest["run"]
    parts = [] if run.get("framework", "pytorch") == "pytorch" else [run["framework"]]
    parts += [str(run.get("workload")), str(run.get("dataset"))]
    if run.get("size", "small") != "small":
        parts.append(str(run["size"]))
    return "-".join(parts)


def profile_json(cls: DeviceClass, comm: CommModel, workload: str,
                 origin: dict[str, Any]) -> dict[str, Any]:
    """A class as a named profile: its fit, its recorded series and where they came from."""
    s = cls.schedule
    return {
        "name": f"{cls.name}@{workload}", "class": cls.name, "label": cls.label,
        "workload": workload, "a_ns": cls.line.a_ns, "b_ns": cls.line.b_ns,
        "slowdown": s.slowdown,
        "slowdown_at": [list(p) for p in s.slowdown_at] if s.slowdown_at else None,
        "jitter": list(s.jitter) if s.jitter else None,
        "phase_shares": list(cls.phase_shares),
        "comm": {"alpha_ns": comm.alpha_ns, "beta_ns_per_byte": comm.beta_ns_per_byte,
                 "bytes": comm.bytes, "origin": comm.origin},
        "origin": origin,
        "sources": [{"run_id": src.run_id, "rank": src.rank,
                     "residual": [round(float(x), 5) for x in src.residual],
                     "after_ns": [round(float(x)) for x in src.after_ns],
                     "gap_ns": [round(float(x)) for x in src.gap_ns],
                     "eval_ns": [round(float(x)) for x in src.evaluations()],
                     "apply_ns": [round(float(x)) for x in src.applies()],
                     "comm_ratio": [round(float(x), 5) for x in src.ratios()],
                     "comm_deviation": [round(float(x), 5) for x in src.deviations()]}
                    for src in cls.sources],
    }


def from_profile(data: dict[str, Any]) -> tuple[DeviceClass, CommModel]:
    worker = {"slowdown": data.get("slowdown", 1.0), "slowdown_at": data.get("slowdown_at"),
              "jitter": data.get("jitter")}
    sources = tuple(Source(np.asarray(s["residual"], float), np.asarray(s["after_ns"], float),
                           np.asarray(s["gap_ns"], float), str(s["run_id"]), int(s["rank"]),
                           np.asarray(s["comm_ratio"], float),
                           np.asarray(s["comm_deviation"], float),
                           np.asarray(s["eval_ns"], float) if "eval_ns" in s else None,
                           np.asarray(s["apply_ns"], float) if "apply_ns" in s else None)
                    for s in data["sources"])
    cls = DeviceClass(name=str(data["name"]), label=str(data["name"]),
                      line=Line(float(data["a_ns"]), float(data["b_ns"])),
                      schedule=_spec(worker), sources=sources,
                      phase_shares=tuple(float(x) for x in data["phase_shares"]),
                      origin={"profile": data["name"], **data.get("origin", {})})
    c = data["comm"]
    return cls, CommModel(float(c["alpha_ns"]), float(c["beta_ns_per_byte"]), int(c["bytes"]),
                          f"profile {data['name']}: {c.get('origin', '')}")


def named_profiles(folder: Path = PROFILES_DIR) -> dict[str, dict[str, Any]]:
    """The named profiles shipped with hetbench (name -> its JSON)."""
    found = {}
    for path in sorted(folder.glob("*.json")):
        data = json.loads(path.read_text())
        found[str(data["name"])] = data
    return found
