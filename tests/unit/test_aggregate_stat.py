"""compare's aggregate tok/s (`diagnose.decision.calls.aggregate_stat`) is a round's tokens
over its wall time, whatever the engine keeps in flight: an engine that queues behind too
few slots (fewer than `concurrency` in flight while a round drains), and a `--traffic`
schedule far below its in-flight cap (where `concurrency` is only the cap)."""

from __future__ import annotations

import random
import statistics

import pytest

from diagnose.decision.calls import AGGREGATE, aggregate_stat, in_order, measured_call
from diagnose.decision.model import EngineResult, Row
from diagnose.decision.requests import EngineRequests
from diagnose.decision.sources import CLIENT
from diagnose.decision.two_engines import CompareInputs, decide_compare
from loadgen.results import RequestRecord, timed_record

TOKENS = 128


def record(index: int, start: float, ttft: float, e2e: float, error: str | None = None):
    """One request that started at `start`, saw its first token `ttft` later and ended at
    `start + e2e`, with `TOKENS` tokens (none when it failed)."""
    return timed_record("x", index, start, ttft, e2e, TOKENS, error=error)


def queued_round(rng: random.Random, slots: int, concurrency: int, n: int, t0: float = 0.0):
    """A closed loop of `concurrency` clients over `n` requests in front of `slots` slots
    (each request takes its slot for ~1 s): the rest wait in a queue, and at the round's end
    fewer than `concurrency` are in flight."""
    free = [t0] * slots
    sent = [t0] * concurrency  # when each client sends its next request
    out = []
    for i in range(n):
        client = min(range(concurrency), key=lambda k: sent[k])
        start = sent[client]
        slot = min(range(slots), key=lambda k: free[k])
        begin = max(start, free[slot])
        service = rng.lognormvariate(0, 0.03)
        ttft = begin - start + 0.02
        end = begin + service
        free[slot] = end
        sent[client] = end
        out.append(record(i, start, ttft, end - start))
    return out


def tokens_over_wall(rnd: list[RequestRecord]) -> float:
    wall = max(r.end_time for r in rnd) - min(r.start_time for r in rnd)
    return sum(r.completion_tokens or 0 for r in rnd if r.error is None) / wall


def test_queueing_engine_aggregate_is_tokens_over_wall_time():
    rng = random.Random(1)
    rounds = [queued_round(rng, 1, 16, 32, t0=100.0 * k) for k in range(3)]
    stat = aggregate_stat(rounds)
    for rnd in rounds:
        # One slot: about one request's tokens per second, not 16 × tokens / Σ e2e.
        assert stat(rnd) == pytest.approx(tokens_over_wall(rnd), rel=1e-9)
        assert stat(rnd) == pytest.approx(TOKENS, rel=0.05)


def test_queue_position_is_not_noise_and_the_lead_matches_the_figures():
    """np1 vs np16 at c=16: the one-slot engine's interval is as narrow as its rounds (its
    queue positions are not resampled as noise), and the stated lead is the ratio of the
    figures (the saved H100 run said 2.0× against 874 / 332 = 2.6×)."""
    rng = random.Random(2)
    one = [queued_round(rng, 1, 16, 32, t0=100.0 * k) for k in range(3)]
    many = [queued_round(rng, 16, 16, 32, t0=100.0 * k) for k in range(3)]
    stat = aggregate_stat([*one, *many])
    va = statistics.median(tokens_over_wall(r) for r in one)
    vb = statistics.median(tokens_over_wall(r) for r in many)
    a, b = EngineResult("np1", "sim"), EngineResult("np16", "sim")
    call = measured_call(
        AGGREGATE, 16, a, b, (va, vb), ([], []), (in_order(one), in_order(many)), stat
    )
    assert call is not None and call.winner == "np16"
    assert call.ratio_point == pytest.approx(vb / va, rel=1e-9)
    assert call.a_lo is not None and call.a_hi is not None
    assert call.a_lo > 0.95 * va and call.a_hi < 1.05 * va


def scheduled_engine(rng: random.Random, name: str, e2e: float):
    """`--traffic` at 1 request/s, 32 a round, 3 rounds, under an in-flight cap of 16 that is
    never reached: each request takes `e2e` seconds."""
    rounds = []
    for _ in range(3):
        rounds.append(
            [record(i, float(i), 0.05, e2e * rng.lognormvariate(0, 0.03)) for i in range(32)]
        )
    agg = [tokens_over_wall(r) for r in rounds]
    engine = EngineResult(name, "sim", weights_bytes=1e9, verdict="decode_below_card_limit")
    engine.rows.append(
        Row(
            name,
            "concurrency",
            16,
            max_tokens=TOKENS,
            requests=96,
            completion_tokens=96 * TOKENS,
            tokens_ok=True,
            aggregate_tok_s=statistics.median(agg),
            aggregate_rounds=agg,
            per_seq_tok_s=TOKENS / e2e,
            per_seq_rounds=[TOKENS / e2e] * 3,
            ttft_s=0.05,
            ttft_rounds=[0.05] * 3,
            per_seq_source=CLIENT,
            ttft_source=CLIENT,
        )
    )
    reqs = EngineRequests(name)
    reqs.by_row[0] = rounds
    return engine, reqs


def test_scheduled_traffic_at_equal_throughput_has_no_throughput_lead():
    """Both engines serve the same schedule (the same tokens per second); B only answers
    each request in half the time. The aggregate is no reason to switch (it used to read
    B ahead by 2.0×, the latency ratio, as throughput)."""
    rng = random.Random(0)
    a, ra = scheduled_engine(rng, "A", 1.0)
    b, rb = scheduled_engine(rng, "B", 0.5)
    d = decide_compare(a, b, CompareInputs(requests={"A": ra, "B": rb}))
    assert d.recommendation == "stay"
    (load,) = [x for x in d.loads if x.concurrency == 16]
    assert load.what == AGGREGATE and load.winner is None
    assert load.ratio_lo is not None and load.ratio_hi is not None
    assert load.ratio_lo > 0.97 and load.ratio_hi < 1.05


def test_a_failed_request_keeps_its_wall_time_and_adds_no_tokens():
    rnd = [record(0, 0.0, 0.1, 2.0), record(1, 0.0, 0.1, 4.0, error="timeout")]
    assert aggregate_stat([rnd])(rnd) == pytest.approx(TOKENS / 4.0)


def test_requests_from_other_rounds_count_as_one_round_of_their_own():
    rounds = [[record(0, 0.0, 0.1, 1.0), record(1, 0.0, 0.1, 1.0)]]
    other = [record(0, 0.0, 0.1, 2.0), record(1, 1.0, 0.1, 2.0)]
    assert aggregate_stat(rounds)(other) == pytest.approx(tokens_over_wall(other))
