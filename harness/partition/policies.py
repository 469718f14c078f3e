"""Batch partitioning: which contiguous slice of the global batch each worker computes.

A partition is a tuple of slice sizes in rank order that sums to the global batch. A slice
is at least 1, except that a worker may be left out (0: it computes nothing and takes no
part in the exchange). It never changes the mathematics (DESIGN.md principle 4), only who
computes what.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, Protocol

# name -> description. Static policies are functions of the configuration (and, for
# 'profiled', of solo timings); adaptive ones are the Repartitioner below.
POLICIES: dict[str, str] = {
    "equal": "global batch split as evenly as possible",
    "sizes": "explicit slice sizes, one per worker",
    "weights": "sizes in proportion to given weights",
    "profiled": "each worker timed alone at two slice sizes, fixed and per-sample cost "
                "fitted, sizes that finish together",
}


# the static policies that time each worker alone before the first step (the loop measures
# their solo throughput; a scheme that runs no hetbench loop cannot)
MEASURED = ("profiled",)


class SliceSpec(Protocol):
    """The fields of a run's partition (hetbench.harness.spec.partitions.PartitionSpec) that choose
    the first slices."""

    @property
    def policy(self) -> str: ...

    @property
    def sizes(self) -> tuple[int, ...] | None: ...

    @property
    def weights(self) -> tuple[float, ...] | None: ...

    @property
    def initial(self) -> str: ...


def measures(spec: SliceSpec) -> bool:
    """The first slices need each worker's solo throughput, measured before step 0."""
    first = spec.initial if spec.policy in ADAPTIVE else spec.policy
    return first in MEASURED


def fixed_policies() -> list[str]:
    """The policies whose slices follow from the configuration alone."""
    return [p for p in POLICIES if p not in ADAPTIVE and p not in MEASURED]


def initial_sizes(spec: SliceSpec, total: int, units: int,
                  lines: Sequence[tuple[float, float]] | None = None,
                  minimum: int = 1) -> tuple[int, ...]:
    """The first slices of `units` workers (or virtual workers) under a partition: a
    static policy's, or an adaptive one's start (equal or profiled); `lines`: each worker's
    solo compute time a + b*n (ns) where the policy `measures` (`solo_line`); `minimum`:
    the smallest slice a measured policy may give (2 for a model whose BatchNorm takes a
    slice's statistics)."""
    first = spec.initial if spec.policy in ADAPTIVE else spec.policy
    if first == "sizes":
        return tuple(spec.sizes or ())
    if first == "weights":
        return largest_remainder(total, spec.weights or ())
    if first in MEASURED:
        assert lines is not None, f"policy {first!r} needs the workers' measured lines"
        return profiled_sizes(total, lines, minimum)
    return equal_sizes(total, units)


def largest_remainder(total: int, weights: Sequence[float], minimum: int = 1) -> tuple[int, ...]:
    """Integer sizes summing exactly to total, proportional to weights, each >= minimum.

    Quotas are rounded by the largest-remainder (Hamilton) method, ties going to the lower
    rank so every rank computes the same answer; a slice below the minimum is then topped
    up one sample at a time from the largest slice.
    """
    n = len(weights)
    if n == 0:
        raise ValueError("no workers")
    if total < n * minimum:
        raise ValueError(f"total {total} cannot give {n} workers at least {minimum} each")
    if not all(math.isfinite(w) and w >= 0 for w in weights) or sum(weights) <= 0:
        raise ValueError(
            f"weights must be finite and non-negative with a positive sum: {list(weights)}"
        )
    weight_sum = float(sum(weights))
    quotas = [total * w / weight_sum for w in weights]
    sizes = [int(q) for q in quotas]
    leftover = total - sum(sizes)
    by_remainder = sorted(range(n), key=lambda i: (-(quotas[i] - sizes[i]), i))
    for i in by_remainder[:leftover]:
        sizes[i] += 1
    for i in range(n):
        while sizes[i] < minimum:
            donor = max(range(n), key=lambda j: (sizes[j], -j))
            sizes[donor] -= 1
            sizes[i] += 1
    return tuple(sizes)


def equal_sizes(total: int, n: int) -> tuple[int, ...]:
    return largest_remainder(total, [1.0] * n)


