"""HTTP front of the exporter: `/metrics` renders what the runner gathered."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from aiohttp import web
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import Metric

from exporter.runner import Runner, deadline_from_header

log = logging.getLogger(__name__)

INDEX = """<html><head><title>llm-bottleneck exporter</title></head>
<body><h1>llm-bottleneck exporter</h1><p><a href="/metrics">/metrics</a></p></body></html>
"""


class _Snapshot:
    """A registry-shaped wrapper so client_python's encoders can render our families."""

    def __init__(self, families: list[Metric]):
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return self._families


def make_app(runner: Runner) -> web.Application:
    """Build the aiohttp application serving `/metrics`, `/healthz` and an index page."""

    async def metrics(request: web.Request) -> web.Response:
        deadline = deadline_from_header(
            request.headers.get("X-Prometheus-Scrape-Timeout-Seconds"), runner.default_deadline
        )
        families = await runner.scrape(deadline)
        encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
        body = encoder(_Snapshot(families))
        resp = web.Response(body=body)
        resp.headers["Content-Type"] = content_type
        return resp

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def index(request: web.Request) -> web.Response:
        return web.Response(text=INDEX, content_type="text/html")

    async def on_startup(app: web.Application) -> None:
        await runner.start()

    async def on_cleanup(app: web.Application) -> None:
        await runner.close()

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/", index)
    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app
