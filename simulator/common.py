"""What both simulated servers share: options, the engine, the GPU state writer."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import pkgutil
import random
import secrets
import string
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from aiohttp import web

from config.kinds import engine_kind
from simulator import gpu_state
from simulator.engine import Engine
from simulator.model import Clock, EngineParams, KvStyle, Request
from simulator.model_files import ModelFiles
from simulator.scenarios import Scenario
from simulator.tokenizer import Tokenizer

Handler = TypeVar("Handler", bound=Callable[..., Any])
FAULT_NAMES = ("error_rate", "hang_rate", "stream_cut_rate", "metrics_garbage_rate")
GARBAGE_METRICS = "# HELP broken\nthis is { not prometheus text\n"
LOG = logging.getLogger("llmb-sim")


@dataclass
class Faults:
    """Injected failures, each a probability per request (seeded for reproducible tests)."""

    error_rate: float = 0.0  # generation requests answer HTTP 500
    hang_rate: float = 0.0  # generation requests never answer (client timeout)
    stream_cut_rate: float = 0.0  # streams stop after a few tokens, without the final chunk
    metrics_garbage_rate: float = 0.0  # /metrics answers unparsable text
    seed: int | None = None
    _rng: random.Random = field(default_factory=random.Random, repr=False)

    @classmethod
    def parse(cls, specs: list[str], seed: int | None = None) -> Faults:
        """Build from `NAME=PROBABILITY` strings (names in FAULT_NAMES)."""
        values: dict[str, float] = {}
        for spec in specs:
            name, sep, value = spec.partition("=")
            if name not in FAULT_NAMES or not sep:
                raise ValueError(f"bad fault {spec!r}: use NAME=P with NAME in {FAULT_NAMES}")
            prob = float(value)
            if not 0.0 <= prob <= 1.0:
                raise ValueError(f"fault {name}: probability must be in [0, 1]")
            values[name] = prob
        return cls(**values, seed=seed, _rng=random.Random(seed))

    def roll(self, rate: float) -> bool:
        """True with probability `rate`."""
        return rate > 0 and self._rng.random() < rate

    def stream_cut(self) -> int | None:
        """Token count after which this stream is cut, or None."""
        return self._rng.randint(1, 8) if self.roll(self.stream_cut_rate) else None


@dataclass
class SimOptions:
    """Command-line options of one simulator."""

    kind: str
    scenario: Scenario
    params: EngineParams
    host: str = "127.0.0.1"
    port: int = 8080
    tokenizer: str = "word"
    time_scale: float = 1.0
    api_key: str | None = None
    metrics: bool = True
    slots: bool = True
    gpu_state_file: Path | None = None
    log_file: Path | None = None
    metric_spelling: str = "colon"  # SGLang: "underscore" gives sglang_ names
    enable_cache_report: bool = False
    served_model_name: str | None = None
    gpu_index: int = 0  # NVML index of the simulated card (the demo gives each engine its own)
    sglang_version: str = "0.5.23"  # SGLang: the release whose families and answers to give
    faults: Faults = field(default_factory=Faults)


def route(method: str, *paths: str) -> Callable[[Handler], Handler]:
    """Serve `method` ("GET" or "POST") `paths` with the decorated engine method."""

    def mark(handler: Handler) -> Handler:
        handler.sim_route = (method, paths)  # type: ignore[attr-defined]
        return handler

    return mark


class SimBase:
    """Engine + clock + GPU state file; subclasses add the HTTP routes."""

    kind = ""
    # How the shared performance model holds this kind's KV cache and weights.
    style: ClassVar[KvStyle]
    # The file name of its log in the demo (None: it writes none there).
    demo_log: ClassVar[str | None] = None
    # Demo presets whose load differs on this kind: preset -> (concurrency, prompt, max tokens).
    demo_loads: ClassVar[dict[str, tuple[int, int, int]]] = {}
    # JSON documents the engine answers on GET: (function of the simulator, its paths).
    DOCUMENTS: tuple[tuple[Callable[[Any], Any], tuple[str, ...]], ...] = ()

    def __init__(self, opts: SimOptions):
        self.opts = opts
        self.clock = Clock(opts.time_scale)
        self.tokenizer = Tokenizer(opts.tokenizer, opts.scenario.model.n_vocab)
        self.engine = Engine(
            self.style,
            opts.scenario.model,
            opts.scenario.gpu,
            opts.params,
            self.tokenizer,
            self.clock,
            self.log,
        )
        self._tasks: list[asyncio.Task[None]] = []
        self.model_files = ModelFiles(opts.kind, opts.scenario.model)

    @property
    def model_path(self) -> str:
        """Path of the model the engine serves (`/props` / `/server_info` `model_path`)."""
        return self.model_files.path

    def log(self, level: str, text: str) -> None:
        """Write one engine log line (no-op unless a subclass has a log file)."""

    def cmdline(self) -> str:
        """The command line the fake NVML process shows (matched by the exporter)."""
        raise NotImplementedError

    def build_app(self) -> web.Application:
        """The aiohttp application: injected faults, the engine's middleware, its `@route`s."""
        app = web.Application()
        app.middlewares.append(self._fault_middleware)
        app.middlewares.append(self._middleware)
        app.on_startup.append(self._on_startup)
        app.on_cleanup.append(self._on_cleanup)
        add = {"GET": app.router.add_get, "POST": app.router.add_post}
        for name, attr in vars(type(self)).items():
            method, paths = getattr(attr, "sim_route", ("GET", ()))
            for path in paths:
                add[method](path, getattr(self, name))
        for document, doc_paths in self.DOCUMENTS:
            for path in doc_paths:
                app.router.add_get(path, self._document_handler(document))
        return app

    def _document_handler(self, document: Callable[[Any], Any]) -> Callable[..., Any]:
        async def answer(request: web.Request) -> web.Response:
            return json_response(document(self))

        return answer

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """The engine's own checks (loading, API key); none here."""
        return await handler(request)

    @web.middleware
    async def _fault_middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        faults = self.opts.faults
        if request.path == "/metrics" and faults.roll(faults.metrics_garbage_rate):
            return web.Response(text=GARBAGE_METRICS, content_type="text/plain")
        if request.method == "POST" and request.path != "/tokenize":
            if faults.roll(faults.error_rate):
                return json_response(
                    {
                        "error": {
                            "code": 500,
                            "message": "simulated failure",
                            "type": "server_error",
                        }
                    },
                    500,
                )
            if faults.roll(faults.hang_rate):
                await asyncio.sleep(600)  # longer than any client timeout
        return await handler(request)

    async def _on_startup(self, app: web.Application) -> None:
        self.clock = self.engine.clock = Clock(self.opts.time_scale)
        self.engine.start()
        if self.opts.gpu_state_file is not None:
            self._tasks.append(asyncio.get_running_loop().create_task(self._write_gpu_state()))

    async def _on_cleanup(self, app: web.Application) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.engine.stop()
        self.model_files.close()

    async def _write_gpu_state(self) -> None:
        assert self.opts.gpu_state_file is not None
        while True:
            try:
                doc = gpu_state.snapshot(
                    self.engine, os.getpid(), self.cmdline(), self.opts.gpu_index
                )
                gpu_state.write_atomic(self.opts.gpu_state_file, doc)
            except OSError:
                pass  # a full disk must not stop serving; the next tick retries
            await asyncio.sleep(0.1)

    @property
    def model_name(self) -> str:
        """Model name shown in responses."""
        return self.opts.served_model_name or self.opts.scenario.model.name


