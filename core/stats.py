"""The statistics of every comparison: percentiles and seeded bootstrap intervals.

One module, used by `compare`/`decide` (intervals over a step's requests and over rounds)
and by the SLO arithmetic (`core.slo`). The random generator is seeded, so the same
samples always give the same interval.

A measurement is a list of rounds, each a list of per-request samples in the order they
were sent; its figure is the median over rounds of the statistic of each round (as a step's
headline figure is the median of its rounds). Requests of one round are not independent:
the `wave` requests sent together share the engine's batches (a warm-up wave is slow as a
whole), and a round shares the engine's state. So one bootstrap resample is hierarchical:
it draws the rounds with replacement (when there are several), then the waves of each drawn
round as blocks, then the requests of each drawn wave, and takes that figure. The interval
covers the spread between rounds, between waves and between requests.

A run of fewer than `FULL_ROUNDS` rounds cannot see how much a whole round moves (one round
shows no round-to-round spread, two show a poor estimate of it): `resolvable` is the smallest
difference such a run calls (`core.thresholds.RESOLVABLE_DIFFERENCE`, from the simulation of
`diagnose.switch_noise`), and nothing smaller is called.
"""

from __future__ import annotations

import bisect
import math
import random
import statistics
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from core.thresholds import COMPARE_NOISE_FLOOR, FULL_ROUNDS, RESOLVABLE_DIFFERENCE

# Resamples per interval: the 2.5/97.5 % quantiles of 2000 resamples move by well under
# 1 % from seed to seed at the request counts of a step.
BOOTSTRAP_RESAMPLES = 2000
# Two-sided confidence of every interval.
CONFIDENCE = 0.95
# The seed of every bootstrap: results are reproducible run to run.
SEED = 0

