"""Step records -> run directory.

While a run is going, each worker appends its records in small parts to
`parts/rank<R>.bin` (fixed-size binary rows, RECORD_DTYPE), so a crash loses at most the
last unflushed part and a half-written row is simply dropped on reading. At the end the
records become `steps.parquet` (one row per worker and step) and `trace.json`.
"""

from __future__ import annotations

import errno
import json
import os
import struct
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter_ns  # a module global: read at every append
from typing import Any

import numpy as np

from hetbench.harness.records import fields

# the record's phases, where the fields are declared (here too, as every reader knows them)
from hetbench.harness.records.fields import COMPUTE_PHASES as COMPUTE_PHASES
from hetbench.harness.records.fields import PHASES as PHASES
from hetbench.harness.records.fields import Phase as Phase
from hetbench.harness.system import clocks

# A step's record: the fields hetbench.harness.records.fields declares, in their order
RECORD_DTYPE = np.dtype([(f.name, f.dtype) for f in fields.STEP_FIELDS])
# A pipeline stage's micro-batches (virtual workers, harness/loop/stage.py): each
# forward and backward of one micro-batch of one wave, stretched as the worker's slowdown
# says (stretch_ns of it is the emulation's).
MICRO_DTYPE = np.dtype(
    [("rank", "<i4"), ("wave", "<i8"), ("micro_batch", "<i4"), ("backward", "?"),
     ("begin_ns", "<i8"), ("end_ns", "<i8"), ("stretch_ns", "<i8")]
)
# A DDP run's gradient buckets (harness/exchange/ddp.py), per worker and step: when the
# backward handed each bucket to its all-reduce, and when that all-reduce was done.
BUCKET_DTYPE = np.dtype(
    [("rank", "<i4"), ("step", "<i8"), ("bucket", "<i4"), ("bytes", "<i8"),
     ("ready_ns", "<i8"), ("reduced_ns", "<i8")]
)
# Fields read over one step in a run's counters_every (harness/loop/counters.py): the
# other steps hold UNMEASURED there.
UNMEASURED = -1
SAMPLED_FIELDS = fields.SAMPLED
EXCHANGE_FIELDS = fields.written_by("exchange")
RECORD_FIELDS: tuple[str, ...] = tuple(RECORD_DTYPE.names or ())
RANK_FIELD = RECORD_FIELDS.index("rank")
# A step a worker sat out (harness/loop/membership.py): batch size 0, no timestamps, no loss.
# Every step keeps a row per worker, so a step missing a row still means a record lost.
_LEFT_OUT = tuple(float("nan") if RECORD_DTYPE[name].kind == "f" else
                  False if RECORD_DTYPE[name].kind == "b" else 0 for name in RECORD_FIELDS)


def left_out_record(rank: int, step: int) -> tuple[Any, ...]:
    return (rank, step, *_LEFT_OUT[2:])


# A step's marks (harness/loop/timer.py): its begin, then the end of each phase in PHASES order;
# the record's instants are these (timed_record spells that order out)
MARK_READY, MARK_REDUCED, MARK_END = (PHASES.index(p) + 1 for p in (Phase.PACK,
                                                                    Phase.ALLREDUCE,
                                                                    Phase.APPLY))
MARKS = len(PHASES) + 1
# instrument = false: every field between the instants and the exchange's is zero (the
# losses NaN), as RECORD_DTYPE orders them
_UNTIMED_MIDDLE = _LEFT_OUT[RECORD_FIELDS.index("end_ns") + 1:RECORD_FIELDS.index("staleness")]


