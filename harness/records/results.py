"""Reading run directories back: manifest (schema-checked) and step records (checked too:
a damaged file is refused by name, never reported as numbers)."""

from __future__ import annotations

import errno
import fnmatch
import os
import socket
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import numpy as np
import pandas as pd

from hetbench.harness.records import collector, fields, jsonfile, manifest
from hetbench.harness.spec import aggregators
from hetbench.harness.spec.errors import UsageError, listed
from hetbench.harness.system import procfs
from hetbench.harness.system import sampler as system

T = TypeVar("T")


@dataclass(frozen=True)
class Run:
    """One recorded run as analysis reads it: the manifest's fields as attributes, and its
    records as frames: steps, held-out evaluations, a pipeline's micro-batches, a DDP run's
    buckets. Made by `load_run` from a run directory, or by `Run.of` from a manifest and
    frames (a run made up by a test). `manifest` stays for what no attribute says yet."""

    run_dir: Path
    manifest: dict[str, Any]
    steps: pd.DataFrame
    evals: pd.DataFrame  # held-out evaluations (eval.parquet); empty without eval_every
    # a pipelined run's micro-batches (microbatches.parquet); empty for other runs
    micro: pd.DataFrame = dataclass_field(default_factory=pd.DataFrame)
    # a DDP run's gradient buckets (buckets.parquet); empty for other runs
    buckets: pd.DataFrame = dataclass_field(default_factory=pd.DataFrame)
    # what analysis worked out from the run, by what it is (`once`)
    derived: dict[str, Any] = dataclass_field(default_factory=dict, compare=False, repr=False)

    def once(self, what: str, work: Callable[[], T]) -> T:
        """`work()`, done the first time `what` is asked of this run and kept with it: a
        table that the report and its figures both read is worked out once."""
        if what not in self.derived:
            self.derived[what] = work()
        return self.derived[what]  # type: ignore[no-any-return]

    @classmethod
    def of(cls, manifest: dict[str, Any], steps: pd.DataFrame,
           evals: pd.DataFrame | None = None, micro: pd.DataFrame | None = None,
           run_dir: Path = Path()) -> Run:
        """A run from its manifest and frames, without a directory."""
        return cls(run_dir, manifest, steps,
                   pd.DataFrame() if evals is None else evals,
                   pd.DataFrame() if micro is None else micro)

    @property
    def spec(self) -> dict[str, Any]:
        """The suite's run table as recorded (RunSpec.to_dict); {} when not recorded."""
        return self.manifest.get("run") or {}

    @property
    def name(self) -> str:
        """The run's name in its suite ("" when not recorded)."""
        return str(self.spec.get("name", ""))

    @property
    def run_id(self) -> str:
        return str(self.manifest.get("run_id", ""))

    @property
    def repeat(self) -> int:
        return int(self.manifest.get("repeat", 0))

    @property
    def aggregator(self) -> str:
        """The aggregator's registry name (aggregators.recorded_name: older names read)."""
        return aggregators.recorded_name(self.spec)

    @property
    def workers(self) -> list[dict[str, Any]]:
        """Each worker as the run described it (device, label, slowdown, ...), by rank."""
        return list(self.manifest.get("workers") or [])

    @property
    def partition_history(self) -> list[dict[str, Any]]:
        """Every partition the run took: from which step, the sizes, and why."""
        return list(self.manifest.get("partition_history") or [])

    @property
    def status(self) -> str:
        return str(self.manifest.get("status", "unknown"))

    @property
    def warmup_steps(self) -> int:
        return int(self.spec.get("warmup_steps", 0))

    @property
    def suite(self) -> str:
        return str(self.manifest["suite"]["name"])

    @property
    def launch(self) -> str:
        """The `hetbench run` that made it (runs recorded before launches had ids: one
        launch, "unrecorded")."""
        return str(self.manifest.get("launch") or "unrecorded")


def load_run(run_dir: Path) -> Run:
    """A run directory's manifest and steps; a run that never finalised is read from its
    flushed parts, so a crashed run still shows every step it recorded."""
    return _load(run_dir, manifest.read(run_dir))


