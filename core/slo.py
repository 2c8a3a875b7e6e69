"""Service-level objectives over per-request samples: parse `--slo`, judge a step, goodput.

`--slo ttft_p99=2s,tpot_p99=50ms,e2e_p90=5s`: each term is a metric at a percentile (`p50`,
`p90`, `p99`) and a limit (`ms` or `s`). Each metric is a figure of one request, and the
term's percentile is taken over the step's successful requests:

- `ttft`: its time to the first token;
- `tpot`: its mean time per output token after the first, (end - first token) / (tokens -
  1) (`RequestRecord.tpot_s`): AIPerf's and GuideLLM's TPOT/ITL;
- `itl`: the term's percentile of every inter-token gap of the step's requests, pooled:
  vLLM's ITL. Requests saved before requests.jsonl kept their gaps (`itls`) are read as
  each request's own gap at the percentile (its median for `itl_p50`, its p99 gap for
  `itl_p90`/`itl_p99`), the meaning `itl` had before, and the step says so (`per_request`);
- `e2e`: its end-to-end time.

A step meets the SLO when, for every term, that percentile is within the limit with
confidence (`judge_step`): the request is the unit of every interval, pooled `itl` gaps
included (a request's gaps share its batches; they are resampled with it). A request is
*within* the SLO when each of its own figures is within every limit. Goodput is the
requests/s and tokens/s of the requests within the SLO over the step's wall time; the share
is their part of all requests sent.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from core.stats import (
    Bootstrap,
    percentile,
    pooled_percentile,
    quantile_bounds,
    requests_needed,
)

METRICS = ("ttft", "tpot", "itl", "e2e")
PERCENTILES = (50, 90, 99)
_TERM = re.compile(r"^(ttft|tpot|itl|e2e)_p(50|90|99)=([0-9]*\.?[0-9]+)(ms|s)$")


class RequestSample(Protocol):
    """What the SLO reads of one request (a `loadgen.results.RequestRecord` is one)."""

    @property
    def start_time(self) -> float: ...
    @property
    def end_time(self) -> float: ...
    @property
    def ttft_s(self) -> float | None: ...
    @property
    def itl_p50_s(self) -> float | None: ...
    @property
    def itl_p99_s(self) -> float | None: ...
    @property
    def tpot_s(self) -> float | None: ...
    @property
    def chunks(self) -> int: ...
    @property
    def itls(self) -> list[float]: ...
    @property
    def e2e_s(self) -> float: ...
    @property
    def completion_tokens(self) -> int | None: ...
    @property
    def error(self) -> str | None: ...


@dataclass(frozen=True)
class Term:
    """One limit: `metric` at percentile `q` within `limit_s` seconds."""

    metric: str
    q: int
    limit_s: float

    @property
    def name(self) -> str:
        return f"{self.metric}_p{self.q}"

    def value(self, r: RequestSample) -> float | None:
        """This request's own figure for the term (None: not measured)."""
        if self.metric == "ttft":
            return r.ttft_s
        if self.metric == "e2e":
            return r.e2e_s
        if self.metric == "tpot":
            return r.tpot_s
        return r.itl_p50_s if self.q == 50 else r.itl_p99_s

    def text(self) -> str:
        limit = f"{self.limit_s * 1000:g}ms" if self.limit_s < 1 else f"{self.limit_s:g}s"
        return f"{self.name}={limit}"


@dataclass(frozen=True)
class Slo:
    """The user's SLO: every term must hold."""

    terms: tuple[Term, ...]

    def text(self) -> str:
        return ",".join(t.text() for t in self.terms)

    def within(self, r: RequestSample) -> bool:
        """Whether one successful request is within every limit (unmeasured: not within)."""
        if r.error is not None:
            return False
        for t in self.terms:
            v = t.value(r)
            if v is None or v > t.limit_s:
                return False
        return True


