"""One measured difference between two engines at one load, with its interval.

A call's interval comes from the step's requests (`core.stats.Bootstrap` over rounds, the
waves of `concurrency` requests sent together, and requests, `diagnose.decision.requests`);
without per-request samples (a results.json saved without requests.jsonl) from the spread
between rounds, as before. A winner is called only when the ratio's interval clears the
difference the run can resolve (`core.stats.resolvable`: the noise floor with 3 rounds or
more, more with fewer).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from core.stats import Bootstrap, Interval, over_rounds, ratio_side, relative_spread, resolvable
from core.thresholds import FULL_ROUNDS, LATENCY_BOUND_TTFT_SHARE
from diagnose.decision.model import EngineResult, Row
from diagnose.decision.requests import EngineRequests, Rounds, decode_rate
from diagnose.decision.sources import ENGINE
from loadgen.results import RequestRecord

# Fewer requests per engine than this show no spread a bootstrap can trust: such a step is
# called from its rounds instead (and one round calls nothing).
MIN_REQUESTS = 4

Stat = Callable[[Sequence[RequestRecord]], float | None]

# What is compared (the `what` of a call).
DECODE = "single-request decode tok/s"
AGGREGATE = "aggregate tok/s"
TTFT = "TTFT s"
# The whole request at low load: TTFT + decode, what one user waits for.
E2E = "end-to-end s per request"
# The basis of a call on an engine's figure over a whole step (no per-request samples).
STEP_ONLY = "no per-request samples: nothing called"


@dataclass
class Call:
    """One measured difference: who is ahead, by how much, and whether it beats the noise.

    `a`, `b` are the engines' figures (the rows' headline numbers); `*_lo`/`*_hi` their
    intervals and the ratio b/a's, `basis` what the interval was taken over.
    """

    what: str
    concurrency: int | None
    a: float
    b: float
    spread: float | None
    winner: str | None  # engine name, None within the noise
    a_lo: float | None = None
    a_hi: float | None = None
    b_lo: float | None = None
    b_hi: float | None = None
    ratio_lo: float | None = None
    ratio_hi: float | None = None
    basis: str = ""
    higher_is_better: bool = True
    # False when the samples could not call a winner at all (one round and too few requests).
    decidable: bool = True
    # The centre of `ratio_lo`..`ratio_hi`: the ratio b/a of the per-request statistic (of
    # the figures `b / a` for aggregate tok/s).
    ratio_point: float | None = None
    # Where each engine's figure came from (diagnose/decision/sources.py; None: the client's
    # chunks, or a run saved before these fields).
    a_source: str | None = None
    b_source: str | None = None
    # What is shown beside the figure (the whole request's parts: decode and TTFT).
    beside: str = ""

    def ratio(self) -> float:
        return self.b / self.a if self.a else math.inf

    def ratio_interval(self) -> Interval | None:
        if self.ratio_lo is None or self.ratio_hi is None or not self.a:
            return None
        return Interval(self.ratio_point or self.ratio(), self.ratio_lo, self.ratio_hi)

    def lead(self) -> str:
        """The winner's lead with its interval: `6.7× [5.9–7.6]` or `+16 % [12–20]`."""
        if self.winner is None or not self.a or not self.b:
            return ""
        iv = self.ratio_interval() or Interval(self.ratio(), self.ratio(), self.ratio())
        # The winner's figure over the loser's in the metric's better direction: the
        # ratio b/a when it is above 1 (b more tok/s, or a the shorter TTFT), else a/b.
        k = iv if iv.value > 1 else Interval(1 / iv.value, 1 / iv.hi, 1 / iv.lo)
        bounds = self.ratio_interval() is not None
        if k.value >= 1.5:
            return f"{k.value:.1f}×" + (f" [{k.lo:.1f}–{k.hi:.1f}]" if bounds else "")
        pct = f"+{(k.value - 1) * 100:.0f} %"
        return pct + (f" [{(k.lo - 1) * 100:.0f}–{(k.hi - 1) * 100:.0f}]" if bounds else "")

    def figures(self, a_name: str, b_name: str) -> str:
        """`llama 217 [210–224] vs sglang 1.46e+03 [1.4e+03–1.5e+03]`."""
        fa, fb = _fig(self.a, self.a_lo, self.a_hi), _fig(self.b, self.b_lo, self.b_hi)
        return f"{a_name} {fa} vs {b_name} {fb}"