def _load(run_dir: Path, meta: dict[str, Any]) -> Run:
    steps = checked_steps(run_dir, meta)
    if (samples := read_system(run_dir)) is not None:
        steps = system.join_to_steps(steps, samples)
    return Run(run_dir, meta, steps, read_evals(run_dir),
               read_side(run_dir, collector.MICRO), read_side(run_dir, collector.BUCKETS))


def checked_steps(run_dir: Path, meta: dict[str, Any]) -> pd.DataFrame:
    """The run's step records (steps.parquet, or its flushed parts), checked as every
    reader and `recover` check them: damage is a UsageError naming the file."""
    steps, file_of_rank = read_steps(run_dir)
    for column, default in fields.OLDER.items():
        if column not in steps.columns and default is not None:  # recorded before it existed
            steps[column] = default
    if "profiled" not in steps.columns:  # read from parts, or recorded before profiling
        collector.with_profiled(steps, meta)
    workers = meta["run"].get("workers")
    instrumented = meta["run"].get("instrument", True)
    problem = (step_problem(steps, instrumented=instrumented,
                            world_size=len(workers) if isinstance(workers, list) else None)
               or _implausible(steps, meta, instrumented))
    if problem:
        raise UsageError(str(file_of_rank(problem.rank)), problem.message)
    if (run_dir / collector.STEPS_FILE).is_file():
        _note_parts_beyond(run_dir, len(steps),
                           len(workers) if isinstance(workers, list) else None)
    if steps.empty and meta.get("status") == "completed":
        raise UsageError(str(file_of_rank(None)), "holds no step, yet the run says it "
                                                  "completed: damaged")
    if meta.get("status") == "completed" and isinstance(workers, list) and _lockstep(meta):
        # every worker of a lockstep aggregator records every step (one left out, a row of
        # batch size 0): a rank with none lost its rows, and its metrics would be NaN
        dropped = {d.get("rank") for d in meta.get("dropped_workers") or []
                   if isinstance(d, dict)}
        silent = sorted(set(range(len(workers))) - dropped
                        - set(steps["rank"].unique().tolist()))
        if silent:
            raise UsageError(str(file_of_rank(None)), f"holds no step of rank {silent[0]}, "
                             f"one of the run's {len(workers)} workers, yet the run says it "
                             "completed: damaged")
    return steps


# how much longer the records may span than the manifest's start to end: its instants are
# the launcher's, taken around the workers' start and end (seconds apart at most)
SPAN_SLACK_S = 60.0


def _implausible(steps: pd.DataFrame, meta: dict[str, Any], instrumented: bool
                 ) -> StepProblem | None:
    """Records that cannot be this run's, or cannot be true: another run's id or repeat, a
    row count that is not the manifest's, a phase longer than its step, or steps spanning
    far longer than the run lasted (an instant of 2^62 ns made samples/s 8e-7)."""
    if not len(steps):
        return None
    for column, own in (("run_id", meta["run_id"]), ("repeat", meta["repeat"])):
        if column in steps.columns and (other := steps[column] != own).any():
            row = int(other.to_numpy().argmax())
            return StepProblem(None, f"row {row}: {column} {steps[column].iat[row]!r} is not "
                                     f"the manifest's {own!r}: records of another run")
    rows = meta.get("rows")
    if type(rows) is int and rows != len(steps) and meta.get("status") != "running":
        return StepProblem(None, f"holds {len(steps)} step records, the manifest says {rows}: "
                                 "damaged")
    span = steps["end_ns"].to_numpy() - steps["begin_ns"].to_numpy()
    for field in PHASE_FIELDS if instrumented else ():
        if (longer := steps[field].to_numpy() > span).any():
            row = int(longer.argmax())
            rank, step = int(steps["rank"].iat[row]), int(steps["step"].iat[row])
            return StepProblem(rank, f"rank {rank}, step {step}: {field} "
                                     f"{steps[field].iat[row]} is longer than its step "
                                     f"({span[row]} ns from begin to end): damaged")
    lasted = _lasted_s(meta)
    timed = steps[steps["end_ns"] != 0]  # a worker left out of a step records zeros
    spanned = (int(timed["end_ns"].max()) - int(timed["begin_ns"].min())) / 1e9 \
        if len(timed) else 0.0
    if lasted is not None and spanned > lasted + SPAN_SLACK_S:
        return StepProblem(None, f"its steps span {spanned:.3g} s, and the run lasted "
                                 f"{lasted:.3g} s (manifest start to end): a damaged instant")
    return None