def random_id(n: int = 32) -> str:
    """Random alphanumeric id like the engines use."""
    alphabet = string.ascii_letters + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(n))


def json_response(body: Any, status: int = 200) -> web.Response:
    """Compact JSON, as both engines send it."""
    return web.Response(
        text=json.dumps(body, separators=(",", ":")),
        status=status,
        content_type="application/json",
    )


def message_text(content: Any) -> str:
    """Text of an OpenAI message content (string or list of parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def chat_prompt(messages: Any, bos: str) -> str:
    """Render messages with a Gemma-style template."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("'messages' must be a non-empty array")
    out = [bos]
    for msg in messages:
        role = "model" if msg.get("role") == "assistant" else msg.get("role", "user")
        out.append(f"<start_of_turn>{role}\n{message_text(msg.get('content'))}<end_of_turn>\n")
    out.append("<start_of_turn>model\n")
    return "".join(out)


def sse(obj: Any) -> bytes:
    """One server-sent event carrying JSON."""
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n".encode()


async def sse_start(request: web.Request) -> web.StreamResponse:
    """Open a server-sent event stream."""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    return resp


async def read_object(request: web.Request, not_object: str) -> dict[str, Any] | str:
    """The request's JSON object, or why there is none (each engine words its own error)."""
    try:
        body = json.loads(await request.text() or "{}")
    except json.JSONDecodeError as exc:
        return f"invalid JSON: {exc}"
    return body if isinstance(body, dict) else not_object


@contextlib.asynccontextmanager
async def client_stream(abort: Callable[[Request], None], req: Request) -> AsyncIterator[None]:
    """Around the writes of a stream: a client that goes away ends it quietly, and the request
    is aborted however the stream ends (a finished one is left as it is)."""
    try:
        yield
    except ConnectionResetError:
        pass  # the client went away
    finally:
        abort(req)


def finish_reason(req: Request) -> str:
    """OpenAI `finish_reason` of a finished request."""
    return "stop" if req.finish == "stop" else "length"


def simulator_class(kind: str) -> type[SimBase]:
    """The simulator class a kind's row names (config/kinds.py `simulator`)."""
    cls = pkgutil.resolve_name(engine_kind(kind).simulator)
    if not (isinstance(cls, type) and issubclass(cls, SimBase) and cls.kind == kind):
        raise TypeError(f"{kind}: {engine_kind(kind).simulator} is not its SimBase subclass")
    return cls