def _fig(v: float, lo: float | None, hi: float | None) -> str:
    if lo is None or hi is None:
        return f"{v:.3g}"
    return f"{v:.3g} [{lo:.3g}–{hi:.3g}]"


def aggregate_stat(rounds: Sequence[Sequence[RequestRecord]]) -> Stat:
    """Aggregate tok/s over these rounds' requests: tokens over the wall time they took.

    Each round's wall time (its last end minus its first start) is shared among its
    successful requests in proportion to each one's decode time (end-to-end minus TTFT), and
    the statistic of any set of them is Σ tokens / Σ their shares: a whole round's figure is
    its tokens over its wall time, whatever the engine keeps in flight (a queue in front of
    too few slots, or a schedule far below the cap). The shares are fixed by the rounds given
    here, so a resample (`core.stats.Bootstrap`) varies only each request's tokens per second
    of decoding; the wait before its first token is excluded, being its place in a queue
    rather than its own speed. Requests not from these rounds count as one round of their own.
    """
    shares = wall_shares(rounds)

    def stat(rs: Sequence[RequestRecord]) -> float | None:
        ok = [r for r in rs if _succeeded(r)]
        if any(shares.get(id(r), (None, 0.0))[0] is not r for r in ok):
            return aggregate_stat([rs])(rs)
        wall = sum(shares[id(r)][1] for r in ok)
        return sum(r.completion_tokens or 0 for r in ok) / wall if wall > 0 else None

    return stat


def wall_shares(
    rounds: Sequence[Sequence[RequestRecord]],
) -> dict[int, tuple[RequestRecord, float]]:
    """Each successful request (by `id`, kept with it) and its share of its round's wall
    time, in proportion to its decode time; a round where one has no decode time (no first
    token seen, or a single token) shares by end-to-end time instead."""
    out: dict[int, tuple[RequestRecord, float]] = {}
    for rnd in rounds:
        ok = [r for r in rnd if _succeeded(r)]
        if not ok:
            continue
        wall = max(r.end_time for r in rnd) - min(r.start_time for r in rnd)
        decode = [r.e2e_s - (r.ttft_s or r.e2e_s) for r in ok]
        weights = decode if all(d > 0 for d in decode) else [r.e2e_s for r in ok]
        total = sum(weights)
        for r, w in zip(ok, weights, strict=True):
            out[id(r)] = (r, wall * w / total)
    return out


def _succeeded(r: RequestRecord) -> bool:
    return r.error is None and r.e2e_s > 0


def decode_stat(rs: Sequence[RequestRecord]) -> float | None:
    """Mean per-sequence decode tok/s (the client's chunks, else the engine's own figure)."""
    rates = [v for v, _ in map(decode_rate, rs) if v]
    return sum(rates) / len(rates) if rates else None


def e2e_stat(rs: Sequence[RequestRecord]) -> float | None:
    """Mean end-to-end seconds of the successful requests (the client's wall time of each,
    measured whether or not the streamed text was empty)."""
    values = [r.e2e_s for r in rs if r.error is None and r.e2e_s > 0]
    return sum(values) / len(values) if values else None


def ttft_stat(rs: Sequence[RequestRecord]) -> float | None:
    """Median time to first token of the requests that saw one."""
    values = [r.ttft_s for r in rs if r.error is None and r.ttft_s]
    return statistics.median(values) if values else None


def measured_call(
    what: str,
    concurrency: int | None,
    a: EngineResult,
    b: EngineResult,
    values: tuple[float | None, float | None],
    rounds: tuple[list[float], list[float]],
    requests: tuple[Rounds, Rounds],
    stat: Stat,
    higher_is_better: bool = True,
    sources: tuple[str | None, str | None] = (None, None),
) -> Call | None:
    """The call from the requests when both engines have them, else from the rounds; each
    figure keeps its source."""
    va, vb = values
    if not va or not vb:
        return None
    call = _call(what, concurrency, a, b, (va, vb), rounds, requests, stat, higher_is_better)
    call.a_source, call.b_source = sources
    # An engine's own figure over a whole step (SGLang's histograms) has no per-request
    # samples and no rounds: shown, never a winner.
    step_only = [
        e.name
        for e, src, r, reqs in zip((a, b), sources, rounds, requests, strict=True)
        if src == ENGINE and not r and over_rounds(reqs, stat) is None
    ]
    if step_only and call.ratio_lo is None:
        call.winner, call.decidable = None, False
        call.basis = (
            f"{' and '.join(step_only)}: the engine's own figure over the step, {STEP_ONLY}"
        )
    return call