def timed_record(rank: int, step: int, batch_size: int, slice_start: int,
                 marks: Sequence[int], stretch: tuple[int, int, int], compute: Any,
                 loss: float, local_loss: float, counters: tuple[int, ...], exchange: Any
                 ) -> tuple[Any, ...]:
    """One step's row, in the order hetbench.harness.records.fields declares (spelled out
    here and in untimed_record, for speed; tests/test_collector.py checks both by name):
    `marks` the timer's (begin, each phase's end), `stretch` the emulation's (its time, its
    wait for a CPU and its CPU time: Stretcher.take()), `compute` the kernel's counts over the
    compute (the fields the `cpu` writer fills: a tuple, or the step's raw readings that
    hetbench.harness.loop.counters.Readings.values() decodes), `counters`
    hetbench.harness.loop.counters.Counters.take()'s (context switches, user and system CPU,
    rss, gc time and collections), `exchange` the aggregator's Exchange (its
    EXCHANGE_FIELDS)."""
    # spelled out, not a loop over PHASES: built once a step right after its compute, where
    # each Python operation costs several times its cost in a loop of its own (half the
    # time of `map(operator.sub, marks[1:], marks)` there: benchmarks/overhead.py --parts)
    try:
        begin, load, to_device, forward, backward, ready, reduced, unpack, end = marks
    except ValueError:
        raise RuntimeError(f"a step marked {len(marks) - 1} phase ends, not {MARKS - 1}"
                           ) from None
    return (rank, step, batch_size, slice_start, begin, ready, reduced, end,
            load - begin, to_device - load, forward - to_device, backward - forward,
            ready - backward, reduced - ready, unpack - reduced, end - unpack,
            *stretch, *(compute if compute.__class__ is tuple else compute.values()),
            loss, local_loss, *counters,
            exchange.staleness, exchange.push_ns, exchange.wait_ns, exchange.pull_ns,
            exchange.asynchronous, exchange.dropped)


# A timed step as its trainer leaves it: timed_record's arguments (rank, step, batch_size,
# slice_start, marks, stretch, compute, loss, local_loss, counters, exchange), with
# the marks at TIMED_MARKS. The writer builds its row when it flushes (step_row), in a loop
# over the flush's rows where Python runs warm; built right after the step, whose compute
# leaves the caches cold, the row cost ~10 us of the step's 30 us budget (issue 28).
TIMED_STEP_PARTS = 11
TIMED_MARKS = 4
assert TIMED_STEP_PARTS != len(RECORD_FIELDS)  # told apart from a row by length


def step_row(record: tuple[Any, ...]) -> tuple[Any, ...]:
    """The record's row in RECORD_DTYPE's order: a timed step's built, a row as it is."""
    return timed_record(*record) if len(record) == TIMED_STEP_PARTS else record


def untimed_record(rank: int, step: int, batch_size: int, slice_start: int, begin_ns: int,
                   end_ns: int, exchange: Any) -> tuple[Any, ...]:
    """A step recorded with instrument = false: its begin and end, what the exchange says
    of staleness and whether it was taken together or dropped; nothing else measured."""
    return (rank, step, batch_size, slice_start, begin_ns, 0, 0, end_ns, *_UNTIMED_MIDDLE,
            exchange.staleness, 0, 0, 0, exchange.asynchronous, exchange.dropped)

STEPS_FILE = "steps.parquet"
TRACE_FILE = "trace.json"
EVAL_FILE = "eval.parquet"
MICRO_FILE = "microbatches.parquet"
BUCKETS_FILE = "buckets.parquet"
PARTS_DIR = "parts"
CLOCK_PART = "clock.json"
PARTITION_LOG = "partition.json"  # rank 0's partition history and standalone rates so far
EVAL_PART = "eval.jsonl"  # rank 0's held-out evaluations so far, one JSON object a line


def error_path(run_dir: Path, rank: int) -> Path:
    """Where a worker leaves the one-line reason it stopped (read by whoever closes the run)."""
    return run_dir / PARTS_DIR / f"rank{rank}.error"


def read_error(run_dir: Path, rank: int) -> str:
    """The worker's reason, or "" when it left none."""
    path = error_path(run_dir, rank)
    return path.read_text().strip() if path.is_file() else ""


def part_path(run_dir: Path, rank: int) -> Path:
    return run_dir / PARTS_DIR / f"rank{rank}.bin"


_STRUCT_CODES = {"<i4": "i", "<i8": "q", "<f8": "d", "|b1": "?"}


