"""The served mix: the lengths, rate and load an engine served, read from the user's Prometheus.

`served_mix(url, window, engine=...)` asks the Prometheus that scrapes the exporter for one
engine's series over the last `window` and returns a `ServedMix`: the prompt and output length
distributions, the arrival rate and the running load, with what the engine's series cannot
tell. `ServedMix.length_mix()` is it as a `LengthMix` (loadgen/traffic/mix.py, the one owner of
the `llmb-length-mix` file): `served-mix` writes it, `run --traffic-from` replays it.

What each engine gives (docs/loadgen.md "The served mix from your Prometheus"):
- SGLang: per-request histograms of prompt and output lengths
  (`llmb_engine_request_prompt_tokens`, `llmb_engine_request_generation_tokens`, from its
  `sglang:prompt_tokens_histogram` / `generation_tokens_histogram`): an empirical mix.
- llama.cpp: token totals only (`llmb_engine_prompt_tokens_total`,
  `llmb_engine_generation_tokens_total`) over the finished requests the exporter counts in its
  log (`llmb_engine_requests_finished_total`): the mix is the mean length (`fixed`).
- Neither gives arrival times or prefix structure: the rate is the mean over the window, the
  cached share of prompt tokens is said but not turned into shared prefixes.

The running load is the p50 and p90 of `llmb_engine_requests_running` (the p90, rounded up,
is `--load-from`'s load: `busiest_running` and `round_load` are shared with it).
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone

import httpx

from config.kinds import engine_kind
from core import series as llmb
from loadgen.options import UsageError
from loadgen.prom_api import (
    Prometheus,
    QueryError,
    duration_seconds,
    label,
    prom_duration,
)
from loadgen.traffic.mix import KIND, LengthDist, LengthMix

MIX_KIND = KIND
DEFAULT_SEED = 1234
# A p90 of 12.0000001 is 12 requests, not 13 (float noise of the interpolation).
_ROUND_SLACK = 1e-6
# Weights below this (increase()'s extrapolation, used after a reset) are no requests.
_NO_WEIGHT = 1e-9
# How far before the window its start value is looked for (`last_over_time`): a failed
# scrape or an outage writes a stale marker, where an instant `offset` lookup finds nothing
# and took the counter for new. A counter without a sample in it counts from zero (so would
# one whose engine's /metrics failed for longer than this without a restart).
BEFORE_WINDOW = "1h"
# The labels that tell one exporter's engine from another's: its counters and its
# `llmb_engine_up` share them (the exporter's `engine`, `host` and the scrape's target).
INSTANCE_LABELS = "engine, host, instance, job"

# llama.cpp's /metrics counts tokens, not requests: the exporter counts them from its log.
NO_REQUEST_COUNT = (
    "no count of finished requests ({finished}); llama.cpp's /metrics counts tokens but not "
    "requests, and the exporter counts them from llama-server's log: give the exporter the "
    "server's log (log_file in its engine entry) and read again once Prometheus has scraped some"
)
# What no engine's series give (said in every mix).
ALWAYS_LACKS = (
    "no arrival times: the rate is the mean over the window",
    "no prefix structure: the cached share of prompt tokens is said, not replayed",
)


class ServedMixError(UsageError):
    """The served mix could not be read (the message says why and what to do; exit 2)."""


def display_name(kind: str) -> str:
    """How messages name an engine kind (config/kinds.py), the label itself when unknown."""
    try:
        return engine_kind(kind).display
    except KeyError:
        return kind or "the engine"


def mean_only(kind: str) -> str:
    """What a mix without length histograms says (llama.cpp's always does)."""
    return (
        f"{display_name(kind)} exports only token totals, no per-request length histograms "
        f"({llmb.ENGINE_REQUEST_PROMPT_TOKENS}, {llmb.ENGINE_REQUEST_GENERATION_TOKENS}): the "
        "mix is the mean length"
    )


def round_load(p90: float) -> int:
    """Running requests at the p90 as a concurrency: rounded up, at least 1 (idle: c=1)."""
    if not math.isfinite(p90) or p90 < 0:
        raise ValueError(f"not a number of requests: {p90}")
    return max(1, math.ceil(p90 - _ROUND_SLACK))


def running_selector(engine: str, window: str) -> str:
    """`llmb_engine_requests_running{engine="NAME"}[1h]`."""
    return f"{llmb.ENGINE_REQUESTS_RUNNING}{{engine={label(engine)}}}[{window}]"


def running_quantile_query(engine: str, window: str, quantile: float) -> str:
    """The quantile of running requests over the window, one series per host/instance."""
    return f"quantile_over_time({quantile}, {running_selector(engine, window)})"


@dataclass(frozen=True)
class RunningLoad:
    """A quantile of running requests: of the busiest series, with its samples in the window."""

    value: float
    samples: int | None
    series: int


def busiest_running(
    prom: Prometheus,
    client: httpx.Client,
    engine: str,
    window: str,
    quantile: float,
    at: float | None = None,
) -> RunningLoad | None:
    """The quantile of the busiest series of `engine` over the window ending now (or at the
    Unix time `at`); None: Prometheus has no series of it.

    Series without a number (NaN) are left out; a `QueryError` when no series has one."""
    found = prom.query(client, running_quantile_query(engine, window, quantile), at)
    if not found:
        return None
    found = [(lab, v) for lab, v in found if math.isfinite(v) and v >= 0]
    if not found:
        raise QueryError(
            f"Prometheus at {prom.url} answered no number of running requests for {engine!r} "
            f"over the last {window}"
        )
    samples = prom.query(client, f"count_over_time({running_selector(engine, window)})", at)
    # One series per host or instance serving that engine: the busiest one's load.
    labels, value = max(found, key=lambda lv: lv[1])
    count = next((int(v) for lab, v in samples if lab == labels), None)
    return RunningLoad(value, count, len(found))


@dataclass(frozen=True)
class Lengths:
    """One served length distribution, in tokens per request.

    `buckets`: (upper bound, requests in the bucket, not cumulative) from the engine's
    histogram; empty when the engine gives only the mean. `mean`: exact (sum / count)."""

    mean: float
    buckets: tuple[tuple[float, float], ...]
    source: str

    def dist(self) -> LengthDist:
        """The length-mix distribution: `empirical` buckets, or `fixed` at the mean."""
        if self.buckets:
            return LengthDist(empirical=tuple((ub, round(w, 3)) for ub, w in self.buckets))
        return LengthDist(fixed=max(1, round(self.mean)))


@dataclass(frozen=True)
class ServedMix:
    """What one engine served over a window, as a length mix and a rate (`length_mix`)."""

    engine: str
    kind: str
    window: str
    at: float  # the window's end (Unix seconds): every query was evaluated there
    prometheus: str
    prompt: Lengths
    output: Lengths
    requests: float  # finished in the window (increase of the counter)
    rate_per_second: float  # requests / window: the mean, idle time included
    running_p50: float | None
    running_p90: float | None
    cached_share: float | None  # prompt tokens served from the prefix cache (0-1)
    lacks: tuple[str, ...]  # what this engine's series cannot tell
    seed: int = DEFAULT_SEED

    @property
    def concurrency(self) -> int | None:
        """The p90 of running requests rounded up (`--load-from`'s load), None unknown."""
        return None if self.running_p90 is None else round_load(self.running_p90)

    def ends(self) -> str:
        """The window's end, UTC to the second (`2026-12-07T03:20:00Z`)."""
        return datetime.fromtimestamp(self.at, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")

    def source(self) -> str:
        """One paragraph: where each figure came from and what is missing."""
        running = (
            f"running requests p50 {self.running_p50:.3g}, p90 {self.running_p90:.3g}"
            if self.running_p50 is not None and self.running_p90 is not None
            else "running requests: no samples"
        )
        cached = (
            f", {self.cached_share:.1%} of prompt tokens cached"
            if self.cached_share is not None
            else ""
        )
        return (
            f"served by {self.engine} ({self.kind}) over the {self.window} ending {self.ends()}, "
            f"Prometheus at "
            f"{self.prometheus}: {self.requests:.0f} requests finished "
            f"({self.rate_per_second:.3g}/s), {running}{cached}; prompt lengths: "
            f"{self.prompt.source}; output lengths: {self.output.source}; lacks: "
            + "; ".join(self.lacks)
        )

    def length_mix(self) -> LengthMix:
        """The served mix as a length mix: what `served-mix` writes and `--traffic-from`
        replays (a histogram bucket past the mix's bounds is a ServedMixError)."""
        try:
            return LengthMix(
                prompt_tokens=self.prompt.dist(),
                output_tokens=self.output.dist(),
                rate_per_second=self.rate_per_second,
                concurrency=None if self.concurrency is None else float(self.concurrency),
                seed=self.seed,
                requests=None,
                source=self.source(),
            )
        except ValueError as exc:
            raise ServedMixError(f"served-mix: not a length mix: {exc}") from None


def buckets_from_cumulative(
    cumulative: list[tuple[float, float]],
) -> tuple[tuple[tuple[float, float], ...], float]:
    """Per-bucket counts from cumulative (le, count) pairs, and the count above the last
    finite bound (the +Inf bucket), which is folded into the last finite bucket.

    increase() extrapolates each bucket on its own, so a cumulative count can dip below the
    one before it by a fraction: such a bucket counts 0. Trailing empty buckets are dropped;
    leading ones are kept (each bucket starts at the bound before it)."""
    ordered = sorted(cumulative)
    out: list[tuple[float, float]] = []
    before = 0.0
    above = 0.0
    for le, count in ordered:
        weight = max(0.0, count - before)
        before = max(before, count)
        if math.isinf(le):
            above = weight
        else:
            out.append((le, weight))
    if above > _NO_WEIGHT and out:
        out[-1] = (out[-1][0], out[-1][1] + above)
    while out and out[-1][1] <= _NO_WEIGHT:
        out.pop()
    return tuple(out), above


def counted_increase(selector: str, window: str, up: str, by: str = "") -> str:
    """PromQL for the exact increase of the counters `selector` over `window`, summed.

    `increase()` extrapolates each series to the window's edges, and less for one that starts
    near zero, so a histogram's `_sum` and `_count` stretch differently: on a few requests the
    mean they give was 3 % off. A counter's samples are exact, so per series:
    - with a sample in the `BEFORE_WINDOW` before the window: the last value less the last
      one before the window; if it is below that one anywhere in the window (the engine
      restarted at its start) the last value, counted from zero;
    - without one, it appeared in the window (an engine's histogram appears with its first
      request) and counts from zero when its instance (`up`, matched on `INSTANCE_LABELS`)
      had a sample before the window, or when it has fewer samples than the instance's
      scrapes that the engine answered (`sum_over_time(up)`: a failed engine scrape writes
      only `llmb_engine_up 0`, so it makes no counter look younger);
    - else (its instance first scraped in the window: Prometheus started there) what
      Prometheus saw, max - min;
    - a series that reset inside the window falls back to `increase()`."""
    on = f"on({INSTANCE_LABELS})"
    last = f"last_over_time({selector}[{window}])"
    before = f"last_over_time({selector}[{BEFORE_WINDOW}] offset {window})"
    low = f"min_over_time({selector}[{window}])"
    kept = f"(({last} - {before}) unless ({low} < {before}))"
    restarted = f"({last} and ({low} < {before}))"
    up_before = f"max_over_time({up}[{BEFORE_WINDOW}] offset {window})"
    answered = f"max by ({INSTANCE_LABELS}) (sum_over_time({up}[{window}]))"
    younger = f"count_over_time({selector}[{window}]) < {on} group_left() {answered}"
    appeared = f"({last} and {on} {up_before} or {last} and ({younger}))"
    seen = f"(max_over_time({selector}[{window}]) - {low})"
    exact = (
        f"(({kept} or {restarted} or {appeared} or {seen}) unless resets({selector}[{window}]) > 0)"
    )
    return f"sum{by} ({exact} or increase({selector}[{window}]))"


@dataclass(frozen=True)
class _Reader:
    """The queries of one engine over one window, all evaluated at one instant `at`: the
    scrapes that land while they run would otherwise move the window between two of them (the
    running quantiles read 1, then 0.5)."""

    prom: Prometheus
    client: httpx.Client
    engine: str
    window: str
    at: float
    flags: ServedFlags

    def _sel(self, name: str) -> str:
        return f"{name}{{engine={label(self.engine)}}}"

    def counted(self, name: str, by: str = "") -> str:
        """The PromQL of a counter's exact increase over the window, summed (`by` e.g.
        ` by (le)`): `counted_increase` over this engine's series."""
        return counted_increase(self._sel(name), self.window, self._sel(llmb.ENGINE_UP), by)

    def increase(self, name: str) -> float | None:
        """The summed increase of a counter over the window (None: no series)."""
        found = self.prom.query(self.client, self.counted(name), self.at)
        values = [v for _, v in found if math.isfinite(v)]
        return values[0] if values else None

    def histogram(self, name: str) -> tuple[list[tuple[float, float]], float, float] | None:
        """Cumulative (le, count) increases, the count and the sum (None: no histogram)."""
        found = self.prom.query(self.client, self.counted(name + "_bucket", " by (le)"), self.at)
        cumulative = []
        for labels, value in found:
            try:
                cumulative.append((float(labels.get("le", "nan")), value))
            except ValueError:
                continue
        cumulative = [(le, v) for le, v in cumulative if not math.isnan(le) and math.isfinite(v)]
        count = self.increase(name + "_count")
        total = self.increase(name + "_sum")
        if not cumulative or count is None or total is None:
            return None
        return cumulative, count, total


def _lengths(
    reader: _Reader, hist_name: str, total_name: str, requests: float, kind: str, what: str
) -> tuple[Lengths, bool]:
    """One distribution: from the histogram when it counted requests, else the mean of the
    token counter over the finished requests. The flag says it is the mean only."""
    hist = reader.histogram(hist_name)
    if hist is not None and hist[1] > _NO_WEIGHT:
        cumulative, count, total = hist
        buckets, above = buckets_from_cumulative(cumulative)
        note = (
            f" ({above:.0f} above {buckets[-1][0]:.0f} tokens counted in the last bucket)"
            if above > 0.5 and buckets
            else ""
        )
        source = (
            f"{hist_name} histogram, {count:.0f} requests, mean {total / count:.1f} tokens{note}"
        )
        return Lengths(total / count, buckets, source), False
    tokens = reader.increase(total_name)
    if tokens is None:
        raise ServedMixError(
            f"served-mix: Prometheus at {reader.prom.url} has no {what} series of "
            f"{reader.engine!r} ({hist_name} nor {total_name}) in the last {reader.window}"
        )
    mean = tokens / requests
    return Lengths(mean, (), f"{mean_only(kind)} ({mean:.1f} tokens from {total_name})"), True


def _engine_kind(reader: _Reader, engine: str | None) -> tuple[str, str]:
    """The engine to read (the only one when not named) and its kind."""
    prom, client, window = reader.prom, reader.client, reader.window
    found = prom.query(
        client,
        f"count by (engine, kind) (count_over_time({llmb.ENGINE_UP}[{window}]))",
        reader.at,
    )
    kinds = {lab.get("engine", ""): lab.get("kind", "") for lab, _ in found}
    if not kinds:
        raise ServedMixError(
            f"served-mix: Prometheus at {prom.url} has no {llmb.ENGINE_UP} samples in the last "
            f"{window}: is it scraping the exporter (job llmb-exporter)? Give a longer "
            f"{reader.flags.window}"
        )
    names = ", ".join(sorted(kinds))
    if engine is None:
        if len(kinds) > 1:
            raise ServedMixError(
                f"served-mix: Prometheus at {prom.url} has samples of several engines "
                f"({names}): pass {reader.flags.engine} NAME"
            )
        engine = next(iter(kinds))
    if engine not in kinds:
        raise ServedMixError(
            f"served-mix: Prometheus at {prom.url} has no samples of engine {engine!r} in the "
            f"last {window}; it has samples of {names}: pass {reader.flags.engine} NAME or a "
            f"longer {reader.flags.window}"
        )
    return engine, kinds[engine]


@dataclass(frozen=True)
class ServedFlags:
    """The flags an error tells the user to change: served-mix's own, or `run --traffic-from`'s
    (`TRAFFIC_FLAGS`), so a message never names a flag the command does not have."""

    engine: str = "--engine"
    window: str = "--window"


TRAFFIC_FLAGS = ServedFlags("--traffic-engine", "--traffic-window")


def window_duration(window: str | float) -> str:
    """The window as a Prometheus duration: `1h` as given, or seconds (3600 → `3600s`)."""
    if isinstance(window, str):
        try:
            return prom_duration(window)
        except argparse.ArgumentTypeError as exc:
            raise ServedMixError(f"served-mix: window: {exc}") from None
    if not math.isfinite(window) or window < 1:
        raise ServedMixError(f"served-mix: window: at least 1 second, got {window!r}")
    return f"{round(window)}s"


def served_mix(
    prometheus_url: str,
    window: str | float,
    engine: str | None = None,
    seed: int = DEFAULT_SEED,
    timeout: float | None = None,
    at: float | None = None,
    flags: ServedFlags = ServedFlags(),
) -> ServedMix:
    """What `engine` (the only engine Prometheus has, when None) served over the `window` (a
    Prometheus duration such as `1h`, or seconds) ending now, or at the Unix time `at`;
    `ServedMixError` (exit 2) when it cannot be read. Every query is evaluated at that one
    instant, so the figures are of one window and a second read with the same `at` agrees."""
    window = window_duration(window)
    seconds = duration_seconds(window)
    if at is None:
        at = time.time()
    elif not math.isfinite(at) or at <= 0:
        raise ServedMixError(f"served-mix: --at: a Unix time in seconds, got {at!r}")
    prom = Prometheus(prometheus_url) if timeout is None else Prometheus(prometheus_url, timeout)
    with prom.asking(ServedMixError, "served-mix") as client:
        reader = _Reader(prom, client, engine or "", window, at, flags)
        return _read(reader, engine, seconds, seed)


def _read(reader: _Reader, engine: str | None, seconds: float, seed: int) -> ServedMix:
    name, kind = _engine_kind(reader, engine)
    reader = replace(reader, engine=name)
    where = f"Prometheus at {reader.prom.url}"
    requests = reader.increase(llmb.ENGINE_REQUESTS_FINISHED_TOTAL)
    if requests is None:
        why = NO_REQUEST_COUNT.format(finished=llmb.ENGINE_REQUESTS_FINISHED_TOTAL)
        raise ServedMixError(f"served-mix: {name} ({display_name(kind)}) on {where}: {why}")
    if requests < 0.5:
        raise ServedMixError(
            f"served-mix: {name} finished no request in the last {reader.window} ({where}): "
            f"give a window in which it served traffic ({reader.flags.window})"
        )
    prompt, prompt_mean_only = _lengths(
        reader,
        llmb.ENGINE_REQUEST_PROMPT_TOKENS,
        llmb.ENGINE_PROMPT_TOKENS_TOTAL,
        requests,
        kind,
        "prompt",
    )
    output, output_mean_only = _lengths(
        reader,
        llmb.ENGINE_REQUEST_GENERATION_TOKENS,
        llmb.ENGINE_GENERATION_TOKENS_TOTAL,
        requests,
        kind,
        "output",
    )
    cached = reader.increase(llmb.ENGINE_PROMPT_TOKENS_CACHED_TOTAL)
    prompt_tokens = reader.increase(llmb.ENGINE_PROMPT_TOKENS_TOTAL)
    share = cached / prompt_tokens if cached is not None and prompt_tokens else None
    p50 = busiest_running(reader.prom, reader.client, name, reader.window, 0.5, reader.at)
    p90 = busiest_running(reader.prom, reader.client, name, reader.window, 0.9, reader.at)
    lacks = list(ALWAYS_LACKS)
    if prompt_mean_only or output_mean_only:
        lacks.insert(0, mean_only(kind))
    return ServedMix(
        engine=name,
        kind=kind,
        window=reader.window,
        at=reader.at,
        prometheus=reader.prom.url,
        prompt=prompt,
        output=output,
        requests=requests,
        rate_per_second=requests / seconds,
        running_p50=None if p50 is None else p50.value,
        running_p90=None if p90 is None else p90.value,
        cached_share=None if share is None else min(1.0, max(0.0, share)),
        lacks=tuple(lacks),
        seed=seed,
    )