def _lasted_s(meta: dict[str, Any]) -> float | None:
    try:
        return (datetime.fromisoformat(meta["end"])
                - datetime.fromisoformat(meta["start"])).total_seconds()
    except (KeyError, TypeError, ValueError):
        return None


def _note_parts_beyond(run_dir: Path, rows: int, world_size: int | None) -> None:
    """The flushed parts hold every record steps.parquet was written from: more there means
    the table lost some (read from the parts' sizes, not their rows). A part of a rank the
    run does not have is no worker's: named on its own."""
    parts = collector.part_files(run_dir)
    for path in parts:
        rank = collector.part_rank(path)
        if world_size is not None and rank is not None and rank >= world_size:
            note(f"{path}: rank {rank} is not one of the run's {world_size} workers: not "
                 "read")
    parts = [p for p in parts if world_size is None or (collector.part_rank(p) or 0)
             < world_size]
    flushed = sum(path.stat().st_size for path in parts) // collector.RECORD_DTYPE.itemsize
    if flushed > rows:
        note(f"{run_dir / collector.PARTS_DIR} holds {flushed} step records and "
             f"{run_dir / collector.STEPS_FILE} {rows}: the table is read, the parts' "
             "others are not")


def _lockstep(meta: dict[str, Any]) -> bool:
    """Whether the run's aggregator has every worker exchange every step (False for one
    this hetbench does not know)."""
    known = aggregators.AGGREGATORS.get(aggregators.recorded_name(meta["run"]))
    return known is not None and known.lockstep


def read_system(run_dir: Path) -> pd.DataFrame | None:
    """The launcher's samples of the host (harness/system/sampler.py), or None where the run has
    none (torchrun mode, a simulated run, a run recorded before them)."""
    path = run_dir / system.SYSTEM_FILE
    if not path.is_file():
        return None
    try:
        samples = pd.read_parquet(path)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises many kinds
        raise UsageError(str(path), f"unreadable: {_one_line(exc)}") from None
    if missing := [c for c in system.COLUMNS if c not in samples.columns]:
        raise UsageError(str(path), f"missing columns {', '.join(missing)}")
    return samples


def read_side(run_dir: Path, table: collector.SideTable) -> pd.DataFrame:
    """A side table's records (a pipelined run's micro-batches, a DDP run's buckets): its
    parquet file, or the flushed parts of a run that never finalised; empty for a run
    that kept none."""
    path = run_dir / table.file
    try:
        if path.is_file():
            return pd.read_parquet(path)
        parts = [p for p in table.read_parts(run_dir) if len(p)]
    except Exception as exc:  # noqa: BLE001 - pyarrow raises many kinds
        raise UsageError(str(path), f"unreadable: {_one_line(exc)}") from None
    return pd.DataFrame(np.concatenate(parts)) if parts else pd.DataFrame()


def load_steps(*paths: str | os.PathLike[str]) -> pd.DataFrame:
    """Every run at `paths` (run directories, or suite and results folders holding them) as
    one tidy DataFrame, one row per (run, worker, step): the step records
    (docs/reference/results.md) after columns suite, run, run_id, launch, repeat and a
    `warmup` flag. Every launch
    found is there: filter on `launch` to keep one, the column says which is which.

        from hetbench.harness.records.results import load_steps
        steps = load_steps("results/variability")
        steps[~steps.warmup].groupby(["run", "repeat"])["allreduce_ns"].median()
    """
    frames = []
    for run_dir in find_runs([Path(p) for p in paths]):
        data = load_run(run_dir)
        frame = collector.with_identity(data.steps.copy(), data.manifest)
        frame.insert(0, "suite", data.suite)
        frame.insert(1, "run", str(data.manifest["run"]["name"]))
        leading = ["suite", "run", *collector.IDENTITY_COLUMNS]
        frames.append(frame[leading + [c for c in frame.columns if c not in leading]])
    return pd.concat(frames, ignore_index=True)


# -- step records ---------------------------------------------------------------------------

