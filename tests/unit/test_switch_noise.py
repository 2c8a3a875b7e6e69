"""The short form of the switch-noise simulation (diagnose/switch_noise.py, the table of
docs/diagnose.md): compare's own call on synthetic request records with round, wave and
request noise. Identical engines must not switch in more than 1 run of 40 at --rounds 3, and
an engine 30 % faster must be called in at least 38 of 40."""

from __future__ import annotations

import random
import re
from collections.abc import Callable

import pytest

from core.slo import judge_step, parse_slo
from core.stats import percentile, resolvable
from core.thresholds import COMPARE_NOISE_FLOOR, RESOLVABLE_DIFFERENCE
from diagnose.decision.calls import latency_bound
from diagnose.decision.loads import recommend
from diagnose.decision.model import STAY, Decision, EngineResult, switch_to
from diagnose.decision.requests import EngineRequests
from diagnose.decision.two_engines import CompareInputs, decide_compare
from diagnose.switch_noise import Noise, outcome, simulated_engine

NOISE = Noise(round=0.03, wave=0.03, request=0.10)


def test_identical_engines_switch_in_at_most_1_of_40_runs_at_3_rounds() -> None:
    got = outcome(0.0, rounds=3, runs=40, noise=NOISE)
    assert got.switch <= 1 and got.called <= 2, got


def test_a_30_percent_faster_engine_switches_in_at_least_38_of_40_runs_at_3_rounds() -> None:
    got = outcome(0.30, rounds=3, runs=40, noise=NOISE)
    assert got.switch >= 38 and got.stay_ahead == 0, got


def test_one_round_calls_no_difference_below_what_it_can_resolve() -> None:
    assert resolvable(3) == resolvable(5) == COMPARE_NOISE_FLOOR
    assert resolvable(1) == RESOLVABLE_DIFFERENCE[1] > resolvable(2) > COMPARE_NOISE_FLOOR
    # 10 % apart with no noise at all: one round does not call it, three rounds do.
    quiet = Noise(round=0.0, wave=0.0, request=0.01)
    assert outcome(0.10, rounds=1, runs=3, noise=quiet).called == 0
    assert outcome(0.10, rounds=3, runs=3, noise=quiet).switch == 3


def test_two_identical_engines_say_stay_at_every_load() -> None:
    rng = random.Random(1)
    a, ra = simulated_engine(rng, "a", (1, 4, 8), 3, noise=NOISE)
    b, rb = simulated_engine(rng, "b", (1, 4, 8), 3, noise=NOISE)
    d = decide_compare(a, b, CompareInputs(requests={"a": ra, "b": rb}))
    assert [lv.winner for lv in d.loads] == [None] * 3, d.loads
    assert d.recommendation == STAY, d.action
    assert d.action.startswith("stay on a: no difference beyond the noise at c=1, c=4, c=8")
    # At every load the user may give (measured or between levels): stay, saying where.
    for load in (1, 2, 4, 8, 32):
        rec, action = recommend(a, b, d.loads, None, load, None)
        assert rec == STAY and action.startswith(
            f"stay on a: no difference beyond the noise at c={load}"
        )


def test_the_whole_request_decides_at_c1() -> None:
    """A: TTFT 2.0 s at 100 tok/s; B: TTFT 0.2 s at 90 tok/s; 128 tokens. B finishes each
    request in 0.2 + 127/90 = 1.6 s against A's 2.0 + 127/100 = 3.3 s: B at c=1, though A
    decodes faster."""
    rng = random.Random(0)
    quiet = Noise(round=0.01, wave=0.01, request=0.02)
    a, ra = simulated_engine(rng, "a", (1,), 3, speed=100.0, ttft=2.0, noise=quiet)
    b, rb = simulated_engine(rng, "b", (1,), 3, speed=90.0, ttft=0.2, noise=quiet)
    d = decide_compare(a, b, CompareInputs(requests={"a": ra, "b": rb}, load=1))
    (lv,) = d.loads
    assert lv.what == "end-to-end s per request" and lv.winner == "b"
    assert lv.a == pytest.approx(3.27, rel=0.03) and lv.b == pytest.approx(1.61, rel=0.03)
    assert lv.lead.startswith("2.0×")
    # Decode and TTFT beside it: A decodes faster, B starts sooner.
    assert re.fullmatch(r"decode 10\d vs (89|9\d) tok/s, TTFT 2 vs 0\.2 s", lv.beside), lv.beside
    assert d.recommendation == switch_to("b")
    assert f"end-to-end s per request ({lv.beside})" in d.action
    # Decode alone is still its own step, and says A.
    decode = next(s for s in d.steps if s.key == "decode")
    assert "a ahead" in decode.answer