def probe_sizes(total: int, units: int) -> tuple[int, int]:
    """The two slices the `profiled` policy times each worker at: half and one and a half
    its equal share, which bracket where a slower and a faster worker end up, so the fitted
    lines are used between the points they were measured at, not far beyond them."""
    share = total / units
    small = max(1, round(share / 2))
    return small, min(total, max(small + 1, round(share * 1.5)))


def solo_line(points: Sequence[tuple[int, float]]) -> tuple[float, float]:
    """(a, b) of a worker's compute time t = a + b*n (ns) through its solo timings (n, t);
    a negative intercept or slope (noise) falls back to the line through the origin and the
    timings' mean, as the adaptive `model` policy's fit does."""
    stats = WindowStats(float(len(points)), float(sum(n for n, _ in points)),
                        float(sum(t for _, t in points)), float(sum(n * n for n, _ in points)),
                        float(sum(n * t for n, t in points)))
    return fit_line(stats)


def profiled_sizes(total: int, lines: Sequence[tuple[float, float]], minimum: int = 1
                   ) -> tuple[int, ...]:
    """The `profiled` policy: the slices with which every worker's fitted solo compute
    a_i + b_i n_i ends at the same time. In proportion to throughput alone (a_i = 0) a
    step's fixed cost (launch, set-up, kernel overheads) unbalanced them: a 3x slower worker
    pays three times the fixed cost too, on a slice that is a third (the quick suite's
    profiled pairs idled 18.0% (MLP) and 20.5% (CNN) of worker time that way, 8.6% and 7.6%
    this way: docs/measurements.md)."""
    target = equal_finish(total, lines, minimum)
    if target is None:
        raise ValueError(f"solo lines {list(lines)} have a slope that is not positive")
    return largest_remainder(total, target, minimum)


def slice_bounds(sizes: Sequence[int]) -> list[tuple[int, int]]:
    bounds, start = [], 0
    for size in sizes:
        bounds.append((start, start + size))
        start += size
    return bounds


# -- adaptive repartitioning ----------------------------------------------------------------

ADAPTIVE = ("proportional", "model")
POLICIES.update({
    "proportional": "every k steps, sizes in proportion to a moving average of each "
                    "worker's per-sample rate",
    "model": "every k steps, fit compute = a + b*n per worker online and solve for equal "
             "finish times",
})


@dataclass(frozen=True)
class WindowStats:
    """One worker's compute measurements over the last window: sums over its steps of the
    slice size n and compute time t (ns), for least squares. Idle and communication time
    are never in t: t = ready - begin."""

    count: float = 0.0
    n: float = 0.0
    t: float = 0.0
    nn: float = 0.0
    nt: float = 0.0

    def as_list(self) -> list[float]:
        return [self.count, self.n, self.t, self.nn, self.nt]

    @classmethod
    def of(cls, values: Sequence[float]) -> WindowStats:
        return cls(*values)

    def __add__(self, other: WindowStats) -> WindowStats:
        return WindowStats(self.count + other.count, self.n + other.n, self.t + other.t,
                           self.nn + other.nn, self.nt + other.nt)

    def aged(self, factor: float, window: WindowStats) -> WindowStats:
        """These sums weighted by `factor`, plus the window's: self.scaled(factor) + window
        in one step (the policy does it for every worker at every update)."""
        return WindowStats(factor * self.count + window.count, factor * self.n + window.n,
                           factor * self.t + window.t, factor * self.nn + window.nn,
                           factor * self.nt + window.nt)

    def scaled(self, factor: float) -> WindowStats:
        return WindowStats(factor * self.count, factor * self.n, factor * self.t,
                           factor * self.nn, factor * self.nt)

    @property
    def mean_t(self) -> float:
        return self.t / self.count if self.count else math.nan

    @property
    def var_n(self) -> float:
        """The variance of the slice sizes summed (0 when every step had the same)."""
        return self.nn / self.count - (self.n / self.count) ** 2 if self.count else 0.0

    def spread(self) -> bool:
        """Slices differed by about a sample or more: a line fitted on these sums tells
        the fixed cost from the per-sample one."""
        return self.var_n > 0.25

    def wide(self) -> bool:
        """The slices' spread is a fifth of their mean or more (32 and 64 samples: a
        third): a line fitted on them is trusted beyond them, which a line through sizes a
        sample or two apart is not (its intercept is mostly noise)."""
        return self.count > 0 and math.sqrt(max(self.var_n, 0.0)) >= 0.2 * self.n / self.count


