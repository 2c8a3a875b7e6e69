"""The one reader of the exporter's series: over HTTP (`--exporter-url`) or in process.

Both give `Series`, {(name, sorted labels): value}, from the exporter's own code: a page is
parsed by `exporter.promtext`, an embedded exporter (`EmbeddedExporter`, the exporter's
collectors run inside the caller, fed one engine) is read from its families. `sweep`'s
per-step figures (`ExporterStepProbe`) and `diagnose`'s monitor (`diagnose.monitor`) read
through here; nothing else in `loadgen` or `diagnose` touches the exporter's internals.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import lzma
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from config.settings import Config, EngineConfig, GpuConfig, ProcessMatch
from core import series as llmb
from core.promql import SeriesKey
from exporter.app import build_runner
from exporter.collectors.llamacpp.log import LogState
from exporter.collectors.llamacpp.memory import host_experts
from exporter.collectors.nvml.backend import NvmlError, PynvmlBackend
from exporter.promtext import parse_exposition
from exporter.runner import Runner
from loadgen.options import metrics_url
from loadgen.resolve import model_label
from model.geometry import geometry_from_gguf
from model.host_memory import HostBandwidth

log = logging.getLogger(__name__)

Series = dict[SeriesKey, float]


def series_from_text(text: str) -> Series:
    """An exporter page as {(name, sorted labels): value} (ValueError when it is none)."""
    expo = parse_exposition(text, llmb.PREFIX)
    return {
        (name, tuple(sorted(s.labels.items()))): s.value
        for name, samples in expo.samples.items()
        for s in samples
    }


def read_exporter(url: str, timeout: float = 10.0) -> Series:
    """One scrape of the exporter, with or without /metrics in `url` (raises httpx/ValueError)."""
    resp = httpx.get(metrics_url(url), timeout=timeout)
    resp.raise_for_status()
    return series_from_text(resp.text)


async def read_exporter_async(client: httpx.AsyncClient, url: str) -> Series:
    """`read_exporter` on an open client (raises httpx/ValueError)."""
    resp = await client.get(metrics_url(url))
    resp.raise_for_status()
    return series_from_text(resp.text)


def pick(series: Series, name: str, **labels: str) -> list[float]:
    """Every value of `name` whose labels include `labels`."""
    return [
        v
        for (n, lab), v in series.items()
        if n == name and all(dict(lab).get(k) == want for k, want in labels.items())
    ]


def first(series: Series, name: str, **labels: str) -> float | None:
    """The largest value of `name` with `labels` (None when absent)."""
    vals = pick(series, name, **labels)
    return max(vals) if vals else None


def labelled(series: Series, name: str) -> list[tuple[dict[str, str], float]]:
    """(labels, value) of every sample of `name`."""
    return [(dict(lab), v) for (n, lab), v in series.items() if n == name]


def exporter_engine(series: Series, engine: str, model: str | None = None) -> str:
    """The exporter's name for our engine: the same name, else the one serving our model.

    With `--url` the load generator names the engine after its model while the exporter's
    config may call it anything; `llmb_engine_info{model}` links the two. Without a model
    (diagnose), an exporter that knows exactly one engine means that one.
    """
    names = {lab.get("engine") for lab, _ in labelled(series, llmb.ENGINE_UP)}
    models = {
        lab["engine"]: lab.get("model", "")
        for lab, _ in labelled(series, llmb.ENGINE_INFO)
        if "engine" in lab
    }
    if engine in names or engine in models:
        return engine
    if model is not None:
        wanted = {m for m in (model, engine) if m}
        matches = [e for e, m in models.items() if m in wanted or model_label(m) in wanted]
        return matches[0] if len(matches) == 1 else engine
    only = next(iter(names)) if len(names) == 1 else None
    if only:
        log.info("exporter knows the engine as %r; using its series", only)
        return only
    return engine


def gpu_readable(gpu: GpuConfig) -> bool:
    """Whether the embedded NVML collector would read a GPU (a fake file, or NVML with a GPU)."""
    if gpu.fake_file:
        return True
    if not gpu.enabled:
        return False
    backend = PynvmlBackend()
    try:
        backend.init()
        return backend.device_count() > 0
    except NvmlError:  # no driver / no GPU: other sources
        return False
    finally:
        backend.shutdown()


class EmbeddedExporter:
    """The exporter's collectors for one engine, run in this process."""

    def __init__(
        self,
        engine: EngineConfig,
        log_file: Path | None,
        pid: int | None,
        gpu: GpuConfig | None,
        host_bandwidth: HostBandwidth | None = None,
    ):
        update: dict[str, Any] = {}
        if log_file is not None:
            update["log_file"] = log_file
        if pid is not None:
            update["process"] = ProcessMatch(pid=pid)
        config = Config(
            host="diagnose",
            engines=[engine.model_copy(update=update)],
            gpu=gpu if gpu is not None else GpuConfig(enabled=False),
        )
        self._runner: Runner = build_runner(config, host_bandwidth=host_bandwidth)

    async def start(self) -> None:
        """Start the collectors."""
        await self._runner.start()

    async def read(self, fresh: bool = False) -> Series:
        """One scrape of every collector; `fresh`: one that began after this call (not the
        collection a background sampler has in flight)."""
        if fresh:
            families = (await self._runner.collect_new()).families
        else:
            families = await self._runner.scrape()
        return {
            (s.name, tuple(sorted(s.labels.items()))): float(s.value)
            for family in families
            for s in family.samples
        }

    async def close(self) -> None:
        """Close the collectors."""
        await self._runner.close()


