"""One streaming OpenAI-compatible client for every engine (llama.cpp, SGLang, others).

The client sends pre-serialized request bodies over a pre-opened aiohttp connection pool,
parses the server-sent events itself and stamps every received network chunk with
`time.perf_counter()`. It never raises for a failed request: every outcome becomes a
`StreamResult` with an `error` category, so the scheduler can record it and go on.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
from aiohttp.payload import BytesPayload

from loadgen.outcomes import (
    CONNECT,
    DISCONNECTED,
    HTTP,
    KV_EXHAUSTED,
    MALFORMED,
    SERVER_ERROR,
    TIMEOUT,
    is_kv_exhausted,
)
from loadgen.target import Target

# Below the shortest server idle timeout we know of (llama.cpp: 5 s).
KEEPALIVE_SECONDS = 3.0

# orjson parses a token chunk several times faster than json (orjson.JSONDecodeError is a
# ValueError), which is most of the client's CPU per chunk.
loads = orjson.loads

_CHAT_PATH = "/v1/chat/completions"
_COMPLETIONS_PATH = "/v1/completions"


class _SentStamp(BytesPayload):
    """A request body that notes when it is handed to the socket (`sent`, perf_counter).

    TTFT counts from there, not from the call to `post`: on Python < 3.12 aiohttp writes the
    body (with the headers coalesced into it) from a task of its own, which runs only after
    every request launched in the same event-loop turn had its turn. A closed loop's wave of
    C requests would otherwise add the client's own launch queue to every TTFT but the first.
    """

    sent = 0.0

    async def write_with_length(self, writer: Any, content_length: int | None) -> None:
        self.sent = self.sent or time.perf_counter()
        await super().write_with_length(writer, content_length)

    async def write(self, writer: Any) -> None:  # aiohttp < 3.12 calls this one
        self.sent = self.sent or time.perf_counter()
        await super().write(writer)


class TargetUnreachable(Exception):
    """The target did not answer at all (connection refused, DNS, connect timeout)."""


@dataclass
class StreamResult:
    """What one streamed request produced, with raw perf_counter timestamps."""

    t_send: float = 0.0
    t_end: float = 0.0
    chunk_times: list[float] = field(default_factory=list)
    usage: dict[str, Any] | None = None
    timings: dict[str, Any] | None = None
    finish_reason: str | None = None
    error: str | None = None
    error_detail: str | None = None
    status: int | None = None
    done: bool = False
    stale: bool = False  # failed on a pooled connection before any answer: safe to resend
    # The raw reads of a stream not parsed yet (`stream(..., parse=False)`); `finish()`
    # parses them and clears both.
    parts: list[bytes] = field(default_factory=list, repr=False)
    stamps: list[float] = field(default_factory=list, repr=False)
    parsed: bool = True


def _decode_event(event: bytes) -> bytes | None:
    """Return the `data:` payload of one SSE event (None for comments and other fields).

    llama.cpp reports an error inside a stream as an `error:` field line (not `data:`); it
    is returned wrapped as `{"error": ...}` so the caller sees one error shape.
    """
    payload: bytes | None = None
    for line in event.split(b"\n"):
        if line.startswith(b"data:"):
            part = line[5:]
            if part.startswith(b" "):
                part = part[1:]
            # Multi-line data fields are joined with newlines (SSE spec); engines send one line.
            payload = part if payload is None else payload + b"\n" + part
        elif line.startswith(b"error:"):
            part = line[6:].strip()
            return (
                b'{"error":'
                + (
                    part
                    if part.startswith((b"{", b'"'))
                    else orjson.dumps(part.decode("utf-8", "replace"))
                )
                + b"}"
            )
    return payload


class StreamClient:
    """Streams completions from one target over a reusable connection pool."""

    def __init__(
        self,
        target: Target,
        *,
        pool_size: int,
        endpoint: str = "chat",
        connect_timeout: float = 5.0,
    ):
        self.target = target
        self.endpoint = endpoint
        self.pool_size = max(1, pool_size)
        self.connect_timeout = connect_timeout
        self.model: str | None = target.model
        self._path = _CHAT_PATH if endpoint == "chat" else _COMPLETIONS_PATH
        self._post_url = target.url + self._path
        self._timeouts: dict[float, aiohttp.ClientTimeout] = {}
        self._session: aiohttp.ClientSession | None = None
        # perf_counter() of the latest network read of any of this client's streams: the
        # scheduler does its own work (records, metrics, files) when reads are quiet.
        self.last_read = 0.0
        self._headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if target.api_key:
            self._headers["Authorization"] = f"Bearer {target.api_key}"

    async def __aenter__(self) -> StreamClient:
        connector = aiohttp.TCPConnector(
            limit=self.pool_size,
            limit_per_host=self.pool_size,
            ttl_dns_cache=300,
            # llama.cpp's HTTP server closes a keep-alive connection idle for 5 s; dropping
            # ours first means a pooled connection is never one the server already closed.
            keepalive_timeout=KEEPALIVE_SECONDS,
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.connect_timeout),
            headers=self._headers,
            # The body is read in raw chunks; a large buffer avoids per-line read overhead.
            read_bufsize=2**16,
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the pool (idempotent)."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("StreamClient used outside `async with`")
        return self._session

    async def open(self, connections: int | None = None) -> None:
        """Check the target answers, learn the model name, and pre-open the pool.

        Raises TargetUnreachable within about `connect_timeout` seconds when nothing listens.
        Any HTTP answer counts as reachable: some servers have no `/v1/models`.
        """
        timeout = aiohttp.ClientTimeout(total=self.connect_timeout * 2)
        try:
            async with self.session.get(self.target.url + "/v1/models", timeout=timeout) as resp:
                body = await resp.read()
                if resp.status == 200 and self.model is None:
                    self.model = first_model_id(body)
        except (aiohttp.ClientConnectionError, asyncio.TimeoutError, OSError) as exc:
            raise TargetUnreachable(
                f"{self.target.name}: cannot reach {self.target.url} "
                f"({type(exc).__name__}: {exc or 'timed out'})"
            ) from None
        await self.preopen(connections)

    async def preopen(self, connections: int | None = None) -> None:
        """Open up to `connections` keep-alive connections now (errors are ignored).

        They are reused by the next requests, so connection setup never lands inside a
        measured TTFT; call it again right before a phase when the pool sat idle.
        """
        timeout = aiohttp.ClientTimeout(total=self.connect_timeout * 2)
        count = min(connections or self.pool_size, self.pool_size)
        await asyncio.gather(*(self._touch(timeout) for _ in range(count)), return_exceptions=True)

    async def _touch(self, timeout: aiohttp.ClientTimeout) -> None:
        async with self.session.get(self.target.url + "/v1/models", timeout=timeout) as resp:
            await resp.read()

    async def get_json(self, path: str, timeout: float = 10.0) -> Any:
        """GET a JSON document from the target (raises on HTTP errors)."""
        async with self.session.get(
            self.target.url + path, timeout=aiohttp.ClientTimeout(total=timeout)
        ) as resp:
            resp.raise_for_status()
            return await resp.json(content_type=None)

    async def probe(self, path: str, timeout: float = 5.0) -> tuple[Any | None, str | None]:
        """GET `path` as a probe: (its JSON, None) on a 2xx JSON answer; (None, None) when the
        server answers otherwise (it is there); (None, why) when nothing answers at all."""
        try:
            return await self.get_json(path, timeout), None
        except (aiohttp.ClientConnectionError, asyncio.TimeoutError, OSError) as exc:
            return None, f"{type(exc).__name__}: {exc or 'timed out'}"
        except (aiohttp.ClientError, ValueError):
            return None, None

    async def probe_json(self, path: str, timeout: float = 5.0) -> Any | None:
        """GET `path` as a probe: its JSON, None when it does not answer 2xx with JSON."""
        return (await self.probe(path, timeout))[0]

    async def post_json(self, path: str, body: dict[str, Any], timeout: float = 60.0) -> Any:
        """POST a JSON body and return the JSON answer (raises on HTTP errors)."""
        async with self.session.post(
            self.target.url + path, json=body, timeout=aiohttp.ClientTimeout(total=timeout)
        ) as resp:
            resp.raise_for_status()
            return await resp.json(content_type=None)

    def build_body(self, prompt: str, params: dict[str, Any]) -> bytes:
        """Serialize one request body for this target's endpoint."""
        body: dict[str, Any] = {"model": self.model or "default"}
        if self.endpoint == "chat":
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        body.update(params)
        return json.dumps(body).encode()

    def body_builder(self, params: dict[str, Any]) -> Callable[[str], bytes]:
        """A fast `build_body` for many prompts with the same parameters.

        Only the prompt is serialized per request; the rest is encoded once.
        """
        head = self.build_body("\x00", params)
        marker = json.dumps("\x00").encode()
        before, _, after = head.partition(marker)

        def build(prompt: str) -> bytes:
            return before + json.dumps(prompt).encode() + after

        return build

    async def stream(self, body: bytes, timeout: float, parse: bool = True) -> StreamResult:
        """Send one streaming request and collect its chunks; never raises for request errors.

        A pooled keep-alive connection that the server closed while idle (llama.cpp's HTTP
        server drops idle ones after 5 s) fails before the request is sent; that attempt is
        repeated on another connection (up to the pool size), since the server never saw it.

        `parse=False` returns as soon as the stream ends, with the raw reads kept in the
        result; `finish(result)` parses them later (the scheduler does it off the hot path).
        """
        result = await self._attempt(body, timeout)
        # Every pooled connection may have gone stale at once (e.g. after a pause between
        # steps); each failed attempt discards one, so retry up to the pool size.
        for _ in range(self.pool_size):
            if not result.stale:
                break
            result = await self._attempt(body, timeout)
        if parse:
            finish(result)
        return result

    def _request_timeout(self, timeout: float) -> aiohttp.ClientTimeout:
        # One object per distinct limit: nothing to build per request on the hot path.
        value = self._timeouts.get(timeout)
        if value is None:
            value = aiohttp.ClientTimeout(total=timeout, sock_connect=self.connect_timeout)
            self._timeouts[timeout] = value
        return value

    async def _attempt(self, body: bytes, timeout: float) -> StreamResult:
        result = StreamResult()
        result.t_send = time.perf_counter()
        payload = _SentStamp(body, content_type="application/json")
        try:
            async with self.session.post(
                self._post_url, data=payload, timeout=self._request_timeout(timeout)
            ) as resp:
                result.status = resp.status
                if resp.status != 200:
                    text = (await resp.read())[:300].decode("utf-8", "replace")
                    result.error, result.error_detail = HTTP, f"HTTP {resp.status}: {text}"
                else:
                    await self._read_events(resp, result)
        except asyncio.TimeoutError:
            result.error, result.error_detail = TIMEOUT, f"no complete answer within {timeout} s"
        except aiohttp.ClientConnectorError as exc:
            result.error, result.error_detail = CONNECT, str(exc)
        except (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError) as exc:
            result.error, result.error_detail = DISCONNECTED, f"{type(exc).__name__}: {exc}"
            result.stale = result.status is None
        except aiohttp.ClientError as exc:
            result.error, result.error_detail = DISCONNECTED, f"{type(exc).__name__}: {exc}"
        except OSError as exc:
            result.error, result.error_detail = CONNECT, f"{type(exc).__name__}: {exc}"
        result.t_send = payload.sent or result.t_send  # unsent (refused): the call's time
        result.t_end = time.perf_counter()
        result.parsed = False
        return result

    async def _read_events(self, resp: aiohttp.ClientResponse, result: StreamResult) -> None:
        """Read the stream: stamp each network read first, parse the events afterwards.

        The loop does nothing but take `perf_counter()` and keep the bytes, so at high
        concurrency a read is stamped as soon as the event loop hands it over and no other
        request's chunk waits behind JSON parsing. Each event then gets the stamp of the
        read that completed it, exactly as if it had been parsed on arrival. The parse runs
        even when the read is cut (timeout, disconnect), so a partial stream keeps its stamps.
        """
        parts = result.parts
        stamps = result.stamps
        perf = time.perf_counter
        # readany() directly: `async for` over iter_any() adds a coroutine frame per read.
        read = resp.content.readany
        while data := await read():
            now = perf()
            stamps.append(now)
            parts.append(data)
            self.last_read = now


