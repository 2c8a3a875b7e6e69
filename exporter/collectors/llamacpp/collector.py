"""llama.cpp `llama-server` source.

Reads `/health`, `/metrics` (only with `--metrics`; 501 otherwise), `/slots`
(501 with `--no-slots`), `/props` and `/v1/models`, plus the server log when one
is configured. This module holds the reading (HTTP, restarts, the log follower); the
mapping onto the llmb_* schema lives beside it: `metrics` (/metrics, /slots, /props) and
`memory` (model, KV estimate, what the log says about memory).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core import series as llmb
from exporter.collectors import EngineCollector, Scrape, SourceError, off_loop, parse_json
from exporter.collectors.llamacpp.log import LogFollower, LogState
from exporter.collectors.llamacpp.memory import kv_unified, map_log, map_model, map_roofline_log
from exporter.collectors.llamacpp.metrics import PREFIX, map_info, map_scheduling, map_tokens
from exporter.fields import Fields, objects
from exporter.promtext import Exposition, parse_exposition
from exporter.schema import MetricSet
from model.geometry import ModelGeometry, geometry_from_gguf

log = logging.getLogger(__name__)

# /v1/models is re-read at least this often; /props (the instance's identity) every scrape.
STATIC_REFRESH_SECONDS = 60.0
# A path missing in a container is most often one not mounted (docs/deploy.md).
_MOUNT_HINT = " (in a container: is the host's file mounted at this path?)"


class _NotEnabled(Exception):
    """The endpoint answered 501: the server runs without the flag that enables it."""


@dataclass(frozen=True)
class _Identity:
    """What tells one llama-server instance from the next one on the same URL."""

    build: str | None
    model_path: str | None
    n_ctx: int | None
    total_slots: int | None


@dataclass
class _Answers:
    """One scrape's answers of the endpoints besides /health (an exception where one failed)."""

    metrics: Any
    slots: Any
    props: Any
    models: Any