def test_a_latency_bound_level_above_c1_is_compared_on_the_whole_request() -> None:
    """At c=8 the engine in use (A) spends 2.0 s of its 3.3 s a request waiting for the first
    token: latency-bound (TTFT >= LATENCY_BOUND_TTFT_SHARE of e2e), so c=8 is compared on the
    whole request, as c=1 is, with decode and TTFT beside it. With B in use (TTFT 0.2 s of
    1.6 s) the same level is not, and aggregate tok/s decides there."""
    rng = random.Random(2)
    quiet = Noise(round=0.01, wave=0.01, request=0.02)
    a, ra = simulated_engine(rng, "a", (1, 8), 3, speed=100.0, ttft=2.0, noise=quiet)
    b, rb = simulated_engine(rng, "b", (1, 8), 3, speed=90.0, ttft=0.2, noise=quiet)
    assert latency_bound(ra.rounds(a, a.at_concurrency(8)))
    assert not latency_bound(rb.rounds(b, b.at_concurrency(8)))
    assert not latency_bound([])
    d = decide_compare(a, b, CompareInputs(requests={"a": ra, "b": rb}))
    by_c = {lv.concurrency: lv for lv in d.loads}
    assert by_c[8].what == "end-to-end s per request" and by_c[8].winner == "b"
    assert by_c[8].a == pytest.approx(3.27, rel=0.03) and by_c[8].b == pytest.approx(1.61, rel=0.03)
    parts = r"decode 10\d(\.\d)? vs (89|9\d)(\.\d)? tok/s, TTFT 2 vs 0\.2 s"
    assert re.fullmatch(parts, by_c[8].beside), by_c[8].beside
    # B in use: not latency-bound at c=8, aggregate tok/s decides (B still ahead there).
    d = decide_compare(b, a, CompareInputs(requests={"a": ra, "b": rb}))
    by_c = {lv.concurrency: lv for lv in d.loads}
    assert by_c[1].what == "end-to-end s per request"
    assert by_c[8].what == "aggregate tok/s" and by_c[8].winner == "b" and by_c[8].beside == ""