class Window:
    """This worker's (n, t) pairs since the last update; cheap to add to every step."""

    def __init__(self) -> None:
        self.sums = [0.0] * 5

    def add(self, n: int, t_ns: int) -> None:
        s = self.sums
        s[0] += 1.0
        s[1] += n
        s[2] += t_ns
        s[3] += n * n
        s[4] += n * t_ns

    def take(self) -> WindowStats:
        out, self.sums = WindowStats(*self.sums), [0.0] * 5
        return out


@dataclass(frozen=True)
class Damping:
    every: int = 10           # steps between updates
    dead_band: float = 0.05   # no change while the window's imbalance is below this
    max_move: float = 0.25    # a slice moves by at most this fraction of the global batch
    min_slice: int = 1
    smoothing: float = 0.5    # weight of the newest window in the moving averages
    # A slice at most doubles or halves per update: a line fitted to the sizes seen so far
    # is not trusted far from them (measured: without it the model policy jumped a slice
    # from 44 to 1 sample on a noisy fit, and back to 47 ten steps later).
    max_ratio: float = 2.0
    # A window whose compute differs from what the history predicts by more than this
    # fraction means the worker changed speed: forget the history and start from the new
    # window, instead of averaging the old speed in for several updates.
    reset: float = 0.3

    @classmethod
    def of(cls, settings: Any) -> Damping:
        """From a suite's PartitionSpec or the partition dict in a manifest; a setting
        that is absent (a run recorded before it existed) keeps its default."""
        get = settings.get if isinstance(settings, Mapping) else \
            lambda name, default: getattr(settings, name, default)
        values: dict[str, Any] = {f.name: get(f.name, f.default) for f in fields(cls)}
        return cls(**values)


class FitsByCount:
    """Each worker's decayed sums, one set per number of workers computing together (the
    set of k + 1 workers: `at(k)`), each set made when first used: a full table for 1,024
    workers would hold a million entries, almost none ever read. A set made late starts
    from `base`: what a change of speed wrote into every set (empty until then)."""

    def __init__(self, world: int) -> None:
        self.world = world
        self.base = [WindowStats()] * world
        self.sets: dict[int, list[WindowStats]] = {}

    def at(self, k: int) -> list[WindowStats]:
        """The set of k + 1 workers, made now if it was not (the list itself: updated in
        place)."""
        if k not in self.sets:
            self.sets[k] = list(self.base)
        return self.sets[k]

    def get(self, k: int, i: int) -> WindowStats:
        found = self.sets.get(k)
        return (self.base if found is None else found)[i]

    def set_everywhere(self, i: int, stats: WindowStats) -> None:
        self.base[i] = stats
        for fits in self.sets.values():
            fits[i] = stats

    def measured(self, i: int) -> bool:
        """Worker i computed beside some number of workers."""
        return self.base[i].count > 0 or any(f[i].count > 0 for f in self.sets.values())

    def nearest(self, i: int, k: int) -> int:
        """The set nearest k (ties: the larger) in which worker i was measured; k when
        none. (Sums once measured stay measured: a set's entry that is empty now never
        had a speed change written into it, so `base`'s is empty too.)"""
        if self.get(k, i).count > 0:
            return k
        measured = [j for j, fits in self.sets.items() if fits[i].count > 0]
        if self.base[i].count > 0:
            measured += [j for j in range(self.world) if j not in self.sets]
        return min(measured, key=lambda j: (abs(j - k), -j), default=k)

    def values(self) -> list[float]:
        """Every set's sums, k by k, worker by worker (Repartitioner.state)."""
        return [v for k in range(self.world) for i in range(self.world)
                for v in self.get(k, i).as_list()]

    def load(self, values: Sequence[float]) -> None:
        """What `values` wrote, into every set (in place: the lists in use stay the ones
        used)."""
        width = len(WindowStats().as_list())
        for k in range(self.world):
            at = k * self.world * width
            self.at(k)[:] = [WindowStats.of(values[at + i * width:at + (i + 1) * width])
                             for i in range(self.world)]
        self.base = [WindowStats()] * self.world  # every set is made: none starts from it


