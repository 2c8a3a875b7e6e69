"""core.stats and core.slo: seeded bootstrap intervals, the noise floor, SLO terms and goodput.

The false-winner check is statistical: identical engines simulated as per-request samples
(with the run-to-run drift of a shared host) must give no winner in 20 of 20 seeded runs,
and an engine 30 % faster must be called in 20 of 20.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import pytest

from core.slo import gaps, judge_step, max_concurrency_within, parse_slo
from core.stats import (
    Bootstrap,
    Interval,
    over_rounds,
    percentile,
    pooled_percentile,
    quantile_bounds,
    ratio_side,
    requests_needed,
    waves,
)
from core.thresholds import COMPARE_NOISE_FLOOR


@dataclass
class Req:
    """A request as the SLO and the statistics read it."""

    start_time: float
    end_time: float
    ttft_s: float | None
    itl_p50_s: float | None
    itl_p99_s: float | None
    e2e_s: float
    completion_tokens: int | None = 96
    tpot_s: float | None = 0.01
    chunks: int = 0
    itls: list[float] = field(default_factory=list)
    error: str | None = None


def mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def test_percentile_interpolates() -> None:
    assert percentile([3.0, 1.0, 2.0, 4.0], 50) == pytest.approx(2.5)
    assert percentile([1.0, 2.0], 99) == pytest.approx(1.99)
    assert percentile([], 50) is None


def test_the_same_samples_give_the_same_interval() -> None:
    rng = random.Random(7)
    rounds = [[rng.gauss(100, 10) for _ in range(64)]]
    first = Bootstrap[float]().interval(rounds, mean)
    assert first == Bootstrap[float]().interval(rounds, mean)
    assert first is not None and first.lo < first.value < first.hi
    # Another seed moves the bounds by little: 2000 resamples are enough.
    other = Bootstrap[float](seed=1).interval(rounds, mean)
    assert other is not None and abs(other.lo - first.lo) < 0.5


def test_interval_width_shrinks_with_more_requests() -> None:
    rng = random.Random(3)
    few = [[rng.gauss(100, 10) for _ in range(8)]]
    many = [[rng.gauss(100, 10) for _ in range(512)]]
    a, b = Bootstrap[float]().interval(few, mean), Bootstrap[float]().interval(many, mean)
    assert a is not None and b is not None
    assert (b.hi - b.lo) < (a.hi - a.lo) / 4


def test_rounds_widen_the_interval_and_the_figure_is_their_median() -> None:
    rng = random.Random(5)
    # Two rounds 20 % apart: the spread between rounds must show in the interval.
    rounds = [[rng.gauss(100, 2) for _ in range(64)], [rng.gauss(120, 2) for _ in range(64)]]
    iv = Bootstrap[float]().interval(rounds, mean)
    one = Bootstrap[float]().interval(rounds[:1], mean)
    assert iv is not None and one is not None
    assert iv.value == pytest.approx(over_rounds(rounds, mean))
    assert iv.value == pytest.approx(110, abs=1)
    assert iv.hi - iv.lo > 5 * (one.hi - one.lo)


def test_ratio_side_needs_the_whole_interval_beyond_the_floor() -> None:
    f = COMPARE_NOISE_FLOOR
    assert ratio_side(Interval(1.3, 1 + f + 0.01, 1.5)) == 1
    assert ratio_side(Interval(1.3, 1 + f - 0.01, 1.5)) == 0
    assert ratio_side(Interval(0.7, 0.6, 1 / (1 + f) - 0.01)) == -1
    assert ratio_side(Interval(1.0, 0.9, 1.1)) == 0


def engine_run(rng: random.Random, speed: float, n: int = 64) -> list[list[float]]:
    """Per-request tok/s of one step: the run's drift (a few % on a shared host) × noise."""
    drift = rng.gauss(1.0, 0.015)
    return [[speed * drift * rng.lognormvariate(0, 0.15) for _ in range(n)]]


