"""Sweeps (one variable changed per step) and server-side probes recorded per step.

A probe reads, while one engine runs a step, the GPU memory peak, the KV-cache usage and the
queue length, either from the exporter's `/metrics` (polled during the step) or from
Prometheus (instant `max_over_time`/`avg_over_time` queries over the step at its end).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import time
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from loadgen.client import Target
from loadgen.options import metrics_url
from loadgen.scheduler import ProbeFactory, RunSpec

log = logging.getLogger(__name__)

GPU_PEAK = "llmb_gpu_memory_used_peak_bytes"
ENGINE_INFO = "llmb_engine_info"
KV_USAGE = "llmb_engine_kv_cache_usage_ratio"
WAITING = "llmb_engine_requests_waiting"


def plan_steps(
    base: RunSpec, concurrencies: list[int], prompt_tokens: list[int], grid: bool = False
) -> list[RunSpec]:
    """Steps that change one variable at a time.

    Default: every concurrency at the first prompt length, then every further prompt length
    at the first concurrency. `grid`: the full product, in an order where consecutive steps
    differ in one variable only (prompt length outer, concurrency snaking up and down).
    """
    concurrencies = concurrencies or [base.concurrency or 1]
    prompt_tokens = prompt_tokens or [base.prompt_tokens or 512]
    pairs: list[tuple[int, int]] = []
    if grid:
        for i, ptok in enumerate(prompt_tokens):
            order = concurrencies if i % 2 == 0 else list(reversed(concurrencies))
            pairs += [(c, ptok) for c in order]
    else:
        pairs += [(c, prompt_tokens[0]) for c in concurrencies]
        pairs += [(concurrencies[0], p) for p in prompt_tokens[1:]]
    return [dataclasses.replace(base, concurrency=c, prompt_tokens=p) for c, p in pairs]


class _Stats:
    def __init__(self) -> None:
        self.values: dict[str, list[float]] = {}

    def add(self, key: str, value: float) -> None:
        if not math.isnan(value):
            self.values.setdefault(key, []).append(value)

    def result(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, vals in sorted(self.values.items()):
            out[f"{key}_max"] = max(vals)
            out[f"{key}_mean"] = sum(vals) / len(vals)
        return out


def _metric_key(name: str) -> str:
    return {GPU_PEAK: "gpu_memory_peak_bytes", KV_USAGE: "kv_usage", WAITING: "waiting"}[name]


class ExporterProbe:
    """Polls the exporter's /metrics during a step and keeps max and mean of each series."""

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
        timeout = aiohttp.ClientTimeout(total=max(self.interval * 2, 2.0))
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                try:
                    await self.sample(session)
                except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as exc:
                    self._errors += 1
                    log.debug("exporter probe %s: %s", self.url, exc)
                await asyncio.sleep(self.interval)

    async def sample(self, session: aiohttp.ClientSession) -> None:
        """Read one /metrics page and account the three series."""
        async with session.get(self.url) as resp:
            resp.raise_for_status()
            text = await resp.text()
        self._scrapes += 1
        gpu_total = None
        by_engine: dict[str, list[tuple[str, float]]] = {}
        models: dict[str, str] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == GPU_PEAK:
                    gpu_total = max(gpu_total or 0.0, sample.value)
                elif sample.name in (KV_USAGE, WAITING):
                    engine = sample.labels.get("engine", "")
                    by_engine.setdefault(engine, []).append((sample.name, sample.value))
                elif sample.name == ENGINE_INFO and "engine" in sample.labels:
                    models[sample.labels["engine"]] = sample.labels.get("model", "")
        for name, value in by_engine.get(self.exporter_engine(models), []):
            self._stats.add(_metric_key(name), value)
        if gpu_total is not None:
            self._stats.add("gpu_memory_peak_bytes", gpu_total)

    def exporter_engine(self, models: dict[str, str]) -> str:
        """The exporter's name for our engine: the same name, else the one serving our model.

        With `--url` the load generator names the engine after its model while the
        exporter's config may call it anything; `llmb_engine_info{model}` links the two.
        """
        if self.engine in models or not models:
            return self.engine
        wanted = {m for m in (self.model, self.engine) if m}
        matches = [e for e, m in models.items() if m in wanted or model_label(m) in wanted]
        return matches[0] if len(matches) == 1 else self.engine

    async def stop(self) -> dict[str, Any]:
        """Stop polling (after one last sample) and return the step's figures."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        # One last read so a short step still has a sample taken at its end.
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as s:
                await self.sample(s)
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError):
            self._errors += 1
        out = self._stats.result()
        out.update(source="exporter", scrapes=self._scrapes, scrape_errors=self._errors)
        return out


class PrometheusProbe:
    """Queries Prometheus at the end of a step over the step's time range."""

    def __init__(self, url: str, engine: str):
        self.url = url.rstrip("/")
        self.engine = engine
        self._t0 = 0.0

    async def start(self) -> None:
        """Remember when the step started."""
        self._t0 = time.time()

    async def stop(self) -> dict[str, Any]:
        """Run the instant queries; a failed query is reported, not raised."""
        window = max(1, math.ceil(time.time() - self._t0))
        sel = f'{{engine="{self.engine}"}}'
        queries = {
            "gpu_memory_peak_bytes_max": f"max(max_over_time({GPU_PEAK}[{window}s]))",
            "kv_usage_max": f"max(max_over_time({KV_USAGE}{sel}[{window}s]))",
            "kv_usage_mean": f"avg(avg_over_time({KV_USAGE}{sel}[{window}s]))",
            "waiting_max": f"max(max_over_time({WAITING}{sel}[{window}s]))",
            "waiting_mean": f"avg(avg_over_time({WAITING}{sel}[{window}s]))",
        }
        out: dict[str, Any] = {"source": "prometheus", "window_s": window}
        errors = []
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            for key, query in queries.items():
                try:
                    async with session.get(
                        self.url + "/api/v1/query", params={"query": query}
                    ) as resp:
                        data = await resp.json(content_type=None)
                    result = data.get("data", {}).get("result", [])
                    if data.get("status") != "success":
                        errors.append(f"{key}: {data.get('error', 'query failed')}")
                    elif result:
                        out[key] = float(result[0]["value"][1])
                except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as exc:
                    errors.append(f"{key}: {type(exc).__name__}: {exc}")
        if errors:
            out["errors"] = errors
        return out


def model_label(model: str) -> str:
    """A model id as an engine label: the file name of a path, without `.gguf`."""
    name = model.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1]
    if name.lower().endswith(".gguf"):
        name = name[: -len(".gguf")]
    return name.strip()


def probe_factory(
    exporter_url: str | None, prometheus_url: str | None, interval: float = 1.0
) -> ProbeFactory | None:
    """A `ProbeFactory` for the given sources, or None when neither is set."""
    if prometheus_url:
        return lambda target: PrometheusProbe(prometheus_url, target.name)
    if exporter_url:
        return lambda target: ExporterProbe(exporter_url, target.name, interval, target.model)
    return None


__all__ = ["ExporterProbe", "PrometheusProbe", "Target", "plan_steps", "probe_factory"]
