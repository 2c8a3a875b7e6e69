"""How often noise flips `compare`'s call: identical engines, and engines a known amount apart.

Pure arithmetic on synthetic request records, no engine: each engine's step is `rounds`
rounds of `waves` waves of `concurrency` requests, and each request's decode speed is the
engine's true speed times a round's noise (warm-up, clocks, a shared host), its wave's noise
(the batch the requests shared) and its own. Every run is called by the same function as a
real comparison (`diagnose.decision.calls.measured_call` on aggregate tok/s), so the rates
below are those of `compare` itself. `bench/switch_noise.py` prints the table of
docs/diagnose.md; the unit tests run its short form.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass

from core.stats import resolvable
from diagnose.decision.calls import (
    AGGREGATE,
    aggregate_stat,
    decode_stat,
    measured_call,
    ttft_stat,
)
from diagnose.decision.model import EngineResult, Row
from diagnose.decision.requests import EngineRequests
from diagnose.decision.sources import CLIENT
from loadgen.results import RequestRecord, timed_record

# Tokens per request and the TTFT every request pays before its first token.
TOKENS = 128
TTFT_S = 0.05
# The per-sequence speed both engines share at equal speed (tok/s).
SPEED = 100.0


@dataclass(frozen=True)
class Noise:
    """Relative standard deviations (lognormal) of a whole round, one wave, one request."""

    round: float = 0.05
    wave: float = 0.05
    request: float = 0.10


@dataclass(frozen=True)
class Outcome:
    """Of `runs` simulated comparisons: B called ahead (a switch), A called ahead."""

    runs: int
    switch: int
    stay_ahead: int

    @property
    def called(self) -> int:
        return self.switch + self.stay_ahead


def _record(
    engine: str, index: int, start: float, rate: float, ttft: float = TTFT_S
) -> RequestRecord:
    return timed_record(engine, index, start, ttft, ttft + (TOKENS - 1) / rate, TOKENS)


def step_records(
    rng: random.Random,
    engine: str,
    speed: float,
    concurrency: int,
    rounds: int,
    waves: int,
    noise: Noise,
    ttft: float = TTFT_S,
) -> list[list[RequestRecord]]:
    """One engine's step: rounds of `waves` consecutive waves of `concurrency` requests,
    sent as the load generator does (a closed loop: each of `concurrency` clients sends its
    next request when its last one ends), so a round's wall time has its real tail."""
    out = []
    for _ in range(rounds):
        r_speed = speed * rng.lognormvariate(0, noise.round)
        free = [k * 1e-4 for k in range(concurrency)]  # when each client sends next
        index, records = 0, []
        for _ in range(waves):
            w_speed = r_speed * rng.lognormvariate(0, noise.wave)
            for k in range(concurrency):
                rate = w_speed * rng.lognormvariate(0, noise.request)
                records.append(_record(engine, index, free[k], rate, ttft))
                free[k] = records[-1].end_time
                index += 1
        out.append(records)
    return out


def outcome(
    difference: float,
    rounds: int,
    runs: int,
    *,
    noise: Noise = Noise(),
    concurrency: int = 4,
    waves: int = 2,
    seed: int = 0,
) -> Outcome:
    """`runs` comparisons of A at `SPEED` and B `difference` faster (0: identical engines)."""
    a, b = EngineResult("a", "sim"), EngineResult("b", "sim")
    switch = stay = 0
    for i in range(runs):
        rng = random.Random(seed * 100_003 + i)
        ra = step_records(rng, "a", SPEED, concurrency, rounds, waves, noise)
        rb = step_records(rng, "b", SPEED * (1 + difference), concurrency, rounds, waves, noise)
        stat = aggregate_stat([*ra, *rb])
        va = [v for v in map(stat, ra) if v is not None]
        vb = [v for v in map(stat, rb) if v is not None]
        values = (sorted(va)[len(va) // 2], sorted(vb)[len(vb) // 2])
        call = measured_call(AGGREGATE, concurrency, a, b, values, ([], []), (ra, rb), stat)
        assert call is not None
        switch += call.winner == "b"
        stay += call.winner == "a"
    return Outcome(runs, switch, stay)


def smallest_called(
    rounds: int,
    runs: int = 20,
    *,
    noise: Noise = Noise(),
    concurrency: int = 4,
    waves: int = 2,
    steps: tuple[float, ...] = (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0),
) -> float | None:
    """The smallest difference of `steps` called in 19 of 20 runs (None: none of them); the
    scan starts at the difference the run can resolve (nothing smaller is ever called)."""
    for d in (x for x in steps if x >= resolvable(rounds)):
        got = outcome(d, rounds, runs, noise=noise, concurrency=concurrency, waves=waves, seed=7)
        if got.switch * 20 >= 19 * runs:
            return d
    return None


def simulated_engine(
    rng: random.Random,
    name: str,
    levels: tuple[int, ...],
    rounds: int,
    *,
    speed: float = SPEED,
    ttft: float = TTFT_S,
    noise: Noise = Noise(),
    waves: int = 2,
) -> tuple[EngineResult, EngineRequests]:
    """An engine measured at `levels` (1 is the single row): its rows, with the headline
    figures a step reports (medians over rounds), and the requests behind each row."""
    engine = EngineResult(name, "sim", weights_bytes=1e9, verdict="decode_below_card_limit")
    reqs = EngineRequests(name)
    for c in levels:
        rs = step_records(rng, name, speed, c, rounds, waves, noise, ttft)
        agg = [v for v in map(aggregate_stat(rs), rs) if v is not None]
        dec = [v for v in (decode_stat(r) for r in rs) if v is not None]
        first = [v for v in (ttft_stat(r) for r in rs) if v is not None]
        reqs.by_row[len(engine.rows)] = rs
        engine.rows.append(
            Row(
                name,
                "single" if c == 1 else "concurrency",
                c,
                max_tokens=TOKENS,
                requests=sum(len(r) for r in rs),
                completion_tokens=TOKENS * sum(len(r) for r in rs),
                tokens_ok=True,
                aggregate_tok_s=statistics.median(agg),
                aggregate_rounds=agg,
                per_seq_tok_s=statistics.median(dec),
                per_seq_rounds=dec,
                ttft_s=statistics.median(first),
                ttft_rounds=first,
                per_seq_source=CLIENT,
                ttft_source=CLIENT,
            )
        )
    return engine, reqs