TIMESTAMPS = ("begin_ns", "ready_ns", "reduced_ns", "end_ns")
# Every other *_ns field is a duration (a phase, a measured part of the exchange, CPU or GC
# time): never negative.
DURATIONS = tuple(f for f in collector.RECORD_FIELDS if f.endswith("_ns") and f not in TIMESTAMPS)
# A step's phases, each between two of its marks: none longer than the step.
PHASE_FIELDS = tuple(f"{phase.value}_ns" for phase in collector.PHASES)
# Fields added after the first runs were recorded: older step tables lack them (those with
# a default get it above; the straggler attribution does without the CPU times).
LATER_FIELDS = tuple(fields.OLDER)
# Record dtype kind -> kinds a column read back may have: integers where integers are
# written (NaN or text in a timestamp is damage), any number for floats, flags as 0/1 too.
ALLOWED_KINDS = {"i": "iu", "f": "fiu", "b": "biu"}
KIND_NAMES = {"i": "integers", "f": "numbers", "b": "true/false"}


class StepProblem(NamedTuple):
    rank: int | None  # the rank of the first bad row; None for the table as a whole
    message: str


def read_steps(run_dir: Path) -> tuple[pd.DataFrame, Callable[[int | None], Path]]:
    """The run's step records, and which file holds the rows of a rank (to name it in an
    error): steps.parquet, or each rank's part for a run that never finalised."""
    steps_file = run_dir / collector.STEPS_FILE
    if steps_file.is_file():
        try:
            steps = pd.read_parquet(steps_file)
        except Exception as exc:  # noqa: BLE001 - pyarrow raises many kinds
            raise UsageError(str(steps_file), f"unreadable: {_one_line(exc)}") from None
        return steps, lambda rank: steps_file
    arrays = [_checked_part(path, collector.read_part(path))
              for path in collector.part_files(run_dir)]

    def part_of(rank: int | None) -> Path:
        if rank is None:  # (a table read from parts has every column, of the right kind)
            return run_dir / collector.PARTS_DIR
        return collector.part_path(run_dir, rank)

    return collector.records_frame(arrays), part_of


def _checked_part(path: Path, rows: np.ndarray) -> np.ndarray:
    """A part holds only its own rank's rows; anything else is not what a worker wrote
    (damaged, shifted by lost bytes, or a record layout of another hetbench version)."""
    rank = collector.part_rank(path)
    if rank is None:
        raise UsageError(str(path), "not a part file hetbench writes (rank<N>.bin)")
    wrong = rows["rank"] != rank
    if wrong.any():
        first = int(wrong.argmax())
        raise UsageError(str(path), f"row {first} holds rank {rows['rank'][first]}, not "
                         f"{rank}: damaged, or records of another hetbench version")
    return rows


def step_problem(steps: pd.DataFrame, instrumented: bool = True,
                 world_size: int | None = None) -> StepProblem | None:
    """What makes a step table unusable, or None: a missing column, a column of the wrong
    kind, a row out of range (a rank the run lacks, a negative step or batch size, a step
    recorded twice) or a row whose time goes backwards (a timestamp before the one it
    follows, a negative duration), which analysis would turn into negative idle.

    Rows of a run recorded with instrument = false hold only begin and end (ready and
    reduced are 0), so only those two are ordered there. Vectorised: a few passes over
    each column, well under the cost of reading the table."""
    missing = [f for f in collector.RECORD_FIELDS
               if f not in steps.columns and f not in LATER_FIELDS]
    if missing:
        return StepProblem(None, f"lacks column(s) {listed(missing)}: not a step table "
                                 "this hetbench reads")
    for field in collector.RECORD_FIELDS:
        if field not in steps.columns:
            continue
        kind = collector.RECORD_DTYPE[field].kind
        if steps[field].dtype.kind not in ALLOWED_KINDS[kind]:
            return StepProblem(None, f"column {field} holds {steps[field].dtype} values "
                                     f"({KIND_NAMES[kind]} are expected)")
    return (_first_row_out_of_range(steps, world_size)
            or _first_backwards_row(steps, instrumented))