def sides_of_20_seeded_runs(first_seed: int, speed_b: float) -> list[int]:
    """The side `ratio_side` calls in 20 seeded runs of A at 100 tok/s against B at `speed_b`."""
    sides = []
    for seed in range(20):
        rng = random.Random(first_seed + seed)
        a, b = engine_run(rng, 100.0), engine_run(rng, speed_b)
        out = Bootstrap[float](seed=seed).ratio(a, b, mean)
        assert out is not None
        sides.append(ratio_side(out[2]))
    return sides


def test_identical_engines_give_no_winner_in_20_of_20_seeded_runs() -> None:
    assert sides_of_20_seeded_runs(0, 100.0) == [0] * 20


def test_a_30_percent_faster_engine_is_called_in_20_of_20_seeded_runs() -> None:
    assert sides_of_20_seeded_runs(100, 130.0) == [1] * 20


def test_parse_slo_terms_and_errors() -> None:
    slo = parse_slo("ttft_p99=2s,itl_p99=100ms,e2e_p50=1.5s")
    assert [(t.name, t.limit_s) for t in slo.terms] == [
        ("ttft_p99", 2.0),
        ("itl_p99", 0.1),
        ("e2e_p50", 1.5),
    ]
    assert slo.text() == "ttft_p99=2s,itl_p99=100ms,e2e_p50=1.5s"
    tpot = parse_slo("tpot_p99=50ms").terms[0]
    assert (tpot.metric, tpot.q, tpot.limit_s) == ("tpot", 99, 0.05)
    for bad in ("ttft_p95=2s", "tpot_p95=1s", "ttft_p99=2", "ttft_p99=2s,ttft_p99=3s"):
        with pytest.raises(ValueError):
            parse_slo(bad)


def step(e2es: list[float], ttft: float | None = 0.1, t0: float = 0.0) -> list[Req]:
    return [Req(t0, t0 + e, ttft, 0.01, 0.02, e) for e in e2es]


def test_judge_step_percentiles_goodput_and_share() -> None:
    slo = parse_slo("e2e_p90=2s")
    # 10 requests, 8 within 2 s; p90 of e2e is between the 9th and 10th: over the limit,
    # but 10 requests cannot bound a p90 either way: not judged, and it says what it needs.
    s = judge_step(slo, 4, [step([1.0] * 8 + [3.0, 4.0])])
    assert s.met is None and s.within == 8 and s.share == pytest.approx(0.8)
    assert s.observed["e2e_p90"] == pytest.approx(3.1)
    assert s.needs == {"e2e_p90": 36} and s.bounds["e2e_p90"] == (1.0, None)
    assert s.why_not_judged() == "e2e_p90: 10 requests, a p90 needs 36"
    # Wall time is the round's span (4 s): 8 good requests of 96 tokens each.
    assert s.goodput_rps == pytest.approx(2.0) and s.goodput_tok_s == pytest.approx(192.0)
    # 40 requests: a p90 is bounded; 30 % of them over the limit, spread over the waves of
    # 4 (three in every ten), misses it with confidence.
    spread = [3.0 if i % 10 in (0, 3, 6) else 1.0 for i in range(40)]
    assert judge_step(slo, 4, [step(spread)]).met is False
    # The same 12 in the last three waves: the other seven waves meet it, and a resample
    # that draws one slow wave or none does too: no confident miss.
    assert judge_step(slo, 4, [step([1.0] * 28 + [3.0] * 12)]).met is None
    assert judge_step(slo, 1, [step([1.0] * 40)]).met is True
    # 10 % over the limit: the true p90 may lie on either side: not judged (no count needed).
    edge = judge_step(slo, 4, [step([1.0] * 36 + [3.0] * 4)])
    assert edge.met is None and edge.unjudged == ["e2e_p90"] and edge.needs == {}


