"""Gather all collectors concurrently under the scrape deadline.

A failing or slow source never fails the scrape: it is reported through
`llmb_source_up{source}`, `llmb_source_duration_seconds{source}` and
`llmb_source_errors_total{source,reason}`, and its fallback families (for an
engine, `llmb_engine_up 0`) are emitted instead. Every series gets the configured
`host` label here, so no collector has to know about it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Sequence

from prometheus_client.metrics_core import Metric

from exporter import __version__
from exporter.collectors import Collector, Scrape, SourceError
from exporter.schema import MetricSet

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


class Runner:
    """Owns the collectors and the exporter's own error counters."""

    def __init__(
        self,
        collectors: Sequence[Collector],
        default_deadline: float = 10.0,
        host: str | None = None,
    ):
        self.collectors = list(collectors)
        self.default_deadline = default_deadline
        # Stamped on every series so one Prometheus can scrape many machines.
        self.host = host
        self._errors: Counter[tuple[str, str]] = Counter()
        self._last_error: dict[str, str] = {}

    async def start(self) -> None:
        for collector in self.collectors:
            await collector.start()

    async def close(self) -> None:
        for collector in self.collectors:
            try:
                await collector.close()
            except Exception:
                log.exception("closing source %s failed", collector.source)

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
            log.exception("source %s crashed", collector.source)
            crashed = SourceError("parse", f"{type(exc).__name__}: {exc}")
            scrape = Scrape(metrics=collector.fallback(), up=False, errors=[crashed])
        return scrape, time.perf_counter() - start

    async def scrape(self, deadline: float | None = None) -> list[Metric]:
        """Collect every source concurrently and return all families for one /metrics answer."""
        budget = self.default_deadline if deadline is None else deadline
        results = await asyncio.gather(*(self._run_one(c, budget) for c in self.collectors))
        out: list[Metric] = []
        own = MetricSet()
        own.info("llmb_exporter_build_info", version=__version__)
        for collector, (scrape, duration) in zip(self.collectors, results, strict=True):
            out.extend(scrape.metrics)
            source = collector.source
            own.add("llmb_source_up", 1.0 if scrape.up else 0.0, source=source)
            own.add("llmb_source_duration_seconds", duration, source=source)
            for err in scrape.errors:
                self._errors[(source, err.reason)] += 1
                message = str(err)
                # Log a changed error once instead of on every scrape.
                if self._last_error.get(source) != message:
                    log.warning("source=%s reason=%s error=%s", source, err.reason, message)
                    self._last_error[source] = message
            if scrape.up and not scrape.errors and source in self._last_error:
                log.info("source=%s recovered", source)
                del self._last_error[source]
        for (source, reason), count in sorted(self._errors.items()):
            own.add("llmb_source_errors_total", count, source=source, reason=reason)
        out.extend(own.metrics())
        merged = _merge(out)
        if self.host is not None:
            _add_host(merged, self.host)
        return merged


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
