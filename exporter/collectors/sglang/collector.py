"""SGLang: `/metrics`, `/server_info`, `/model_info` and `/v1/models` (`/health` only as a
last resort).

Liveness without generating: SGLang's `/health` runs a 1-token generation by default, so
asking it on every scrape adds requests to the engine being measured. A `/metrics` answer
already proves the server serves; when `/metrics` fails with an HTTP error, `/v1/models`
(served by the tokenizer manager, no generation) is asked; only when that fails too is
`/health` consulted, to tell "loading" (503) from "broken".

Warm-up: SGLang answers HTTP, `/metrics` included, before it is ready (40 s on an H200, where
`/server_info` blocks until then; a few seconds on a CPU, where it answers). Its `/health`
says 503 without generating while it starts, so each new instance is asked `/health` until
its first other answer (one 1-token generation per instance), in the background: a scrape
waits at most STATIC_WAIT_SECONDS for it and for the static endpoints, and says
`llmb_engine_loading 1`, `llmb_engine_up 0` while the instance is starting.

Only the normalized `llmb_*` schema is exported; raw `sglang:*` series are not
re-exposed, because names with colons are reserved for Prometheus recording rules
(and Prometheus can scrape SGLang directly when someone wants them).

This module holds the reading (HTTP, caching, warm-up, restarts); the mapping lives beside
it: `metrics` (/metrics), `server_info` (identity, slots), `memory` (weights, KV, model
structure) and `log` (the server log's memory lines).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core import series as llmb
from exporter.collectors import Body, EngineCollector, Scrape, SourceError, off_loop, parse_json
from exporter.collectors.sglang.log import SGLangLog
from exporter.collectors.sglang.memory import map_geometry, map_memory, map_weights
from exporter.collectors.sglang.metrics import FAMILIES, PREFIX, PromptSeconds, map_metrics
from exporter.collectors.sglang.server_info import map_identity, reported_memory, version
from exporter.fields import Fields
from exporter.promtext import Exposition, parse_exposition
from exporter.schema import MetricSet
from model.geometry import ModelGeometry, geometry_from_hf_config

log = logging.getLogger(__name__)

# Ask for the text format: an OpenMetrics answer escapes `sglang:` to `sglang_` on
# prometheus_client >= 0.23 (both spellings are accepted anyway).
ACCEPT = "text/plain;version=0.0.4"
STATIC_TTL_SECONDS = 60.0
# While SGLang warms up it answers HTTP but /server_info blocks until it is ready (~40 s on
# an H200, longer on a CPU): a scrape waits this long for the static endpoints and then
# answers without them (they keep loading in the background), and as long for /health.
STATIC_WAIT_SECONDS = 0.4
# /server_info keys that change while one instance runs; every other key is a start argument.
VOLATILE_INFO_KEYS = frozenset({"internal_states", "status", "last_gen_throughput"})
# Series whose values only change with a new instance: startup phase durations and sizes.
IDENTITY_FAMILIES = ("startup_time_seconds", "max_total_num_tokens", "context_len")

Statics = list[tuple[Any, SourceError | None]]


def _no_sglang_samples(text: str) -> bool:
    """Sample lines, but no SGLang family in any spelling (`sglang:`, `sglang_`)."""
    if "sglang" in text:  # the usual case, found in C
        return False
    return any(line.strip() and not line.startswith("#") for line in text.splitlines())


def _info_pending(statics: Statics | None) -> bool:
    """/server_info has not answered: still in flight, or it timed out."""
    if statics is None:
        return True
    value, err = statics[0]
    return value is None and err is not None and err.reason == "timeout"


@dataclass
class _Cached:
    at: float
    value: Any


class SGLangCollector(EngineCollector):
    """Reads one SGLang server and maps it onto the normalized schema."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._static: dict[str, _Cached] = {}
        self._geometry: _Cached | None = None
        self._model_path_warned = False  # a configured model_path not there: said once
        # Restart detection: facts of the instance seen last, and whether it went away.
        self._identity: dict[str, Any] = {}
        self._info_args: str | None = None
        self._gone = False
        self._seen = False
        # llmb_engine_prompt_seconds_total kept monotonic (metrics.PromptSeconds).
        self._prompt_seconds = PromptSeconds()
        self.restarts = 0
        self._statics_task: asyncio.Task[Statics] | None = None
        # Warm-up: whether this instance was seen ready (/health other than 503) and whether
        # it answered /health 503 since it appeared.
        self._health_task: asyncio.Task[int | SourceError] | None = None
        self._ready = False
        self._health_503 = False
        log_file = self.engine.log_file
        self._log = SGLangLog(log_file) if log_file is not None else None

    # --- HTTP -----------------------------------------------------------------------------

    async def _alive_without_metrics(self) -> tuple[bool, bool, SourceError | None]:
        """(up, loading, error) when /metrics did not answer: /v1/models, then /health."""
        try:
            if 200 <= (await self.get("/v1/models")).status < 300:
                return True, False, None
        except SourceError as err:
            if err.reason == "too_large":
                return True, False, err  # it answered, at length
            if err.reason != "http":
                return False, False, err
        try:
            # The generating health check, only now: nothing cheaper proved liveness.
            status = (await self.get("/health")).status
        except SourceError as err:
            return False, False, err
        if 200 <= status < 300:
            return True, False, None
        if status == 503:
            return False, True, None
        return False, False, SourceError("http", f"GET /health: HTTP {status}")

    async def _json(self, *paths: str) -> Any:
        """JSON of the first path that does not answer 404; None when all are 404."""
        for path in paths:
            resp = await self.get(path)
            if resp.status == 404:
                continue
            if resp.status >= 400:
                raise SourceError("http", f"GET {path}: HTTP {resp.status}")
            return await parse_json(resp, path)
        return None

    async def _static_json(self, key: str, *paths: str) -> Any:
        """A rarely changing endpoint, fetched at most every STATIC_TTL_SECONDS."""
        now = self.clock()
        cached = self._static.get(key)
        if cached is not None and now - cached.at < STATIC_TTL_SECONDS:
            return cached.value
        value = await self._json(*paths)
        self._static[key] = _Cached(now, value)
        return value

    async def _optional(self, key: str, *paths: str) -> tuple[Any, SourceError | None]:
        try:
            return await self._static_json(key, *paths), None
        except SourceError as err:
            stale = self._static.get(key)
            return (stale.value if stale else None), err

    async def _statics(self) -> Statics:
        return list(
            await asyncio.gather(
                self._optional("server_info", "/server_info", "/get_server_info"),
                self._optional("model_info", "/model_info", "/get_model_info"),
                self._optional("models", "/v1/models"),
            )
        )

    async def _statics_bounded(self) -> Statics | None:
        """The static endpoints, waited for at most STATIC_WAIT_SECONDS; None while pending.

        A pending read keeps running in the background (up to the source timeout) and the
        next scrape takes its answer, so a slow /server_info never holds a scrape.
        """
        task = self._statics_task
        if task is None:
            task = asyncio.ensure_future(self._statics())
            self._statics_task = task
        done, _ = await asyncio.wait({task}, timeout=min(STATIC_WAIT_SECONDS, self.timeout))
        if not done:
            return None
        self._statics_task = None
        return task.result()

    def _stale_statics(self) -> Statics:
        """The last answers of the static endpoints (None where there is none)."""
        out: Statics = []
        for key in ("server_info", "model_info", "models"):
            cached = self._static.get(key)
            out.append((cached.value if cached else None, None))
        return out

    async def close(self) -> None:
        """Stop the background reads still in flight."""
        tasks = [t for t in (self._statics_task, self._health_task) if t is not None]
        self._statics_task = self._health_task = None
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    # --- geometry -------------------------------------------------------------------------

    def _model_dir(self, server_info: Fields) -> Path | None:
        candidates = [self.engine.model_path]
        reported = server_info.text("model_path")
        # The server's path is relative to *its* working directory (or an HF id): only an
        # absolute path can name the same directory here.
        if reported and "\ufffd" not in reported and Path(reported).is_absolute():
            candidates.append(Path(reported))
        for candidate in candidates:
            try:
                if candidate is not None and (candidate / "config.json").is_file():
                    return candidate
            except (OSError, ValueError):  # a name the filesystem cannot take
                continue
        return None

    def _model_path_error(self) -> list[SourceError]:
        """A configured model_path without config.json: a `connect` error every scrape."""
        path = self.engine.model_path
        try:
            if path is None or (path / "config.json").is_file():
                return []
        except (OSError, ValueError):
            pass
        message = f"model_path {path}: no config.json there"
        if not self._model_path_warned:
            self._model_path_warned = True
            log.warning(
                "engine=%s %s (in a container: is the host's folder mounted at this path?)",
                self.engine.name,
                message,
            )
        return [SourceError("connect", message)]

    async def _geometry_for(self, server_info: Fields) -> ModelGeometry | None:
        now = self.clock()
        if self._geometry is not None and now - self._geometry.at < STATIC_TTL_SECONDS:
            cached: ModelGeometry | None = self._geometry.value
            return cached
        directory = self._model_dir(server_info)
        geom = None
        if directory is not None:
            try:
                geom = await asyncio.to_thread(geometry_from_hf_config, directory)
            except Exception as exc:  # noqa: BLE001 - a bad config.json must not fail the scrape
                log.warning("engine=%s cannot read model geometry: %s", self.engine.name, exc)
        self._geometry = _Cached(now, geom)
        return geom

    # --- collect --------------------------------------------------------------------------

    async def collect(self) -> Scrape:
        """Read the engine once (within about a second even while SGLang warms up)."""
        ms = MetricSet()
        labels = self.labels
        errors: list[SourceError] = []
        problems: list[str] = []
        if self._gone:
            self._forget_instance()  # unreachable since the last answer: re-read every fact
        # Everything concurrently: a scrape costs one round trip, not four.
        metrics_resp, statics = await asyncio.gather(
            self.get("/metrics", ACCEPT), self._statics_bounded(), return_exceptions=True
        )
        if isinstance(metrics_resp, SourceError) and metrics_resp.reason == "connect":
            self._gone = self._gone or metrics_resp.unreachable
            ms.add(llmb.ENGINE_UP, 0.0, **labels)
            ms.add(llmb.ENGINE_RESTARTS_TOTAL, self.restarts, **labels)
            return Scrape.of(ms, up=False, errors=[metrics_resp])
        # Too large: it answered, with more than we read. Alive; its /metrics is lost this time.
        too_large = isinstance(metrics_resp, SourceError) and metrics_resp.reason == "too_large"
        if isinstance(metrics_resp, BaseException) and not too_large:
            raise metrics_resp  # a timeout, or a bug: the runner classifies it
        if isinstance(statics, BaseException):
            raise statics
        # A too-large answer arrives as a SourceError (an exception): _read_metrics records it.
        assert isinstance(metrics_resp, (Body, SourceError))
        up, loading, expo, metrics_ok = await self._read_metrics(metrics_resp, errors, problems)
        if loading:
            self._gone = True  # every endpoint 503: a starting server is a new instance
        elif up and not self._ready:
            up, loading = await self._readiness(statics)
        ms.add(llmb.ENGINE_UP, 1.0 if up else 0.0, **labels)
        ms.add(llmb.ENGINE_LOADING, 1.0 if loading else 0.0, **labels)
        if not up:
            ms.add(llmb.ENGINE_RESTARTS_TOTAL, self.restarts, **labels)
            # While loading endpoints answer 503 or not at all; that is not a failure of ours.
            return Scrape.of(ms, up=False, errors=[] if loading else errors)
        statics = await self._instance_statics(expo, statics)
        ms.add(llmb.ENGINE_RESTARTS_TOTAL, self.restarts, **labels)
        errors.extend(err for _, err in statics if err is not None)
        info = Fields(statics[0][0], "/server_info", problems)
        model_info = Fields(statics[1][0], "/model_info", problems)
        models = Fields(statics[2][0], "/v1/models", problems)

        map_metrics(ms, expo, version(info.text("version")), labels)
        ms.add(llmb.ENGINE_PROMPT_SECONDS_TOTAL, self._prompt_seconds.read(expo), **labels)
        map_identity(ms, expo, (info, model_info, models), labels)
        weights, kv = self._reported_memory(info)
        geom = await self._geometry_for(info)
        missing = self._model_path_error()
        errors.extend(missing)
        map_memory(ms, expo, info, kv, geom, labels)
        placed = map_weights(ms, expo, info, geom, weights, labels)
        if geom is not None:
            map_geometry(ms, expo, info, geom, placed, labels)
        self._report_pids(expo)
        # A configured model folder not there counts as the source failing, as for llama.cpp.
        return Scrape.of(ms, up=metrics_ok and not missing, errors=errors, problems=problems)

    async def _read_metrics(
        self, resp: Body | SourceError, errors: list[SourceError], problems: list[str]
    ) -> tuple[bool, bool, Exposition, bool]:
        """(up, loading, exposition, metrics read) from the /metrics answer."""
        expo = Exposition({})
        if isinstance(resp, SourceError):
            errors.append(resp)
            return True, False, expo, False
        if resp.status >= 400:
            # 404: started without --enable-metrics; the static endpoints still tell something.
            up, loading, failed = await self._alive_without_metrics()
            if not loading:
                errors.append(SourceError("http", f"GET /metrics: HTTP {resp.status}"))
                if failed is not None:
                    errors.append(failed)
            return up, loading, expo, False
        try:
            expo = await off_loop(
                len(resp.content), parse_exposition, resp.text, PREFIX, FAMILIES, self.timeout
            )
        except ValueError as exc:
            errors.append(SourceError("parse", f"GET /metrics: {exc}"))
            return True, False, expo, False
        if _no_sglang_samples(resp.text):
            # Samples, none of them SGLang's (which lists hundreds even idle; an empty answer
            # is a server still starting): another server, say a llama-server given kind
            # sglang, whose figures must not pass for SGLang's.
            errors.append(SourceError("parse", f"GET /metrics: no {PREFIX} samples: not SGLang's"))
            return True, False, expo, False
        problems.extend(expo.problems)
        return True, False, expo, True

    async def _health_status(self) -> int | SourceError:
        try:
            return (await self.get("/health")).status
        except SourceError as err:
            return err

    async def _readiness(self, statics: Statics | None) -> tuple[bool, bool]:
        """(up, loading) of an instance that has not been seen ready yet.

        SGLang answers HTTP (and /metrics) while it warms up; only /health knows: 503 while
        starting, without generating. So it is asked, in the background and waited for at
        most STATIC_WAIT_SECONDS, until its first other answer; then (the 1-token health
        generation of a ready server, once per instance) never again for this instance.
        """
        task = self._health_task
        if task is None:
            task = self._health_task = asyncio.ensure_future(self._health_status())
        done, _ = await asyncio.wait({task}, timeout=min(STATIC_WAIT_SECONDS, self.timeout))
        if done:
            self._health_task = None
            result = task.result()
            if result == 503:
                self._health_503 = True
                return False, True
            if not (isinstance(result, SourceError) and result.reason == "timeout"):
                self._ready = True  # 2xx; any other answer: /metrics already proved it serves
                return True, False
            if not self._health_503:
                self._ready = True  # no answer in the whole timeout and never a 503: serving
                return True, False
        # Pending: still loading after a 503, or while /server_info has not answered either.
        loading = self._health_503 or (
            _info_pending(statics) and self._static.get("server_info") is None
        )
        return not loading, loading

    async def _instance_statics(self, expo: Exposition, statics: Statics | None) -> Statics:
        """The static answers of the instance now serving (re-read after a restart)."""
        if _info_pending(statics):
            statics = self._stale_statics()
        assert statics is not None
        if self._new_instance(expo, statics[0][0]):
            self.restarts += 1
            log.info("engine=%s new instance (restart %d)", self.engine.name, self.restarts)
            self._forget_instance()
            statics = await self._statics_bounded() or self._stale_statics()
            self._new_instance(expo, statics[0][0])  # remember the new instance's arguments
        return statics

    def _forget_instance(self) -> None:
        """Drop every cached fact of the previous instance."""
        self._static.clear()
        self._geometry = None
        self._ready = self._health_503 = False

    def _new_instance(self, expo: Exposition, server_info: Any) -> bool:
        """Whether the answering server is another instance than the one whose facts we hold.

        Signs: it was unreachable in between; a value that only changes with a new process
        changed (startup phase durations, KV pool size, context length, model name); or the
        start arguments in /server_info changed. The first instance ever seen is no restart.
        """
        new = self._gone
        identity: dict[str, Any] = {}
        for family in IDENTITY_FAMILIES:
            for s in expo.get(PREFIX + family):
                identity[family + repr(sorted(s.labels.items()))] = s.value
        # Only values present before and now count: a phase that appears late is no restart.
        if any(k in self._identity and self._identity[k] != v for k, v in identity.items()):
            new = True
        if identity:
            self._identity = identity
        if isinstance(server_info, dict):
            args = {k: v for k, v in server_info.items() if k not in VOLATILE_INFO_KEYS}
            try:
                text = repr(sorted(args.items(), key=lambda kv: str(kv[0])))
            except RecursionError:
                text = None
            if text is not None:
                if self._info_args is not None and text != self._info_args:
                    new = True
                self._info_args = text
        seen = self._seen
        self._seen = True
        self._gone = False
        return new and seen

    def _report_pids(self, expo: Exposition) -> None:
        pids: set[int] = set()
        for name in ("num_retracted_reqs", "num_paused_reqs"):
            for s in expo.get(PREFIX + name):
                pid = s.labels.get("pid", "")
                if pid.isdigit():
                    pids.add(int(pid))
        if pids:
            self.attribution.report_pids(self.engine.name, pids)

    def _reported_memory(self, info: Fields) -> tuple[float | None, float | None]:
        """(weight bytes, KV pool bytes) the engine reported outside /metrics.

        `/server_info` `internal_states[0].memory_usage`, else the server log's
        `Load weight end ... mem usage=` and `KV Cache is allocated`.
        """
        reported = reported_memory(info)
        if reported is not None:
            return reported
        if self._log is not None:
            try:
                state = self._log.poll()
            except OSError as exc:
                log.debug("engine=%s cannot read log: %s", self.engine.name, exc)
                state = self._log.state
            return state.weights_bytes, state.kv_bytes
        return None, None
