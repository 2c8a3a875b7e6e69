"""The aiohttp-backed httpx transport behaves like httpx's own where the collectors look.

Every test talks real HTTP on 127.0.0.1: an aiohttp server, or a raw asyncio server for
broken answers. The same checks run against httpx's default transport as the reference,
so a difference in behaviour fails here and not in a collector.
"""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from aiohttp import web

from exporter.transport import AiohttpTransport
from tests.conftest import get_free_port

Transport = Callable[[], httpx.AsyncBaseTransport | None]
TRANSPORTS: dict[str, Transport] = {"aiohttp": AiohttpTransport, "httpx": lambda: None}


@pytest.fixture(params=sorted(TRANSPORTS))
async def client(request: pytest.FixtureRequest) -> AsyncIterator[httpx.AsyncClient]:
    transport = TRANSPORTS[request.param]()
    kwargs: dict[str, Any] = {} if transport is None else {"transport": transport}
    async with httpx.AsyncClient(follow_redirects=True, timeout=5, **kwargs) as http:
        yield http


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, dict[str, int]]]:
    """An aiohttp server with the answers the collectors meet; counts /plain requests."""
    stats = {"requests": 0}
    big = b"x" * (1 << 20)

    async def plain(request: web.Request) -> web.Response:
        stats["requests"] += 1
        headers = request.headers
        return web.Response(text=f"auth={headers.get('Authorization')} accept={headers['Accept']}")

    async def zipped(request: web.Request) -> web.Response:
        return web.Response(
            body=gzip.compress(b"llamacpp:prompt_tokens_total 1\n"),
            headers={"Content-Encoding": "gzip", "Content-Type": "text/plain"},
        )

    async def redirect(request: web.Request) -> web.Response:
        raise web.HTTPFound("/plain")

    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(3)
        return web.Response(text="late")

    async def large(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        for i in range(0, len(big), 65536):
            await resp.write(big[i : i + 65536])
        return resp

    async def status(request: web.Request) -> web.Response:
        return web.Response(status=503, text="loading")

    app = web.Application()
    for path, handler in {
        "/plain": plain,
        "/gzip": zipped,
        "/redirect": redirect,
        "/slow": slow,
        "/large": large,
        "/503": status,
    }.items():
        app.router.add_get(path, handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = get_free_port()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    yield f"http://127.0.0.1:{port}", stats
    await runner.cleanup()


async def test_headers_redirects_gzip_and_status(
    client: httpx.AsyncClient, server: tuple[str, dict[str, int]]
) -> None:
    url, stats = server
    resp = await client.get(
        url + "/plain", headers={"Authorization": "Bearer k", "Accept": "text/plain"}
    )
    assert (resp.status_code, resp.text) == (200, "auth=Bearer k accept=text/plain")
    moved = await client.get(url + "/redirect")
    assert moved.status_code == 200 and moved.url.path == "/plain"
    assert (await client.get(url + "/gzip")).text == "llamacpp:prompt_tokens_total 1\n"
    down = await client.get(url + "/503")
    assert (down.status_code, down.text) == (503, "loading")
    assert stats["requests"] == 2


async def test_read_timeout_is_an_httpx_timeout(
    client: httpx.AsyncClient, server: tuple[str, dict[str, int]]
) -> None:
    url, _ = server
    with pytest.raises(httpx.ReadTimeout):
        await client.get(url + "/slow", timeout=0.3)
    # The client still works afterwards.
    assert (await client.get(url + "/plain")).status_code == 200


async def test_refused_connection_is_a_connect_error(client: httpx.AsyncClient) -> None:
    with pytest.raises(httpx.ConnectError):
        await client.get(f"http://127.0.0.1:{get_free_port()}/metrics")


async def test_streaming_can_stop_early_and_the_client_recovers(
    client: httpx.AsyncClient, server: tuple[str, dict[str, int]]
) -> None:
    url, _ = server
    read = 0
    async with client.stream("GET", url + "/large") as resp:
        async for chunk in resp.aiter_bytes():
            read += len(chunk)
            if read >= 100_000:
                break  # a size cap gives up here
    assert 100_000 <= read < (1 << 20)
    async with client.stream("GET", url + "/large") as resp:
        assert len(await resp.aread()) == 1 << 20
    assert (await client.get(url + "/plain")).status_code == 200


async def _raw_server(answer: bytes) -> tuple[asyncio.Server, str]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(answer)
        await writer.drain()
        writer.close()

    srv = await asyncio.start_server(handle, "127.0.0.1", 0)
    return srv, f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}"


async def test_a_body_cut_short_is_a_transport_error(client: httpx.AsyncClient) -> None:
    srv, url = await _raw_server(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\npartial")
    async with srv:
        with pytest.raises(httpx.TransportError):
            await client.get(url + "/metrics")


async def test_a_garbage_answer_is_a_transport_error(client: httpx.AsyncClient) -> None:
    srv, url = await _raw_server(b"this is not HTTP\r\n\r\n")
    async with srv:
        with pytest.raises(httpx.TransportError):
            await client.get(url + "/metrics")


async def test_connections_are_kept_alive_and_closed_before_the_server_does() -> None:
    """Requests reuse one connection; one idle past the keep-alive is not reused."""
    peers: list[int] = []

    async def plain(request: web.Request) -> web.Response:
        transport = request.transport
        assert transport is not None
        peers.append(transport.get_extra_info("peername")[1])
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/", plain)
    # llama-server closes idle connections after 5 s; this one after 1 s, so the client's
    # 4 s would be too late: use a transport with a shorter keep-alive for the test.
    runner = web.AppRunner(app, access_log=None, keepalive_timeout=1.0)
    await runner.setup()
    port = get_free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    transport = AiohttpTransport(keepalive_seconds=0.5)
    try:
        async with httpx.AsyncClient(transport=transport) as http:
            for _ in range(3):
                assert (await http.get(f"http://127.0.0.1:{port}/")).text == "ok"
            assert len(set(peers)) == 1  # one connection for three requests
            await asyncio.sleep(1.5)  # past both keep-alives: the server has closed it
            assert (await http.get(f"http://127.0.0.1:{port}/")).text == "ok"
            assert len(set(peers)) == 2
    finally:
        await runner.cleanup()
