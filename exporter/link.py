"""The compose `host` profile's link to engines that listen on the host's loopback.

The compose exporter runs on the stack's network (Prometheus scrapes it there) with the
host's pids; an engine the user already runs on 127.0.0.1 of the host is out of that
network's reach. Two halves of one byte relay carry the exporter's connections to it,
through a unix socket in a volume both containers mount:

* `python -m exporter.link host DIR URL...` runs on the host's network (`network_mode:
  host`): for each loopback URL it listens on `DIR/<host>_<port>.sock` and connects every
  stream to that address;
* `python -m exporter.link local DIR URL...` runs in the exporter's network namespace
  (`network_mode: service:exporter`): for each loopback URL it listens on that same address
  there and connects every stream to the socket.

So the exporter requests the very URL the user wrote in `.env`. Empty URLs (an engine not
there) and URLs on another host (reachable from the stack's network as they are) are
skipped. Bytes only: TLS, keep-alive and streaming pass untouched.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from urllib.parse import urlsplit

LOOPBACK = {"127.0.0.1", "localhost", "::1"}
USAGE = "usage: python -m exporter.link host|local SOCKET_DIR [URL ...]"


def loopback_addresses(urls: list[str]) -> list[tuple[str, int]]:
    """(host, port) of each loopback URL, in order, once; empty and other URLs skipped."""
    found: list[tuple[str, int]] = []
    for url in urls:
        if not url.strip():
            continue
        parts = urlsplit(url.strip())
        host = parts.hostname or ""
        if host not in LOOPBACK:
            continue
        port = parts.port or (443 if parts.scheme == "https" else 80)
        if (host, port) not in found:
            found.append((host, port))
    return found


def socket_path(folder: Path, host: str, port: int) -> Path:
    """The socket that carries `host:port` (one name per address, both halves agree)."""
    return folder / f"{host.replace(':', '_')}_{port}.sock"


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        pass


Streams = tuple[asyncio.StreamReader, asyncio.StreamWriter]
Connect = Callable[[], Awaitable[Streams]]


async def _relay(
    client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter, connect: Connect
) -> None:
    try:
        upstream_r, upstream_w = await connect()
    except OSError:
        client_w.close()  # the engine is not there: the exporter sees a refused connection
        return
    try:
        await asyncio.gather(_pipe(client_r, upstream_w), _pipe(upstream_r, client_w))
    finally:
        for writer in (client_w, upstream_w):
            writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await writer.wait_closed()


async def serve(side: str, folder: Path, addresses: list[tuple[str, int]]) -> list[asyncio.Server]:
    """Start the relays of one half; returns the servers (already serving)."""
    servers: list[asyncio.Server] = []
    for host, port in addresses:
        path = socket_path(folder, host, port)

        if side == "host":

            async def to_tcp(h: str = host, p: int = port) -> Streams:
                return await asyncio.open_connection(h, p)

            with contextlib.suppress(FileNotFoundError):
                path.unlink()  # left by an earlier container
            servers.append(
                await asyncio.start_unix_server(partial(_relay, connect=to_tcp), path=str(path))
            )
        else:

            async def to_unix(s: Path = path) -> Streams:
                return await asyncio.open_unix_connection(str(s))

            servers.append(await asyncio.start_server(partial(_relay, connect=to_unix), host, port))
        print(f"exporter.link {side}: {host}:{port} <-> {path}", flush=True)
    return servers


async def _main(side: str, folder: Path, urls: list[str]) -> None:
    addresses = loopback_addresses(urls)
    if not addresses:
        print(f"exporter.link {side}: no engine URL on this host's loopback; idle", flush=True)
    await serve(side, folder, addresses)
    await asyncio.Event().wait()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 2 or args[0] not in ("host", "local"):
        print(USAGE, file=sys.stderr)
        return 2
    folder = Path(args[1])
    if not os.access(folder, os.W_OK | os.X_OK) and args[0] == "host":
        print(f"exporter.link: cannot write sockets in {folder}", file=sys.stderr)
        return 1
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_main(args[0], folder, args[2:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