T = TypeVar("T")


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (q in 0..100) of unsorted values; None when empty."""
    if not values:
        return None
    data = sorted(values)
    pos = (len(data) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = math.ceil(pos)
    if lo == hi:
        return data[lo]
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


@dataclass(frozen=True)
class Interval:
    """A figure and its bootstrap interval (`lo`..`hi`, at `CONFIDENCE`)."""

    value: float
    lo: float
    hi: float

    def scaled(self, k: float) -> Interval:
        """The same interval in other units (or centred on another estimator of the figure)."""
        return Interval(self.value * k, self.lo * k, self.hi * k)

    def text(self, fmt: str = ".3g") -> str:
        """`6.7 [5.9–7.6]`."""
        return f"{self.value:{fmt}} [{self.lo:{fmt}}–{self.hi:{fmt}}]"


def relative_spread(values: Sequence[float]) -> float | None:
    """(max - min) / median of the rounds; None with fewer than two rounds."""
    if len(values) < 2:
        return None
    med = statistics.median(values)
    return (max(values) - min(values)) / med if med > 0 else None


def resolvable(rounds: int, floor: float = COMPARE_NOISE_FLOOR) -> float:
    """The smallest relative difference a run of `rounds` rounds calls (the noise floor from
    `FULL_ROUNDS` on; larger below, where the run cannot see a round's own noise)."""
    if rounds >= FULL_ROUNDS:
        return floor
    return max(floor, RESOLVABLE_DIFFERENCE[max(1, rounds)])


def waves(samples: Sequence[T], wave: int) -> list[Sequence[T]]:
    """The samples (in the order sent) cut into consecutive waves of `wave` (the last may be
    shorter): the requests that ran side by side in one batch."""
    size = max(1, wave)
    return [samples[i : i + size] for i in range(0, len(samples), size)]


class Bootstrap(Generic[T]):
    """Seeded hierarchical resampling: rounds, then waves of `wave` requests, then requests."""

    def __init__(
        self,
        resamples: int = BOOTSTRAP_RESAMPLES,
        seed: int = SEED,
        wave: int = 1,
        pooled: bool = False,
    ):
        self.resamples = resamples
        self.seed = seed
        self.wave = wave
        # Pooled: the figure is the statistic of all rounds' samples together (an SLO's
        # percentile is over the step's requests), not the median of each round's.
        self.pooled = pooled

    def figure(
        self, rounds: Sequence[Sequence[T]], stat: Callable[[Sequence[T]], float | None]
    ) -> float | None:
        """The figure of these rounds: the median of each round's statistic, or pooled."""
        if self.pooled:
            return stat([x for r in rounds for x in r]) if any(rounds) else None
        return over_rounds(rounds, stat)

    def _draw(self, rng: random.Random, rounds: Sequence[Sequence[Sequence[T]]]) -> list[list[T]]:
        picked = rng.choices(rounds, k=len(rounds)) if len(rounds) > 1 else rounds
        rnd = rng.random
        out = []
        for blocks in picked:
            if len(blocks) > 1:
                blocks = rng.choices(blocks, k=len(blocks))
            # What rng.choices(b, k=len(b)) draws for each block, in one comprehension.
            out.append([b[int(rnd() * n)] for b in blocks for n in (len(b),) for _ in range(n)])
        return out

    def draws(self, rounds: Sequence[Sequence[T]]) -> Iterator[list[list[T]]]:
        """Every resample of these rounds, in the seeded order (`distribution` takes its
        statistic of each)."""
        rng = random.Random(self.seed)
        blocks = [waves(r, self.wave) for r in rounds if r]
        for _ in range(self.resamples):
            yield self._draw(rng, blocks)

    def distribution(
        self, rounds: Sequence[Sequence[T]], stat: Callable[[Sequence[T]], float | None]
    ) -> list[float]:
        """The statistic over every resample (resamples where it is undefined are dropped)."""
        out = []
        for drawn in self.draws(rounds):
            v = self.figure(drawn, stat)
            if v is not None and math.isfinite(v):
                out.append(v)
        return out

    def interval(
        self, rounds: Sequence[Sequence[T]], stat: Callable[[Sequence[T]], float | None]
    ) -> Interval | None:
        """The statistic of all samples and its percentile interval (None: no samples)."""
        point = self.figure([r for r in rounds if r], stat)
        if point is None:
            return None
        return _quantiles(point, self.distribution(rounds, stat))

    def ratio(
        self,
        a: Sequence[Sequence[T]],
        b: Sequence[Sequence[T]],
        stat: Callable[[Sequence[T]], float | None],
    ) -> tuple[Interval, Interval, Interval] | None:
        """Intervals of stat(a), stat(b) and of the ratio stat(b) / stat(a), resampled together.

        The two engines are resampled independently (different seeds of one generator), and
        the ratio's interval is taken over the paired resamples.
        """
        pa = self.figure([r for r in a if r], stat)
        pb = self.figure([r for r in b if r], stat)
        if pa is None or pb is None or pa <= 0 or pb <= 0:
            return None
        da = self.distribution(a, stat)
        other = Bootstrap[T](self.resamples, self.seed + 1, self.wave, self.pooled)
        db = other.distribution(b, stat)
        ratios = [y / x for x, y in zip(da, db, strict=False) if x > 0]
        return _quantiles(pa, da), _quantiles(pb, db), _quantiles(pb / pa, ratios)


def pooled_percentile(
    rounds: Sequence[Sequence[Sequence[float]]],
    q: float,
    wave: int = 1,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = SEED,
) -> Interval | None:
    """The q-th percentile of every value of every group pooled (a request's inter-token
    gaps are one group), and its interval from the hierarchical bootstrap with the groups as
    the units: rounds, waves of `wave` groups, groups, each drawn group bringing all its
    values (the gaps of one request share its batches, so they are not resampled one by one).
    None: no values.

    A resample's pooled percentile is not computed from its own sorted values (tens of
    thousands a step, 2000 times): the k-th smallest of all resamples' percentiles is the
    smallest pooled value x that at least k+1 resamples hold at or below it, and a resample's
    percentile is at or below x when enough of its values are, which is a sum of each drawn
    group's count at or below x. A search over the pooled values finds each end."""
    groups = [sorted(g) for rnd in rounds for g in rnd]
    values = sorted(v for g in groups for v in g)
    point = percentile(values, q)
    if point is None:
        return None
    index, start = [], 0
    for rnd in rounds:
        index.append(list(range(start, start + len(rnd))))
        start += len(rnd)
    size = [len(g) for g in groups].__getitem__
    sets, pos = [], []
    for d in Bootstrap[int](resamples, seed, wave).draws(index):
        flat = [i for rnd in d for i in rnd]
        n = sum(map(size, flat))
        if n:  # a resample of groups without values has no percentile
            sets.append(flat)
            pos.append((n - 1) * q / 100.0)
    # A resample's percentile lies between its order statistics floor and ceil of (n - 1) q
    # (from 0): the lower end reads the first, the upper end the second (never narrower).
    tail, m = (1 - CONFIDENCE) / 2, len(sets)
    lo = _kth_percentile(groups, values, sets, [math.floor(p) + 1 for p in pos],
                         math.floor((m - 1) * tail), point, q / 100)  # fmt: skip
    hi = _kth_percentile(groups, values, sets, [math.ceil(p) + 1 for p in pos],
                         math.ceil((m - 1) * (1 - tail)), point, q / 100)  # fmt: skip
    if lo is None or hi is None:
        return Interval(point, point, point)
    return Interval(point, min(lo, point), max(hi, point))


def _kth_percentile(
    groups: list[list[float]],
    values: list[float],
    drawn: list[list[int]],
    rank: list[int],
    k: int,
    start: float,
    share: float,
) -> float | None:
    """The k-th smallest (from 0) of the resamples' percentiles, where resample d's is its
    `rank[d]`-th smallest value: the smallest pooled value that k + 1 resamples reach.

    The search starts at `start` (the point estimate, the pooled values' `share` quantile)
    and gallops outwards (the resamples' percentiles lie near it), then bisects; a resample
    settled on one side of a probe is not counted again, so a step costs a few passes over
    the resamples, not one per halving."""
    if not drawn or not 0 <= k < len(drawn):
        return None
    lo, hi = -1, len(values) - 1  # the answer's index lies in (lo, hi]
    below, pending = 0, list(range(len(drawn)))
    i = bisect.bisect_left(values, start)
    # The first stride: one binomial standard deviation of the percentile's rank among the
    # pooled values (a resample's moves by about that much, or more when groups differ).
    step = max(1, round(math.sqrt(len(values) * share * (1 - share))))
    first, bisecting = None, False
    while hi - lo > 1:
        i = min(max(i, lo + 1), hi - 1)
        at = [bisect.bisect_right(g, values[i]) for g in groups].__getitem__
        reached: list[int] = []
        short: list[int] = []
        for j in pending:
            (reached if sum(map(at, drawn[j])) >= rank[j] else short).append(j)
        if below + len(reached) >= k + 1:
            down, hi, pending = True, i, reached
        else:
            down, lo, below, pending = False, i, below + len(reached), short
        first = down if first is None else first
        bisecting = bisecting or down != first
        if bisecting:
            i = (lo + hi) // 2
        else:
            i, step = (i - step if down else i + step), step * 2
    return values[hi]


def over_rounds(
    rounds: Sequence[Sequence[T]], stat: Callable[[Sequence[T]], float | None]
) -> float | None:
    """The median over rounds of each round's statistic (None: defined in no round)."""
    values = [v for v in (stat(r) for r in rounds) if v is not None]
    return statistics.median(values) if values else None


def _quantiles(point: float, dist: list[float]) -> Interval:
    if not dist:
        return Interval(point, point, point)
    tail = (1 - CONFIDENCE) / 2 * 100
    lo, hi = percentile(dist, tail), percentile(dist, 100 - tail)
    assert lo is not None and hi is not None
    # A percentile interval of a skewed statistic may miss its own point estimate by a hair.
    return Interval(point, min(lo, point), max(hi, point))


def ratio_side(ratio: Interval, floor: float = COMPARE_NOISE_FLOOR) -> int:
    """+1 when the ratio B/A is above 1 + floor, -1 when below 1 / (1 + floor), else 0."""
    if ratio.lo > 1 + floor:
        return 1
    if ratio.hi < 1 / (1 + floor):
        return -1
    return 0


def _binomial_cdf(n: int, p: float) -> list[float]:
    """P(B <= k) for k = 0..n, B ~ Binomial(n, p) (log space: no overflow at large n)."""
    if p <= 0 or p >= 1:
        return [1.0 if p <= 0 else 0.0] * n + [1.0]
    lp, lq = math.log(p), math.log1p(-p)
    out, total = [], 0.0
    for k in range(n + 1):
        log_pmf = math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
        total += math.exp(log_pmf + k * lp + (n - k) * lq)
        out.append(min(total, 1.0))
    return out


def quantile_bounds(
    values: Sequence[float], q: float, confidence: float = CONFIDENCE
) -> tuple[float | None, float | None]:
    """The distribution-free interval of the q-th percentile (q in 0..100) from the order
    statistics of `values`: the true percentile lies between them with `confidence`. A side
    that so few samples cannot bound is None (a p99 from 50 requests has no upper bound:
    the 50 could all lie below the true p99)."""
    data = sorted(values)
    n = len(data)
    if not n:
        return None, None
    cdf = _binomial_cdf(n, q / 100.0)
    tail = (1 - confidence) / 2
    # Lower: the largest order statistic X_(l) with P(B >= l) >= 1 - tail, i.e. P(B <= l-1) <= tail.
    low = max((k for k in range(1, n + 1) if cdf[k - 1] <= tail), default=None)
    # Upper: the smallest X_(u) with P(B <= u-1) >= 1 - tail.
    high = next((k for k in range(1, n + 1) if cdf[k - 1] >= 1 - tail), None)
    return (
        data[low - 1] if low is not None else None,
        data[high - 1] if high is not None else None,
    )


def requests_needed(q: float, confidence: float = CONFIDENCE) -> int:
    """The fewest samples whose largest can bound the q-th percentile from above with
    `confidence`: 6 for a p50, 36 for a p90, 368 for a p99 (at 95 %)."""
    tail = (1 - confidence) / 2
    return math.ceil(math.log(tail) / math.log(q / 100.0))
