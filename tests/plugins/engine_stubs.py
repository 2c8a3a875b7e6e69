"""Engine stubs on real ports answering with captured bodies and counting requests.

`counting_engines()` starts a llama.cpp stub (the H200 capture) and an SGLang stub
(0.5.23, busy) in the running event loop and yields `(llama, sglang, delay)`; each stub's
`hits` counts requests per path, and setting `delay[0]` slows every answer down.

`ThreadedApp`: a base for misbehaving engines served from a thread of their own (a loop
that the test's own blocking calls cannot stall); subclasses define `handle`.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from aiohttp import web

from tests.conftest import get_free_port

FIX = Path(__file__).resolve().parents[1] / "fixtures"
H200 = FIX / "llamacpp-h200-gemma3-27b-shape-q4_0"
SGL = FIX / "sglang-0.5.23"
SGL_ENDPOINTS = FIX / "sglang-0.5.23-endpoints"


@dataclass
class CountingStub:
    """An engine stub on a real port; `hits` counts requests per path."""

    url: str
    hits: Counter[str] = field(default_factory=Counter)


def _app(bodies: dict[str, str], hits: Counter[str], delay: Callable[[], float]) -> web.Application:
    async def handle(request: web.Request) -> web.Response:
        hits[request.path] += 1
        pause = delay()
        if pause:
            await asyncio.sleep(pause)
        return web.Response(text=bodies[request.path])

    app = web.Application()
    for path in bodies:
        app.router.add_get(path, handle)
    return app


def _captured(folder: Path, files: dict[str, str]) -> dict[str, str]:
    """{path: the captured answer in folder/file}."""
    return {path: (folder / name).read_text() for path, name in files.items()}


# The H200 capture (llama.cpp) and SGLang 0.5.23 busy: the answers the golden exposition
# (tests/system/test_golden.py) and the counting stubs serve.
LLAMA_BODIES = {
    "/health": '{"status":"ok"}',
    **_captured(
        H200,
        {
            "/metrics": "metrics_np4_c4.txt",
            "/slots": "slots_np4_c4.json",
            "/props": "props.json",
            "/v1/models": "models.json",
        },
    ),
}
SGLANG_BODIES = {
    "/health": "",
    "/metrics": (SGL / "metrics-busy.txt").read_text(),
    **_captured(
        SGL_ENDPOINTS,
        {
            "/server_info": "server_info.json",
            "/model_info": "model_info.json",
            "/v1/models": "v1_models.json",
        },
    ),
}


@asynccontextmanager
async def counting_engines() -> AsyncIterator[tuple[CountingStub, CountingStub, list[float]]]:
    """Start both stubs; stop them on exit."""
    delay = [0.0]
    stubs, runners = [], []
    try:
        for bodies in (LLAMA_BODIES, SGLANG_BODIES):
            port = get_free_port()
            stub = CountingStub(f"http://127.0.0.1:{port}")
            runner = web.AppRunner(_app(bodies, stub.hits, lambda: delay[0]), access_log=None)
            runners.append(runner)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", port).start()
            stubs.append(stub)
        yield stubs[0], stubs[1], delay
    finally:
        for runner in runners:
            await runner.cleanup()


AppT = TypeVar("AppT", bound="ThreadedApp")


class ThreadedApp:
    """An aiohttp app on 127.0.0.1 (a free port, in `port`) in a thread of its own, as a
    context manager; every GET goes to `handle`. Handlers still running at exit are cancelled."""

    def __init__(self) -> None:
        self.port = 0
        self._runner: web.AppRunner | None = None
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """Answer one request (subclasses)."""
        raise NotImplementedError

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def start() -> None:
            app = web.Application()
            app.router.add_route("GET", "/{tail:.*}", self.handle)
            self._runner = web.AppRunner(app)
            await self._runner.setup()
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            await site.start()
            self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            self._ready.set()

        self._loop.run_until_complete(start())
        self._loop.run_forever()

    def __enter__(self: AppT) -> AppT:
        self._thread.start()
        assert self._ready.wait(10)
        return self

    async def _shutdown(self) -> None:
        # Cancel handlers still sleeping or streaming so the loop closes cleanly.
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._runner is not None:
            await self._runner.cleanup()

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
