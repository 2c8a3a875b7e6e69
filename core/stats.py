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

import math
import random
import statistics
from collections.abc import Callable, Sequence
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

    def distribution(
        self, rounds: Sequence[Sequence[T]], stat: Callable[[Sequence[T]], float | None]
    ) -> list[float]:
        """The statistic over every resample (resamples where it is undefined are dropped)."""
        rng = random.Random(self.seed)
        blocks = [waves(r, self.wave) for r in rounds if r]
        out = []
        for _ in range(self.resamples):
            v = self.figure(self._draw(rng, blocks), stat)
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