def row_packer(dtype: np.dtype) -> struct.Struct | None:
    """A struct that packs a row of `dtype` byte for byte as numpy lays it out (packed
    fields of the kinds the records use, little-endian), or None where it cannot."""
    names = dtype.names or ()
    if not names or any(dtype[name].str not in _STRUCT_CODES for name in names):
        return None
    codes = [_STRUCT_CODES[dtype[name].str] for name in names]
    packer = struct.Struct("<" + "".join(codes))
    offsets = [dtype.fields[name][1] for name in names]  # type: ignore[index]
    expected = [struct.calcsize("<" + "".join(codes[:i])) for i in range(len(codes))]
    return packer if packer.size == dtype.itemsize and offsets == expected else None


class RecordWriter:
    """Buffers record tuples and writes them to the rank's part file every few steps.

    A flush can be cut short: workers turn SIGINT and SIGTERM into an exception that may
    land on any line, and close() then flushes what is still pending. So a flush writes
    its rows at their place in the file (pwrite at the bytes already committed) and then
    commits them in one assignment: cut before the commit, the next flush writes the same
    bytes at the same place again, never a row twice. (Holding the signals back instead
    cost 8 handler swaps a flush, ~5 us a step.)"""

    def __init__(self, path: Path, flush_every: int = 16, flush_interval_s: float = 0.5,
                 dtype: np.dtype = RECORD_DTYPE) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._path = path
        self._dtype = dtype
        self._packer = row_packer(dtype)
        self._row = step_row if dtype is RECORD_DTYPE else None  # timed steps become rows
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        # (bytes committed to the file, rows pending): replaced whole, never changed in part
        self._start = os.fstat(self._fd).st_size  # where this writer's rows begin
        self._state: tuple[int, list[tuple[Any, ...]]] = (self._start, [])
        self._flush_every = flush_every
        self._interval_ns = int(flush_interval_s * 1e9)
        self._last_flush = perf_counter_ns()

    def append(self, record: tuple[Any, ...]) -> None:
        pending = self._state[1]
        pending.append(record)
        if (len(pending) >= self._flush_every
                or perf_counter_ns() - self._last_flush >= self._interval_ns):
            self.flush()

    def flush(self) -> None:
        committed, pending = self._state
        if pending:
            data = self._bytes(pending)
            written = os.pwrite(self._fd, data, committed)
            if written != len(data):
                raise OSError(errno.ENOSPC, f"{self._path}: wrote {written} of {len(data)} "
                                            "bytes", str(self._path))
            self._state = (committed + written, [])
        self._last_flush = perf_counter_ns()

    def _bytes(self, rows: list[tuple[Any, ...]]) -> bytes:
        """The rows as the dtype lays them out: struct packs a row in ~0.8 us where numpy
        converts it in ~2.9 us (every row of a run goes through here); numpy where struct
        refuses a value (a float in an integer field: numpy truncates it, as it always did)."""
        if self._row is not None:
            rows = [self._row(row) for row in rows]
        if self._packer is not None:
            pack = self._packer.pack
            try:
                return b"".join([pack(*row) for row in rows])
            except struct.error:
                pass
        return np.array(rows, dtype=self._dtype).tobytes()

    def records(self) -> np.ndarray:
        """Every row this writer wrote (read back from its file: a run keeps nothing twice
        in memory)."""
        if self._fd >= 0:
            self.flush()
        with open(self._path, "rb") as f:
            f.seek(self._start)
            data = f.read(self._state[0] - self._start)
        return np.frombuffer(data, dtype=self._dtype).copy()

    def close(self) -> None:
        if self._fd < 0:
            return
        self.flush()
        os.close(self._fd)
        self._fd = -1


def read_part(path: Path, dtype: np.dtype = RECORD_DTYPE) -> np.ndarray:
    """Every complete row of a part file; a torn last row (crash mid-write) is dropped."""
    data = path.read_bytes()
    usable = len(data) - len(data) % dtype.itemsize
    return np.frombuffer(data[:usable], dtype=dtype).copy()


