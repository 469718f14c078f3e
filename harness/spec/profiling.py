"""A run's `profile` key: a window of steps recorded by PyTorch's profiler on some ranks.

    profile = { steps = "50-54", ranks = "all" }     # or ranks = [0, 2]

The profiled ranks write one Kineto trace each (harness/loop/profiling.py), the layout
Holistic Trace Analysis reads. The window's steps, and the step after it (the profiled ranks
stop the profiler before it, while the others wait in its exchange), are marked `profiled`
in steps.parquet and left out of every summary (hetbench.analysis.view.metrics.after_warmup).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from hetbench.harness.spec.errors import UsageError
from hetbench.harness.spec.fields import MAX_STEPS, check_keys, integer, table, toml_type

PROFILE_KEYS = {"steps", "ranks"}
# The profiler keeps every event of the window in memory until the run ends: a window is a
# handful of steps, as torch.profiler's own schedules record.
MAX_PROFILED_STEPS = 100


@dataclass(frozen=True)
class ProfileSpec:
    first: int
    last: int
    ranks: tuple[int, ...] | None = None  # None: every rank

    def records(self, rank: int) -> bool:
        return self.ranks is None or rank in self.ranks

    @property
    def perturbed(self) -> tuple[int, int]:
        """The steps the profiler touches: the window and the step after it."""
        return self.first, self.last + 1


def describe(window: dict[str, Any]) -> str:
    """'steps 60-69 on every rank' (or 'on ranks [0, 2]'), from a manifest's `run.profile`."""
    ranks = "every rank" if window.get("ranks") is None else f"ranks {list(window['ranks'])}"
    return f"steps {window['first']}-{window['last']} on {ranks}"


def step_window(value: Any, where: str, allowed: str) -> tuple[int, int] | None:
    """'A-B', steps A to B with A <= B, as a pair; None when `value` is not a string."""
    if not isinstance(value, str):
        return None
    match = re.fullmatch(r"\s*(\d+)\s*-\s*(\d+)\s*", value)
    if not match or int(match[1]) > int(match[2]) or int(match[2]) > MAX_STEPS:
        raise UsageError(where, f"{value[:40]!r}: a window is 'A-B', steps A to B with "
                                f"A <= B; {allowed}")
    return int(match[1]), int(match[2])


def parse_profile(raw: Any, framework: str, steps: int, warmup_steps: int, world_size: int,
                  where: str) -> ProfileSpec | None:
    """`profile = { steps = "A-B", ranks = "all" | [r, ...] }`; None when not set."""
    if raw is None:
        return None
    values = table(raw, where)
    check_keys(values, PROFILE_KEYS, where)
    if framework != "pytorch":
        raise UsageError(where, "torch.profiler records PyTorch workers (framework "
                         f"\"pytorch\"); this run's framework is {framework!r}")
    if "steps" not in values:
        raise UsageError(f"{where}.steps", "required: the window of steps to profile, \"A-B\"")
    window = step_window(values["steps"], f"{where}.steps", "at most "
                         f"{MAX_PROFILED_STEPS} steps")
    if window is None:
        raise UsageError(f"{where}.steps", "must be a string \"A-B\" (steps A to B), not "
                         f"{toml_type(values['steps'])}")
    first, last = window
    if last - first + 1 > MAX_PROFILED_STEPS:
        raise UsageError(f"{where}.steps", f"{last - first + 1} steps is too many (at most "
                         f"{MAX_PROFILED_STEPS}: the profiler holds the window in memory)")
    if last >= steps:
        raise UsageError(f"{where}.steps", f"step {last} is past the run's last step "
                         f"({steps - 1})")
    summarised = set(range(warmup_steps, steps)) - set(range(first, last + 2))
    if not summarised:
        raise UsageError(f"{where}.steps", f"{first}-{last} leaves no step after warm-up "
                         "unprofiled for the summaries (the window and the step after it are "
                         "left out of them)")
    return ProfileSpec(first, last, _ranks(values.get("ranks", "all"), world_size,
                                           f"{where}.ranks"))


def _ranks(raw: Any, world_size: int, where: str) -> tuple[int, ...] | None:
    if raw == "all":
        return None
    if not isinstance(raw, list) or not raw:
        raise UsageError(where, f"\"all\" or a list of ranks (0 to {world_size - 1})")
    ranks = tuple(integer(r, where, 0, world_size - 1) for r in raw)
    if len(set(ranks)) != len(ranks):
        raise UsageError(where, f"{list(ranks)} names a rank twice")
    return tuple(sorted(ranks))


def profile_from_dict(data: dict[str, Any] | None) -> ProfileSpec | None:
    """The inverse of asdict(ProfileSpec) (run.json keeps it)."""
    if not data:
        return None
    ranks = data.get("ranks")
    return ProfileSpec(int(data["first"]), int(data["last"]),
                       None if ranks is None else tuple(ranks))