def _first_row_out_of_range(steps: pd.DataFrame, world_size: int | None
                            ) -> StepProblem | None:
    """A rank the run does not have, a negative step or batch size, or a (rank, step)
    recorded twice: no worker writes such rows (every rank numbers its own steps once)."""
    ranks, step_numbers = steps["rank"].to_numpy(), steps["step"].to_numpy()
    checks = [(ranks < 0, "rank {rank} is negative")]
    if world_size is not None:
        checks.append((ranks >= world_size, f"rank {{rank}} is not one of the run's "
                                            f"{world_size} workers"))
    checks += [(step_numbers < 0, "step {step} is negative"),
               (steps["batch_size"].to_numpy() < 0, "batch_size {batch} is negative"),
               (steps.duplicated(["rank", "step"]).to_numpy(),
                "rank {rank}, step {step} is recorded twice")]
    found = [(int(bad.argmax()), message) for bad, message in checks if bad.any()]
    if not found:
        return None
    row, message = min(found)
    rank, step = int(ranks[row]), int(step_numbers[row])
    text = message.format(rank=rank, step=step, batch=int(steps["batch_size"].iat[row]))
    return StepProblem(rank if 0 <= rank < (world_size or rank + 1) else None,
                       f"row {row}: {text}: damaged")


def _first_backwards_row(steps: pd.DataFrame, instrumented: bool) -> StepProblem | None:
    order = TIMESTAMPS if instrumented else (TIMESTAMPS[0], TIMESTAMPS[-1])
    found: list[tuple[int, str]] = []  # (row, what is wrong there)
    for before, after in zip(order, order[1:], strict=False):
        early, late = steps[before].to_numpy(), steps[after].to_numpy()
        backwards = late < early
        if backwards.any():
            row = int(backwards.argmax())
            found.append((row, f"{after} {late[row]} is before {before} {early[row]} "
                               "(time goes backwards)"))
    for field in DURATIONS:
        if field not in steps.columns or not len(steps):
            continue
        values = steps[field].to_numpy()
        # a sampled counter holds UNMEASURED (-1) on the steps between the sampled ones
        least = collector.UNMEASURED if field in collector.SAMPLED_FIELDS else 0
        if values.min() < least:
            row = int((values < least).argmax())
            found.append((row, f"{field} is negative ({values[row]})"))
    if not found:
        return None
    row, what = min(found)
    rank, step = int(steps["rank"].iat[row]), int(steps["step"].iat[row])
    return StepProblem(rank, f"rank {rank}, step {step}: {what}")


# -- held-out evaluations -------------------------------------------------------------------

EVAL_COLUMNS = ("step", "samples", "wall_s", "train_s", "loss")


def read_evals(run_dir: Path) -> pd.DataFrame:
    """The run's held-out evaluations (empty when it made none), with the columns the
    convergence analysis reads, as numbers."""
    source = collector.eval_source(run_dir)
    try:
        evals = collector.eval_frame(run_dir)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises many kinds
        raise UsageError(str(source), f"unreadable: {_one_line(exc)}") from None
    if evals.empty:
        return evals
    missing = [c for c in EVAL_COLUMNS if c not in evals.columns]
    if missing:
        raise UsageError(str(source), f"lacks column(s) {listed(missing)}: not held-out "
                                      "evaluations this hetbench reads")
    for column in EVAL_COLUMNS:
        if evals[column].dtype.kind not in "iuf":
            raise UsageError(str(source), f"column {column} holds {evals[column].dtype} "
                                          "values (numbers are expected)")
    return evals


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


# -- several runs ---------------------------------------------------------------------------


def load_finished_runs(run_dirs: Iterable[Path]) -> list[Run]:
    """The runs that are not still going, each loaded; a run whose manifest says `running`
    is left out with a note saying why (its records are still being written, or its
    launcher died before it could close it), never analysed as if it had ended."""
    runs = []
    for run_dir in run_dirs:
        meta = manifest.read(run_dir)
        if meta["status"] == "running":
            note(running_note(run_dir, meta))
        else:
            runs.append(_load(run_dir, meta))
    return runs


def running_note(run_dir: Path, meta: dict[str, Any]) -> str:
    alive = launcher_alive(meta)
    if alive:
        return f"{run_dir} is still running (launcher pid {meta['launcher']['pid']} " \
               "alive): left out"
    if alive is False:
        return f"{run_dir} says running but its launcher is gone: left out (hetbench " \
               f"recover {run_dir} closes it as failed from its parts)"
    host = (meta.get("launcher") or {}).get("host")
    where = f"recorded on host {host}" if host else "no launcher recorded"
    return f"{run_dir} says running; cannot tell whether its launcher lives ({where}): " \
           "left out"