def test_quantile_bounds_and_the_requests_a_percentile_needs() -> None:
    assert [requests_needed(q) for q in (50, 90, 99)] == [6, 36, 368]
    values = [float(i) for i in range(1, 1001)]
    lo, hi = quantile_bounds(values, 99)
    assert lo is not None and hi is not None and lo < 990 < hi
    assert quantile_bounds(values[:367], 99)[1] is None
    assert quantile_bounds(values[:368], 99)[1] is not None
    assert quantile_bounds([], 50) == (None, None)


def test_a_term_that_was_not_measured_is_not_met() -> None:
    slo = parse_slo("ttft_p99=1s,e2e_p99=10s")
    s = judge_step(slo, 4, [step([1.0] * 4, ttft=None)])
    assert s.met is None and s.unmeasured == ["ttft_p99"] and s.within == 0
    # ... but a failing term still fails the step.
    s = judge_step(slo, 4, [step([20.0] * 4, ttft=None)])
    assert s.met is False


def test_failed_requests_are_never_within() -> None:
    slo = parse_slo("e2e_p99=10s")
    reqs = step([1.0] * 4)
    reqs[0].error = "http_error"
    s = judge_step(slo, 4, [reqs])
    assert s.within == 3 and s.share == pytest.approx(0.75)


def test_the_highest_load_within_comes_from_every_level_and_a_miss_below_is_named() -> None:
    slo = parse_slo("e2e_p50=5s")
    steps = [
        judge_step(slo, 1, [step([1.0] * 8)]),
        judge_step(slo, 4, [step([3.5] * 8)]),
        judge_step(slo, 16, [step([9.1] * 8)]),
        judge_step(slo, 64, [step([4.0] * 8)]),  # better again: it counts, the miss is named
    ]
    assert [s.met for s in steps] == [True, True, False, True]
    assert max_concurrency_within(steps) == 64
    assert [s.concurrency for s in gaps(steps)] == [16]
    assert max_concurrency_within(steps[2:3]) is None and gaps(steps[2:3]) == []


def test_live_goodput_counts_the_requests_within_the_slo() -> None:
    from loadgen.metrics import LoadgenMetrics
    from loadgen.results import RequestRecord

    def record(ttft: float, e2e: float, error: str | None = None) -> RequestRecord:
        return RequestRecord(
            "a", 0, 0, 0.0, e2e, ttft, 0.01, 0.01, 0.02, 0.01, e2e, 100.0, 64, 96, None, 96,
            "length", None, None, None, None, None, None, error,
        )  # fmt: skip

    metrics = LoadgenMetrics(parse_slo("ttft_p99=1s,e2e_p90=5s"))
    for r in (record(0.5, 3.0), record(2.0, 3.0), record(0.5, 6.0), record(0.5, 1.0, "timeout")):
        metrics.observe(r)
    get = metrics.registry.get_sample_value
    assert get("llmb_loadgen_goodput_requests_total", {"engine": "a"}) == 1
    assert get("llmb_loadgen_goodput_completion_tokens_total", {"engine": "a"}) == 96
    assert get("llmb_loadgen_slo_info", {"slo": "ttft_p99=1s,e2e_p90=5s"}) == 1
    # Without --slo nothing is counted and no SLO is published.
    plain = LoadgenMetrics()
    plain.observe(record(0.5, 3.0))
    assert (
        plain.registry.get_sample_value("llmb_loadgen_goodput_requests_total", {"engine": "a"})
        is None
    )


def test_a_ratio_needs_a_positive_figure_on_both_sides() -> None:
    zero = [[0.0, 0.0, 0.0, 0.0]]
    some = [[1.0, 2.0, 3.0, 4.0]]
    assert Bootstrap[float]().ratio(zero, some, mean) is None
    assert Bootstrap[float]().ratio(some, zero, mean) is None
    assert Bootstrap[float]().ratio([[]], some, mean) is None