class Repartitioner:
    """The adaptive policies. Every rank holds one, feeds it the same all-gathered window
    statistics and so computes the same new partition, with no extra coordination.

    With `leave_out` (policy 'model' only) a worker may get an empty slice: it is kept only
    while the step predicted with it is shorter than without it (`membership`). A worker
    left out computes nothing, so its window is empty and its fitted line stays as it was
    last measured; it rejoins when the others' lines say it would pay for itself again."""

    def __init__(self, policy: str, total: int, world: int, damping: Damping,
                 prior_intercepts_ns: Sequence[float] | None = None,
                 leave_out: bool = False) -> None:
        if policy not in ADAPTIVE:
            raise ValueError(f"{policy!r} is not an adaptive policy ({', '.join(ADAPTIVE)})")
        if leave_out and policy != "model":
            raise ValueError("leave_out needs the 'model' policy (fitted lines predict the "
                             "step with and without a worker)")
        self.policy, self.total, self.world, self.damping = policy, total, world, damping
        self.leave_out = leave_out
        self.rates: list[float] | None = None  # proportional: samples per ns, smoothed
        # model: decayed sums per worker, one set per number of workers computing
        # together (by_count.at(k - 1): while k computed). On a shared host a worker computes
        # slower beside others than alone, so a line measured alone does not predict it
        # beside them (measured: a 2x slower partner predicted to save 10% cost 28%).
        # Without leave_out only the set of `world` is ever used.
        self.by_count = FitsByCount(world)
        self.fits = self.by_count.at(world - 1)  # those of the current number of members
        self.prior_a = list(prior_intercepts_ns or [0.0] * world)
        # What a step of two or more workers costs beyond their slowest one's fitted
        # compute: the exchange, and the cost of variability (the latest of several noisy
        # workers arrives later than the typical one). Measured while two or more compute
        # (smoothed over windows); a lone worker pays neither.
        self.excess_ns = math.nan
        # How often each worker was left out: taking one back on a line measured before
        # (against the others' lines since) is a guess, so it needs twice the dead band,
        # and twice more each time it was left out again (no flapping in and out on a
        # machine whose speed drifts).
        self.times_left_out = [0] * world

    def update(self, sizes: Sequence[int], windows: Sequence[WindowStats],
               synchronized_ns: Sequence[float] | None = None
               ) -> tuple[tuple[int, ...], str] | None:
        """New sizes and the reason, or None to keep the current partition.
        `synchronized_ns`: each worker's mean time from a step's begin to the reduced sums
        over the window (NaN where it computed nothing), which membership decisions need."""
        alpha, reset = self.damping.smoothing, self.damping.reset
        changed: list[int] = []
        if self.policy == "proportional":
            fresh = [w.n / w.t if w.t > 0 else 0.0 for w in windows]
            if self.rates is None:
                self.rates = fresh
            else:
                changed = [i for i, (f, r) in enumerate(zip(fresh, self.rates, strict=True))
                           if r > 0 and abs(f / r - 1) > reset]
                reset_ones = set(changed)
                self.rates = [f if i in reset_ones else alpha * f + (1 - alpha) * r
                              for i, (f, r) in enumerate(zip(fresh, self.rates, strict=True))]
        else:
            self.fits = self.by_count.at(sum(1 for n in sizes if n > 0) - 1)
            for i, (history, window) in enumerate(zip(self.fits, windows, strict=True)):
                predicted = predict(history, self.prior_a[i], window)
                if window.count and predicted > 0 and predicts_at(history, window) \
                        and abs(window.mean_t / predicted - 1) > reset:
                    changed.append(i)
            reset_ones = set(changed)
            # a worker that computed nothing this window (left out) keeps its line
            self.fits[:] = [history if window.count <= 0 else
                            window if i in reset_ones else history.aged(1 - alpha, window)
                            for i, (history, window)
                            in enumerate(zip(self.fits, windows, strict=True))]
            for i in changed:  # a new speed is the best guess beside any number of workers
                self.by_count.set_everywhere(i, windows[i])
        members = [i for i, size in enumerate(sizes) if size > 0]
        if self.leave_out:
            if len(members) > 1 and synchronized_ns is not None:
                self._measure_excess(sizes, members, synchronized_ns)
            if (decided := self.membership(members)) is not None:
                joined, reason = decided
                return self._sizes_for(joined), reason
        means = [windows[i].mean_t for i in members]
        imbalance = max(means) / (sum(means) / len(means)) - 1.0
        if imbalance < self.damping.dead_band:
            return None
        target = self._target(members)
        if target is None:
            return None
        # a slice at most doubles or halves per update, but where the worker's line was
        # fitted on sizes wide apart (model): there it moves to the target at once
        ratios = [math.inf if self.policy == "model" and self.fits[i].wide()
                  else self.damping.max_ratio for i in members]
        moved = limit_moves([sizes[i] for i in members], target,
                            self.damping.max_move * self.total, self.damping.min_slice,
                            self.total, ratios)
        new = [0] * len(sizes)
        for i, size in zip(members, moved, strict=True):
            new[i] = size
        if tuple(new) == tuple(sizes):
            return None
        speed = f", speed changed on worker(s) {changed}" if changed else ""
        return tuple(new), f"{self.policy}: imbalance {imbalance:.1%}{speed}, target " \
                           f"{[round(x, 1) for x in target]}"

    def early_update_step(self) -> int | None:
        """The step after which the first update comes, half a window early (None: at the
        first window's end): `early_update_step(every)`."""
        return early_update_step(self.damping.every)

    def state(self) -> list[float]:
        """What a worker taken back needs to compute the same partitions as the others
        from then on (policy 'model': the excess, how often each worker was left out, and
        the decayed sums of every context)."""
        return [self.excess_ns, *map(float, self.times_left_out),
                *self.by_count.values()]

    def load_state(self, values: Sequence[float]) -> None:
        self.excess_ns = float(values[0])
        self.times_left_out = [int(v) for v in values[1:1 + self.world]]
        self.by_count.load(values[1 + self.world:])

    def _measure_excess(self, sizes: Sequence[int], members: Sequence[int],
                        synchronized_ns: Sequence[float]) -> None:
        measured = [synchronized_ns[i] for i in members if math.isfinite(synchronized_ns[i])]
        if not measured:
            return
        lines = self._lines()
        slowest = max(lines[i][0] + lines[i][1] * sizes[i] for i in members)
        if not math.isfinite(slowest):
            return
        fresh = max(max(measured) - slowest, 0.0)
        alpha = self.damping.smoothing
        self.excess_ns = fresh if math.isnan(self.excess_ns) else \
            alpha * fresh + (1 - alpha) * self.excess_ns

    def _lines(self, count: int | None = None) -> list[tuple[float, float]]:
        """Each worker's line while `count` workers compute (default: as many as now);
        where it never computed beside that many, the line of the nearest count it did."""
        return [fit_line(f, prior) for f, prior in zip(self._fits(count), self.prior_a,
                                                       strict=True)]

    def _fits(self, count: int | None) -> list[WindowStats]:
        if count is None:
            return self.fits
        table = self.by_count
        return [table.get(table.nearest(i, count - 1), i) for i in range(self.world)]

    def _target(self, members: Sequence[int]) -> list[float] | None:
        """The members' target slice sizes, in member order."""
        if self.policy == "proportional":
            assert self.rates is not None
            rates = [self.rates[i] for i in members]
            total_rate = sum(rates)
            return [self.total * r / total_rate for r in rates] if total_rate > 0 else None
        lines = self._lines(len(members))
        return equal_finish(self.total, [lines[i] for i in members], self.damping.min_slice)

    def predicted_step_ns(self, members: Sequence[int]) -> float:
        """The step these members would take up to the reduced sums: their equal-finish
        compute time, plus the measured excess of a step of several workers (exchange and
        variability), none when one worker computes alone (no exchange, no one to wait
        for)."""
        every = self._fits(len(members))
        fits = [every[i] for i in members]
        lines = [fit_line(f, self.prior_a[i]) for f, i in zip(fits, members, strict=True)]
        sizes = equal_finish(self.total, lines, self.damping.min_slice)
        if sizes is None:
            return math.inf
        # Beyond the slices a line was fitted on, its intercept is a guess (fitted on a
        # narrow range of slices it can be anything): there the line through the origin
        # is taken where it predicts more, so that no worker is left out (or kept) on the
        # strength of an extrapolated fixed cost.
        careful = [through_origin(f) if f.count > 0 and n > f.n / f.count
                   and through_origin(f)[1] * n > a + b * n else (a, b)
                   for f, (a, b), n in zip(fits, lines, sizes, strict=True)]
        finish = finish_time(self.total, careful, self.damping.min_slice)
        return finish + (0.0 if len(members) == 1 else self.excess_ns)

    def membership(self, members: Sequence[int]) -> tuple[tuple[int, ...], str] | None:
        """The rule: keep a worker only if the step predicted with it is shorter than
        without it. One worker at a time is left out or taken back (or every member but
        one left out at once), greedily, while the prediction improves by more than the dead
        band (no flapping on noise); taking back a worker left out k times needs 2^k dead
        bands."""
        if not math.isfinite(self.excess_ns):
            return None  # no step of several workers measured: nothing to weigh one against
        alone = self._lines(1)
        known = [i for i in range(self.world)
                 if self.by_count.measured(i) and alone[i][1] > 0]
        current = tuple(members)
        best, best_ns = current, self.predicted_step_ns(current)
        start_ns = best_ns
        band = self.damping.dead_band
        for _ in range(self.world):
            options = [(tuple(m for m in best if m != i), band)
                       for i in best if len(best) > 1]
            # A lone worker pays no exchange, which one removal at a time cannot reach: with
            # two CPU workers at their minimum slices beside a GPU, leaving out either moves
            # its samples to the GPU and keeps the exchange (predicted slower), while leaving
            # out both saves the whole exchange (measured on an H200: the GPU alone 4.3 ms a
            # step, with both CPUs kept at 2 samples each 12.7 ms).
            options += [((i,), band) for i in best if len(best) > 2]
            options += [(tuple(sorted((*best, j))),
                         band * 2.0 ** self.times_left_out[j])
                        for j in known if j not in best]
            scored = [(predicted, option) for option, margin in options
                      if all(i in known for i in option)
                      and (predicted := self.predicted_step_ns(option)) < best_ns * (1 - margin)]
            if not scored:
                break
            best_ns, best = min(scored)
        if best == current:
            return None
        out = sorted(set(current) - set(best))
        back = sorted(set(best) - set(current))
        for i in out:
            self.times_left_out[i] += 1
        what = "; ".join(part for part in (f"left out worker(s) {out}" if out else "",
                                           f"took back worker(s) {back}" if back else "")
                         if part)
        return best, (f"model: {what}: predicted step {best_ns / 1e6:.3f} ms against "
                      f"{start_ns / 1e6:.3f} ms (a step of several workers costs "
                      f"{self.excess_ns / 1e6:.3f} ms beyond their compute)")

    def _sizes_for(self, members: Sequence[int]) -> tuple[int, ...]:
        """The equal-finish slices of these members, zero for the others: a membership
        change moves straight to its target (it was decided past the dead band)."""
        target = self._target(members)
        assert target is not None  # members have fitted lines (membership checks)
        sizes = largest_remainder(self.total, target, self.damping.min_slice)
        out = [0] * self.world
        for i, size in zip(members, sizes, strict=True):
            out[i] = size
        return tuple(out)