def _call(
    what: str,
    concurrency: int | None,
    a: EngineResult,
    b: EngineResult,
    values: tuple[float, float],
    rounds: tuple[list[float], list[float]],
    requests: tuple[Rounds, Rounds],
    stat: Stat,
    higher_is_better: bool,
) -> Call:
    va, vb = values
    enough = all(sum(len(r) for r in x) >= MIN_REQUESTS for x in requests)
    sent = tuple(in_order(x) for x in requests)
    wave = concurrency or 1
    boot = Bootstrap[RequestRecord](wave=wave).ratio(sent[0], sent[1], stat) if enough else None
    if boot is None:
        call = _rounds_call(
            what, concurrency, a, b, rounds[0] or [va], rounds[1] or [vb], higher_is_better
        )
        fewest = min(sum(len(r) for r in x) for x in requests)
        if 0 < fewest < MIN_REQUESTS:
            call.basis = f"{fewest} requests (< {MIN_REQUESTS}): {call.basis}"
        return call
    ia, ib, ir = boot
    # Each engine's interval is shown around its row's figure (the width comes from the
    # requests). The ratio and the winner come from the per-request statistic, whose
    # definition may differ from the row's (a median over the step, the engine's own
    # timings), and an interval from one put around the other would call that a winner;
    # but aggregate tok/s is tokens over wall time in both (the row's wall the load
    # generator's own, a hair longer), so its ratio is centred on the figures shown and the
    # lead is their quotient.
    ia, ib = ia.scaled(va / ia.value), ib.scaled(vb / ib.value)
    if what == AGGREGATE:
        ir = ir.scaled(vb / va / ir.value)
    rounds_n = min(len(requests[0]), len(requests[1]))
    floor = resolvable(rounds_n)
    side = ratio_side(ir, floor)
    winner = None
    if side:
        winner = b.name if (side > 0) == higher_is_better else a.name
    na, nb = (sum(len(r) for r in x) for x in requests)
    basis = (
        f"bootstrap over {na} + {nb} requests, {rounds_n} round{'s' if rounds_n > 1 else ''}"
        + (f" in waves of {wave}" if wave > 1 else "")
        + resolvable_text(rounds_n)
    )
    spread = max(
        (s for s in (relative_spread(rounds[0]), relative_spread(rounds[1])) if s is not None),
        default=None,
    )
    return Call(
        what,
        concurrency,
        va,
        vb,
        spread,
        winner,
        ia.lo,
        ia.hi,
        ib.lo,
        ib.hi,
        ir.lo,
        ir.hi,
        basis,
        higher_is_better,
        ratio_point=ir.value,
    )


def in_order(rounds: Rounds) -> Rounds:
    """Each round's requests in the order they were sent (the waves are consecutive)."""
    return [sorted(r, key=lambda x: (x.start_time, x.index)) for r in rounds]


def resolvable_text(rounds: int) -> str:
    """`; with 1 round a difference under 25 % is not resolved` (nothing from 3 rounds on)."""
    floor = resolvable(rounds)
    if floor <= resolvable(FULL_ROUNDS):
        return ""
    return (
        f"; with {rounds} round{'s' if rounds > 1 else ''} a difference under "
        f"{floor * 100:.0f} % is not resolved (--rounds {FULL_ROUNDS} resolves "
        f"{resolvable(FULL_ROUNDS) * 100:.0f} %)"
    )