def test_a_slow_wave_is_resampled_as_a_block() -> None:
    """The same-weights run's c=16: one wave of a round at 0.23 s, the next at 0.06 s. As
    independent requests the interval of the mean is narrow; as two waves of 16 it spans
    much of the distance between them (a resample may hold the slow wave twice or not at all)."""
    rounds = [[0.233] * 16 + [0.057] * 16]
    flat = Bootstrap[float]().interval(rounds, mean)
    waved = Bootstrap[float](wave=16).interval(rounds, mean)
    assert flat is not None and waved is not None
    assert flat.value == waved.value == pytest.approx(0.145)
    assert waved.hi - waved.lo > 2.5 * (flat.hi - flat.lo)
    assert waved.lo == pytest.approx(0.057) and waved.hi == pytest.approx(0.233)
    assert [len(w) for w in waves(list(range(10)), 4)] == [4, 4, 2]


def test_tpot_reads_each_requests_mean_time_per_token_and_itl_pools_every_gap() -> None:
    # 100 gaps of 10 ms and one stall of 300 ms per request: the mean time per token (tpot,
    # AIPerf's and GuideLLM's) is 13 ms; vLLM's pooled ITL p90 is 10 ms; each request's own
    # p99 gap (what itl read before) is near 300 ms.
    gaps = [0.01] * 100 + [0.3]
    reqs = [Req(0.0, 1.0, 0.1, 0.01, 0.297, 1.0, tpot_s=0.013, chunks=102, itls=gaps)
            for _ in range(40)]  # fmt: skip
    s = judge_step(parse_slo("tpot_p90=50ms,itl_p90=50ms"), 4, [reqs])
    assert s.observed == {"tpot_p90": pytest.approx(0.013), "itl_p90": pytest.approx(0.01)}
    assert s.met is True and s.per_request == []
    # Requests saved without their gaps: each request's own gap, and the step says so.
    old = [Req(0.0, 1.0, 0.1, 0.01, 0.297, 1.0, chunks=102) for _ in range(40)]
    s = judge_step(parse_slo("itl_p90=50ms"), 4, [old])
    assert s.observed == {"itl_p90": pytest.approx(0.297)} and s.per_request == ["itl_p90"]
    assert s.met is False


def test_an_itl_slo_says_its_meaning_changed(capsys: pytest.CaptureFixture[str]) -> None:
    from loadgen.options import ITL_NOTICE, slo_arg

    slo_arg("ttft_p99=1s")
    assert capsys.readouterr().err == ""
    slo_arg("itl_p99=100ms")
    assert capsys.readouterr().err == ITL_NOTICE + "\n"
    assert "\n" not in ITL_NOTICE  # one line


def waves_of(pattern: list[list[float]], t0: float = 0.0) -> list[Req]:
    """One round's requests, wave after wave (each wave's requests start together)."""
    out = []
    for i, wave in enumerate(pattern):
        out += step(wave, t0=t0 + i * 10.0)
    return out


def test_one_slow_wave_is_no_confident_miss_but_every_wave_slow_is() -> None:
    """Requests sent together share batches: a slow (warm-up) wave is one block, not 8
    independent requests. The SLO's interval resamples rounds, waves and requests as the
    ratio intervals do, so one slow wave of four cannot make a confident miss alone."""
    slo = parse_slo("e2e_p90=2s")
    fast, slow = [1.0] * 8, [5.0] * 8
    one_slow = [waves_of([slow, fast]), waves_of([fast, fast])]
    s = judge_step(slo, 8, one_slow)
    assert s.met is not False and s.observed["e2e_p90"] == pytest.approx(5.0)
    lo, _ = s.bounds["e2e_p90"]
    assert lo is not None and lo <= 2.0
    # The same 8 slow requests of 32 as independent ones (order statistics alone) would be
    # a confident miss: the wave structure is what holds it back.
    lo_independent, _ = quantile_bounds([1.0] * 24 + [5.0] * 8, 90)
    assert lo_independent is not None and lo_independent > 2.0
    # Every wave misses (2 slow requests in each): a confident miss.
    mixed = [1.0] * 6 + [5.0] * 2
    every = judge_step(slo, 8, [waves_of([mixed, mixed]), waves_of([mixed, mixed])])
    assert every.met is False
    lo, _ = every.bounds["e2e_p90"]
    assert lo is not None and lo > 2.0


