"""Wire the configured sources into a Runner."""

from __future__ import annotations

import httpx

from config.settings import Config
from exporter.attribution import Attribution
from exporter.collectors import Collector, EngineCollector
from exporter.collectors.llamacpp.collector import LlamaCppCollector
from exporter.collectors.nvml.collector import NvmlCollector
from exporter.collectors.sglang.collector import SGLangCollector
from exporter.runner import Runner
from exporter.transport import AiohttpTransport
from model.host_memory import HostBandwidth

# The collector class of each engine kind of config/kinds.py.
COLLECTORS: dict[str, type[EngineCollector]] = {
    "llamacpp": LlamaCppCollector,
    "sglang": SGLangCollector,
}


def build_runner(
    config: Config,
    client: httpx.AsyncClient | None = None,
    host_bandwidth: HostBandwidth | None = None,
) -> Runner:
    """Create one collector per source (NVML when enabled, one per engine).

    Each engine's collector class is its kind's entry in `COLLECTORS`. `host_bandwidth` is
    the host memory figure to export (the caller measures it: a copy of hundreds of MiB has
    no place in building a runner); without it, the config's
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
        collectors.append(COLLECTORS[engine.kind](engine, http, timeout, attribution))
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