def finish(result: StreamResult) -> StreamResult:
    """Parse the raw reads of `result` and settle its error category (idempotent).

    An error already set while reading (timeout, disconnect) wins over what the partial
    stream shows, but the chunks that did arrive keep their stamps.
    """
    if result.parsed:
        return result
    result.parsed = True
    before = (result.error, result.error_detail)
    parse_events(result.parts, result.stamps, result)
    result.parts, result.stamps = [], []
    if before[0] is not None:
        result.error, result.error_detail = before
    if result.error is None and not result.done:
        result.error = DISCONNECTED
        result.error_detail = "stream ended before data: [DONE]"
    if result.error is None and result.usage is None:
        result.error = MALFORMED
        result.error_detail = "no usage chunk (stream_options.include_usage ignored?)"
    if result.error in (HTTP, SERVER_ERROR) and is_kv_exhausted(result.error_detail):
        result.error = KV_EXHAUSTED
    return result


def parse_events(parts: list[bytes], stamps: list[float], result: StreamResult) -> None:
    """Parse the SSE events of a stream's reads into `result` (chunk times, usage, errors).

    `parts[i]` arrived at `stamps[i]`; an event is stamped with the read that completed it.
    Stops at the first malformed or error event, as the engine's stream ends there.
    """
    whole = b"".join(parts)
    if b"\r" in whole:
        _parse_crlf(parts, stamps, result)
        return
    # One split of the whole stream instead of a buffer per read: the events are the same
    # (both cut at the first "\n\n" after the previous event), and each one gets the stamp of
    # the read holding its last terminator byte; the last piece is an unterminated rest.
    events = whole.split(b"\n\n")
    ends = list(itertools.accumulate(map(len, parts)))
    read = 0
    offset = 0
    for event in events[:-1]:
        offset += len(event) + 2
        while ends[read] < offset:
            read += 1
        if event.startswith(b"data: ") and b"\n" not in event:
            payload: bytes | None = event[6:]
        else:
            payload = _decode_event(event)
        if payload is not None and not _apply_event(payload, stamps[read], result):
            return


