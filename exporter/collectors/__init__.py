"""One collector per source behind one small async interface.

A collector reads one source (NVML, one llama-server, one SGLang server) and
returns a `Scrape`: fresh metric families, whether the source is up, and the
errors it met, each classified by reason. The runner (`exporter.runner`) calls
every collector concurrently under the scrape deadline and adds the per-source
`llmb_source_*` metrics; a collector never has to know about the others.
"""

from __future__ import annotations

import abc
import asyncio
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import httpx
from prometheus_client.metrics_core import Metric

from core import series as llmb
from exporter.schema import MetricSet

if TYPE_CHECKING:
    from config.settings import EngineConfig
    from exporter.attribution import Attribution

ErrorReason = Literal["timeout", "connect", "http", "parse", "too_large"]
REASONS: tuple[ErrorReason, ...] = ("timeout", "connect", "http", "parse", "too_large")

# Engine answers smaller than this are parsed on the event loop (microseconds); larger ones
# in a worker thread, so /healthz and other sources never wait behind a big parse.
INLINE_PARSE_BYTES = 64 * 1024
DEFAULT_MAX_RESPONSE_BYTES = 4 * 1024 * 1024


class SourceError(Exception):
    """A source could not be read; `reason` is one of REASONS."""

    def __init__(self, reason: ErrorReason, message: str, unreachable: bool = False):
        super().__init__(message)
        self.reason = reason
        # Nothing listened at the address (connection refused/unresolvable): whatever answers
        # there next is a new process.
        self.unreachable = unreachable


@dataclass(frozen=True)
class Body:
    """Status and raw bytes of one engine answer (at most the configured cap)."""

    status: int
    content: bytes

    @property
    def text(self) -> str:
        """The body as text; invalid UTF-8 becomes U+FFFD instead of failing."""
        return self.content.decode("utf-8", errors="replace")


async def fetch(
    client: httpx.AsyncClient,
    url: str,
    path: str,
    headers: dict[str, str],
    timeout: float,
    max_bytes: int,
) -> Body:
    """GET `url + path`, reading at most `max_bytes` of body; failures become SourceErrors.

    The body is streamed and the read stops at the cap, so a 50 MB answer costs 4 MiB of
    memory and no parse at all (reason `too_large`).
    """
    try:
        async with client.stream("GET", url + path, headers=headers, timeout=timeout) as resp:
            declared = resp.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > max_bytes:
                raise SourceError("too_large", f"GET {path}: {declared} bytes > {max_bytes}")
            chunks: list[bytes] = []
            size = 0
            async for chunk in resp.aiter_bytes():
                size += len(chunk)
                if size > max_bytes:
                    raise SourceError("too_large", f"GET {path}: more than {max_bytes} bytes")
                chunks.append(chunk)
            return Body(resp.status_code, b"".join(chunks))
    except httpx.TimeoutException:
        raise SourceError("timeout", f"GET {path}: timed out") from None
    except httpx.ConnectError as exc:
        raise SourceError("connect", f"GET {path}: {exc}", unreachable=True) from None
    except httpx.HTTPError as exc:
        # Transport failures, and protocol errors such as a broken chunked encoding.
        raise SourceError("connect", f"GET {path}: {type(exc).__name__}: {exc}") from None


T = TypeVar("T")


async def off_loop(size: int, func: Callable[..., T], *args: Any) -> T:
    """Run a parse inline when the input is small, else in a worker thread."""
    if size <= INLINE_PARSE_BYTES:
        return func(*args)
    return await asyncio.to_thread(func, *args)


def _loads(content: bytes) -> Any:
    # Invalid UTF-8 is replaced, not fatal: one bad byte in a model name must not cost the
    # whole document. Lone surrogates survive json.loads and are sanitized at label time.
    return json.loads(content.decode("utf-8", errors="replace"))


async def parse_json(body: Body, path: str) -> Any:
    """JSON of an engine answer; anything unparseable (incl. deep nesting) is a parse error."""
    try:
        return await off_loop(len(body.content), _loads, body.content)
    except (ValueError, RecursionError) as exc:
        raise SourceError("parse", f"GET {path}: not JSON: {type(exc).__name__}") from None


@dataclass
class Scrape:
    """What one collector produced in one scrape."""

    metrics: list[Metric] = field(default_factory=list)
    up: bool = True
    errors: list[SourceError] = field(default_factory=list)

    @classmethod
    def of(
        cls, ms: MetricSet, up: bool, errors: list[SourceError], problems: Sequence[str] = ()
    ) -> Scrape:
        """A Scrape from a MetricSet; fields dropped while reading and values the set refused
        count as one parse error (one per scrape, so the log says it once)."""
        dropped = [*problems, *ms.problems]
        if dropped:
            shown = "; ".join(dropped[:3]) + (
                f"; +{len(dropped) - 3} more" if len(dropped) > 3 else ""
            )
            errors = [*errors, SourceError("parse", f"{len(dropped)} field(s) dropped: {shown}")]
        return cls(ms.metrics(), up=up, errors=errors)


class Collector(abc.ABC):
    """Reads one source. `source` names it in `llmb_source_*{source=...}`."""

    source: str

    @abc.abstractmethod
    async def collect(self) -> Scrape:
        """Read the source once and return fresh families. Must not raise for source failures
        it can classify; the runner treats any other exception as a parse error."""

    def fallback(self) -> list[Metric]:
        """Families to emit when `collect` timed out or crashed (e.g. `llmb_engine_up 0`)."""
        return []

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Start background work (samplers, log followers). Called once by the runner."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Stop background work and release resources."""


class EngineCollector(Collector):
    """Reads one inference server; the base of every engine kind's collector.

    The constructor is the one `exporter.app` calls for every kind registered in
    config/kinds.py. Every series it adds carries `labels` (`engine`, `kind`).
    """

    def __init__(
        self,
        engine: EngineConfig,
        client: httpx.AsyncClient,
        timeout: float,
        attribution: Attribution,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.engine = engine
        self.source = engine.name
        self.client = client
        self.timeout = timeout
        self.attribution = attribution
        self.clock = clock
        self.labels = {"engine": engine.name, "kind": engine.kind}
        api_key = engine.api_key()
        self._auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    async def get(self, path: str, accept: str | None = None, wait: float | None = None) -> Body:
        """GET `path` of the engine (body capped at `max_response_bytes`, within the source
        timeout or `wait` when shorter), failures as classified SourceErrors."""
        headers = {"Accept": accept, **self._auth} if accept else self._auth
        return await fetch(
            self.client,
            self.engine.url,
            path,
            headers,
            self.timeout if wait is None else min(wait, self.timeout),
            self.engine.max_response_bytes,
        )

    def fallback(self) -> list[Metric]:
        """`llmb_engine_up 0` for this engine."""
        ms = MetricSet()
        ms.add(llmb.ENGINE_UP, 0, **self.labels)
        return ms.metrics()
