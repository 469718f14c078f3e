"""The typed readers every suite key goes through, and the bounds they check: each error is
one line naming the field and what is allowed (spec.errors.UsageError)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

from hetbench.harness.spec.errors import UsageError

# Where a value came from, for errors: a run's `at(key)` says runs[i].key or defaults.key.
At = Callable[[str], str]

# Used with fullmatch: '$' alone would also accept a trailing newline.
# Suite and run names: the folders a run directory's path is made of.
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")

MAX_MICRO_BATCHES = 4096

MAX_LOADER_WORKERS = 32

MAX_PREFETCH = 256

MAX_SUITE_BYTES = 1 << 24  # suites are kilobytes; this stops a read of a disk image
PIPE_TIMEOUT_S = 30.0  # a suite read from a pipe: its writer has this long to write it all

# Upper bounds: generous, but a typo (an extra zero or ten) is refused before anything runs
# instead of a run that never ends, a fork bomb or an overflow deep inside a worker.
MAX_NAME_LENGTH = 100  # run folders are NAME-rREPEAT-TIMESTAMP: well under 255 bytes

MAX_REPEATS = 1000

MAX_STEPS = 10_000_000  # every count of steps: steps, warm-ups, intervals, staleness

MAX_TIMEOUT_S = 86_400.0  # a day

MAX_GLOBAL_BATCH = 1_000_000  # the data set's own size is checked too

MAX_WORKERS = 1024
MAX_NODES = 1024  # hosts of a run across hosts

MAX_THREADS = 1024

MAX_CORE = 8191  # Linux numbers at most 8192 CPUs (NR_CPUS)

MAX_SERVERS = 64

MAX_SLOWDOWN = 1e6  # slowdown, slowdown_at and jitter factors (large ones emulate a stall)

MAX_LR = 100.0

MAX_SEED = 2**32 - 1  # what every framework's and numpy's seeding accepts

MAX_WEIGHT = 1e6  # partition weights are relative: a ratio beyond this is a typo

MAX_TOLERANCE = 100.0  # dead_band and reset, relative thresholds (100 = 10,000 %)

MAX_SLICE_RATIO = 1000.0

MAX_EPS = 1.0

MAX_WEIGHT_DECAY = 1.0

MAX_TARGET_LOSS = 1e6

def check_keys(table: dict[str, Any], allowed: set[str], where: str) -> None:
    for key in table:
        if key not in allowed:
            shown = key if key.isprintable() else repr(key)  # errors stay on one line
            field_name = f"{where}.{shown}" if where else shown
            raise UsageError(field_name, f"unknown key (allowed: {', '.join(sorted(allowed))})")

# Python type -> what a TOML author calls it
TOML_TYPES = {"str": "a string", "int": "an integer", "float": "a float", "bool": "a boolean",
              "list": "an array", "dict": "a table", "datetime": "a date-time",
              "date": "a date", "time": "a time"}

def toml_type(value: Any) -> str:
    name = type(value).__name__
    return TOML_TYPES.get(name, name)

def table(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise UsageError(where, f"must be a table, not {toml_type(value)}")
    return value

def text(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise UsageError(where, f"must be a string, not {toml_type(value)}")
    return value

def valid_name(value: Any, where: str) -> str:
    value = text(value, where)
    if not NAME_PATTERN.fullmatch(value):
        raise UsageError(where, f"{value!r} is not a name (letters, digits, '.', '_', '-')")
    if len(value) > MAX_NAME_LENGTH:
        raise UsageError(where, f"{len(value)} characters is too long (at most "
                         f"{MAX_NAME_LENGTH}: run folders are named after it)")
    return value

def choice(value: Any, allowed: Any, where: str) -> str:
    value = text(value, where)
    if value not in allowed:
        raise UsageError(where, f"unknown {value!r} (allowed: {', '.join(sorted(allowed))})")
    return value

def boolean(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise UsageError(where, f"must be true or false, not {toml_type(value)}")
    return value

def integer(value: Any, where: str, minimum: int, maximum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise UsageError(where, f"must be an integer, not {toml_type(value)}")
    if value < minimum:
        raise UsageError(where, f"{short(value)} is below the minimum {minimum}")
    if value > maximum:
        raise UsageError(where, f"{short(value)} is not allowed ({minimum} to {maximum})")
    return value

def number(value: Any, where: str, minimum: float, maximum: float, strict: bool = False,
           below_maximum: bool = False) -> float:
    """A finite number from `minimum` (excluded when strict) to `maximum` (excluded when
    below_maximum); an integer is taken as a float."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise UsageError(where, f"must be a number, not {toml_type(value)}")
    if not math.isfinite(value):
        raise UsageError(where, f"{value} is not allowed (must be a finite number)")
    if value < minimum or (strict and value == minimum):
        bound = f"above {minimum}" if strict else f"at least {minimum}"
        raise UsageError(where, f"{value} is not allowed (must be {bound})")
    if value > maximum or (below_maximum and value == maximum):
        raise UsageError(where, f"{short(value)} is not allowed "
                         f"({range_text(minimum, maximum, strict, below_maximum)})")
    return float(value)

def range_text(minimum: float, maximum: float, strict: bool, below_maximum: bool) -> str:
    """'0 to 1', or with an end excluded 'above 0, at most 1' / 'at least 0, below 1'."""
    if not strict and not below_maximum:
        return f"{minimum:g} to {maximum:g}"
    low = f"above {minimum:g}" if strict else f"at least {minimum:g}"
    high = f"below {maximum:g}" if below_maximum else f"at most {maximum:g}"
    return f"{low}, {high}"

def short(value: float) -> str:
    """A number as written, cut short when it has hundreds of digits (TOML integers may)."""
    text = str(value)
    return text if len(text) <= 30 else f"{text[:12]}...({len(text)} digits)"

def int_list_of(value: Any, where: str, length: int, what: str) -> tuple[int, ...]:
    """A list of `length` positive integers."""
    if not isinstance(value, list) or len(value) != length:
        raise UsageError(where, f"must be a list of {length} integers, {what}")
    return tuple(integer(v, where, 1, MAX_STEPS) for v in value)

def int_list(value: Any, where: str, length: int, minimum: int, maximum: int
             ) -> tuple[int, ...]:
    if not isinstance(value, list) or len(value) != length:
        raise UsageError(where, f"must be a list of {length} integers, one per worker")
    return tuple(integer(v, where, minimum, maximum) for v in value)