class LlamaCppCollector(EngineCollector):
    """One llama-server."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.log = LogFollower(self.engine.log_file) if self.engine.log_file else None
        # The first /v1/models card, as read (it is re-read when older than the refresh).
        self._model: dict[str, Any] | None = None
        self._model_at = -1e18
        self._geometry: ModelGeometry | None = None
        self._geometry_path: Path | None = None
        # The configured model file could not be opened: a `connect` error every scrape.
        self.model_error: SourceError | None = None
        self._announced: set[str] = set()
        # Restart detection: the last instance seen, and whether it went away since.
        self._identity: _Identity | None = None
        self._gone = False
        self._log_instances: int | None = None
        self.restarts = 0

    # -- HTTP --------------------------------------------------------------------------------
    async def _json(self, path: str) -> Any:
        resp = await self.get(path)
        if resp.status == 501:
            raise _NotEnabled(path)
        if resp.status != 200:
            raise SourceError("http", f"GET {path}: HTTP {resp.status}")
        return await parse_json(resp, path)

    async def _metrics(self) -> Exposition:
        resp = await self.get("/metrics", accept="text/plain;version=0.0.4")
        if resp.status == 501:
            raise _NotEnabled("/metrics")
        if resp.status != 200:
            raise SourceError("http", f"GET /metrics: HTTP {resp.status}")
        try:
            return await off_loop(
                len(resp.content), parse_exposition, resp.text, PREFIX, None, self.timeout
            )
        except ValueError as exc:
            raise SourceError("parse", f"GET /metrics: {exc}") from exc

    async def _models(self, refresh: bool) -> Any:
        """/v1/models, re-read when the instance changed or the cache is old."""
        now = self.clock()
        if (
            not refresh
            and self._model is not None
            and now - self._model_at < STATIC_REFRESH_SECONDS
        ):
            return None
        return await self._json("/v1/models")

    def _announce(self, key: str, message: str) -> None:
        if key not in self._announced:
            self._announced.add(key)
            log.warning("engine=%s %s", self.engine.name, message)

    async def _health(self) -> tuple[bool, bool]:
        """(up, loading) from /health."""
        resp = await self.get("/health")
        if resp.status == 200:
            return True, False
        if resp.status == 503:
            return False, "loading" in resp.text.lower()
        raise SourceError("http", f"GET /health: HTTP {resp.status}")

    # -- instances ---------------------------------------------------------------------------
    def _new_instance(self, identity: _Identity | None, log_state: LogState | None) -> bool:
        """Whether the instance answering now is not the one whose facts we hold.

        Signs: the engine was unreachable or loading in between (a refused connection means
        no process listened), its /props identity changed, or its log shows a new process.
        The first instance ever seen is not a restart.
        """
        new = self._gone
        if identity is not None and self._identity is not None and identity != self._identity:
            new = True
        if log_state is not None:
            if self._log_instances is not None and log_state.instances > self._log_instances:
                new = True
            self._log_instances = log_state.instances
        seen_before = self._identity is not None
        if identity is not None:
            self._identity = identity
        self._gone = False
        return new and seen_before

    def _forget_instance(self) -> None:
        """Drop every cached fact of the previous instance."""
        self._model = None
        self._model_at = -1e18
        self._geometry = None
        self._geometry_path = None

    async def _check_instance(self, props: Fields, log_state: LogState | None, models: Any) -> Any:
        """Count a restart when another instance answers; the /v1/models answer to use."""
        if self._new_instance(self._identity_of(props), log_state):
            self.restarts += 1
            log.info("engine=%s new instance (restart %d)", self.engine.name, self.restarts)
            self._forget_instance()
            if models is None:  # the cached card belongs to the old instance
                try:
                    models = await self._json("/v1/models")
                except (SourceError, _NotEnabled) as exc:
                    models = exc
        return models

    @staticmethod
    def _identity_of(props: Fields) -> _Identity | None:
        if not props:
            return None
        return _Identity(
            props.text("build_info"),
            props.text("model_path"),
            props.obj("default_generation_settings").count("n_ctx"),
            props.count("total_slots"),
        )

    # -- collect -----------------------------------------------------------------------------
    async def collect(self) -> Scrape:
        ms = MetricSet()
        labels = self.labels
        errors: list[SourceError] = []
        log_state = self._poll_log(errors)
        # All endpoints at once: one round trip per scrape, not two.
        results: tuple[Any, ...] = await asyncio.gather(
            self._health(),
            self._metrics(),
            self._json("/slots"),
            self._json("/props"),
            self._models(refresh=self._gone),
            return_exceptions=True,
        )
        health = results[0]
        if isinstance(health, SourceError):
            self._gone = self._gone or health.unreachable
            ms.add(llmb.ENGINE_UP, 0, **labels)
            ms.add(llmb.ENGINE_RESTARTS_TOTAL, self.restarts, **labels)
            self._map_log(ms, log_state, None)
            return Scrape.of(ms, up=False, errors=[health, *errors])
        if isinstance(health, BaseException):
            raise health
        up, loading = health
        ms.add(llmb.ENGINE_UP, 1 if up else 0, **labels)
        ms.add(llmb.ENGINE_LOADING, 1 if loading else 0, **labels)
        if not up:
            # While loading every endpoint answers 503; that is not a failure of ours. A
            # loading server is a new process: its facts replace the old ones once it answers.
            self._gone = True
            ms.add(llmb.ENGINE_RESTARTS_TOTAL, self.restarts, **labels)
            self._map_log(ms, log_state, None)
            return Scrape.of(ms, up=True, errors=errors)
        answers = _Answers(*results[1:])
        for res in (answers.metrics, answers.slots, answers.props, answers.models):
            if isinstance(res, SourceError):
                errors.append(res)
            elif isinstance(res, BaseException) and not isinstance(res, _NotEnabled):
                raise res  # a bug or a cancellation: the runner reports it
        problems: list[str] = []
        await self._map_serving(ms, answers, log_state, problems)
        if self.model_error is not None:
            errors.append(self.model_error)
        return Scrape.of(ms, up=not errors, errors=errors, problems=problems)

    async def _map_serving(
        self, ms: MetricSet, answers: _Answers, log_state: LogState | None, problems: list[str]
    ) -> None:
        """Everything of a server that answered /health 200."""
        labels = self.labels
        props_doc = None if isinstance(answers.props, BaseException) else answers.props
        props = Fields(props_doc, "/props", problems)
        models = await self._check_instance(props, log_state, answers.models)
        ms.add(llmb.ENGINE_RESTARTS_TOTAL, self.restarts, **labels)
        if models is not None and not isinstance(models, BaseException):
            cards = Fields(models, "/v1/models", problems).objects("data")
            self._model = cards[0].doc if cards else {}
            self._model_at = self.clock()

        expo = answers.metrics if isinstance(answers.metrics, Exposition) else None
        if expo is not None:
            problems.extend(expo.problems)
        slots = None
        if not isinstance(answers.slots, BaseException):
            slots = objects(answers.slots, "/slots", problems)
        self._map_enabled(ms, answers)

        model = Fields(self._model, "/v1/models.data[0]", problems)
        meta = model.obj("meta")
        map_info(ms, props, model, meta, labels)
        map_scheduling(ms, expo, slots, props, kv_unified(log_state), labels)
        map_tokens(ms, expo, log_state, labels)
        sizes = (meta.num("size"), meta.num("n_params"))
        ms.add(llmb.MODEL_WEIGHTS_BYTES, sizes[0], **labels)
        ms.add(llmb.MODEL_PARAMETERS, sizes[1], **labels)
        geom = await self._load_geometry(props)
        map_model(ms, geom, sizes, (props, slots), log_state, labels)
        self._map_log(ms, log_state, expo)

    def _map_enabled(self, ms: MetricSet, answers: _Answers) -> None:
        """`llmb_engine_endpoint_enabled` of /metrics and /slots (501: started without)."""
        metrics_enabled = not isinstance(answers.metrics, _NotEnabled)
        slots_enabled = not isinstance(answers.slots, _NotEnabled)
        labels = self.labels
        ms.add(llmb.ENGINE_ENDPOINT_ENABLED, int(metrics_enabled), endpoint="metrics", **labels)
        ms.add(llmb.ENGINE_ENDPOINT_ENABLED, int(slots_enabled), endpoint="slots", **labels)
        if not metrics_enabled:
            self._announce(
                "metrics",
                "/metrics answers 501: start llama-server with --metrics "
                "(token counters come from the log file only, if configured)",
            )
        if not slots_enabled:
            self._announce("slots", "/slots answers 501 (--no-slots): KV fill cannot be derived")

    # -- pieces ------------------------------------------------------------------------------
    def _map_log(self, ms: MetricSet, state: LogState | None, expo: Exposition | None) -> None:
        """The log's series (when a log is configured) and the roofline's inputs."""
        if state is not None:
            map_log(ms, state, self.labels)
        map_roofline_log(ms, state, expo, self._geometry, self.labels)

    def _poll_log(self, errors: list[SourceError]) -> LogState | None:
        if self.log is None:
            return None
        try:
            return self.log.poll()
        except OSError as exc:
            self._announce("log", f"cannot read log file {self.log.path}: {exc}{_MOUNT_HINT}")
            errors.append(SourceError("connect", f"log file: {exc}"))
            return None

    def _model_path(self, props: Fields) -> Path | None:
        if self.engine.model_path:
            return Path(self.engine.model_path)
        path = props.text("model_path")
        # The server's path is only meaningful when the exporter shares its filesystem.
        try:
            if path and "\ufffd" not in path and Path(path).is_file():
                return Path(path)
        except (OSError, ValueError):  # a name the filesystem cannot take
            return None
        return None

    async def _load_geometry(self, props: Fields) -> ModelGeometry | None:
        """The model's geometry from its GGUF header, read once per model path."""
        path = self._model_path(props)
        # A file not there yet (a mount missing, a typo) is looked for again every scrape.
        if path is not None and (path != self._geometry_path or self.model_error is not None):
            self._geometry_path = path
            self.model_error = None
            try:
                # A big vocabulary makes the header megabytes: read it off the event loop.
                self._geometry = await asyncio.to_thread(geometry_from_gguf, path)
            except OSError as exc:
                self.model_error = SourceError("connect", f"model_path {path}: {exc}")
                self._announce("geometry", f"cannot read model file {path}: {exc}{_MOUNT_HINT}")
                self._geometry = None
            except Exception as exc:  # noqa: BLE001 - a bad header must not fail the scrape
                self._announce("geometry", f"cannot read model header {path}: {exc}")
                self._geometry = None
        return self._geometry