def early_update_step(every: int) -> int | None:
    """The step after which an adaptive policy's first update comes: half a window early
    (None: at the window's end, as every other). One slice size fits no fixed cost, so the
    first update moves only part of the way (the proportional target), and the second is
    the first whose lines span two sizes: early, the run reaches it half a window sooner.
    A window under 4 steps keeps too few steps for half of it (the first step at a size
    is not measured)."""
    return every // 2 - 1 if every >= 4 else None


def update_ends(every: int, steps: int) -> list[int]:
    """The number of steps taken when each update of a run of `steps` comes (what the
    loop does, for the replays and the simulator): the early first, then every window's
    end."""
    early = early_update_step(every)
    ends = [] if early is None else [early + 1]
    return ends + list(range(every, steps, every))


def predict(history: WindowStats, prior_a: float, window: WindowStats) -> float:
    """The history's fitted compute time at the window's mean slice; NaN without history."""
    if history.count <= 0 or window.count <= 0:
        return math.nan
    a, b = fit_line(history, prior_a)
    return a + b * window.n / window.count


def predicts_at(history: WindowStats, window: WindowStats) -> bool:
    """The history's line can be held against the window to tell a change of speed: it
    was fitted on two or more slice sizes, or on the window's own. A line of one size says
    nothing of another's cost (its intercept is the prior's guess): a window at a new size
    is its second point, not a new speed (measured: taken for one, every move from equal
    slices threw the first size away and the next update was proportional again, so a 3x
    slower worker's slice walked 64, 32, 19, 13, 10, 5, 3 over 60 steps:
    docs/measurements.md)."""
    if history.count <= 0 or window.count <= 0:
        return False
    return history.spread() or abs(history.n / history.count - window.n / window.count) < 1.0