def by_suite(runs: Iterable[Run]) -> dict[str, list[Run]]:
    """Runs grouped by suite, in the order suites first appear: runs of different suites
    are never pooled (a run name may mean different things in two suites)."""
    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(run.suite, []).append(run)
    return groups


def finished_runs(paths: list[Path]) -> list[Run]:
    """The finished runs at `paths` (load_finished_runs); none at all is an error."""
    runs = load_finished_runs(find_runs(paths))
    if not runs:
        raise UsageError(" ".join(map(str, paths)), "no finished run here (every run found "
                         "says it is still running)")
    return runs


def finished_runs_by_suite(paths: list[Path], outcome: str,
                           launches: LaunchChoice | None = None) -> dict[str, list[Run]]:
    """The finished runs at `paths` by suite (see load_finished_runs and by_suite), with a
    note saying so when there are several suites (`outcome`: what is done with them), and
    of each suite the launches chosen (`choose_launches`). No finished run at all is an
    error."""
    suites = by_suite(finished_runs(paths))
    mixed_suites_note(paths, suites, outcome)
    return {name: choose_launches(runs, launches or LaunchChoice(), f"suite {name}")
            for name, runs in suites.items()}


@dataclass(frozen=True)
class LaunchChoice:
    """Which launches' runs to read together (`--launch`, `--pool-launches`)."""

    pattern: str | None = None  # launch ids matching this glob
    pool: bool = False  # every launch, pooled as repeats


def choose_launches(runs: list[Run], choice: LaunchChoice, where: str) -> list[Run]:
    """Launches of the same run are not repeats of one experiment unless the user says
    so: the launches matching `choice.pattern`, or all of them with `choice.pool`, else
    each run's newest launch (the launches of different runs, `-k` one at a time, are all
    read); a note says which were read whenever there were several."""
    ordered = sorted(runs, key=lambda r: str(r.manifest.get("start", "")))
    launches = list(dict.fromkeys(r.launch for r in ordered))
    if choice.pattern is not None:
        picked = [launch for launch in launches if fnmatch.fnmatchcase(launch, choice.pattern)]
        if not picked:
            raise UsageError("--launch", f"{choice.pattern!r} matches no launch of {where} "
                             f"(launches: {', '.join(launches)})")
        note(f"{where}: reading launch{'es' if len(picked) > 1 else ''} {', '.join(picked)}"
             + (" (pooled as repeats)" if len(picked) > 1 else ""))
    elif len(launches) == 1:
        return runs
    elif choice.pool:
        picked = launches
        note(f"{where}: pooling {len(picked)} launches as repeats ({', '.join(picked)})")
    else:
        return _newest_of_each_run(runs, ordered, launches, where)
    return [r for r in runs if r.launch in picked]


def _newest_of_each_run(runs: list[Run], ordered: list[Run], launches: list[str],
                        where: str) -> list[Run]:
    newest = {r.name: r.launch for r in ordered}  # the last launch of each run
    again = [name for name in newest
             if len({r.launch for r in ordered if r.name == name}) > 1]
    if not again:
        note(f"{where}: reading {len(launches)} launches together, each of other runs "
             f"({', '.join(launches)})")
        return runs
    note(f"{where} holds {len(launches)} launches ({', '.join(launches)}) and "
         f"{listed(again, 5)} in more than one: reading each run's newest launch "
         "(--launch GLOB picks others, --pool-launches pools them)")
    return [r for r in runs if r.launch == newest[r.name]]


def mixed_suites_note(paths: Sequence[object], suites: Iterable[str], outcome: str) -> None:
    """One note when the paths together hold runs of more than one suite."""
    names = list(dict.fromkeys(suites))
    if len(names) > 1:
        holders = " and ".join(map(str, paths)) + (" holds" if len(paths) == 1 else " hold")
        note(f"{holders} runs of {len(names)} suites ({', '.join(names)}): {outcome}")


def note(text: str) -> None:
    """A remark on what is (not) shown, beside the output: one stderr line, not an error."""
    print(f"hetbench: note: {text}", file=sys.stderr)


