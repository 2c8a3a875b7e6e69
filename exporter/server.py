"""HTTP front of the exporter: `/metrics` serves the runner's current collection.

Concurrent scrapes share one collection (`Runner.collect`), and each collection is
rendered once per format (`Collection.encode`), gzip-compressed only when the client
asks for it. `/healthz` never waits on a collection. With a web configuration
(`exporter.web_config`) every path requires HTTP basic auth.
"""

from __future__ import annotations

import logging

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from exporter.runner import CollectionTimeout, Runner, deadline_from_header
from exporter.web_config import BasicAuth

log = logging.getLogger(__name__)

INDEX = """<html><head><title>llm-bottleneck exporter</title></head>
<body><h1>llm-bottleneck exporter</h1><p><a href="/metrics">/metrics</a></p></body></html>
"""


def _accepts_gzip(header: str) -> bool:
    """True when `Accept-Encoding` lists gzip with a non-zero quality."""
    for part in header.split(","):
        coding, _, params = part.strip().partition(";")
        if coding.strip().lower() == "gzip":
            quality = params.strip().removeprefix("q=").strip()
            try:
                return not quality or float(quality) > 0
            except ValueError:
                return True
    return False


def make_app(runner: Runner, auth: BasicAuth | None = None) -> web.Application:
    """Build the aiohttp application serving `/metrics`, `/healthz` and an index page."""

    async def metrics(request: web.Request) -> web.Response:
        deadline = deadline_from_header(
            request.headers.get("X-Prometheus-Scrape-Timeout-Seconds"), runner.default_deadline
        )
        try:
            collection = await runner.collect(deadline)
        except CollectionTimeout as exc:
            # Only before the first collection ever finished; later ones serve the last.
            return web.Response(status=503, text=f"{exc}\n")
        gzipped = _accepts_gzip(request.headers.get("Accept-Encoding", ""))
        body, content_type = collection.encode(request.headers.get("Accept", ""), gzipped)
        resp = web.Response(body=body)
        resp.headers["Content-Type"] = content_type
        if gzipped:
            resp.headers["Content-Encoding"] = "gzip"
        return resp

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def index(request: web.Request) -> web.Response:
        return web.Response(text=INDEX, content_type="text/html")

    async def on_startup(app: web.Application) -> None:
        await runner.start()

    async def on_cleanup(app: web.Application) -> None:
        await runner.close()

    middlewares = [] if auth is None else [_auth_middleware(auth)]
    app = web.Application(middlewares=middlewares)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/", index)
    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app


def _auth_middleware(auth: BasicAuth) -> Middleware:
    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not await auth.allows(request.headers.get("Authorization")):
            return web.Response(
                status=401,
                text="Unauthorized\n",
                headers={"WWW-Authenticate": 'Basic realm="llmb-exporter"'},
            )
        return await handler(request)

    return check