def fit_line(s: WindowStats, prior_a: float = 0.0) -> tuple[float, float]:
    """(a, b) of t = a + b*n by least squares; with too little spread in n to tell the
    intercept from the slope, the intercept is the prior (0, or a profiled value)."""
    if s.count <= 0 or s.n <= 0:
        return prior_a, math.nan
    mean_n, mean_t = s.n / s.count, s.t / s.count
    if s.spread():
        b = (s.nt / s.count - mean_n * mean_t) / s.var_n
        a = mean_t - b * mean_n
        if b > 0 and a >= 0:
            return a, b
    a = min(prior_a, 0.9 * mean_t)
    return a, (mean_t - a) / mean_n


def equal_finish(total: int, lines: Sequence[tuple[float, float]], minimum: int
                 ) -> list[float] | None:
    """Real slice sizes n_i summing to total with a_i + b_i n_i equal for all workers (the
    closed form T = (total + sum a_i/b_i) / sum 1/b_i), workers pinned at the minimum
    where their share would fall below it."""
    if any(not (b > 0) for _, b in lines):
        return None
    free = list(range(len(lines)))
    sizes = [float(minimum)] * len(lines)
    while free:
        budget = total - minimum * (len(lines) - len(free))
        finish = (budget + sum(lines[i][0] / lines[i][1] for i in free)) / sum(
            1.0 / lines[i][1] for i in free)
        shares = {i: (finish - lines[i][0]) / lines[i][1] for i in free}
        low = [i for i, n in shares.items() if n < minimum]
        if not low:
            for i, n in shares.items():
                sizes[i] = n
            return sizes
        free = [i for i in free if i not in low]
    return None