@dataclass(frozen=True)
class SideTable:
    """Records a trainer keeps beside its step records (a pipeline stage's micro-batches, a
    DDP run's gradient buckets): flushed to parts/<prefix>-rank<R>.bin while running, one
    parquet file (`file`, rows sorted by `order`) once the run is closed."""

    file: str
    prefix: str
    dtype: np.dtype
    order: tuple[str, ...]

    def part_path(self, run_dir: Path, rank: int) -> Path:
        return run_dir / PARTS_DIR / f"{self.prefix}-rank{rank}.bin"

    def read_parts(self, run_dir: Path) -> list[np.ndarray]:
        folder = run_dir / PARTS_DIR
        paths = sorted(folder.glob(f"{self.prefix}-rank*.bin")) if folder.is_dir() else []
        return [read_part(p, self.dtype) for p in paths]

    def write(self, run_dir: Path, arrays: Sequence[np.ndarray],
              clock: dict[str, Any] | None = None) -> None:
        """The table's file from every rank's rows, on rank 0's clock when `clock` says
        the ranks' clocks differ; nothing when no rank kept a row."""
        import pandas as pd

        arrays = [a for a in arrays if len(a)]
        if not arrays:
            return
        frame = pd.DataFrame(np.concatenate(arrays))
        if clock:
            clocks.align(frame, clock["start"], clock.get("end"))
        frame = frame.sort_values(list(self.order), kind="stable")
        tmp = run_dir / f".{self.file}.tmp"
        with _naming(run_dir / self.file):
            frame.reset_index(drop=True).to_parquet(tmp, index=False)
        tmp.replace(run_dir / self.file)


MICRO = SideTable(MICRO_FILE, "micro", MICRO_DTYPE, ("wave", "rank", "begin_ns"))
BUCKETS = SideTable(BUCKETS_FILE, "buckets", BUCKET_DTYPE, ("step", "rank", "bucket"))
SIDE_TABLES = (MICRO, BUCKETS)


def part_files(run_dir: Path) -> list[Path]:
    """The flushed record files of a run, one per rank that started recording."""
    folder = run_dir / PARTS_DIR
    return sorted(folder.glob("rank*.bin")) if folder.is_dir() else []


def part_rank(path: Path) -> int | None:
    """The rank whose records `path` holds (rank<R>.bin), or None for another name."""
    digits = path.stem.removeprefix("rank")
    return int(digits) if path.suffix == ".bin" and digits.isdigit() else None


def read_parts(run_dir: Path) -> list[np.ndarray]:
    return [read_part(p) for p in part_files(run_dir)]


def write_survivor(run_dir: Path, rank: int, params: dict[str, Any],
                   finish: dict[str, Any]) -> None:
    """What a worker that ended training writes when no collective may follow (a run that
    goes on without dead workers): its parameters and what rank 0 would put in the
    manifest."""
    np.savez(run_dir / PARTS_DIR / f"params-rank{rank}.npz", **params)
    (run_dir / PARTS_DIR / f"finish-rank{rank}.json").write_text(json.dumps(finish))


