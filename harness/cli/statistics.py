"""The statistics options `hetbench compare` and `hetbench ci` share, and the settings
they make: unpaired (compare's groups, analysis/tables/compare.py) or paired (ci's rounds,
analysis/tables/paired.py)."""

from __future__ import annotations

import argparse
import fnmatch
import math
from typing import Any

from hetbench.harness.cli import launches
from hetbench.harness.spec.errors import UsageError

DEFAULT_THRESHOLD = 0.10
DEFAULT_ALPHA = 0.002
# paired rounds: the gate metrics move a few percent from launch to launch (not 15%), and
# Bonferroni over a handful of them (not Holm over 23 at 0.002) is what their claim needs
PAIRED_THRESHOLD = 0.05
PAIRED_ALPHA = 0.05


def add_statistics_arguments(parser: argparse.ArgumentParser, gate: str = "") -> None:
    """compare's options; with `gate` (the gate metrics, comma-separated), `hetbench ci`'s:
    paired rounds, no choice of launches (a gate's folder is its rounds)."""
    paired = f"paired: {PAIRED_THRESHOLD}" if not gate else "the gate's"
    parser.add_argument("--threshold", type=float, default=None,
                        help="smallest relative change that counts, as a factor 1 + X "
                             f"(default {DEFAULT_THRESHOLD if not gate else PAIRED_THRESHOLD}"
                             f"{'; ' + paired if not gate else ''})")
    parser.add_argument("--metric-threshold", action="append", default=[],
                        metavar="NAME=X",
                        help="threshold for one metric (NAME may be a pattern: phase_*=0.3); "
                             "repeatable")
    parser.add_argument("--alpha", type=float, default=None,
                        help="family-wise significance level: unpaired Holm-corrected over "
                             f"the metrics (default {DEFAULT_ALPHA}), paired Bonferroni over "
                             f"the gate metrics (default {PAIRED_ALPHA})")
    parser.add_argument("--metrics", default="",
                        help="comma-separated metric names or patterns: "
                             + (f"the gate metrics (default: {gate})" if gate else
                                "those compared (default: all; paired: the gate metrics, "
                                "cpu_per_sample_us,compute_busy_ms)"))
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    if not gate:
        launches.add_arguments(parser)
    parser.add_argument("--all", action="store_true", dest="show_all",
                        help="list every metric (default: only those that changed or could "
                             "not be shown unchanged" + (", and the gate's" if gate else "")
                             + ")")


def settings_from(args: argparse.Namespace) -> Any:
    from hetbench.analysis.tables.compare import Settings

    threshold, alpha = threshold_and_alpha(args, DEFAULT_THRESHOLD, DEFAULT_ALPHA)
    return Settings(threshold=threshold, metric_thresholds=metric_thresholds(args),
                    alpha=alpha, metrics=metric_patterns(args.metrics))


def threshold_and_alpha(args: argparse.Namespace, threshold: float, alpha: float
                        ) -> tuple[float, float]:
    """--threshold and --alpha, checked; the defaults given where they are not."""
    threshold = threshold if args.threshold is None else args.threshold
    alpha = alpha if args.alpha is None else args.alpha
    if not (math.isfinite(threshold) and threshold >= 0):
        raise UsageError("--threshold", f"{threshold} is not allowed (a number >= 0)")
    if not (0 < alpha < 1):
        raise UsageError("--alpha", f"{alpha} is not allowed (between 0 and 1)")
    return threshold, alpha


def metric_patterns(text: str) -> tuple[str, ...]:
    """--metrics: comma-separated names or patterns, each matching some metric."""
    from hetbench.analysis.tables.compare import DIRECTIONS

    patterns = tuple(p.strip() for p in text.split(",") if p.strip())
    for pattern in patterns:
        check_pattern(pattern, "--metrics", ", ".join(DIRECTIONS))
    return patterns


def metric_thresholds(args: argparse.Namespace) -> tuple[tuple[str, float], ...]:
    """--metric-threshold NAME=X, checked."""
    from hetbench.analysis.tables.compare import DIRECTIONS

    known = ", ".join(DIRECTIONS)
    pairs = []
    for item in args.metric_threshold:
        name, sep, value = item.partition("=")
        try:
            threshold = float(value)
        except ValueError:
            threshold = math.nan
        if not sep or not name or not (math.isfinite(threshold) and threshold >= 0):
            raise UsageError("--metric-threshold", f"{item!r} is not NAME=X with X >= 0")
        check_pattern(name, "--metric-threshold", known)
        pairs.append((name, threshold))
    return tuple(pairs)


def check_pattern(pattern: str, where: str, known: str) -> None:
    from hetbench.analysis.tables.compare import DIRECTIONS

    if not any(fnmatch.fnmatchcase(name, pattern) for name in DIRECTIONS):
        raise UsageError(where, f"{pattern!r} matches no metric (metrics: {known})")


def paired_settings(args: argparse.Namespace, metrics: str) -> Any:
    """PairedSettings from the shared statistics options (compare.add_statistics_arguments);
    `metrics`: the gate metrics where --metrics is not given."""
    from hetbench.analysis.tables.paired import PairedSettings

    threshold, alpha = threshold_and_alpha(args, PAIRED_THRESHOLD, PAIRED_ALPHA)
    return PairedSettings(threshold=threshold, alpha=alpha,
                          gate=metric_patterns(args.metrics or metrics),
                          metric_thresholds=metric_thresholds(args))


def plain(value: Any) -> Any:
    """JSON-safe scalars: numpy types to Python, NaN and infinities to null."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