def parse_slo(text: str) -> Slo:
    """`ttft_p99=2s,itl_p99=100ms` → Slo; ValueError naming the bad term."""
    terms: list[Term] = []
    for part in (p.strip() for p in text.split(",")):
        m = _TERM.match(part)
        if not m:
            raise ValueError(
                f"bad SLO term {part!r}: expected METRIC_pQ=LIMIT with METRIC one of "
                f"{', '.join(METRICS)}, Q one of {', '.join(map(str, PERCENTILES))} and LIMIT "
                "in ms or s (e.g. ttft_p99=2s,itl_p99=100ms)"
            )
        metric, q, num, unit = m.groups()
        limit = float(num) / (1000.0 if unit == "ms" else 1.0)
        if any(t.metric == metric and t.q == int(q) for t in terms):
            raise ValueError(f"SLO term {metric}_p{q} given twice")
        terms.append(Term(metric, int(q), limit))
    return Slo(tuple(terms))


@dataclass
class StepSlo:
    """One step (engine, concurrency) against the SLO, judged with confidence.

    `met`: True when every term's percentile is within its limit with confidence (the upper
    end of its interval is), False when one term's is over it with confidence (the lower end
    is), None when neither can be said: a term not measured, too few requests to bound the
    percentile (`needs`: the count it needs), or an interval across the limit.
    """

    concurrency: int
    met: bool | None
    requests: int
    within: int
    share: float
    goodput_rps: float | None
    goodput_tok_s: float | None
    # Each term's percentile over the step's successful requests (None: not measured).
    observed: dict[str, float | None] = field(default_factory=dict)
    unmeasured: list[str] = field(default_factory=list)
    # Each term's distribution-free 95 % interval (None: a side so few requests cannot bound).
    bounds: dict[str, tuple[float | None, float | None]] = field(default_factory=dict)
    # Terms whose interval does not settle the limit, and the requests a bound would need.
    unjudged: list[str] = field(default_factory=list)
    needs: dict[str, int] = field(default_factory=dict)
    # `itl` terms read from each request's own gap (requests saved without their gaps).
    per_request: list[str] = field(default_factory=list)

    def why_not_judged(self) -> str:
        """`ttft_p99: 64 requests, a p99 needs 368` or `ttft_p99 0.19 s [0.12–0.25]`."""
        out = [f"{t} not measured" for t in self.unmeasured]
        for t in self.unjudged:
            if t in self.needs:
                out.append(f"{t}: {self.requests} requests, a p{t.rsplit('_p', 1)[1]} needs "
                           f"{self.needs[t]}")  # fmt: skip
            else:
                lo, hi = self.bounds.get(t, (None, None))
                v = self.observed.get(t)
                out.append(f"{t} {v or 0:.3g} s [{lo or 0:.3g}–{hi or 0:.3g}] across the limit")
        return "; ".join(out)


def judge_step(slo: Slo, concurrency: int, rounds: Sequence[Sequence[RequestSample]]) -> StepSlo:
    """The step's percentiles against the SLO, with confidence, and its goodput."""
    samples = [r for rnd in rounds for r in rnd]
    ok = [r for r in samples if r.error is None]
    out = StepSlo(concurrency, None, len(samples), 0, 0.0, None, None)
    failed = False
    for t in slo.terms:
        values = [v for v in (t.value(r) for r in ok) if v is not None]
        # A figure missing for some requests cannot be judged from the rest.
        if not values or len(values) != len(ok):
            out.observed[t.name] = None
            out.unmeasured.append(t.name)
            continue
        if t.metric == "itl":
            if _gaps_saved(ok):
                values = [g for r in ok for g in r.itls]
            else:
                out.per_request.append(t.name)
        out.observed[t.name] = percentile(values, t.q)
        if t.metric == "itl" and t.name not in out.per_request:
            lo, hi = out.bounds[t.name] = _pooled_bounds(t, values, rounds, concurrency)
        else:
            lo, hi = out.bounds[t.name] = _bounds(t, values, rounds, concurrency)
        if lo is not None and lo > t.limit_s:
            failed = True
        elif hi is None or hi > t.limit_s:
            out.unjudged.append(t.name)
            if hi is None:
                out.needs[t.name] = requests_needed(t.q)
    # One term over its limit with confidence fails the step, whatever the others say.
    out.met = False if failed or not ok else (None if out.unmeasured or out.unjudged else True)
    good = [r for r in ok if slo.within(r)]
    wall = sum(
        max(r.end_time for r in rnd) - min(r.start_time for r in rnd) for rnd in rounds if rnd
    )
    out.within = len(good)
    out.share = len(good) / len(samples) if samples else 0.0
    out.goodput_rps = len(good) / wall if wall > 0 else None
    out.goodput_tok_s = sum(r.completion_tokens or 0 for r in good) / wall if wall > 0 else None
    return out