def _parse_crlf(parts: list[bytes], stamps: list[float], result: StreamResult) -> None:
    """`parse_events` for a stream with CR bytes: CRLF is normalized as the reads arrive."""
    buf = b""
    for data, now in zip(parts, stamps, strict=True):
        buf += data
        if b"\r" in data:
            # On the whole buffer, so a CRLF split across two reads is joined first.
            buf = buf.replace(b"\r\n", b"\n")
        start = 0
        while True:
            end = buf.find(b"\n\n", start)
            if end < 0:
                break
            payload = _decode_event(buf[start:end])
            start = end + 2
            if payload is not None and not _apply_event(payload, now, result):
                return
        buf = buf[start:]


def _apply_event(payload: bytes, now: float, result: StreamResult) -> bool:
    """Apply one event's `data:` payload stamped `now`; False when the stream ends there."""
    if payload == b"[DONE]":
        result.done = True
        return True
    try:
        obj = loads(payload)
    except ValueError:
        result.error = MALFORMED
        result.error_detail = f"not JSON: {payload[:120]!r}"
        return False
    if not isinstance(obj, dict):
        result.error, result.error_detail = MALFORMED, f"not an object: {obj!r:.120}"
        return False
    if "error" in obj:
        result.error, result.error_detail = SERVER_ERROR, str(obj["error"])[:300]
        return False
    choices = obj.get("choices")
    if choices:
        choice = choices[0]
        delta = choice.get("delta")
        if delta:
            text = delta.get("content") or delta.get("reasoning_content")
        else:
            text = choice.get("text")
        if text:
            result.chunk_times.append(now)
        reason = choice.get("finish_reason")
        if reason:
            result.finish_reason = reason
    usage = obj.get("usage")
    if usage:
        result.usage = usage
    timings = obj.get("timings")
    if timings:
        result.timings = timings
    return True


def first_model_id(body: bytes) -> str | None:
    """The first model id of a `/v1/models` answer, or None."""
    try:
        return model_id(json.loads(body))
    except ValueError:
        return None


def model_id(models: Any) -> str | None:
    """The first model id of a parsed `/v1/models` document, or None."""
    try:
        return str(models["data"][0]["id"])
    except (KeyError, IndexError, TypeError):
        return None


def probe_client(url: str, api_key: str | None, timeout: float = 5.0) -> StreamClient:
    """The one HTTP client of every probe before load (kind, model): the load generator's own.

    Use it as `async with probe_client(...) as client` and ask `client.probe_json(path)`.
    """
    target = Target("probe", url, api_key=api_key)
    return StreamClient(target, pool_size=1, connect_timeout=timeout)
