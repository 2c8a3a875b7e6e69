"""A bare `--url` is probed through one client (the load generator's aiohttp client).

`probe_url` tells the kind from the engine's own endpoint and reads the model id, with the
same `Authorization` header every later request sends; a server that answers neither
llama.cpp's /props nor SGLang's /server_info is `openai`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp import web

from diagnose.probe import probe_url
from tests.conftest import get_free_port


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[dict[str, Any]], Any]]:
    """Start a server answering GET `path` with its JSON (paths not listed: 404)."""
    runners: list[web.AppRunner] = []
    seen: list[tuple[str, str | None]] = []

    async def start(answers: dict[str, Any]) -> tuple[str, list[tuple[str, str | None]]]:
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


MODELS = {"data": [{"id": "/models/gemma-3-270m.gguf"}]}


async def test_llama_server_is_told_by_props_with_the_key(serve: Any) -> None:
    url, seen = await serve({"/props": {"total_slots": 4}, "/v1/models": MODELS})
    assert await probe_url(url, "k", "openai", model=True) == (
        "llamacpp",
        "/models/gemma-3-270m.gguf",
    )
    assert seen == [("/props", "Bearer k"), ("/v1/models", "Bearer k")]


async def test_sglang_is_told_by_server_info(serve: Any) -> None:
    url, seen = await serve({"/server_info": {"context_length": 8192}})
    assert await probe_url(url, None, "openai", model=True) == ("sglang", None)
    assert [p for p, _ in seen] == ["/server_info"]  # /props and /v1/models: 404


async def test_a_given_kind_and_name_ask_nothing(serve: Any) -> None:
    url, seen = await serve({"/props": {}, "/v1/models": MODELS})
    assert await probe_url(url, None, "sglang", model=False) == ("sglang", None)
    assert seen == []


async def test_neither_endpoint_is_openai_and_nothing_listening_too(serve: Any) -> None:
    url, _ = await serve({"/props": ["not", "an", "object"], "/v1/models": MODELS})
    assert await probe_url(url, None, "openai", model=False) == ("openai", None)
    closed = f"http://127.0.0.1:{get_free_port()}"
    assert await probe_url(closed, None, "openai", model=True) == ("openai", None)