@dataclass
class _Stats:
    values: dict[str, list[float]] = field(default_factory=dict)

    def add(self, key: str, value: float) -> None:
        if not math.isnan(value):
            self.values.setdefault(key, []).append(value)

    def result(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, vals in sorted(self.values.items()):
            out[f"{key}_max"] = max(vals)
            out[f"{key}_mean"] = sum(vals) / len(vals)
        return out


class ExporterStepProbe:
    """`sweep`'s probe: polls the exporter during a step, max and mean of three series."""

    def __init__(self, url: str, engine: str, interval: float = 1.0, model: str | None = None):
        self.url = metrics_url(url)
        self.engine = engine
        self.model = model
        self.interval = interval
        self._task: asyncio.Task[None] | None = None
        self._stats = _Stats()
        self._scrapes = 0
        self._errors = 0

    async def start(self) -> None:
        """Begin polling in the background."""
        self._task = asyncio.create_task(self._loop())

    async def _loop(self) -> None:
        async with httpx.AsyncClient(timeout=max(self.interval * 2, 2.0)) as client:
            while True:
                await self._sample(client)
                await asyncio.sleep(self.interval)

    async def _sample(self, client: httpx.AsyncClient) -> None:
        try:
            series = await read_exporter_async(client, self.url)
        except (httpx.HTTPError, OSError, ValueError) as exc:
            self._errors += 1
            log.debug("exporter probe %s: %s", self.url, exc)
            return
        self._scrapes += 1
        engine = exporter_engine(series, self.engine, self.model or "")
        for name, key in (
            (llmb.ENGINE_KV_CACHE_USAGE_RATIO, "kv_usage"),
            (llmb.ENGINE_REQUESTS_WAITING, "waiting"),
        ):
            for value in pick(series, name, engine=engine):
                self._stats.add(key, value)
        peak = pick(series, llmb.GPU_MEMORY_USED_PEAK_BYTES)
        if peak:
            self._stats.add("gpu_memory_peak_bytes", max(0.0, *peak))

    async def stop(self) -> dict[str, Any]:
        """Stop polling (after one last sample) and return the step's figures."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        # One last read so a short step still has a sample taken at its end.
        async with httpx.AsyncClient(timeout=5.0) as client:
            await self._sample(client)
        out = self._stats.result()
        out.update(source="exporter", scrapes=self._scrapes, scrape_errors=self._errors)
        return out


def saved_log_experts(log: Path, model: Path | None) -> tuple[int, float] | None:
    """(layers, bytes) of routed experts in host memory that a saved llama-server log shows,
    read by the exporter's own log parser (with the GGUF's geometry when `model` is readable):
    what `decide` re-reads so that a saved run gains today's parser. None: the log says not.
    `.xz` logs (as docs/results keeps them) are read too."""
    state = LogState()
    xz = log.suffix == ".xz"
    with (
        lzma.open(log, "rt", encoding="utf-8", errors="replace")
        if xz
        else log.open(encoding="utf-8", errors="replace")
    ) as f:
        for line in f:
            state.feed(line)
    geom = None
    if model is not None and model.is_file():
        with contextlib.suppress(OSError, ValueError):
            geom = geometry_from_gguf(model)
    return host_experts(state, geom)
