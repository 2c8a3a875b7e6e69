"""A small OpenAI-compatible streaming server for tests and benchmarks (`python -m simulator.stub`).

It tokenizes by whitespace (one token per word, `token_factor` scales the count to mimic
another tokenizer), streams exactly `max_tokens` chunks (or stops early on purpose), and can
delay the first token and the following ones on absolute deadlines: token k of a request is
due at arrival + ttft + k * itl, so a late wake-up does not push the later tokens back.
`/stats` reports how late the chunks really left, which is the stub's own timing error.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass
class StubOptions:
    """Behaviour knobs of the stub."""

    ttft: float = 0.0
    itl: float = 0.0
    token_factor: float = 1.0  # prompt tokens = ceil(words * factor) + overhead
    chat_overhead: int = 4  # template tokens around a chat message
    stop_after: int | None = None  # emit at most this many tokens (finish_reason "length")
    fail_every: int = 0  # every n-th completion request answers HTTP 500
    malformed_every: int = 0  # every n-th completion request sends a non-JSON chunk
    timings: bool = True  # attach llama.cpp-style `timings` to the last chunk
    # Put the request's arrival and each token's real send time (perf_counter, which is
    # CLOCK_MONOTONIC and so comparable across processes on Linux) into `timings`, so a
    # benchmark can separate the client's timing error from the stub's own lateness.
    report_sends: bool = False
    model: str = "stub-model"


@dataclass
class StubState:
    """What the stub saw (for assertions)."""

    requests: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    prompts: list[str] = field(default_factory=list)
    bodies: list[dict[str, Any]] = field(default_factory=list)
    lateness: list[float] = field(default_factory=list)  # chunk send time - deadline
    seen_prefixes: set[str] = field(default_factory=set)
    keep_bodies: bool = True


def count_tokens(text: str, options: StubOptions) -> int:
    """The stub's tokenizer: words times `token_factor`, rounded up, plus BOS."""
    words = len(text.split())
    return 1 + int(-(-words * options.token_factor // 1))


def _chunk(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def _events(
    options: StubOptions, chat: bool, n_out: int, prompt_tokens: int, cached: int
) -> list[bytes]:
    """Every SSE event of one response, in order (role chunk, tokens, finish, usage, DONE)."""
    # The object type as OpenAI-compatible servers send it (a client may dispatch on it).
    kind = "chat.completion.chunk" if chat else "text_completion"
    base: dict[str, Any] = {"id": "stub", "object": kind, "model": options.model}
    events = []
    if chat:
        role = {"index": 0, "delta": {"role": "assistant", "content": None}}
        events.append(_chunk(base | {"choices": [role]}))
    for k in range(n_out):
        choice: dict[str, Any] = {"index": 0, "finish_reason": None}
        if chat:
            choice["delta"] = {"content": f" t{k}"}
        else:
            choice["text"] = f" t{k}"
        events.append(_chunk(base | {"choices": [choice]}))
    end: dict[str, Any] = {"index": 0, "finish_reason": "length"}
    if chat:
        end["delta"] = {}
    else:
        end["text"] = ""
    events.append(_chunk(base | {"choices": [end]}))
    last: dict[str, Any] = base | {
        "choices": [],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": n_out,
            "total_tokens": prompt_tokens + n_out,
            "prompt_tokens_details": {"cached_tokens": cached},
        },
    }
    if options.timings:
        span = max(options.itl * (n_out - 1), 1e-6)
        last["timings"] = {
            "cache_n": cached,
            "prompt_n": prompt_tokens - cached,
            "prompt_ms": options.ttft * 1000,
            "predicted_n": n_out,
            "predicted_ms": span * 1000,
            "predicted_per_second": (n_out - 1) / span if n_out > 1 else 0.0,
        }
    events.append(_chunk(last))
    events.append(b"data: [DONE]\n\n")
    return events


def _with_sends(event: bytes, arrival: float, sent: list[float]) -> bytes:
    """The usage event with the request's arrival and token send times in `timings`."""
    obj = json.loads(event[len(b"data: ") :])
    obj.setdefault("timings", {}).update(arrival=arrival, sent=sent)
    return _chunk(obj)


def _prompt_text(body: dict[str, Any], chat: bool) -> str:
    """The text the stub counts: the chat messages' contents joined, or the prompt."""
    if chat:
        return " ".join(str(m.get("content", "")) for m in body.get("messages", []))
    return str(body.get("prompt", ""))


def _cached_tokens(prompt: str, prompt_tokens: int, state: StubState) -> int:
    """Prompt cache: a prompt whose first eight words began an earlier one is cached but BOS."""
    words = prompt.split()
    cached = 0
    if words and state.keep_bodies:
        key = " ".join(words[:8])
        cached = prompt_tokens - 1 if key in state.seen_prefixes else 0
        state.seen_prefixes.add(key)
    return cached


@dataclass
class _Paced:
    """Writes a request's events on their deadlines (token k at arrival + ttft + k * itl)."""

    options: StubOptions
    state: StubState
    t_arrival: float
    n_out: int
    head: int  # events before the first token (a chat stream's role chunk)
    malformed: bool

    async def write(self, resp: web.StreamResponse, events: list[bytes]) -> bytes | None:
        """Write the token events on their deadlines and return the rest (finish, usage,
        DONE) for the caller's `write_eof`; None when a malformed chunk ended the stream.

        The rest goes out in one write: it is due at once, and a send per event would cost
        the stub a system call each while a closed loop's whole wave ends together.
        """
        options, n_out = self.options, self.n_out
        delayed = options.ttft > 0 or options.itl > 0
        sent: list[float] = []
        tail: list[bytes] = []
        for k, event in enumerate(events):
            token = k - self.head
            if token >= n_out:
                last = options.report_sends and k == len(events) - 2
                tail.append(_with_sends(event, self.t_arrival, sent) if last else event)
                continue
            if delayed and token >= 0:
                due = self.t_arrival + options.ttft + token * options.itl
                wait = due - time.perf_counter()
                if wait > 0:
                    await asyncio.sleep(wait)
                self.state.lateness.append(time.perf_counter() - due)
            if self.malformed and token == n_out // 2:
                await resp.write(b"data: {not json\n\n")
                return None
            await resp.write(event)
            if token >= 0:
                sent.append(time.perf_counter())
        return b"".join(tail)


Shape = tuple[bool, int, int, int]  # chat?, output tokens, prompt tokens, cached tokens


class _Rendered:
    """Every event of a response depends only on its shape: rendered once per shape (at most
    256 kept), so a request costs the stub no JSON work."""

    def __init__(self, options: StubOptions):
        self.options = options
        self.kept: dict[Shape, list[bytes]] = {}
        self.joined: dict[Shape, bytes] = {}

    def events(self, shape: Shape) -> list[bytes]:
        """The response's events, in order."""
        events = self.kept.get(shape)
        if events is None:
            events = _events(self.options, *shape)
            if len(self.kept) < 256:
                self.kept[shape] = events
        return events

    def whole(self, shape: Shape) -> bytes:
        """The response's events in one piece (the zero-delay stream)."""
        whole = self.joined.get(shape)
        if whole is None:
            whole = b"".join(self.events(shape))
            if shape in self.kept:
                self.joined[shape] = whole
        return whole


def make_app(options: StubOptions, state: StubState) -> web.Application:
    """The aiohttp application of the stub."""
    rendered = _Rendered(options)

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": options.model}]})

    async def tokenize(request: web.Request) -> web.Response:
        body = await request.json()
        n = count_tokens(str(body.get("content", "")), options)
        return web.json_response({"tokens": list(range(n))})

    async def stats(request: web.Request) -> web.Response:
        late = sorted(state.lateness)

        def pct(q: float) -> float | None:
            return late[min(len(late) - 1, int(q / 100 * len(late)))] if late else None

        return web.json_response(
            {
                "requests": state.requests,
                "max_in_flight": state.max_in_flight,
                "chunks": len(late),
                "lateness_p50_s": pct(50),
                "lateness_p99_s": pct(99),
                "lateness_max_s": late[-1] if late else None,
            }
        )

    async def complete(request: web.Request) -> web.StreamResponse:
        t_arrival = time.perf_counter()
        body = await request.json()
        state.requests += 1
        number = state.requests
        chat = request.path.endswith("/chat/completions")
        prompt = _prompt_text(body, chat)
        if state.keep_bodies:
            state.prompts.append(prompt)
            state.bodies.append(body)
        if options.fail_every and number % options.fail_every == 0:
            return web.json_response({"error": {"message": "injected failure"}}, status=500)
        max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
        n_out = max_tokens if options.stop_after is None else min(max_tokens, options.stop_after)
        prompt_tokens = count_tokens(prompt, options) + (options.chat_overhead if chat else 0)
        cached = _cached_tokens(prompt, prompt_tokens, state)
        state.in_flight += 1
        state.max_in_flight = max(state.max_in_flight, state.in_flight)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        malformed = bool(options.malformed_every and number % options.malformed_every == 0)
        delayed = options.ttft > 0 or options.itl > 0
        try:
            await resp.prepare(request)
            shape = (chat, n_out, prompt_tokens, cached)
            if not delayed and not malformed:
                # Zero-delay mode: the whole stream in one write, so the stub spends almost
                # nothing per chunk and the client is what is measured.
                await resp.write_eof(rendered.whole(shape))
            else:
                paced = _Paced(options, state, t_arrival, n_out, 1 if chat else 0, malformed)
                tail = await paced.write(resp, rendered.events(shape))
                if tail is None:
                    return resp  # a malformed chunk ends the stream
                await resp.write_eof(tail)
        finally:
            state.in_flight -= 1
        return resp

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_get("/stats", stats)
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/v1/chat/completions", complete)
    app.router.add_post("/v1/completions", complete)
    return app


class ThreadedStub:
    """The stub served from a background thread with its own event loop (for tests)."""

    def __init__(
        self,
        options: StubOptions | None = None,
        port: int = 0,
        extend: Callable[[web.Application], None] | None = None,
    ):
        self.options = options or StubOptions()
        self._extend = extend
        self.state = StubState()
        self._port = port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ThreadedStub:
        """Start serving; returns once the port is bound."""
        ready = threading.Event()
        self._loop = asyncio.new_event_loop()

        async def setup() -> None:
            app = make_app(self.options, self.state)
            if self._extend is not None:
                self._extend(app)
            self._runner = web.AppRunner(app, access_log=None)
            await self._runner.setup()
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", self._port))
            self.port = sock.getsockname()[1]
            await web.SockSite(self._runner, sock).start()

        def serve() -> None:
            assert self._loop is not None
            asyncio.set_event_loop(self._loop)
            self._loop.run_until_complete(setup())
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=serve, daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("stub did not start")
        return self

    def stop(self) -> None:
        """Stop serving and join the thread (bounded)."""
        if self._loop is None:
            return
        loop = self._loop
        if self._runner is not None:
            fut = asyncio.run_coroutine_threadsafe(self._runner.cleanup(), loop)
            fut.result(10)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(10)
        loop.close()
        self._loop = None

    def __enter__(self) -> ThreadedStub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    """Serve the stub in this process until killed."""
    parser = argparse.ArgumentParser(prog="python -m simulator.stub", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--ttft", type=float, default=0.0, help="seconds to the first token")
    parser.add_argument("--itl", type=float, default=0.0, help="seconds between tokens")
    parser.add_argument("--token-factor", type=float, default=1.0)
    parser.add_argument("--stop-after", type=int)
    parser.add_argument("--no-keep", action="store_true", help="do not keep request bodies")
    parser.add_argument(
        "--report-sends",
        action="store_true",
        help="add arrival and per-token send times (perf_counter) to the usage chunk's timings",
    )
    args = parser.parse_args(argv)
    options = StubOptions(
        ttft=args.ttft,
        itl=args.itl,
        token_factor=args.token_factor,
        stop_after=args.stop_after,
        report_sends=args.report_sends,
    )
    state = StubState(keep_bodies=not args.no_keep)
    print(f"stub pid {os.getpid()} on {args.host}:{args.port}", flush=True)
    web.run_app(
        make_app(options, state), host=args.host, port=args.port, print=None, access_log=None
    )


if __name__ == "__main__":
    main()