def _bounds(
    t: Term, values: list[float], rounds: Sequence[Sequence[RequestSample]], wave: int
) -> tuple[float | None, float | None]:
    """The term's interval: the wider of the order statistics' (which assume independent
    requests, and say how many a percentile needs) and the hierarchical bootstrap's over
    rounds, waves of `wave` requests sent together, and requests (`core.stats.Bootstrap`,
    the resampler of the ratio intervals): one slow wave moves the bootstrap's percentile
    only in the resamples that draw it, so it cannot make a confident miss alone."""
    lo, hi = quantile_bounds(values, t.q)
    sent = [
        [v for v in (t.value(r) for r in sorted(rnd, key=lambda r: r.start_time)
                     if r.error is None) if v is not None]
        for rnd in rounds
    ]  # fmt: skip
    iv = Bootstrap[float](wave=wave, pooled=True).interval(sent, lambda v: percentile(v, t.q))
    if iv is None:
        return lo, hi
    return (
        min(lo, iv.lo) if lo is not None else None,
        max(hi, iv.hi) if hi is not None else None,
    )


def _pooled_bounds(
    t: Term, gaps: list[float], rounds: Sequence[Sequence[RequestSample]], wave: int
) -> tuple[float | None, float | None]:
    """A pooled `itl` percentile's interval. The gaps of one request, and of one wave, share
    batches: they are not independent samples, so the request is the unit, as for the other
    terms. The interval is the wider of the gaps' order statistics and the hierarchical
    bootstrap over rounds, waves and requests, each drawn request bringing all its gaps
    (`core.stats.pooled_percentile`): a slow (warm-up) wave widens it instead of deciding.
    The upper end needs as many requests as a per-request percentile
    (`core.stats.requests_needed`): fewer could all miss the few requests whose gaps make
    the pooled tail, whatever the count of gaps."""
    lo, hi = quantile_bounds(gaps, t.q)
    sent = [
        [r.itls for r in sorted(rnd, key=lambda r: r.start_time) if r.error is None]
        for rnd in rounds
    ]
    # A request without gaps (one token) holds no sample of them.
    if sum(1 for rnd in sent for g in rnd if g) < requests_needed(t.q):
        hi = None
    iv = pooled_percentile(sent, t.q, wave=wave)
    if iv is None:
        return lo, hi
    return (
        min(lo, iv.lo) if lo is not None else None,
        max(hi, iv.hi) if hi is not None else None,
    )


def _gaps_saved(requests: Sequence[RequestSample]) -> bool:
    """Whether every request carries its inter-token gaps (one fewer than its chunks)."""
    return all(len(r.itls) == max(0, r.chunks - 1) for r in requests) and any(
        r.itls for r in requests
    )


def max_concurrency_within(steps: Sequence[StepSlo]) -> int | None:
    """The highest measured concurrency that meets the SLO with confidence, from all levels
    (a lower level that misses does not hide a higher one that meets: `gaps` names it)."""
    met = [s.concurrency for s in steps if s.met is True]
    return max(met) if met else None


def gaps(steps: Sequence[StepSlo]) -> list[StepSlo]:
    """The levels below the highest within the SLO that do not meet it (a miss between two
    levels that meet, or a level not judged): the answer is not monotonic there."""
    best = max_concurrency_within(steps)
    if best is None:
        return []
    return [s for s in sorted(steps, key=lambda s: s.concurrency) if s.concurrency < best
            and s.met is not True]  # fmt: skip
