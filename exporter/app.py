"""Wire the configured sources into a Runner."""

from __future__ import annotations

import pkgutil

import httpx

from config.kinds import engine_kind
from config.settings import Config
from exporter.attribution import Attribution
from exporter.collectors import Collector, EngineCollector
from exporter.collectors.nvml.collector import NvmlCollector
from exporter.runner import Runner
from exporter.transport import AiohttpTransport
from model.host_memory import HostBandwidth


def collector_class(kind: str) -> type[EngineCollector]:
    """The collector class a kind's row names (config/kinds.py `collector`)."""
    cls = pkgutil.resolve_name(engine_kind(kind).collector)
    if not (isinstance(cls, type) and issubclass(cls, EngineCollector)):
        raise TypeError(f"{kind}: {engine_kind(kind).collector} is not an EngineCollector")
    return cls


def build_runner(
    config: Config,
    client: httpx.AsyncClient | None = None,
    host_bandwidth: HostBandwidth | None = None,
) -> Runner:
    """Create one collector per source (NVML when enabled, one per engine).

    Each engine's collector class is the one its kind's row names (`collector_class`).
    `host_bandwidth` is the host memory figure to export (the caller measures it: a copy of
    hundreds of MiB has no place in building a runner); without it, the config's
    `host_memory_bandwidth_bytes_per_second` when set, else no such series.
    """
    # aiohttp underneath: httpx's own transport costs more CPU than parsing (exporter/transport.py).
    http = client or httpx.AsyncClient(follow_redirects=True, transport=AiohttpTransport())
    attribution = Attribution(config.engines)
    collectors: list[Collector] = []
    if config.gpu.enabled:
        collectors.append(NvmlCollector(config.gpu, attribution))
    for engine in config.engines:
        timeout = engine.timeout_seconds or config.source_timeout_seconds
        collectors.append(collector_class(engine.kind)(engine, http, timeout, attribution))
    runner = Runner(
        collectors,
        default_deadline=config.scrape_timeout_seconds,
        host=config.host,
        min_interval=config.min_interval,
        host_bandwidth=host_bandwidth or configured_host_bandwidth(config),
    )
    if client is None:
        runner.on_close.append(http.aclose)
    return runner


def configured_host_bandwidth(config: Config) -> HostBandwidth | None:
    """The config's host memory bandwidth, when it sets one."""
    value = config.host_memory_bandwidth_bytes_per_second
    return HostBandwidth(value, "config") if value is not None else None
