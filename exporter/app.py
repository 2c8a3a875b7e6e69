"""Wire the configured sources into a Runner."""

from __future__ import annotations

import httpx

from config.kinds import engine_kind, load
from config.settings import Config
from exporter.attribution import Attribution
from exporter.collectors import Collector
from exporter.runner import Runner
from exporter.transport import AiohttpTransport


def build_runner(config: Config, client: httpx.AsyncClient | None = None) -> Runner:
    """Create one collector per source (NVML when enabled, one per engine).

    Each engine's collector class comes from its kind's row in config/kinds.py.
    """
    from exporter.collectors.nvml.collector import NvmlCollector

    # aiohttp underneath: httpx's own transport costs more CPU than parsing (exporter/transport.py).
    http = client or httpx.AsyncClient(follow_redirects=True, transport=AiohttpTransport())
    attribution = Attribution(config.engines)
    collectors: list[Collector] = []
    if config.gpu.enabled:
        collectors.append(NvmlCollector(config.gpu, attribution))
    for engine in config.engines:
        timeout = engine.timeout_seconds or config.source_timeout_seconds
        collector = load(engine_kind(engine.kind).collector)
        collectors.append(collector(engine, http, timeout, attribution))
    runner = Runner(
        collectors,
        default_deadline=config.scrape_timeout_seconds,
        host=config.host,
        min_interval=config.min_interval,
    )
    if client is None:
        runner.on_close.append(http.aclose)
    return runner