def _rounds_call(
    what: str,
    concurrency: int | None,
    a: EngineResult,
    b: EngineResult,
    va: list[float],
    vb: list[float],
    higher_is_better: bool,
) -> Call:
    """Without requests: a winner only when the rounds' ranges do not overlap (and the
    medians differ by more than the noise floor); one round calls nothing."""
    ma, mb = statistics.median(va), statistics.median(vb)
    spreads = [s for s in (relative_spread(va), relative_spread(vb)) if s is not None]
    winner = None
    floor = resolvable(min(len(va), len(vb)))
    apart = abs(mb - ma) / min(ma, mb) > floor if min(ma, mb) > 0 else False
    if len(va) >= 2 and len(vb) >= 2 and apart:
        if min(vb) > max(va):
            winner = b.name if higher_is_better else a.name
        elif min(va) > max(vb):
            winner = a.name if higher_is_better else b.name
    several = len(va) >= 2 and len(vb) >= 2
    return Call(
        what,
        concurrency,
        ma,
        mb,
        max(spreads) if spreads else None,
        winner,
        basis="the spread between rounds" if several else "one round: nothing called",
        higher_is_better=higher_is_better,
        decidable=several,
    )


def latency_bound(rounds: Rounds) -> bool:
    """Whether a step is latency-bound: the median TTFT of its requests is at least
    `LATENCY_BOUND_TTFT_SHARE` of their mean end-to-end time (what a user waits for is
    mostly the wait for the first token: a queue in front of too few slots, or prefill).
    False without requests."""
    pooled = [r for rnd in rounds for r in rnd]
    ttft, e2e = ttft_stat(pooled), e2e_stat(pooled)
    return bool(ttft and e2e and ttft >= LATENCY_BOUND_TTFT_SHARE * e2e)


def whole_request_calls(
    a: EngineResult, b: EngineResult, reqs: dict[str, EngineRequests]
) -> list[Call]:
    """End-to-end time per request at c=1 and at every higher level both engines ran where
    the engine in use (`a`) is latency-bound, with decode and TTFT beside it."""
    common = sorted(
        {r.concurrency for r in a.ok_rows() if r.step == "concurrency"}
        & {r.concurrency for r in b.ok_rows() if r.step == "concurrency"}
    )
    out = [whole_request_call(a, b, reqs, 1)]
    for c in common:
        if c > 1 and latency_bound(reqs[a.name].rounds(a, a.at_concurrency(c))):
            out.append(whole_request_call(a, b, reqs, c))
    return [x for x in out if x]


def whole_request_call(
    a: EngineResult, b: EngineResult, reqs: dict[str, EngineRequests], concurrency: int
) -> Call | None:
    """End-to-end time per request at one level, with decode and TTFT beside it (None: no
    requests)."""
    if concurrency == 1:
        ra, rb = a.single() or a.at_concurrency(1), b.single() or b.at_concurrency(1)
    else:
        ra, rb = a.at_concurrency(concurrency), b.at_concurrency(concurrency)
    if ra is None or rb is None:
        return None
    samples = (reqs[a.name].rounds(a, ra), reqs[b.name].rounds(b, rb))
    va, vb = over_rounds(samples[0], e2e_stat), over_rounds(samples[1], e2e_stat)
    if va is None or vb is None:
        return None
    rounds = tuple([v for v in map(e2e_stat, s) if v is not None] for s in samples)
    call = measured_call(
        E2E,
        concurrency,
        a,
        b,
        (va, vb),
        (rounds[0], rounds[1]),
        samples,
        e2e_stat,
        higher_is_better=False,
    )
    if call is not None:
        call.beside = _parts_text(ra, rb)
    return call


def _parts_text(ra: Row, rb: Row) -> str:
    """`decode 100 vs 90 tok/s, TTFT 2.0 vs 0.2 s` (each with its source when the engine's)."""

    def fig(v: float | None, src: str | None) -> str:
        if not v:
            return "not measured"
        return f"{v:.3g}" + (" (engine's own)" if src == ENGINE else "")

    decode = f"decode {fig(ra.per_seq_tok_s, ra.per_seq_source)} vs "
    decode += f"{fig(rb.per_seq_tok_s, rb.per_seq_source)} tok/s"
    ttft = f"TTFT {fig(ra.ttft_s, ra.ttft_source)} vs {fig(rb.ttft_s, rb.ttft_source)} s"
    return f"{decode}, {ttft}"
