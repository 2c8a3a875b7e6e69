"""Sweeps (one variable changed per step) and server-side probes recorded per step.

A probe reads, while one engine runs a step, the GPU memory peak, the KV-cache usage and the
queue length, either from the exporter's `/metrics` (polled during the step by the one
exporter reader, `loadgen.exporter_series.ExporterStepProbe`) or from Prometheus (instant
`max_over_time`/`avg_over_time` queries over the step at its end).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from typing import Any

import aiohttp

from core import series as llmb
from loadgen.exporter_series import ExporterStepProbe
from loadgen.prom_api import QueryError, vector_values
from loadgen.scheduler.context import ProbeFactory
from loadgen.scheduler.spec import RunSpec
from loadgen.target import Target

log = logging.getLogger(__name__)


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
        kv, waiting = llmb.ENGINE_KV_CACHE_USAGE_RATIO, llmb.ENGINE_REQUESTS_WAITING
        queries = {
            "gpu_memory_peak_bytes_max": (
                f"max(max_over_time({llmb.GPU_MEMORY_USED_PEAK_BYTES}[{window}s]))"
            ),
            "kv_usage_max": f"max(max_over_time({kv}{sel}[{window}s]))",
            "kv_usage_mean": f"avg(avg_over_time({kv}{sel}[{window}s]))",
            "waiting_max": f"max(max_over_time({waiting}{sel}[{window}s]))",
            "waiting_mean": f"avg(avg_over_time({waiting}{sel}[{window}s]))",
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
                    values = vector_values(data)
                    if values:
                        out[key] = values[0][1]
                except QueryError as exc:
                    errors.append(f"{key}: {exc}")
                except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as exc:
                    errors.append(f"{key}: {type(exc).__name__}: {exc}")
        if errors:
            out["errors"] = errors
        return out


def probe_factory(
    exporter_url: str | None, prometheus_url: str | None, interval: float = 1.0
) -> ProbeFactory | None:
    """A `ProbeFactory` for the given sources, or None when neither is set."""
    if prometheus_url:
        return lambda target: PrometheusProbe(prometheus_url, target.name)
    if exporter_url:
        return lambda target: ExporterStepProbe(exporter_url, target.name, interval, target.model)
    return None


__all__ = ["PrometheusProbe", "Target", "plan_steps", "probe_factory"]
