"""A collector double for the runner's tests: `Fixed(source, delay, fail, crash)` answers
`llmb_engine_up 1` after `delay` seconds (a source error `fail`, or an exception with
`crash`), counts its collections in `calls`, and falls back to `llmb_engine_up 0`."""

from __future__ import annotations

import asyncio

from prometheus_client.metrics_core import Metric

from exporter.collectors import Collector, Scrape, SourceError
from exporter.schema import MetricSet


class Fixed(Collector):
    """One source `source` with a fixed answer."""

    def __init__(
        self, source: str, delay: float = 0.0, fail: str | None = None, crash: bool = False
    ):
        self.source = source
        self.delay = delay
        self.fail = fail
        self.crash = crash
        self.calls = 0

    async def collect(self) -> Scrape:
        self.calls += 1
        await asyncio.sleep(self.delay)
        if self.crash:
            raise RuntimeError("bug")
        ms = MetricSet()
        ms.add("llmb_engine_up", 1, engine=self.source, kind="llamacpp")
        if self.fail:
            return Scrape(ms.metrics(), up=False, errors=[SourceError(self.fail, "boom")])  # type: ignore[arg-type]
        return Scrape(ms.metrics())

    def fallback(self) -> list[Metric]:
        ms = MetricSet()
        ms.add("llmb_engine_up", 0, engine=self.source, kind="llamacpp")
        return ms.metrics()
