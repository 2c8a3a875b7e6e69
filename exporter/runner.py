"""Gather all collectors concurrently under the scrape deadline.

A failing or slow source never fails the scrape: it is reported through
`llmb_source_up{source}`, `llmb_source_duration_seconds{source}` and
`llmb_source_errors_total{source,reason}`, and its fallback families (for an
engine, `llmb_engine_up 0`) are emitted instead. Every series gets the configured
`host` label here, so no collector has to know about it.

Collection is coalesced: concurrent `/metrics` requests share the one collection
in flight, and with `min_interval` a request within that many seconds of the last
collection is answered from it. The engines therefore see one set of requests per
collection, however many scrapers there are. Each `Collection` caches its encoded
exposition per format, so many scrapers cost one rendering.
"""

from __future__ import annotations

import asyncio
import gzip
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field

from prometheus_client.exposition import choose_encoder, generate_latest
from prometheus_client.metrics_core import Metric

from core import series as llmb
from exporter import __version__
from exporter.collectors import Collector, Scrape, SourceError
from exporter.exposition import render_text
from exporter.schema import MetricSet
from model.host_memory import HostBandwidth

log = logging.getLogger(__name__)

# Leave this much of Prometheus' scrape timeout for rendering and the network.
DEADLINE_MARGIN_SECONDS = 0.25
MIN_DEADLINE_SECONDS = 0.1


def deadline_from_header(header: str | None, default: float) -> float:
    """Seconds available to collect, from `X-Prometheus-Scrape-Timeout-Seconds` when valid."""
    if header:
        try:
            value = float(header)
        except ValueError:
            value = 0.0
        if value > 0:
            return max(MIN_DEADLINE_SECONDS, value - DEADLINE_MARGIN_SECONDS)
    return default


class Families:
    """A registry-shaped wrapper so client_python's encoders can render our families."""

    def __init__(self, families: list[Metric]):
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return self._families


@dataclass
class Collection:
    """The families of one collection, and their encodings rendered so far.

    Shared by every request coalesced onto it, so it is never mutated after it is built
    except for the encoding cache.
    """

    families: list[Metric]
    started: float
    _encoded: dict[tuple[str, bool], tuple[bytes, str]] = field(default_factory=dict, repr=False)

    def encode(self, accept: str = "", gzipped: bool = False) -> tuple[bytes, str]:
        """Body and content type for an `Accept` header, gzip-compressed when asked for.

        Rendered once per format per collection: 20 scrapers cost one rendering.
        """
        encoder, content_type = choose_encoder(accept)
        key = (content_type, gzipped)
        cached = self._encoded.get(key)
        if cached is None:
            plain = self._encoded.get((content_type, False))
            body = plain[0] if plain is not None else _render(encoder, self.families)
            self._encoded[(content_type, False)] = (body, content_type)
            if gzipped:
                # Level 1: on loopback and LAN the CPU matters more than the last bytes, and
                # an exposition still shrinks about tenfold.
                body = gzip.compress(body, compresslevel=1)
                self._encoded[key] = (body, content_type)
            cached = (body, content_type)
        return cached


def _render(encoder: Callable[[Families], bytes], families: list[Metric]) -> bytes:
    # The plain text format of the default Accept header has a faster writer with the same
    # output; anything it does not cover goes to client_python.
    if encoder is generate_latest:
        text = render_text(families)
        if text is not None:
            return text
    return encoder(Families(families))


class CollectionTimeout(Exception):
    """A request's deadline passed while it waited for a collection, and none was done yet."""

    def __init__(self, deadline: float):
        super().__init__(f"no collection finished within {deadline:.2f}s")