def steps_done(run_dir: Path, world_size: int, ranks: Iterable[int] | None = None) -> int:
    """Steps flushed by the slowest rank (of `ranks`, default all; for the progress bar;
    reads only file sizes)."""
    counts = []
    for rank in (range(world_size) if ranks is None else ranks):
        try:
            counts.append(part_path(run_dir, rank).stat().st_size // RECORD_DTYPE.itemsize)
        except FileNotFoundError:
            counts.append(0)
    return min(counts) if counts else 0


def records_frame(arrays: Iterable[np.ndarray], clock: dict[str, Any] | None = None):  # type: ignore[no-untyped-def]
    """One tidy DataFrame, one row per (rank, step). `clock`: the offsets measured when the
    workers do not share a clock ({"start": ..., "end": ...}, hetbench.harness.system.clocks),
    applied so that every timestamp is on rank 0's clock."""
    import pandas as pd

    arrays = [a for a in arrays if len(a)]
    merged = np.concatenate(arrays) if arrays else np.empty(0, dtype=RECORD_DTYPE)
    frame = pd.DataFrame(merged)
    if clock:
        clocks.align(frame, clock["start"], clock.get("end"))
    return frame.sort_values(["step", "rank"], kind="stable").reset_index(drop=True)


def write_clock(run_dir: Path, start: dict[str, Any], domains: list[str]) -> None:
    """Rank 0's start offsets and every worker's clock domain, for whoever closes a run that
    fails before rank 0 can (the launcher, or hetbench recover)."""
    (run_dir / PARTS_DIR / CLOCK_PART).write_text(json.dumps({"start": start,
                                                              "domains": domains}))


def read_clock(run_dir: Path) -> dict[str, Any] | None:
    """What to align a failed run's records by: None when its workers shared one clock, or
    when rank 0 never measured (the records then stay on each worker's clock)."""
    try:
        saved = json.loads((run_dir / PARTS_DIR / CLOCK_PART).read_text())
    except (OSError, ValueError):
        return None
    return None if len(set(saved["domains"])) == 1 else {"start": saved["start"]}


RESERVE_FILE = ".reserve.tmp"
RESERVE_BYTES = 256 * 1024  # more than a manifest and the small files closing writes


def reserve_space(run_dir: Path) -> None:
    """Ballast written when the run starts: if the disk fills up while the run goes on, its
    removal is what leaves room to close the run (its manifest saying `failed`, and why)."""
    with open(run_dir / RESERVE_FILE, "wb") as f:
        f.write(bytes(RESERVE_BYTES))


def remove_temporary(run_dir: Path) -> None:
    """The reserve, and the half-written files of a write that failed (`.NAME.tmp`,
    replaced onto NAME only once complete)."""
    for tmp in run_dir.glob(".*.tmp"):
        try:
            tmp.unlink(missing_ok=True)
        except OSError:  # a folder nobody may write: what follows says so (NotClosed)
            pass


@contextmanager
def _naming(path: Path) -> Iterator[None]:
    """An OSError raised while writing `path` names it (pyarrow's do not)."""
    try:
        yield
    except OSError as exc:
        if exc.filename:
            raise
        raise OSError(exc.errno or errno.EIO, exc.strerror or str(exc), str(path)) from exc


# Which run a row belongs to, as columns of steps.parquet, so that rows of many runs can be
# concatenated and still told apart (hetbench.harness.records.results.load_steps adds them to runs
# recorded before, or read from parts): run id, launch, repeat, and whether the step is warm-up.
IDENTITY_COLUMNS = ("run_id", "launch", "repeat", "warmup", "profiled")


def with_identity(frame: Any, meta: dict[str, Any]) -> Any:
    """`frame` with IDENTITY_COLUMNS set from the run's manifest (in place, and returned)."""
    warmup = int((meta.get("run") or {}).get("warmup_steps", 0))
    frame["run_id"] = str(meta.get("run_id", ""))
    frame["launch"] = str(meta.get("launch") or "unrecorded")
    frame["repeat"] = int(meta.get("repeat", 0))
    # the run's first steps, counted from its first recorded (an imported run keeps the
    # profiler's numbers, which need not begin at 0)
    frame["warmup"] = (frame["step"] < frame["step"].min() + warmup
                       if "step" in frame and len(frame) else False)
    return with_profiled(frame, meta)


def with_profiled(frame: Any, meta: dict[str, Any]) -> Any:
    """Column `profiled`: the steps the run's profiler touched (harness/spec/profiling.py),
    which summaries leave out as they leave out warm-up (in place, and returned)."""
    window = (meta.get("run") or {}).get("profile")
    if window and "step" in frame:
        frame["profiled"] = frame["step"].between(window["first"], window["last"] + 1)
    else:
        frame["profiled"] = False
    return frame


def with_placement(frame: Any, meta: dict[str, Any]) -> Any:
    """Where the run pipelined its model (virtual workers): columns `virtual_worker` and
    `stage` of each row's rank (in place, and returned); nothing otherwise. Every stage of a
    virtual worker records the virtual worker's slice: its samples count once, at stage 0
    (hetbench.analysis.view.metrics.counted_samples)."""
    pipeline = (meta.get("run") or {}).get("pipeline")
    if not pipeline or "rank" not in frame:
        return frame
    place = {r: (v, s) for v, ranks in enumerate(pipeline["virtual_workers"])
             for s, r in enumerate(ranks)}
    frame["virtual_worker"] = frame["rank"].map(lambda r: place[r][0]).astype("int32")
    frame["stage"] = frame["rank"].map(lambda r: place[r][1]).astype("int32")
    return frame


def write_steps(run_dir: Path, frame: Any) -> None:
    """steps.parquet, with the identity (and placement) columns of the run whose manifest
    is in run_dir."""
    meta_path = run_dir / "manifest.json"
    if meta_path.is_file():
        meta = json.loads(meta_path.read_text())
        with_placement(with_identity(frame, meta), meta)
    tmp = run_dir / f".{STEPS_FILE}.tmp"
    with _naming(run_dir / STEPS_FILE):
        frame.to_parquet(tmp, index=False)
    tmp.replace(run_dir / STEPS_FILE)


def write_records(run_dir: Path, arrays: list[np.ndarray],
                  clock: dict[str, Any] | None = None,
                  side: dict[str, list[np.ndarray]] | None = None) -> Any:
    """Write steps.parquet from the records, each side table from `side` (by file name;
    a table not named there: from its parts on disk, if any) and eval.parquet; returns
    the steps' frame (for the trace, which comes after the manifest)."""
    frame = records_frame(arrays, clock)
    write_steps(run_dir, frame)
    side = side or {}
    for table in SIDE_TABLES:
        rows = side.get(table.file)
        table.write(run_dir, table.read_parts(run_dir) if rows is None else rows, clock)
    write_eval(run_dir)
    return frame


def write_partition_log(run_dir: Path, history: list[dict[str, Any]],
                        standalone: list[dict[str, Any]]) -> None:
    """Written by rank 0 whenever the partition changes (every few steps at most), atomically,
    so the launcher can put a failed run's partition history into its manifest."""
    path = run_dir / PARTS_DIR / PARTITION_LOG
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"partition_history": history, "standalone": standalone}))
    tmp.replace(path)


