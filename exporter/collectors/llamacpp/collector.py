"""llama.cpp `llama-server` source.

Reads `/health`, `/metrics` (only with `--metrics`; 501 otherwise), `/slots`
(501 with `--no-slots`), `/props` and `/v1/models`, plus the server log when one
is configured, and maps them onto the llmb_* schema:

* KV fill comes from `/slots` (llama.cpp removed its KV metrics in 2025): tokens
  held by *processing* slots over the KV capacity. Builds that still expose
  `llamacpp:kv_cache_usage_ratio` / `kv_cache_tokens` are used directly.
* Per-sequence decode speed comes from the counters `tokens_predicted_total` /
  `tokens_predicted_seconds_total` (both move when a request ends). The
  windowed throughput gauges are never used: llama.cpp resets them on every
  scrape, so they depend on who else scrapes.
* Without `/metrics` the per-request timing lines of the log stand in for the
  token/time counters.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.metrics_core import Metric

from exporter.attribution import Attribution
from exporter.collectors import Body, Collector, Scrape, SourceError, fetch, off_loop, parse_json
from exporter.collectors.llamacpp.log import MIB, LogFollower, LogState, is_host_buffer
from exporter.config import EngineConfig
from exporter.fields import Fields, objects
from exporter.model.geometry import ModelGeometry, geometry_from_gguf
from exporter.model.kv_cache import estimate_llamacpp_kv, kv_type_bytes
from exporter.promtext import Exposition, parse_exposition
from exporter.schema import MetricSet, add_kv_cache_type, add_model_structure

log = logging.getLogger(__name__)

KIND = "llamacpp"
PREFIX = "llamacpp:"
# /v1/models is re-read at least this often; /props (the instance's identity) every scrape.
STATIC_REFRESH_SECONDS = 60.0


class _NotEnabled(Exception):
    """The endpoint answered 501: the server runs without the flag that enables it."""


def _geometry(model_path: Path) -> ModelGeometry:
    """Read the model header (once per model: the structure is static)."""
    return geometry_from_gguf(model_path)


def host_experts(state: LogState, geom: ModelGeometry | None) -> tuple[int, float] | None:
    """(layers, bytes) of routed experts that llama.cpp keeps in host memory; None: unknown.

    From the `buffer type overridden to CPU` lines (-lv 5) when the log has them: their layers,
    with each layer's expert bytes from the GGUF (else the MiB the lines print). Without them
    (-lv 4), when every layer is offloaded to a GPU: the host model buffers minus the token
    embedding (llama.cpp keeps the input layer on the CPU) are expert bytes, counted in whole
    layers from layer 0 as `--n-cpu-moe N` places them.
    """
    if state.expert_overrides:
        host = {layer for layer, _ in state.expert_overrides.values()}
        by_layer = geom.routed_expert_bytes_by_layer if geom else ()
        if by_layer and all(layer < len(by_layer) for layer in host):
            return len(host), float(sum(by_layer[layer] for layer in host))
        return len(host), float(sum(mib for _, mib in state.expert_overrides.values()) * MIB)
    if geom is None or not geom.routed_expert_bytes_by_layer:
        return None
    buffers = state.model_buffer_bytes
    on_device = sum(v for dev, v in buffers.items() if not is_host_buffer(dev))
    all_offloaded = state.layers_total and state.layers_offloaded == state.layers_total
    if not on_device or not all_offloaded:
        return None  # CPU-only build, or whole layers on the CPU (-ngl): other signals say so
    excess = sum(v for dev, v in buffers.items() if is_host_buffer(dev))
    excess -= geom.input_embedding_bytes
    layers, total = 0, 0
    for layer_bytes in geom.routed_expert_bytes_by_layer:
        # Half a layer of slack: buffer sizes are rounded and hold small extras.
        if layer_bytes and total + layer_bytes <= excess + layer_bytes / 2:
            layers, total = layers + 1, total + layer_bytes
        elif layer_bytes:
            break
    return layers, float(total)


@dataclass(frozen=True)
class _Identity:
    """What tells one llama-server instance from the next one on the same URL."""

    build: str | None
    model_path: str | None
    n_ctx: int | None
    total_slots: int | None


class LlamaCppCollector(Collector):
    """One llama-server."""

    def __init__(
        self,
        engine: EngineConfig,
        client: httpx.AsyncClient,
        timeout: float,
        attribution: Attribution,
        clock: Any = time.monotonic,
    ):
        self.engine = engine
        self.source = engine.name
        self.client = client
        self.timeout = timeout
        self.attribution = attribution
        self.clock = clock
        self.log = LogFollower(engine.log_file) if engine.log_file else None
        # The first /v1/models card, as read (it is re-read when older than the refresh).
        self._model: dict[str, Any] | None = None
        self._model_at = -1e18
        self._geometry: ModelGeometry | None = None
        self._geometry_path: Path | None = None
        self._announced: set[str] = set()
        # Restart detection: the last instance seen, and whether it went away since.
        self._identity: _Identity | None = None
        self._gone = False
        self._log_instances: int | None = None
        self.restarts = 0
        api_key = engine.api_key()
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    # -- HTTP --------------------------------------------------------------------------------
    async def _get(self, path: str, accept: str | None = None) -> Body:
        headers = dict(self._headers)
        if accept:
            headers["Accept"] = accept
        return await fetch(
            self.client,
            self.engine.url,
            path,
            headers,
            self.timeout,
            self.engine.max_response_bytes,
        )

    async def _json(self, path: str) -> Any:
        resp = await self._get(path)
        if resp.status == 501:
            raise _NotEnabled(path)
        if resp.status != 200:
            raise SourceError("http", f"GET {path}: HTTP {resp.status}")
        return await parse_json(resp, path)

    async def _metrics(self) -> Exposition:
        resp = await self._get("/metrics", accept="text/plain;version=0.0.4")
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

    # -- collect -----------------------------------------------------------------------------
    def fallback(self) -> list[Metric]:
        ms = MetricSet()
        ms.add("llmb_engine_up", 0, **self._labels())
        return ms.metrics()

    def _labels(self) -> dict[str, str]:
        return {"engine": self.engine.name, "kind": KIND}

    async def _health(self) -> tuple[bool, bool]:
        """(up, loading) from /health."""
        resp = await self._get("/health")
        if resp.status == 200:
            return True, False
        if resp.status == 503:
            return False, "loading" in resp.text.lower()
        raise SourceError("http", f"GET /health: HTTP {resp.status}")

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

    async def collect(self) -> Scrape:
        ms = MetricSet()
        labels = self._labels()
        errors: list[SourceError] = []
        problems: list[str] = []
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
            ms.add("llmb_engine_up", 0, **labels)
            ms.add("llmb_engine_restarts_total", self.restarts, **labels)
            self._emit_log(ms, log_state, None)
            return Scrape.of(ms, up=False, errors=[health, *errors])
        if isinstance(health, BaseException):
            raise health
        up, loading = health
        ms.add("llmb_engine_up", 1 if up else 0, **labels)
        ms.add("llmb_engine_loading", 1 if loading else 0, **labels)
        if not up:
            # While loading every endpoint answers 503; that is not a failure of ours. A
            # loading server is a new process: its facts replace the old ones once it answers.
            self._gone = True
            ms.add("llmb_engine_restarts_total", self.restarts, **labels)
            self._emit_log(ms, log_state, None)
            return Scrape.of(ms, up=True, errors=errors)
        metrics_res, slots_res, props_res, models_res = results[1:]
        for res in (metrics_res, slots_res, props_res, models_res):
            if isinstance(res, SourceError):
                errors.append(res)
            elif isinstance(res, BaseException) and not isinstance(res, _NotEnabled):
                raise res  # a bug or a cancellation: the runner reports it

        props_doc = None if isinstance(props_res, BaseException) else props_res
        props = Fields(props_doc, "/props", problems)
        if self._new_instance(self._identity_of(props), log_state):
            self.restarts += 1
            log.info("engine=%s new instance (restart %d)", self.engine.name, self.restarts)
            self._forget_instance()
            if models_res is None:  # the cached card belongs to the old instance
                try:
                    models_res = await self._json("/v1/models")
                except (SourceError, _NotEnabled) as exc:
                    models_res = exc
        ms.add("llmb_engine_restarts_total", self.restarts, **labels)
        if models_res is not None and not isinstance(models_res, BaseException):
            cards = Fields(models_res, "/v1/models", problems).objects("data")
            self._model = cards[0].doc if cards else {}
            self._model_at = self.clock()

        expo = metrics_res if isinstance(metrics_res, Exposition) else None
        if expo is not None:
            problems.extend(expo.problems)
        slots = None
        if not isinstance(slots_res, BaseException):
            slots = objects(slots_res, "/slots", problems)
        metrics_enabled = not isinstance(metrics_res, _NotEnabled)
        slots_enabled = not isinstance(slots_res, _NotEnabled)
        ms.add("llmb_engine_endpoint_enabled", int(metrics_enabled), endpoint="metrics", **labels)
        ms.add("llmb_engine_endpoint_enabled", int(slots_enabled), endpoint="slots", **labels)
        if not metrics_enabled:
            self._announce(
                "metrics",
                "/metrics answers 501: start llama-server with --metrics "
                "(token counters come from the log file only, if configured)",
            )
        if not slots_enabled:
            self._announce("slots", "/slots answers 501 (--no-slots): KV fill cannot be derived")

        model = Fields(self._model, "/v1/models.data[0]", problems)
        meta = model.obj("meta")
        self._emit_info(ms, props, model, meta)
        self._emit_scheduling(ms, expo, slots, props, log_state)
        self._emit_tokens(ms, expo, log_state)
        await self._emit_model(ms, props, meta, slots, log_state)
        self._emit_log(ms, log_state, expo)
        return Scrape.of(ms, up=not errors, errors=errors, problems=problems)

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

    # -- pieces ------------------------------------------------------------------------------
    def _poll_log(self, errors: list[SourceError]) -> LogState | None:
        if self.log is None:
            return None
        try:
            return self.log.poll()
        except OSError as exc:
            self._announce("log", f"cannot read log file {self.log.path}: {exc}")
            errors.append(SourceError("connect", f"log file: {exc}"))
            return None

    def _emit_info(self, ms: MetricSet, props: Fields, model: Fields, meta: Fields) -> None:
        build = props.text("build_info") or ""
        ms.info(
            "llmb_engine_info",
            model=model.text("id") or props.text("model_alias") or props.text("model_path") or "",
            version=build,
            quantization=meta.text("ftype") or props.text("model_ftype") or "",
            simulated="true" if "llmb-sim" in build else "false",
            **self._labels(),
        )

    def _kv_unified(self, log_state: LogState | None) -> bool:
        return bool(log_state and log_state.kv_unified)

    @staticmethod
    def _slot_shape(props: Fields, slots: list[Fields] | None) -> tuple[int | None, int | None]:
        """(slots, per-slot context): live /slots first, else /props."""
        if slots:
            return len(slots), slots[0].count("n_ctx")
        n_ctx = props.obj("default_generation_settings").count("n_ctx")
        return props.count("total_slots"), n_ctx

    def _emit_scheduling(
        self,
        ms: MetricSet,
        expo: Exposition | None,
        slots: list[Fields] | None,
        props: Fields,
        log_state: LogState | None,
    ) -> None:
        labels = self._labels()
        n_slots, n_ctx = self._slot_shape(props, slots)
        ms.add("llmb_engine_slots", n_slots, **labels)
        ms.add("llmb_engine_context_tokens", n_ctx, **labels)

        running = expo.first(PREFIX + "requests_processing") if expo else None
        if running is None and slots is not None:
            running = sum(1 for s in slots if s.flag("is_processing"))
        ms.add("llmb_engine_requests_running", running, **labels)
        if expo:
            ms.add(
                "llmb_engine_requests_waiting", expo.first(PREFIX + "requests_deferred"), **labels
            )

        capacity: float | None = None
        if n_ctx and n_slots:
            capacity = n_ctx if self._kv_unified(log_state) else n_ctx * n_slots
        used: float | None = None
        ratio: float | None = None
        if expo and PREFIX + "kv_cache_usage_ratio" in expo:
            # Builds before llama.cpp PR #13660 (May 2025) still report KV directly.
            ratio = expo.first(PREFIX + "kv_cache_usage_ratio")
            used = expo.first(PREFIX + "kv_cache_tokens")
            if used is not None and ratio:
                capacity = capacity or used / ratio
        if slots is not None:
            held = [
                (s.count("n_prompt_tokens") or 0, s.count("n_ctx") or 0)
                for s in slots
                if s.flag("is_processing")
            ]
            if used is None:
                used = float(sum(t for t, _ in held))
            fullest = max((t / c for t, c in held if c), default=0.0)
            ms.add("llmb_engine_slot_context_usage_max_ratio", min(1.0, fullest), **labels)
        if ratio is None and used is not None and capacity:
            ratio = min(1.0, used / capacity)
        ms.add("llmb_engine_kv_cache_capacity_tokens", capacity, **labels)
        ms.add("llmb_engine_kv_cache_used_tokens", used, **labels)
        ms.add("llmb_engine_kv_cache_usage_ratio", ratio, **labels)

    def _emit_tokens(
        self, ms: MetricSet, expo: Exposition | None, log_state: LogState | None
    ) -> None:
        labels = self._labels()
        if expo is not None:
            processed = expo.first(PREFIX + "prompt_tokens_total")
            cached = expo.first(PREFIX + "prompt_tokens_cached_total")
            if processed is not None:
                # llama.cpp counts processed prompt tokens without the cache hits; the schema
                # counts all prompt tokens, as SGLang does.
                ms.add("llmb_engine_prompt_tokens_total", processed + (cached or 0.0), **labels)
            ms.add("llmb_engine_prompt_tokens_cached_total", cached, **labels)
            ms.add(
                "llmb_engine_prompt_seconds_total",
                expo.first(PREFIX + "prompt_seconds_total"),
                **labels,
            )
            predicted = expo.first(PREFIX + "tokens_predicted_total")
            ms.add("llmb_engine_generation_tokens_total", predicted, **labels)
            if log_state is None:
                # Counts every generated token, also the first one that the prompt pass
                # produced: per-sequence speed reads high by n/(n-1), and one-token requests
                # (probes) add tokens without time. The log corrects both (see below).
                ms.add("llmb_engine_decode_tokens_total", predicted, **labels)
                ms.add(
                    "llmb_engine_decode_seconds_total",
                    expo.first(PREFIX + "tokens_predicted_seconds_total"),
                    **labels,
                )
            ms.add(
                "llmb_engine_decode_steps_total", expo.first(PREFIX + "n_decode_total"), **labels
            )
        elif log_state is not None:
            ms.add("llmb_engine_prompt_seconds_total", log_state.prompt_seconds, **labels)
            ms.add("llmb_engine_generation_tokens_total", log_state.eval_tokens, **labels)
        if log_state is not None:
            # Decode intervals after each request's first token over the engine's decode
            # time: what timings.predicted_per_second and SGLang's ITL histogram measure.
            ms.add("llmb_engine_decode_tokens_total", log_state.eval_intervals, **labels)
            ms.add("llmb_engine_decode_seconds_total", log_state.eval_seconds, **labels)
        if log_state is not None:
            ms.add("llmb_engine_requests_finished_total", log_state.requests_finished, **labels)

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

    async def _emit_model(
        self,
        ms: MetricSet,
        props: Fields,
        meta: Fields,
        slots: list[Fields] | None,
        log_state: LogState | None,
    ) -> None:
        labels = self._labels()
        size = meta.num("size")
        n_params = meta.num("n_params")
        ms.add("llmb_model_weights_bytes", size, **labels)
        ms.add("llmb_model_parameters", n_params, **labels)
        path = self._model_path(props)
        if path is not None and path != self._geometry_path:
            self._geometry_path = path
            try:
                # A big vocabulary makes the header megabytes: read it off the event loop.
                self._geometry = await asyncio.to_thread(_geometry, path)
            except Exception as exc:  # noqa: BLE001 - a bad header must not fail the scrape
                self._announce("geometry", f"cannot read model header {path}: {exc}")
                self._geometry = None
        geom = self._geometry
        if geom is None:
            if log_state and log_state.layers_total:
                # "offloaded N/M layers" counts the output layer as one more.
                ms.add("llmb_model_layers", log_state.layers_total - 1, **labels)
            return
        ms.add("llmb_model_layers", geom.n_layer, **labels)
        if not n_params:
            ms.add("llmb_model_parameters", geom.n_params, **labels)
        if not size:
            ms.add("llmb_model_weights_bytes", geom.weight_bytes, **labels)
        add_model_structure(ms, geom, **labels)
        self._emit_kv_estimate(ms, geom, props, slots, log_state)

    def _kv_types(self, ms: MetricSet, log_state: LogState | None) -> tuple[str, str]:
        """The cache's element types from the log's KV lines; llama.cpp's default f16 else."""
        type_k = (log_state.kv_type_k if log_state else None) or "f16"
        type_v = (log_state.kv_type_v if log_state else None) or type_k
        for name in (type_k, type_v):
            try:
                kv_type_bytes("f16" if name == "none" else name)
            except ValueError:
                ms.problems.append(f"KV estimate: unknown KV cache type {name!r}, assumed f16")
                return "f16", "f16"
        return type_k, type_v

    def _emit_kv_estimate(
        self,
        ms: MetricSet,
        geom: ModelGeometry,
        props: Fields,
        slots: list[Fields] | None,
        log_state: LogState | None,
    ) -> None:
        labels = self._labels()
        type_k, type_v = self._kv_types(ms, log_state)
        # An MLA model's V-less cache ("none") stores no V; its head_dim_v is 0 anyway.
        type_v = type_k if type_v == "none" else type_v
        per_token = geom.kv_bytes_per_token(kv_type_bytes(type_k), kv_type_bytes(type_v))
        ms.add("llmb_model_kv_bytes_per_token_estimated", per_token, **labels)
        n_slots, n_ctx_slot = self._slot_shape(props, slots)
        if n_ctx_slot and n_slots:
            unified = self._kv_unified(log_state)
            n_ctx = n_ctx_slot if unified else n_ctx_slot * n_slots
            try:
                est = estimate_llamacpp_kv(
                    geom,
                    n_ctx=n_ctx,
                    n_seq=n_slots,
                    kv_unified=unified,
                    type_k=type_k,
                    type_v=type_v,
                )
            except (ValueError, ArithmeticError) as exc:  # e.g. an absurd n_ctx
                ms.problems.append(f"KV estimate: {exc}")
                return
            ms.add("llmb_model_kv_cache_bytes_estimated", est.total, **labels)

    def _emit_roofline_log(
        self, ms: MetricSet, state: LogState | None, expo: Exposition | None
    ) -> None:
        """Experts in host memory, speculative decoding's accept length, the draft's weights."""
        labels = self._labels()
        if state is not None and state.kv_type_k:
            add_kv_cache_type(ms, state.kv_type_k, state.kv_type_v or state.kv_type_k, **labels)
        experts = host_experts(state, self._geometry) if state else None
        if experts is not None:
            ms.add("llmb_engine_experts_host_layers", experts[0], **labels)
            ms.add("llmb_engine_experts_host_bytes", experts[1], **labels)
        accept = state.spec_accept_length if state else None
        if accept is None and expo is not None:
            drafts = expo.first(PREFIX + "spec_decode_num_drafts_total")
            accepted = expo.first(PREFIX + "spec_decode_num_accepted_tokens_total")
            if drafts and accepted is not None:
                # Over verification steps only (llama.cpp's own "mean len").
                accept = 1.0 + accepted / drafts
        ms.add("llmb_engine_spec_accept_length", accept, **labels)
        if state is not None:
            ms.add("llmb_model_draft_weights_bytes", state.draft_weights_bytes, **labels)

    def _emit_log(self, ms: MetricSet, state: LogState | None, expo: Exposition | None) -> None:
        if state is None:
            self._emit_roofline_log(ms, state, expo)
            return
        labels = self._labels()
        ms.add("llmb_engine_gpu_layers_offloaded", state.layers_offloaded, **labels)
        ms.add("llmb_engine_gpu_layers_total", state.layers_total, **labels)
        ms.add("llmb_engine_load_seconds", state.load_seconds, **labels)
        for device, value in sorted(state.model_buffer_bytes.items()):
            ms.add("llmb_engine_model_buffer_bytes", value, device=device, **labels)
        for device, value in sorted(state.kv_buffer_bytes.items()):
            ms.add("llmb_engine_kv_cache_bytes", value, device=device, **labels)
        for event in ("kv_no_space", "context_exceeded", "context_shift", "slot_truncated"):
            ms.add(
                "llmb_engine_kv_pressure_events_total",
                state.events.get(event, 0),
                event=event,
                **labels,
            )
        self._emit_roofline_log(ms, state, expo)