class Runner:
    """Owns the collectors, the coalescing of collections and the exporter's error counters."""

    def __init__(
        self,
        collectors: Sequence[Collector],
        default_deadline: float = 10.0,
        host: str | None = None,
        min_interval: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
        host_bandwidth: HostBandwidth | None = None,
    ):
        self.collectors = list(collectors)
        # Measured once before the runner exists (model/host_memory.py), exported every scrape.
        self.host_bandwidth = host_bandwidth
        self.default_deadline = default_deadline
        # Stamped on every series so one Prometheus can scrape many machines.
        self.host = host
        # A request within this many seconds of the start of the last collection gets it.
        self.min_interval = min_interval
        self.clock = clock
        # Collections run so far (each one is one set of engine requests).
        self.collections = 0
        self._errors: Counter[tuple[str, str]] = Counter()
        self._logged: dict[str, frozenset[tuple[str, str]]] = {}
        self._crashed: dict[str, str] = {}
        self._inflight: asyncio.Future[Collection] | None = None
        self._inflight_ends = 0.0  # time.monotonic() by which the collection in flight ends
        self._last: Collection | None = None
        # Shared resources to release after the collectors (the engines' HTTP client).
        self.on_close: list[Callable[[], Awaitable[None]]] = []

    async def start(self) -> None:
        for collector in self.collectors:
            await collector.start()

    async def close(self) -> None:
        for collector in self.collectors:
            try:
                await collector.close()
            except Exception:
                log.exception("closing source %s failed", collector.source)
        for release in self.on_close:
            await release()

    async def _run_one(self, collector: Collector, deadline: float) -> tuple[Scrape, float]:
        start = time.perf_counter()
        try:
            scrape = await asyncio.wait_for(collector.collect(), timeout=deadline)
        except asyncio.TimeoutError:
            timeout = SourceError("timeout", f"no answer within {deadline:.2f}s")
            scrape = Scrape(metrics=collector.fallback(), up=False, errors=[timeout])
        except SourceError as failed:
            scrape = Scrape(metrics=collector.fallback(), up=False, errors=[failed])
        except Exception as exc:
            text = f"{type(exc).__name__}: {exc}"
            # A bug that repeats on every scrape gets one traceback, not one per scrape.
            if self._crashed.get(collector.source) != text:
                log.exception("source %s crashed", collector.source)
                self._crashed[collector.source] = text
            crashed = SourceError("parse", text)
            scrape = Scrape(metrics=collector.fallback(), up=False, errors=[crashed])
        return scrape, time.perf_counter() - start

    async def collect(self, deadline: float | None = None) -> Collection:
        """The current collection: the one in flight, a recent one, or a new one.

        Requests that arrive while a collection runs wait for it instead of starting their
        own. One that joins a collection due to end after its own deadline (a scraper with
        a shorter timeout than the one that started it) waits until its deadline and then
        gets the last finished collection; `CollectionTimeout` when there is none yet.
        """
        last = self._last
        if (
            last is not None
            and self.min_interval > 0
            and self.clock() - last.started < self.min_interval
        ):
            return last
        budget = self.default_deadline if deadline is None else deadline
        task = self._inflight
        if task is None:
            task = self._start(budget)
        elif self._inflight_ends > time.monotonic() + budget:
            try:
                return await asyncio.wait_for(asyncio.shield(task), budget)
            except asyncio.TimeoutError:
                if self._last is None:
                    raise CollectionTimeout(budget) from None
                return self._last
        # A scraper that disconnects must not cancel the collection the others wait for.
        return await asyncio.shield(task)

    async def collect_new(self, deadline: float | None = None) -> Collection:
        """A collection that began after this call: never a recent one, nor one already in
        flight (whose sources may have been read before what the caller just did)."""
        asked = self.clock()
        while True:
            task = self._inflight
            if task is None:
                task = self._start(self.default_deadline if deadline is None else deadline)
            collection = await asyncio.shield(task)
            if collection.started >= asked:
                return collection
            if self._inflight is task:  # done: the next turn starts a new one
                self._inflight = None

    def _start(self, budget: float) -> asyncio.Future[Collection]:
        """Begin the collection that requests arriving meanwhile will share."""
        task = asyncio.ensure_future(self._collect(budget))
        self._inflight = task
        self._inflight_ends = time.monotonic() + budget
        task.add_done_callback(self._finished)
        return task

    def _finished(self, task: asyncio.Future[Collection]) -> None:
        if self._inflight is task:
            self._inflight = None
        if not task.cancelled() and task.exception() is None:
            self._last = task.result()

    async def scrape(self, deadline: float | None = None) -> list[Metric]:
        """Collect every source concurrently and return all families for one /metrics answer."""
        return (await self.collect(deadline)).families

    async def _collect(self, budget: float) -> Collection:
        started = self.clock()
        self.collections += 1
        results = await asyncio.gather(*(self._run_one(c, budget) for c in self.collectors))
        out: list[Metric] = []
        own = MetricSet()
        own.info(llmb.EXPORTER_BUILD_INFO, version=__version__)
        if self.host_bandwidth is not None:
            own.add(
                llmb.HOST_MEMORY_BANDWIDTH_BYTES_PER_SECOND,
                self.host_bandwidth.bytes_per_second,
                source=self.host_bandwidth.source,
            )
        for collector, (scrape, duration) in zip(self.collectors, results, strict=True):
            out.extend(scrape.metrics)
            source = collector.source
            own.add(llmb.SOURCE_UP, 1.0 if scrape.up else 0.0, source=source)
            own.add(llmb.SOURCE_DURATION_SECONDS, duration, source=source)
            for err in scrape.errors:
                self._errors[(source, err.reason)] += 1
            self._log_change(source, scrape)
        for (source, reason), count in sorted(self._errors.items()):
            own.add(llmb.SOURCE_ERRORS_TOTAL, count, source=source, reason=reason)
        out.extend(own.metrics())
        merged = _merge(out)
        if self.host is not None:
            _add_host(merged, self.host)
        return Collection(merged, started)

    def _log_change(self, source: str, scrape: Scrape) -> None:
        """Log each error of a source once while it persists, and its recovery once."""
        current = frozenset((err.reason, str(err)) for err in scrape.errors)
        previous = self._logged.get(source, frozenset())
        # A set, not the last message: a source with two errors per scrape would otherwise
        # alternate between them and log both on every scrape.
        for reason, message in sorted(current - previous):
            log.warning("source=%s reason=%s error=%s", source, reason, message)
        if current:
            self._logged[source] = current
        elif scrape.up and source in self._logged:
            log.info("source=%s recovered", source)
            del self._logged[source]
            self._crashed.pop(source, None)


def _add_host(families: list[Metric], host: str) -> None:
    """Add the `host` label to every sample, once and centrally, after collection."""
    for fam in families:
        fam.samples = [
            s if "host" in s.labels else s._replace(labels={**s.labels, "host": host})
            for s in fam.samples
        ]


def _merge(families: list[Metric]) -> list[Metric]:
    """Merge families of the same name from different collectors (e.g. two engines)."""
    merged: dict[str, Metric] = {}
    for fam in families:
        existing = merged.get(fam.name)
        if existing is None:
            merged[fam.name] = fam
        else:
            existing.samples.extend(fam.samples)
    return list(merged.values())