def append_eval(run_dir: Path, row: dict[str, Any]) -> None:
    """One held-out evaluation (rank 0), appended and flushed at once: a run that fails
    later keeps every evaluation it made."""
    with open(run_dir / PARTS_DIR / EVAL_PART, "a") as f:
        f.write(json.dumps(row) + "\n")


def eval_frame(run_dir: Path):  # type: ignore[no-untyped-def]
    """The held-out evaluations: eval.parquet, or the part rank 0 flushed (a torn last line
    is dropped); an empty frame when the run evaluated nothing."""
    import pandas as pd

    path = eval_source(run_dir)
    if path.name == EVAL_FILE:
        return pd.read_parquet(path)
    rows = []
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                break
    return pd.DataFrame(rows)


def eval_source(run_dir: Path) -> Path:
    """Where the held-out evaluations are read from: eval.parquet once the run is finished,
    before that the part rank 0 appends to."""
    path = run_dir / EVAL_FILE
    return path if path.is_file() else run_dir / PARTS_DIR / EVAL_PART


def write_eval(run_dir: Path) -> int:
    """eval.parquet from the flushed evaluations (none: no file); returns the row count."""
    frame = eval_frame(run_dir)
    if len(frame) and not (run_dir / EVAL_FILE).is_file():
        tmp = run_dir / f".{EVAL_FILE}.tmp"
        with _naming(run_dir / EVAL_FILE):
            frame.to_parquet(tmp, index=False)
        tmp.replace(run_dir / EVAL_FILE)
    return len(frame)


def read_partition_log(run_dir: Path) -> dict[str, Any]:
    """What write_partition_log last wrote; {} when it never ran or left a torn file."""
    try:
        data = json.loads((run_dir / PARTS_DIR / PARTITION_LOG).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
