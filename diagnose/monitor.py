"""The monitor: what is sampled while one engine is measured (exporter series, memory).

With `--exporter-url` the running exporter is scraped. Without it the exporter's own
collectors run inside diagnose (`loadgen.exporter_series.EmbeddedExporter`: same code, same `llmb_*`
series), fed the launched engine's log and process id. Either way the series go through the
recording rules' arithmetic (`core.rules.rule_values_at`) exactly as Prometheus would. The engine's
log is read by the exporter's collector only: its layers, buffers and KV events arrive as
series. `loadgen.exporter_series` is the one seam to the exporter.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path
from typing import Protocol

import httpx

from config.settings import EngineConfig, GpuConfig
from core import series as llmb
from core.promql import series_from_scrapes
from core.rules import STRUCTURE_SERIES, RuleValues, rule_values_at
from diagnose.options import Options
from loadgen.exporter_series import (
    EmbeddedExporter,
    Series,
    exporter_engine,
    first,
    gpu_readable,
    pick,
    read_exporter,
)

log = logging.getLogger(__name__)

__all__ = ["RESULT_STRUCTURE_SERIES", "Monitor", "Series", "counters_from_zero"]

# EngineResult field -> the exporter series of the model's structure (issue 17): the
# rules' (`ModelStructure` fields, same names) and what diagnose reports beside them.
RESULT_STRUCTURE_SERIES = llmb.field_series(
    *(f for f in STRUCTURE_SERIES if f != "weights_bytes"),
    "spec_accept_length",
    "experts_host_layers",
    "experts_host_bytes",
)


class HostProcess(Protocol):
    """A launched engine as the monitor sees it: its resident memory."""

    def rss_bytes(self) -> int | None: ...


# What `increase` reads: counters and a histogram's sum and count.
COUNTER_SUFFIXES = ("_total", "_sum", "_count")


def counters_from_zero(
    scrapes: list[tuple[float, Series]], engine: str, suffixes: tuple[str, ...] = ("_total",)
) -> list[tuple[float, Series]]:
    """A window's scrapes, with 0 at its first scrape for each counter (a series named with
    one of `suffixes`) the engine began later.

    SGLang creates a metric family at its first observation (the inter-token histogram that
    gives the decode counters after the first streamed request, the retraction counter at
    the first retraction): in a step that began before it, the counter is in the step's
    later scrapes only, and a rate over a single point is none (no decode efficiency, no
    event). It stood at 0 when the step began: the engine was up and had counted nothing.
    """
    start, head = scrapes[0]
    if first(head, llmb.ENGINE_UP, engine=engine) != 1:
        return scrapes  # the engine unread at the start: absent says nothing
    born = {
        key
        for _, later in scrapes[1:]
        for key in later
        if key not in head and key[0].endswith(suffixes) and ("engine", engine) in key[1]
    }
    if not born:
        return scrapes
    return [(start, {**head, **dict.fromkeys(born, 0.0)}), *scrapes[1:]]


class Monitor:
    """Samples the exporter's series and memory while one engine is measured."""

    def __init__(self, engine: str, opts: Options):
        self.engine = engine
        self.opts = opts
        self.exporter_engine = opts.exporter_engine or engine
        self.scrapes: list[tuple[float, Series]] = []
        self.timeline: list[tuple[float, float]] = []
        self.scrape_errors = 0
        self.process: HostProcess | None = None
        self.embedded: EmbeddedExporter | None = None
        self._gpu: GpuConfig | None = None
        self._gpu_known = False
        self._task: asyncio.Task[None] | None = None

    # sources -----------------------------------------------------------------------------

    def _gpu_config(self) -> GpuConfig | None:
        """GPU sampling of the embedded collectors: the config's, when a GPU can be read."""
        if not self._gpu_known:
            self._gpu_known = True
            gpu = self.opts.gpu or GpuConfig()
            self._gpu = gpu if gpu_readable(gpu) else None
        return self._gpu

    @property
    def source(self) -> str | None:
        """'gpu' (exporter, GPU file or NVML), 'host rss' (launched engine) or None."""
        if self.opts.exporter_url or self._gpu_config() is not None:
            return "gpu"
        return "host rss" if self.process is not None else None

    async def attach(self, engine: EngineConfig, log_path: Path | None, pid: int | None) -> None:
        """Point the embedded collectors at this engine instance (after each launch)."""
        if self.opts.exporter_url:
            return
        await self.detach()
        self.exporter_engine = engine.name
        self.embedded = EmbeddedExporter(
            engine, log_path, pid, self._gpu_config(), self.opts.host_bandwidth
        )
        await self.embedded.start()

    async def detach(self) -> None:
        """Close the embedded collectors."""
        if self.embedded is not None:
            embedded, self.embedded = self.embedded, None
            await embedded.close()

    async def _read(self, fresh: bool = False) -> Series | None:
        if self.opts.exporter_url:
            try:
                series = await asyncio.to_thread(read_exporter, self.opts.exporter_url)
            except (httpx.HTTPError, ValueError) as exc:
                # A failed scrape is a gap, never a reading from another source.
                self.scrape_errors += 1
                log.debug("exporter scrape failed: %s", exc)
                return None
            self.exporter_engine = exporter_engine(series, self.exporter_engine)
            return series
        if self.embedded is not None:
            return await self.embedded.read(fresh)
        return None

    async def sample(self, fresh: bool = False) -> None:
        """Take one sample of every source; `fresh`: the embedded collectors read after this
        call (a step's window edges: a collection the background loop began earlier may
        have read the engine before the step's calibration requests ended)."""
        now = time.time()
        if self.opts.exporter_url is None and self.embedded is None:
            series = None
        else:
            series = await self._read(fresh)
            if series is None:
                return
        used: float | None = None
        if series is not None:
            self.scrapes.append((now, series))
            used = first(series, llmb.GPU_MEMORY_USED_BYTES)
        if used is None and self.process is not None and self._gpu_config() is None:
            rss = await asyncio.to_thread(self.process.rss_bytes)
            used = float(rss) if rss is not None else None
        if used is not None:
            self.timeline.append((now, used))

    async def _loop(self) -> None:
        while True:
            try:
                await self.sample()
            except Exception:  # a failed sample is a gap, not a failed run
                log.exception("sampling failed")
            await asyncio.sleep(self.opts.sample_interval)

    def start(self) -> None:
        """Begin sampling in the background."""
        if self._task is None:
            self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        """Stop sampling and close the embedded collectors."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self.detach()

    # readings ------------------------------------------------------------------------------

    def memory_peak(self, t0: float, t1: float) -> float | None:
        """Largest memory reading taken in [t0, t1] (and the exporter's peak gauge)."""
        vals = [v for t, v in self.timeline if t0 <= t <= t1]
        for t, series in self.scrapes:
            if t0 <= t <= t1:
                vals += pick(series, llmb.GPU_MEMORY_USED_PEAK_BYTES)
        return max(vals) if vals else None

    async def memory_now(self) -> float | None:
        """A fresh memory reading."""
        await self.sample()
        return self.timeline[-1][1] if self.timeline else None

    def rule_values(self, at: float, since: float | None = None) -> RuleValues | None:
        """The recording rules' values for this engine at `at`.

        With `since`, only the samples of [since, at] count: what Prometheus would say had
        it watched this load for the whole window, without the earlier steps mixed in.
        """
        # Sorted: the background sampler and a step's own samples may finish out of order.
        scrapes = sorted(
            ((t, s) for t, s in self.scrapes if since is None or since <= t <= at),
            key=lambda scrape: scrape[0],
        )
        if not scrapes:
            return None
        if since is not None:
            scrapes = counters_from_zero(scrapes, self.exporter_engine)
        series = series_from_scrapes(scrapes)
        for key, values in rule_values_at(series, at).items():
            if key.engine == self.exporter_engine:
                return values
        return None

    def window(self, name: str, t0: float, t1: float) -> list[float]:
        """Every value of this engine's `name` sampled in [t0, t1]."""
        return [
            v
            for t, s in self.scrapes
            if t0 <= t <= t1
            for v in pick(s, name, engine=self.exporter_engine)
        ]

    def increase(self, name: str, t0: float, t1: float) -> float | None:
        """How much this engine's counter `name` (a `_total`, or a histogram's `_sum` or
        `_count`) rose between the first and the last sample of [t0, t1], over its other labels.

        A series missing from the first sample while the engine was up stood at 0 (SGLang
        creates a histogram at its first observation). None without two samples, without
        the series, or across a reset (the engine restarted within the window).
        """
        scrapes = sorted(
            ((t, s) for t, s in self.scrapes if t0 <= t <= t1), key=lambda scrape: scrape[0]
        )
        if len(scrapes) < 2:
            return None
        scrapes = counters_from_zero(scrapes, self.exporter_engine, COUNTER_SUFFIXES)
        head, tail = scrapes[0][1], scrapes[-1][1]
        engine = ("engine", self.exporter_engine)
        rises = []
        for key, value in tail.items():
            if key[0] == name and engine in key[1]:
                before = head.get(key)
                if before is None or value < before:
                    return None
                rises.append(value - before)
        return sum(rises) if rises else None

    def engine_value(self, name: str) -> float | None:
        """The newest value of a per-engine series."""
        return first(self.latest(), name, engine=self.exporter_engine)

    def engine_total(self, name: str) -> float:
        """The newest values of a per-engine series, summed over its other labels."""
        return sum(pick(self.latest(), name, engine=self.exporter_engine))

    def latest(self) -> Series:
        """The newest scrape (empty without one)."""
        return self.scrapes[-1][1] if self.scrapes else {}