# -- is a run's launcher alive? -------------------------------------------------------------


def launcher_alive(meta: dict[str, Any]) -> bool | None:
    """Whether the launcher that wrote this manifest still runs: None when that cannot be
    told from here (no launcher recorded, another host, or no start time recorded). An
    exited launcher its parent has not reaped yet (a zombie) is not alive."""
    launcher = meta.get("launcher")
    if not isinstance(launcher, dict) or launcher.get("host") != socket.gethostname():
        return None
    started = launcher.get("started")
    if not isinstance(started, int):
        return None
    return procfs.alive(int(launcher["pid"]), started)


def require_launcher_gone(meta: dict[str, Any], where: str) -> None:
    """Before closing what a launcher left (`meta` records it): refused (UsageError) while
    that launcher lives, or where this host cannot tell."""
    launcher = meta.get("launcher") or {}
    alive = launcher_alive(meta)
    if alive is None:
        raise UsageError(where, "cannot tell whether its launcher lives (it was started on "
                         f"host {launcher.get('host', 'unknown')!r}, this is "
                         f"{socket.gethostname()!r}): recover it there")
    if alive:
        raise UsageError(where, f"still running: its launcher (pid {launcher['pid']}) lives")


# -- paths ----------------------------------------------------------------------------------


def writable_folder(path: Path, where: str) -> Path:
    """Create `path` if needed and check that files can be written in it, before anything
    runs: a bad --out is one line, not a traceback after the first run."""
    if path.exists() and not path.is_dir():
        raise UsageError(where, f"{path} is a file, not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".hetbench-write-test-{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError as exc:
        why = exc.strerror or str(exc)
        if exc.errno == errno.ENOENT:  # a folder that exists says so: /proc, /sys
            there = next(p for p in (path, *path.parents) if p.exists())
            why = f"nothing can be created in {there}"
        raise UsageError(where, f"{path} is not a writable folder ({why})") from None
    return path


def find_runs(paths: list[Path]) -> list[Path]:
    """Run directories named directly, or found below a suite or results folder (two
    levels down at most), in a stable order, each run once (once_per_run). A path with
    no run is an error."""
    found: list[Path] = []
    for path in paths:
        if not path.exists():
            raise UsageError(str(path), "no such file or directory")
        if (path / manifest.MANIFEST_FILE).is_file():
            found.append(path)
            continue
        below = sorted(p.parent for p in path.glob(f"*/{manifest.MANIFEST_FILE}"))
        below += sorted(p.parent for p in path.glob(f"*/*/{manifest.MANIFEST_FILE}"))
        if not below:
            raise UsageError(str(path), "not a run directory, and no run directories below it "
                             "(a run directory holds manifest.json)")
        found.extend(below)
    return once_per_run(list(dict.fromkeys(found)))


def once_per_run(run_dirs: list[Path]) -> list[Path]:
    """The run directories, a run found again under another path (a link to its folder, a
    copy) left out with a note, by its manifest's `run_id`: pooled twice it would count as
    two repeats that agree exactly. The folder itself is kept rather than a link to it; a
    manifest that cannot say its id is kept, for the reader to refuse by name."""
    ids = {run_dir: _run_id(run_dir) for run_dir in run_dirs}
    kept: dict[str, Path] = {}
    for run_dir in sorted(run_dirs, key=Path.is_symlink):  # stable: folders, then links
        if (run_id := ids[run_dir]) is not None:
            kept.setdefault(run_id, run_dir)
    out = []
    for run_dir in run_dirs:
        run_id = ids[run_dir]
        if run_id is not None and kept[run_id] != run_dir:
            note(f"{run_dir} is {kept[run_id]} again (a link to it or a copy; run "
                 f"{run_id}): read once")
            continue
        out.append(run_dir)
    return out


def _run_id(run_dir: Path) -> str | None:
    """The run's id with its suite and start: a copy's manifest holds the same three."""
    try:
        meta = jsonfile.read(run_dir / manifest.MANIFEST_FILE, "manifest")
        run_id, suite, start = meta["run_id"], meta["suite"]["name"], meta.get("start")
    except (UsageError, TypeError, KeyError):
        return None
    if not isinstance(run_id, str):
        return None
    return f"{run_id} of suite {suite}" + (f", started {start}" if start else "")