def test_pooled_bootstrap_takes_the_statistic_of_all_rounds_together() -> None:
    rounds = [[1.0, 2.0], [3.0, 10.0]]
    pooled = Bootstrap[float](pooled=True).interval(rounds, mean)
    per_round = Bootstrap[float]().interval(rounds, mean)
    assert pooled is not None and per_round is not None
    assert pooled.value == pytest.approx(4.0)  # mean of the four, not median of 1.5 and 6.5
    assert per_round.value == pytest.approx(4.0)
    skewed = [[1.0, 2.0], [3.0, 10.0], [4.0, 5.0]]
    p = Bootstrap[float](pooled=True).interval(skewed, mean)
    assert p is not None and p.value == pytest.approx(25 / 6)
    assert over_rounds(skewed, mean) == pytest.approx(4.5)


def test_pooled_percentile_is_the_bootstrap_of_requests_carrying_their_gaps() -> None:
    """`pooled_percentile` finds its ends by a search over counts, not by sorting each
    resample: it must give exactly the interval of resampling the requests (rounds, waves,
    requests, each with all its gaps) and reading each resample's pooled order statistics."""
    rng = random.Random(11)
    for _ in range(4):
        rounds = [
            [[rng.lognormvariate(0, 0.5) * (3 if (rd == 0 and i < 4) else 1)
              for _ in range(rng.randint(0, 30))] for i in range(rng.randint(1, 12))]
            for rd in range(rng.randint(1, 3))
        ]  # fmt: skip
        for q in (50, 90, 99):
            got = pooled_percentile(rounds, q, wave=4, resamples=200)
            pooled = [v for rnd in rounds for g in rnd for v in g]
            if not pooled:
                assert got is None
                continue
            lows, highs = [], []
            for drawn in Bootstrap[list[float]](200, wave=4).draws(rounds):
                vals = sorted(v for rnd in drawn for g in rnd for v in g)
                if vals:
                    pos = (len(vals) - 1) * q / 100
                    lows.append(vals[math.floor(pos)])
                    highs.append(vals[math.ceil(pos)])
            lows.sort()
            highs.sort()
            m = len(lows)
            point = percentile(pooled, q)
            assert got is not None and point is not None and got.value == point
            assert got.lo == min(point, lows[math.floor((m - 1) * 0.025)])
            assert got.hi == max(point, highs[math.ceil((m - 1) * 0.975)])
            assert pooled_percentile(rounds, q, wave=4, resamples=200) == got  # seeded


def test_a_pooled_itl_percentile_needs_requests_not_gaps() -> None:
    """3 requests of 200 gaps are 600 gaps, enough order statistics for a p99 if gaps were
    independent; but the requests are the units (a request's gaps share its batches, and the
    tail may come whole requests at a time): a p99 is bounded from 368 requests, as ttft's."""
    slo = parse_slo("itl_p99=50ms")
    gaps = [0.01] * 200
    few = [Req(0.0, 2.0, 0.1, 0.01, 0.01, 2.0, chunks=201, itls=gaps) for _ in range(3)]
    s = judge_step(slo, 4, [few])
    assert s.met is None and s.why_not_judged() == "itl_p99: 3 requests, a p99 needs 368"
    many = [Req(0.0, 1.0, 0.1, 0.01, 0.01, 1.0, chunks=4, itls=[0.01] * 3) for _ in range(368)]
    s = judge_step(slo, 16, [many])
    assert s.met is True and s.bounds["itl_p99"] == (0.01, 0.01)
    # A miss needs no count: 3 requests whose gaps all lie over the limit miss it.
    slow = [Req(0.0, 2.0, 0.1, 0.1, 0.1, 2.0, chunks=201, itls=[0.1] * 200) for _ in range(3)]
    assert judge_step(slo, 4, [slow]).met is False
