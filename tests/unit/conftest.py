"""The unit tier runs in-process: a test here that starts a child process fails.

`serve` starts in-process HTTP servers (aiohttp) that answer JSON at given paths.
"""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp import web

from tests.conftest import get_free_port


@pytest.fixture(autouse=True)
def _no_child_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    # asyncio's subprocesses go through subprocess.Popen too, so this one seam covers both.
    def refuse(self: subprocess.Popen[Any], args: Any, *_: Any, **__: Any) -> None:
        raise RuntimeError(
            f"a unit test started a process ({args!r}): it belongs in tests/integration"
        )

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)


Seen = list[tuple[str, str | None]]


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[dict[str, Any]], Any]]:
    """Start a server answering GET `path` with its JSON (paths not listed: 404)."""
    runners: list[web.AppRunner] = []
    seen: Seen = []

    async def start(answers: dict[str, Any]) -> tuple[str, Seen]:
        async def handler(request: web.Request) -> web.Response:
            seen.append((request.path, request.headers.get("Authorization")))
            return web.json_response(answers[request.path])

        app = web.Application()
        for path in answers:
            app.router.add_get(path, handler)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        port = get_free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        runners.append(runner)
        return f"http://127.0.0.1:{port}", seen

    yield start
    for runner in runners:
        await runner.cleanup()
