"""An httpx transport on aiohttp's client: the engine requests of every collection.

The collectors speak httpx (its API, timeouts, exceptions and streaming), which the tests
rely on. httpx's own transport (httpcore on anyio) costs about as much CPU per request as
everything else in a collection together: it checks every pooled connection for expiry
on each request, which asks the socket for its peer name, and more. This transport keeps
the httpx interface and sends the request with aiohttp, which the exporter already uses
for its server. Behaviour the collectors depend on is kept:

- timeouts: httpx's `connect` and `read` timeouts become aiohttp's per-connect and
  per-read timeouts, and raise `httpx.ConnectTimeout` / `httpx.ReadTimeout`;
- failures raise `httpx.ConnectError` (no connection) or `httpx.ReadError` /
  `httpx.RemoteProtocolError` (broken answer), all `httpx.TransportError`;
- the body is streamed in chunks, so a size cap can stop reading early;
- redirects, content decoding and auth stay with httpx (`follow_redirects`, gzip).

Idle connections are closed after KEEPALIVE_SECONDS, below llama-server's 5 s keep-alive,
so a request never goes out on a connection the server is closing.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import httpx

KEEPALIVE_SECONDS = 4.0
CHUNK_BYTES = 64 * 1024
# Set by aiohttp itself; passing httpx's copies would duplicate them.
_SKIP_HEADERS = {b"host", b"content-length", b"transfer-encoding", b"connection"}


class _Body(httpx.AsyncByteStream):
    def __init__(self, response: aiohttp.ClientResponse):
        self._response = response

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._response.content.iter_chunked(CHUNK_BYTES):
                yield chunk
        except BaseException as exc:
            self._response.close()
            raise _mapped(exc) from exc

    async def aclose(self) -> None:
        # A body read to the end returns the connection to the pool; one abandoned early
        # (size cap) must not be reused, since the rest of it would still be on the wire.
        if self._response.content.at_eof():
            self._response.release()
        else:
            self._response.close()


def _mapped(exc: BaseException) -> BaseException:
    """The httpx exception a collector expects for an aiohttp failure."""
    if isinstance(exc, httpx.HTTPError) or not isinstance(exc, Exception):
        return exc
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return httpx.ConnectTimeout(str(exc) or "connect timeout")
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
        return httpx.ReadTimeout(str(exc) or "read timeout")
    if isinstance(exc, (aiohttp.ClientConnectorError, aiohttp.InvalidURL)):
        return httpx.ConnectError(str(exc))
    if isinstance(exc, (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError)):
        return httpx.RemoteProtocolError(str(exc) or type(exc).__name__)
    if isinstance(exc, (aiohttp.ClientError, OSError)):
        return httpx.ReadError(f"{type(exc).__name__}: {exc}")
    return exc


class AiohttpTransport(httpx.AsyncBaseTransport):
    """httpx transport sending requests with one pooled aiohttp session."""

    def __init__(self, keepalive_seconds: float = KEEPALIVE_SECONDS) -> None:
        self.keepalive_seconds = keepalive_seconds
        self._session: aiohttp.ClientSession | None = None

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(keepalive_timeout=self.keepalive_seconds),
                cookie_jar=aiohttp.DummyCookieJar(),
                auto_decompress=False,  # httpx decodes Content-Encoding itself
                skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding"),
            )
        return self._session

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        timeouts = request.extensions.get("timeout", {})
        timeout = aiohttp.ClientTimeout(
            total=None,
            sock_connect=timeouts.get("connect"),
            sock_read=timeouts.get("read"),
        )
        headers = [
            (k.decode("latin-1"), v.decode("latin-1"))
            for k, v in request.headers.raw
            if k.lower() not in _SKIP_HEADERS
        ]
        body = await request.aread() if request.method not in ("GET", "HEAD") else None
        try:
            response = await self._get_session().request(
                request.method,
                str(request.url),
                headers=headers,
                data=body,
                allow_redirects=False,
                timeout=timeout,
            )
        except BaseException as exc:
            raise _mapped(exc) from exc
        return httpx.Response(
            status_code=response.status,
            headers=[(k, v) for k, v in response.raw_headers],
            stream=_Body(response),
            extensions={
                "http_version": b"HTTP/1.1",
                "reason_phrase": (response.reason or "").encode("latin-1", "replace"),
            },
        )

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