def gapped_engine(
    rng: random.Random, name: str, waves: int, gaps: Callable[[int, int, int], list[float]]
) -> tuple[EngineResult, EngineRequests]:
    """An engine at c=16 over 3 rounds of `waves` waves whose requests carry their inter-token
    gaps: `gaps(round, wave, i)` of the i-th request of that wave (ITL_TOKENS tokens each)."""
    e, reqs = simulated_engine(rng, name, (16,), 3, noise=Noise(0.01, 0.01, 0.02), waves=waves)
    for rd, records in enumerate(reqs.by_row[0]):
        for k, r in enumerate(sorted(records, key=lambda r: r.start_time)):
            g = [x * rng.lognormvariate(0, 0.05) for x in gaps(rd, k // 16, k % 16)]
            r.itls, r.chunks = g, len(g) + 1
            r.itl_p50_s, r.itl_p99_s = percentile(g, 50), percentile(g, 99)
            r.tpot_s = sum(g) / len(g)
    return e, reqs


ITL_TOKENS = 64
ITL_SLO = parse_slo("itl_p99=50ms")


def warm_up(rd: int, wave: int, i: int) -> list[float]:
    """The reviewer's case: round 1's first wave at 60 ms gaps, every other wave at 10 ms."""
    return [0.060 if rd == wave == 0 else 0.010] * (ITL_TOKENS - 1)


def steady(rd: int, wave: int, i: int) -> list[float]:
    return [0.010] * (ITL_TOKENS - 1)


def stalls(rd: int, wave: int, i: int) -> list[float]:
    """Every request of every wave stalls: 4 of its 63 gaps at 60 ms (a pooled p99 of 60 ms)."""
    return [0.060] * 4 + [0.010] * (ITL_TOKENS - 5)


Engine = tuple[EngineResult, EngineRequests]


def compare_at_16(a: Engine, b: Engine) -> Decision:
    """compare's call at c=16 with the itl_p99 SLO (A in use)."""
    inputs = CompareInputs(requests={"a": a[1], "b": b[1]}, load=16, slo=ITL_SLO)
    return decide_compare(a[0], b[0], inputs)


def test_an_itl_warm_up_wave_is_no_confident_miss_and_no_switch() -> None:
    """Pooled gaps resampled as independent samples made A miss itl_p99=50ms with a tight
    interval (0.064-0.065) from one warm-up wave, and compare switched. The request (with its
    gaps) is the unit of the resample, its wave and round the blocks: the warm-up widens the
    interval down to the 10 ms of the other waves, so A is not judged and the call is stay."""
    rng = random.Random(3)
    # The reviewer's shape: 3 rounds of 2 waves, 96 requests: not judged, and says why.
    a, b = gapped_engine(rng, "a", 2, warm_up), gapped_engine(rng, "b", 2, steady)
    s = judge_step(ITL_SLO, 16, a[1].by_row[0])
    assert s.observed["itl_p99"] == pytest.approx(0.06, rel=0.1)  # the pooled p99: vLLM's
    lo, _ = s.bounds["itl_p99"]
    assert s.met is None and lo is not None and lo < 0.012  # the 10 ms waves p99
    assert s.why_not_judged() == "itl_p99: 96 requests, a p99 needs 368"
    d = compare_at_16(a, b)
    assert d.recommendation == STAY, d.action
    # Enough requests for a p99 (3 rounds of 8 waves, 384): B meets it with confidence, A's
    # one warm-up wave still is not a confident miss, and the call stays.
    a, b = gapped_engine(rng, "a", 8, warm_up), gapped_engine(rng, "b", 8, steady)
    sa, sb = judge_step(ITL_SLO, 16, a[1].by_row[0]), judge_step(ITL_SLO, 16, b[1].by_row[0])
    assert sa.observed["itl_p99"] == pytest.approx(0.06, rel=0.1)
    lo, hi = sa.bounds["itl_p99"]
    assert sa.met is None and lo is not None and hi is not None and lo < 0.05 < hi
    assert sb.met is True and sb.bounds["itl_p99"][1] == pytest.approx(0.0112, rel=0.02)
    d = compare_at_16(a, b)
    assert d.recommendation == STAY, d.action


def test_itl_gaps_slow_in_every_wave_are_a_confident_miss_and_switch() -> None:
    rng = random.Random(4)
    a, b = gapped_engine(rng, "a", 8, stalls), gapped_engine(rng, "b", 8, steady)
    s = judge_step(ITL_SLO, 16, a[1].by_row[0])
    lo, _ = s.bounds["itl_p99"]
    assert s.met is False and lo is not None and lo > 0.05
    d = compare_at_16(a, b)
    assert d.recommendation == switch_to("b"), d.action
    assert "only b meets the SLO" in d.action
    # A miss needs no count: 96 requests whose every wave stalls miss it too.
    few = gapped_engine(rng, "a", 2, stalls)
    assert judge_step(ITL_SLO, 16, few[1].by_row[0]).met is False
