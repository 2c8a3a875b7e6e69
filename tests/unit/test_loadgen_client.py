"""The streaming client and request records, against captured real streams replayed over HTTP."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from loadgen.client import StreamClient, TargetUnreachable
from loadgen.outcomes import (
    CONNECT,
    DISCONNECTED,
    EARLY_STOP,
    HTTP,
    MALFORMED,
    SERVER_ERROR,
    TIMEOUT,
)
from loadgen.results import build_record, percentile, verify_tokens
from loadgen.summary import ABSENT, RunSummary, summarize
from loadgen.target import Target
from tests.conftest import get_free_port
from tests.paths import FIXTURES

CPU = FIXTURES / "llamacpp-cpu-gemma3-270m"
H200 = FIXTURES / "llamacpp-h200-gemma3-27b-shape-q4_0" / "run2"

Handler = Callable[[web.Request], "web.StreamResponse"]


def _sse(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _kvslot_stream() -> bytes:
    """A chat stream shaped like the captured H200 run2 request that stopped at 454 of 512."""
    captured = json.loads((H200 / "req_kvslot.json").read_text())[0]
    parts = [_sse({"choices": [{"index": 0, "delta": {"role": "assistant", "content": None}}]})]
    parts += [
        _sse({"choices": [{"index": 0, "delta": {"content": f" w{i}"}}]})
        for i in range(captured["chunks"])
    ]
    parts.append(_sse({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}))
    parts.append(_sse({"choices": [], "usage": captured["usage"], "timings": captured["timings"]}))
    return b"".join(parts) + b"data: [DONE]\n\n"


@pytest.fixture
async def replay() -> AsyncIterator[Callable[..., object]]:
    """Start a server that answers chat completions with given bytes (split in pieces)."""
    servers: list[TestServer] = []

    async def start(body: bytes, status: int = 200, piece: int = 97, cut: bool = False) -> str:
        async def chat(request: web.Request) -> web.StreamResponse:
            await request.read()
            if status != 200:
                return web.Response(status=status, text="model is loading")
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            # Odd-sized pieces so events straddle network reads, as on a real socket.
            for i in range(0, len(body), piece):
                await resp.write(body[i : i + piece])
            if cut:
                request.transport.close()  # type: ignore[union-attr]
                return resp
            await resp.write_eof()
            return resp

        async def models(request: web.Request) -> web.Response:
            return web.json_response({"data": [{"id": "captured"}]})

        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        app.router.add_get("/v1/models", models)
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        servers.append(server)
        return f"http://127.0.0.1:{server.port}"

    yield start
    for server in servers:
        await server.close()


async def _stream(url: str, timeout: float = 10.0):
    async with StreamClient(Target("llama", url, "llamacpp"), pool_size=2) as client:
        await client.open()
        assert client.model == "captured"
        return await client.stream(client.build_body("hello", {"max_tokens": 8}), timeout)


async def test_captured_llamacpp_stream_is_parsed(replay) -> None:
    result = await _stream(await replay((CPU / "chat_stream.txt").read_bytes()))
    assert result.error is None and result.done
    # Eight content chunks; the role chunk (content null) and the finish chunk carry no token.
    assert len(result.chunk_times) == 8
    assert result.chunk_times == sorted(result.chunk_times)
    assert result.usage["prompt_tokens_details"]["cached_tokens"] == 29
    assert result.timings["predicted_per_second"] == pytest.approx(74.1376206060221)
    record = build_record(result, engine="llama", step=0, index=0, max_tokens=8, wall_offset=0.0)
    assert record.error is None
    assert (record.prompt_tokens, record.completion_tokens, record.cached_tokens) == (34, 8, 29)
    assert record.server_cache_n == 29 and record.server_prompt_ms == pytest.approx(33.37)
    assert record.ttft_s is not None and 0 < record.ttft_s < record.e2e_s
    assert len(record.itls) == 7


async def test_crlf_and_comment_events(replay) -> None:
    body = (CPU / "chat_stream.txt").read_bytes().replace(b"\n", b"\r\n")
    result = await _stream(await replay(b": ping\r\n\r\n" + body, piece=5))
    assert result.error is None and len(result.chunk_times) == 8


async def test_captured_early_stop_is_flagged(replay) -> None:
    result = await _stream(await replay(_kvslot_stream(), piece=4096))
    record = build_record(result, engine="llama", step=0, index=0, max_tokens=512, wall_offset=0.0)
    assert record.error == EARLY_STOP
    assert record.completion_tokens == 454 and record.chunks == 454
    assert "454 of 512" in (record.error_detail or "")
    reasons = verify_tokens({"llama": [record]}, 512)
    assert reasons and "stopped early" in reasons[0]


@pytest.mark.parametrize(
    ("body", "status", "cut", "error"),
    [
        (b"data: {oops\n\n", 200, False, MALFORMED),
        (_sse({"error": {"message": "context full"}}), 200, False, SERVER_ERROR),
        (b"", 503, False, HTTP),
        (_sse({"choices": [{"index": 0, "delta": {"content": "a"}}]}), 200, True, DISCONNECTED),
        (_sse({"choices": [{"index": 0, "delta": {"content": "a"}}]}), 200, False, DISCONNECTED),
        (
            _sse({"choices": [{"index": 0, "text": "a"}]}) + b"data: [DONE]\n\n",
            200,
            False,
            MALFORMED,
        ),
    ],
    ids=["not-json", "error-event", "http-503", "cut", "no-done", "no-usage"],
)
async def test_failures_become_error_categories(replay, body, status, cut, error) -> None:
    result = await _stream(await replay(body, status=status, cut=cut))
    assert result.error == error, result.error_detail


async def test_timeout_is_recorded() -> None:
    async def slow(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        await resp.write(_sse({"choices": [{"index": 0, "delta": {"content": "a"}}]}))
        await __import__("asyncio").sleep(5)
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", slow)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        async with StreamClient(
            Target("x", f"http://127.0.0.1:{server.port}"), pool_size=1
        ) as client:
            result = await client.stream(client.build_body("hi", {}), timeout=0.3)
        assert result.error == TIMEOUT
        assert len(result.chunk_times) == 1
        assert result.t_end - result.t_send < 2
    finally:
        await server.close()


async def test_unreachable_target_fails_fast() -> None:
    url = f"http://127.0.0.1:{get_free_port()}"
    async with StreamClient(Target("x", url), pool_size=1, connect_timeout=1.0) as client:
        with pytest.raises(TargetUnreachable, match="cannot reach"):
            await client.open()
        result = await client.stream(client.build_body("hi", {}), timeout=5)
    assert result.error == CONNECT


def test_percentile_matches_linear_interpolation() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0], 99) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == pytest.approx(2.5)
    assert percentile(list(map(float, range(101))), 99) == pytest.approx(99.0)


async def test_summary_uses_successful_requests(replay) -> None:
    url = await replay((CPU / "chat_stream.txt").read_bytes())
    good = build_record(
        await _stream(url), engine="e", step=0, index=0, max_tokens=8, wall_offset=0
    )
    short = build_record(
        await _stream(url), engine="e", step=0, index=1, max_tokens=9, wall_offset=0
    )
    summary = summarize(
        [good, short],
        engine="e",
        step=0,
        concurrency=1,
        rate=None,
        prompt_tokens_target=34,
        max_tokens=8,
        wall_s=2.0,
    )
    assert summary.requests_ok == 1 and summary.requests_failed == 1
    assert summary.early_stop == 1 and summary.errors == {"early_stop": 1}
    assert summary.output_tok_s == pytest.approx(4.0)
    assert summary.decode_tok_s_mean == pytest.approx(good.decode_tok_s, rel=1e-3)
    assert summary.prompt_tokens == 34


def test_summary_document_keeps_its_keys_and_order() -> None:
    # summary.json is a contract: the row's keys in this order; context keys that do not
    # apply (model with --workers, workers without, server without a probe) are left out.
    row = summarize(
        [], engine="e", step=0, concurrency=1, rate=None, prompt_tokens_target=8,
        max_tokens=4, wall_s=0.0,
    )  # fmt: skip
    stats = [
        "engine", "step", "concurrency", "rate", "prompt_tokens_target", "max_tokens",
        "requests", "requests_ok", "requests_failed", "early_stop", "kv_exhausted", "errors",
        "wall_s", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "ttft_mean_s", "itl_p50_s",
        "itl_p99_s", "itl_mean_s", "tpot_mean_s", "tpot_p99_s", "tpot_p50_s", "e2e_mean_s",
        "e2e_p50_s", "e2e_p99_s", "decode_tok_s_mean", "decode_tok_s_p50",
        "server_decode_tok_s_mean", "output_tok_s", "requests_per_s", "prompt_tokens",
        "completion_tokens", "cached_tokens_mean", "output_tokens_total",
    ]  # fmt: skip
    context = ["kind", "endpoint", "cache"]
    assert list(row.to_dict()) == [*stats, *context, "valid"]
    row.model, row.server, row.invalid_reasons = None, {"source": "exporter"}, []
    keys = [*stats, *context, "model", "server", "valid", "invalid_reasons"]
    assert list(row.to_dict()) == keys
    assert row.to_dict()["model"] is None and row.to_dict()["output_tok_s"] is None
    row.model, row.workers, row.invalid_reasons = ABSENT, 2, None
    assert list(row.to_dict()) == [*stats, *context, "workers", "server", "valid"]
    run = RunSummary(True, [], False, None, False, "v", {"command": "run"}, [row])
    assert list(run.to_dict()) == [
        "valid", "invalid_reasons", "aborted", "abort_reason", "interrupted", "tool_version",
        "run", "steps",
    ]  # fmt: skip
    assert run.to_dict()["steps"] == [row.to_dict()]


async def test_ttft_counts_from_the_request_leaving_not_from_the_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A client held up between `stream()` and the socket write (other requests of a closed
    loop's wave taking their turn first) does not count the hold-up as the server's TTFT."""
    from aiohttp.client_reqrep import ClientRequest

    from simulator.stub import StubOptions, ThreadedStub

    write_bytes = ClientRequest.write_bytes

    async def held_up(self: ClientRequest, *args: object, **kwargs: object) -> None:
        time.sleep(0.3)  # noqa: ASYNC251 (the point: the loop is busy before this body goes out)
        await write_bytes(self, *args, **kwargs)  # type: ignore[arg-type]

    with ThreadedStub(StubOptions(ttft=0.1)) as stub:
        async with StreamClient(Target("stub", stub.url), pool_size=1) as client:
            await client.open()
            monkeypatch.setattr(ClientRequest, "write_bytes", held_up)
            called = time.perf_counter()
            params = {"max_tokens": 2, "stream": True, "stream_options": {"include_usage": True}}
            result = await client.stream(client.build_body("hello there", params), timeout=10)
    record = build_record(result, engine="stub", step=0, index=0, max_tokens=2, wall_offset=0)
    assert record.error is None and record.completion_tokens == 2
    assert result.t_send - called >= 0.29  # stamped when the body was handed to the socket
    assert record.ttft_s == pytest.approx(0.1, abs=0.08)  # the stub's 100 ms, not 400