def through_origin(s: WindowStats) -> tuple[float, float]:
    """The line t = b*n through the origin and the window's mean."""
    return 0.0, (s.t / s.n if s.n > 0 else math.nan)


def finish_time(total: int, lines: Sequence[tuple[float, float]], minimum: int) -> float:
    """When the last of these workers finishes its equal-finish slice (ns)."""
    sizes = equal_finish(total, lines, minimum)
    if sizes is None:
        return math.inf
    return max(a + b * n for (a, b), n in zip(lines, sizes, strict=True))


def limit_moves(old: Sequence[int], target: Sequence[float], max_delta: float,
                minimum: int, total: int, max_ratio: float | Sequence[float] = math.inf
                ) -> tuple[int, ...]:
    """Integer sizes near `target` that move each slice by at most max_delta from `old`
    (at least one sample) and by at most a factor max_ratio (one for all, or one per
    slice), never below `minimum`, and sum exactly to total."""
    step = max(1.0, max_delta)
    ratios = [float(max_ratio)] * len(old) if isinstance(max_ratio, (int, float)) \
        else list(max_ratio)
    lower = [max(float(minimum), min(o - 1.0, max(o - step, o / r)))
             for o, r in zip(old, ratios, strict=True)]
    upper = [max(o + 1.0, min(o + step, o * r)) for o, r in zip(old, ratios, strict=True)]
    clipped = [min(max(t, lo), hi) for t, lo, hi in zip(target, lower, upper, strict=True)]
    # Clipping can break the sum: share the difference over the slices with room left.
    for _ in range(len(old)):
        gap = total - sum(clipped)
        if abs(gap) < 1e-9:
            break
        room = [(hi - c) if gap > 0 else (c - lo)
                for c, lo, hi in zip(clipped, lower, upper, strict=True)]
        spare = sum(room)  # once: inside the comprehension it made this O(workers^2)
        if spare <= 0:
            break
        clipped = [c + gap * r / spare for c, r in zip(clipped, room, strict=True)]
    return largest_remainder(total, clipped, minimum)
