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

Multi-rank servers: scheduler series carry `tp_rank`/`pp_rank` (and `dp_rank` with data
parallelism). By default only attention-TP rank 0 of each DP group reports; when several
TP/PP ranks do (`--enable-metrics-for-all-schedulers`) rank 0 is taken, so a request or a
KV pool is never counted twice. DP groups are separate schedulers with separate pools,
so their values are summed.

SGLang's "GB" is GiB: `memory_pool.py` defines `GB = 1024 * 1024 * 1024` and
`get_available_gpu_memory` divides by `1 << 30`, so `*_memory_usage_gb` x 2^30 = bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.metrics_core import Metric

from exporter.attribution import Attribution
from exporter.collectors import Body, Collector, Scrape, SourceError, fetch, off_loop, parse_json
from exporter.config import EngineConfig
from exporter.fields import Fields
from exporter.model.geometry import (
    ModelGeometry,
    estimate_sglang_kv,
    geometry_from_hf_config,
    kv_type_bytes,
)
from exporter.promtext import Exposition, Sample, parse_exposition
from exporter.schema import MetricSet, add_kv_cache_type, add_model_structure, sanitize_label

log = logging.getLogger(__name__)

GIB = 1 << 30
PREFIX = "sglang:"
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
# First release seen with the `num_retracted_requests` counter (created at the first
# retraction); 0.5.11 has only the `num_retracted_reqs` gauge.
RETRACTION_COUNTER_SINCE = (0, 5, 23)
# Series whose values only change with a new instance: startup phase durations and sizes.
IDENTITY_FAMILIES = ("startup_time_seconds", "max_total_num_tokens", "context_len")
RANK_LABELS = ("tp_rank", "pp_rank")

# (schema histogram, SGLang histogram names in order of preference: current, older)
HISTOGRAMS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("llmb_engine_time_to_first_token_seconds", ("time_to_first_token_seconds",)),
    (
        "llmb_engine_inter_token_latency_seconds",
        ("inter_token_latency_seconds", "time_per_output_token_seconds"),
    ),
    ("llmb_engine_queue_time_seconds", ("queue_time_seconds",)),
    ("llmb_engine_e2e_request_latency_seconds", ("e2e_request_latency_seconds",)),
)

# Families the mapping reads (without `sglang:` and without _total/_bucket/_sum/_count);
# only their lines are parsed (exporter.promtext). A test keeps this list complete.
FAMILIES = (
    "context_len",
    "kv_cache_memory_usage_gb",
    "kv_used_tokens",
    "max_total_num_tokens",
    "max_total_num_tokens_swa",
    "num_queue_reqs",
    "num_retracted_requests",
    "num_retracted_reqs",
    "num_paused_reqs",
    "num_running_reqs",
    "num_used_tokens",
    "page_size",
    "token_usage",
    "full_token_usage",
    "swa_token_usage",
    "spec_accept_length",
    "weight_memory_usage_gb",
    "cached_tokens",
    "generation_tokens",
    "num_requests",
    "prompt_tokens",
    "startup_time_seconds",
    *(name for _, names in HISTOGRAMS for name in names),
)


def _finite(samples: Iterable[Sample]) -> list[Sample]:
    # NaN is an engine's "no value" (SGLang writes it for idle ratios): skipped silently.
    # ±Inf is kept, so the MetricSet drops the series it reaches and counts it.
    return [s for s in samples if not math.isnan(s.value)]


def _rank0(samples: list[Sample]) -> list[Sample]:
    """Keep the rank-0 samples of one DP group (all samples when no rank 0 reports)."""
    for label in RANK_LABELS:
        zero = [s for s in samples if s.labels.get(label, "0") == "0"]
        if zero:
            samples = zero
    return samples


def _priority_total(samples: list[Sample]) -> list[Sample]:
    # With priority scheduling SGLang adds per-priority series and the total under priority="".
    if any("priority" in s.labels for s in samples):
        total = [s for s in samples if s.labels.get("priority", "") == ""]
        return total or samples
    return samples


def _by_dp(samples: list[Sample]) -> dict[str, list[Sample]]:
    groups: dict[str, list[Sample]] = defaultdict(list)
    for s in samples:
        groups[s.labels.get("dp_rank", "")].append(s)
    return groups


def scheduler_value(expo: Exposition, name: str, reduce: str = "sum") -> float | None:
    """One scheduler series: rank 0 of each DP group, then summed (or max) over DP groups."""
    samples = _priority_total(_finite(expo.get(PREFIX + name)))
    if not samples:
        return None
    per_group = [max(s.value for s in _rank0(g)) for g in _by_dp(samples).values()]
    return max(per_group) if reduce == "max" else sum(per_group)


def total_value(expo: Exposition, name: str, **match: str) -> float | None:
    """A tokenizer-side series (no rank labels): sum over label sets like `is_streaming`."""
    samples = _priority_total(_finite(expo.get(PREFIX + name, **match)))
    if not samples:
        return None
    if any(label in s.labels for s in samples for label in RANK_LABELS):
        return sum(max(s.value for s in _rank0(g)) for g in _by_dp(samples).values())
    return sum(s.value for s in samples)


def _histogram(expo: Exposition, base: str) -> tuple[list[tuple[str, float]], float] | None:
    """Buckets (summed per `le` over label sets, rank 0 only) and the summed `_sum`."""
    buckets = _priority_total(_finite(expo.get(PREFIX + base + "_bucket")))
    if not buckets:
        return None
    selected: list[Sample] = []
    for group in _by_dp(buckets).values():
        selected.extend(_rank0(group))
    by_le: dict[float, tuple[str, float]] = {}
    for s in selected:
        le = s.labels.get("le")
        if le is None:
            continue
        try:
            key = float(le)
        except ValueError:
            key = math.nan
        if math.isnan(key):
            raise ValueError(f"{base}: bucket bound le={le!r} is not a number")
        text, value = by_le.get(key, (le, 0.0))
        by_le[key] = (text, value + s.value)
    if math.inf not in by_le:
        return None
    keep = {tuple(sorted((k, v) for k, v in s.labels.items() if k != "le")) for s in selected}
    total = 0.0
    for s in _finite(expo.get(PREFIX + base + "_sum")):
        if tuple(sorted(s.labels.items())) in keep:
            total += s.value
    return [by_le[k] for k in sorted(by_le)], total


def checkpoint_weight_bytes(geom: ModelGeometry) -> float | None:
    """The checkpoint's weight bytes: safetensors headers, else the HF config's shapes x dtype.

    `--load-format dummy` (and a checkpoint not on this host) leaves only config.json: the
    byte split from it (always-read + routed experts + an untied embedding) is the weights.
    """
    if geom.weight_bytes:
        return float(geom.weight_bytes)
    if geom.always_read_bytes is None:
        return None
    return float(geom.always_read_bytes + geom.routed_expert_bytes + geom.token_embedding_bytes)


# How far the model structure's bytes may be from what the engine placed (its own weight
# figure is rounded to 0.01 GiB and counts buffers SGLang adds, 0.78 vs 0.72 GiB on the H200).
STRUCTURE_TOLERANCE = 0.10


def structure_fits(geom: ModelGeometry, placed: float | None) -> bool:
    """Whether the config's byte split describes the weights the engine placed.

    A config missing sizes (no `intermediate_size`, no vocabulary) or a model quantized while
    loading (`--quantization fp8` of a bf16 checkpoint) gives a split that is not what a step
    reads: then no structure is exported and the roofline counts the placed weights.
    """
    total = checkpoint_weight_bytes(geom)
    if placed is None or total is None:
        return True
    return abs(total - placed) <= STRUCTURE_TOLERANCE * placed


def _version(text: str | None) -> tuple[int, ...] | None:
    """`0.5.23` / `0.5.11.post1` as (0, 5, 23) / (0, 5, 11); None when unreadable."""
    match = re.match(r"v?(\d+)\.(\d+)(?:\.(\d+))?", text or "")
    if match is None:
        return None
    return tuple(int(part) for part in match.groups("0"))


def _info_pending(statics: list[tuple[Any, SourceError | None]] | None) -> bool:
    """/server_info has not answered: still in flight, or it timed out."""
    if statics is None:
        return True
    value, err = statics[0]
    return value is None and err is not None and err.reason == "timeout"


def kv_usage_ratio(expo: Exposition) -> float | None:
    """KV usage 0-1 of the fullest pool.

    SGLang rounds `token_usage` to two decimals (0.0038 reads 0.0 on the H200 capture);
    `full_token_usage` / `swa_token_usage` (0.5.11 and 0.5.23) are unrounded, and
    `token_usage` is their maximum. Older servers have only `token_usage`.
    """
    full = scheduler_value(expo, "full_token_usage", "max")
    if full is None:
        return scheduler_value(expo, "token_usage", "max")
    swa = scheduler_value(expo, "swa_token_usage", "max")
    return full if swa is None else max(full, swa)


# The server log's memory lines (SGLang 0.5.x, `GB` = GiB as everywhere in SGLang):
#   Load weight end. elapsed=0.14 s, type=Qwen2ForCausalLM, avail mem=138.35 GB, mem usage=0.78 GB.
#   KV Cache is allocated. #tokens: 3574979, K size: 20.46 GB, V size: 20.46 GB
# (MLA models: `KV size: X GB`).
_LOG_WEIGHTS = re.compile(r"Load weight end\..*?mem usage=(\d+(?:\.\d+)?) GB")
_LOG_KV = re.compile(
    r"KV Cache is allocated\. #tokens: (\d+), (?:K size: (\d+(?:\.\d+)?) GB, "
    r"V size: (\d+(?:\.\d+)?) GB|KV size: (\d+(?:\.\d+)?) GB)"
)
LOG_READ_LIMIT = 8 << 20  # bytes read per scrape; the memory lines come in the first few KiB


@dataclass
class SGLangLogState:
    """What the server log said about the last instance's memory (None = not seen)."""

    weights_bytes: float | None = None
    kv_bytes: float | None = None
    kv_tokens: int | None = None


class SGLangLog:
    """Follows an SGLang server log (`--log-file`, or its captured stdout) from the start."""

    def __init__(self, path: Path):
        self.path = path
        self.offset = 0
        self.state = SGLangLogState()
        self._partial = b""

    def poll(self) -> SGLangLogState:
        """Read what was appended since the last poll; a shorter file starts over."""
        size = self.path.stat().st_size
        if size < self.offset:
            self.offset, self._partial, self.state = 0, b"", SGLangLogState()
        with self.path.open("rb") as fh:
            fh.seek(self.offset)
            chunk = fh.read(LOG_READ_LIMIT)
        self.offset += len(chunk)
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()[-65536:]
        for raw in lines:
            self.feed(raw.decode("utf-8", errors="replace"))
        return self.state

    def feed(self, line: str) -> None:
        """One log line; a later instance's lines replace an earlier one's."""
        if (m := _LOG_WEIGHTS.search(line)) is not None:
            weights = float(m.group(1)) * GIB
            self.state = SGLangLogState(weights_bytes=weights if math.isfinite(weights) else None)
        elif (m := _LOG_KV.search(line)) is not None:
            gib = float(m.group(4)) if m.group(4) else float(m.group(2)) + float(m.group(3))
            self.state.kv_bytes = gib * GIB if math.isfinite(gib * GIB) else None
            self.state.kv_tokens = int(m.group(1)) if len(m.group(1)) < 16 else None


@dataclass
class _Cached:
    at: float
    value: Any


class SGLangCollector(Collector):
    """Reads one SGLang server and maps it onto the normalized schema."""

    def __init__(
        self,
        engine: EngineConfig,
        client: httpx.AsyncClient,
        timeout: float,
        attribution: Attribution,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.engine = engine
        self.client = client
        self.timeout = timeout
        self.attribution = attribution
        self.source = engine.name
        self._clock = clock
        self._static: dict[str, _Cached] = {}
        self._geometry: _Cached | None = None
        self._labels = {"engine": engine.name, "kind": "sglang"}
        # Restart detection: facts of the instance seen last, and whether it went away.
        self._identity: dict[str, Any] = {}
        self._info_args: str | None = None
        self._gone = False
        self._seen = False
        self.restarts = 0
        self._statics_task: asyncio.Task[list[tuple[Any, SourceError | None]]] | None = None
        # Warm-up: whether this instance was seen ready (/health other than 503) and whether
        # it answered /health 503 since it appeared.
        self._health_task: asyncio.Task[int | SourceError] | None = None
        self._ready = False
        self._health_503 = False
        self._log = SGLangLog(engine.log_file) if engine.log_file is not None else None

    # --- HTTP -----------------------------------------------------------------------------

    def _headers(self, accept: str | None = None) -> dict[str, str]:
        headers = {}
        if accept:
            headers["Accept"] = accept
        key = self.engine.api_key()
        if key:
            headers["Authorization"] = f"Bearer {key}"
        return headers

    async def _get(self, path: str, accept: str | None = None, wait: float | None = None) -> Body:
        """GET `path` (body capped), turning transport failures into classified SourceErrors."""
        return await fetch(
            self.client,
            self.engine.url,
            path,
            self._headers(accept),
            self.timeout if wait is None else min(wait, self.timeout),
            self.engine.max_response_bytes,
        )

    async def _alive_without_metrics(self) -> tuple[bool, bool, SourceError | None]:
        """(up, loading, error) when /metrics did not answer: /v1/models, then /health."""
        try:
            if 200 <= (await self._get("/v1/models")).status < 300:
                return True, False, None
        except SourceError as err:
            if err.reason == "too_large":
                return True, False, err  # it answered, at length
            if err.reason != "http":
                return False, False, err
        try:
            # The generating health check, only now: nothing cheaper proved liveness.
            status = (await self._get("/health")).status
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
            resp = await self._get(path)
            if resp.status == 404:
                continue
            if resp.status >= 400:
                raise SourceError("http", f"GET {path}: HTTP {resp.status}")
            return await parse_json(resp, path)
        return None

    async def _static_json(self, key: str, *paths: str) -> Any:
        """A rarely changing endpoint, fetched at most every STATIC_TTL_SECONDS."""
        now = self._clock()
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

    async def _statics(self) -> list[tuple[Any, SourceError | None]]:
        return list(
            await asyncio.gather(
                self._optional("server_info", "/server_info", "/get_server_info"),
                self._optional("model_info", "/model_info", "/get_model_info"),
                self._optional("models", "/v1/models"),
            )
        )

    async def _statics_bounded(self) -> list[tuple[Any, SourceError | None]] | None:
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

    def _stale_statics(self) -> list[tuple[Any, SourceError | None]]:
        """The last answers of the static endpoints (None where there is none)."""
        out: list[tuple[Any, SourceError | None]] = []
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

    async def _geometry_for(self, server_info: Fields) -> ModelGeometry | None:
        now = self._clock()
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

    def fallback(self) -> list[Metric]:
        """`llmb_engine_up 0` for this engine."""
        ms = MetricSet()
        ms.add("llmb_engine_up", 0.0, **self._labels)
        return ms.metrics()

    async def collect(self) -> Scrape:
        """Read the engine once (within about a second even while SGLang warms up)."""
        ms = MetricSet()
        labels = self._labels
        errors: list[SourceError] = []
        problems: list[str] = []
        if self._gone:
            self._forget_instance()  # unreachable since the last answer: re-read every fact
        # Everything concurrently: a scrape costs one round trip, not four.
        metrics_resp, statics = await asyncio.gather(
            self._get("/metrics", ACCEPT), self._statics_bounded(), return_exceptions=True
        )
        if isinstance(metrics_resp, SourceError) and metrics_resp.reason == "connect":
            self._gone = self._gone or metrics_resp.unreachable
            ms.add("llmb_engine_up", 0.0, **labels)
            ms.add("llmb_engine_restarts_total", self.restarts, **labels)
            return Scrape.of(ms, up=False, errors=[metrics_resp])
        # Too large: it answered, with more than we read. Alive; its /metrics is lost this time.
        too_large = isinstance(metrics_resp, SourceError) and metrics_resp.reason == "too_large"
        for result in (statics,) if too_large else (metrics_resp, statics):
            if isinstance(result, BaseException):
                raise result  # a timeout, or a bug: the runner classifies it
        assert not isinstance(statics, BaseException)
        # A too-large answer arrives as a SourceError (an exception): _read_metrics records it.
        assert too_large or not isinstance(metrics_resp, BaseException)
        up, loading, expo, metrics_ok = await self._read_metrics(metrics_resp, errors, problems)
        if loading:
            self._gone = True  # every endpoint 503: a starting server is a new instance
        elif up and not self._ready:
            up, loading = await self._readiness(statics)
        ms.add("llmb_engine_up", 1.0 if up else 0.0, **labels)
        ms.add("llmb_engine_loading", 1.0 if loading else 0.0, **labels)
        if not up:
            ms.add("llmb_engine_restarts_total", self.restarts, **labels)
            # While loading endpoints answer 503 or not at all; that is not a failure of ours.
            return Scrape.of(ms, up=False, errors=[] if loading else errors)
        statics = await self._instance_statics(expo, statics)
        ms.add("llmb_engine_restarts_total", self.restarts, **labels)
        errors.extend(err for _, err in statics if err is not None)
        server_info = Fields(statics[0][0], "/server_info", problems)
        model_info = Fields(statics[1][0], "/model_info", problems)
        models = Fields(statics[2][0], "/v1/models", problems)

        self._map_metrics(ms, expo, _version(server_info.text("version")))
        self._map_static(ms, expo, server_info, model_info, models)
        reported = self._reported_memory(server_info)
        geom = await self._geometry_for(server_info)
        self._map_memory(ms, expo, server_info, reported[1])
        placed = self._map_weights(ms, expo, server_info, geom, reported[0])
        if geom is not None:
            self._map_geometry(ms, expo, server_info, geom, placed)
        self._report_pids(expo)
        return Scrape.of(ms, up=metrics_ok, errors=errors, problems=problems)

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
        problems.extend(expo.problems)
        return True, False, expo, True

    async def _health_status(self) -> int | SourceError:
        try:
            return (await self._get("/health")).status
        except SourceError as err:
            return err

    async def _readiness(
        self, statics: list[tuple[Any, SourceError | None]] | None
    ) -> tuple[bool, bool]:
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

    async def _instance_statics(
        self, expo: Exposition, statics: list[tuple[Any, SourceError | None]] | None
    ) -> list[tuple[Any, SourceError | None]]:
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

    def _map_metrics(
        self, ms: MetricSet, expo: Exposition, version: tuple[int, ...] | None
    ) -> None:
        labels = self._labels
        ms.add("llmb_engine_requests_running", scheduler_value(expo, "num_running_reqs"), **labels)
        ms.add("llmb_engine_requests_waiting", scheduler_value(expo, "num_queue_reqs"), **labels)
        ms.add("llmb_engine_context_tokens", scheduler_value(expo, "context_len", "max"), **labels)
        capacity = scheduler_value(expo, "max_total_num_tokens")
        ms.add("llmb_engine_kv_cache_capacity_tokens", capacity, **labels)
        used = scheduler_value(expo, "kv_used_tokens")
        if used is None:
            used = scheduler_value(expo, "num_used_tokens")
        ms.add("llmb_engine_kv_cache_used_tokens", used, **labels)
        # The fullest DP group throttles admission; token_usage is already max over pools.
        ms.add("llmb_engine_kv_cache_usage_ratio", kv_usage_ratio(expo), **labels)

        ms.add(
            "llmb_engine_prompt_tokens_total", total_value(expo, "prompt_tokens_total"), **labels
        )
        cached = total_value(expo, "cached_tokens_total", cache_source="total")
        if cached is None:
            parts = [
                total_value(expo, "cached_tokens_total", cache_source=src)
                for src in ("device", "host", "storage")
            ]
            known = [p for p in parts if p is not None]
            cached = sum(known) if known else None
            if cached is None:
                cached = total_value(expo, "cached_tokens_total")  # older: no cache_source
        ms.add("llmb_engine_prompt_tokens_cached_total", cached, **labels)
        ms.add(
            "llmb_engine_generation_tokens_total",
            total_value(expo, "generation_tokens_total"),
            **labels,
        )
        for itl in ("inter_token_latency_seconds", "time_per_output_token_seconds"):
            count = total_value(expo, itl + "_count")
            if count is not None:
                ms.add("llmb_engine_decode_tokens_total", count, **labels)
                ms.add(
                    "llmb_engine_decode_seconds_total", total_value(expo, itl + "_sum"), **labels
                )
                break
        ms.add(
            "llmb_engine_requests_finished_total", total_value(expo, "num_requests_total"), **labels
        )
        retracted = scheduler_value(expo, "num_retracted_requests_total")
        if (
            retracted is None
            and PREFIX + "num_retracted_reqs" in expo
            and version is not None
            and version >= RETRACTION_COUNTER_SINCE
        ):
            # The counter appears at the first retraction, the gauge at the first stats
            # publish: on a release with the counter, gauge without counter is a true zero.
            # Older ones (0.5.11) have only the gauge (retracted in the last step), which
            # says nothing about how many there were: unknown, so absent.
            retracted = 0.0
        ms.add("llmb_engine_kv_pressure_events_total", retracted, event="retracted", **labels)

        load_samples = _finite(expo.get(PREFIX + "startup_time_seconds", phase="load_weight"))
        load = max((s.value for s in load_samples), default=None)
        ms.add("llmb_engine_load_seconds", load, **labels)

        for schema_name, candidates in HISTOGRAMS:
            for base in candidates:
                try:
                    hist = _histogram(expo, base)
                except ValueError as exc:  # a bucket bound that is no number
                    ms.problems.append(str(exc))
                    break
                if hist is not None:
                    ms.histogram(schema_name, hist[0], hist[1], **labels)
                    break

    def _map_static(
        self,
        ms: MetricSet,
        expo: Exposition,
        server_info: Fields,
        model_info: Fields,
        models: Fields,
    ) -> None:
        labels = self._labels
        cards = models.objects("data")
        card = cards[0] if cards else Fields(None, "/v1/models.data[0]", server_info.problems)
        if PREFIX + "context_len" not in expo:
            ms.add("llmb_engine_context_tokens", card.num("max_model_len") or None, **labels)

        states = server_info.objects("internal_states") or []
        per_dp = [s.num("effective_max_running_requests_per_dp") for s in states]
        known = [n for n in per_dp if n]
        if known:
            ms.add("llmb_engine_slots", float(sum(known)), **labels)
        else:
            ms.add("llmb_engine_slots", server_info.num("max_running_requests") or None, **labels)

        model = (
            server_info.text("served_model_name")
            or model_info.text("served_model_name")
            or card.text("id")
            or next(
                (
                    s.labels[k]
                    for s in expo.get(PREFIX + "num_running_reqs")
                    for k in ("model_name", "name")
                    if k in s.labels
                ),
                None,
            )
            or model_info.text("model_path")
            or server_info.text("model_path")
        )
        if not (model or server_info):
            return
        quant = ""
        for key in ("quantization", "dtype", "kv_cache_dtype"):
            value = server_info.text(key)
            if value and value != "auto":
                quant = value
                break
        ms.info(
            "llmb_engine_info",
            model=sanitize_label(model or ""),
            version=server_info.text("version") or "",
            quantization=quant,
            simulated="true" if server_info.flag("simulated") is True else "false",
            **labels,
        )

    def _reported_memory(self, server_info: Fields) -> tuple[float | None, float | None, str]:
        """(weight bytes, KV pool bytes, source) the engine reported outside /metrics.

        `/server_info` `internal_states[0].memory_usage` (GiB, rounded to 0.01: 0 = unknown),
        else the server log's `Load weight end ... mem usage=` and `KV Cache is allocated`.
        """
        states = server_info.objects("internal_states") or []
        usage = states[0].obj("memory_usage") if states else None
        # Memory deltas: on a CPU they can read -0.00 or below. Not above 0: not known.
        weight = usage.num("weight", minimum=None) if usage is not None else None
        kv = usage.num("kvcache", minimum=None) if usage is not None else None
        if (weight is not None and weight > 0) or (kv is not None and kv > 0):
            return (
                weight * GIB if weight is not None and weight > 0 else None,
                kv * GIB if kv is not None and kv > 0 else None,
                "server_info",
            )
        if self._log is not None:
            try:
                state = self._log.poll()
            except OSError as exc:
                log.debug("engine=%s cannot read log: %s", self.engine.name, exc)
                state = self._log.state
            return state.weights_bytes, state.kv_bytes, "log"
        return None, None, ""

    def _map_memory(
        self, ms: MetricSet, expo: Exposition, server_info: Fields, reported_kv: float | None
    ) -> None:
        """The KV pool's bytes, spec-decoding accept length and KV element types."""
        labels = self._labels
        kv_gb = scheduler_value(expo, "kv_cache_memory_usage_gb")
        kv = reported_kv if kv_gb is None else kv_gb * GIB
        ms.add("llmb_engine_kv_cache_bytes", kv, device="gpu", **labels)
        if server_info.text("speculative_algorithm"):
            # 0 until the first verified step; a real accept length is at least 1.
            accept = scheduler_value(expo, "spec_accept_length", "max")
            ms.add(
                "llmb_engine_spec_accept_length",
                accept if accept and accept >= 1 else None,
                **labels,
            )
        kv_type = self._kv_dtype(server_info)
        if kv_type is not None:
            add_kv_cache_type(ms, type_k=kv_type, type_v=kv_type, **labels)

    def _kv_dtype(self, server_info: Fields) -> str | None:
        """The KV cache element type: `kv_cache_dtype`, `auto` read as the model's dtype."""
        kv = server_info.text("kv_cache_dtype")
        if kv is None:
            return None
        if kv != "auto":
            return kv
        dtype = server_info.text("dtype")
        if dtype and dtype != "auto":
            return dtype
        geom = self._geometry.value if self._geometry is not None else None
        if isinstance(geom, ModelGeometry) and geom.file_type:
            # SGLang serves a float32 checkpoint in float16 ("auto" follows the served dtype).
            return "float16" if geom.file_type in ("float32", "fp32") else geom.file_type
        return None

    def _map_weights(
        self,
        ms: MetricSet,
        expo: Exposition,
        server_info: Fields,
        geom: ModelGeometry | None,
        reported_weights: float | None = None,
    ) -> float | None:
        """Weights on the GPU and in host memory (`--cpu-offload-gb`), and the model's size.

        The size is what SGLang placed (GPU + CPU offload), so weights quantized while
        loading still count as resident; the checkpoint's size is the fallback.
        """
        labels = self._labels
        gpu_gb = scheduler_value(expo, "weight_memory_usage_gb")
        gpu = None if gpu_gb is None else gpu_gb * GIB
        if gpu is None:
            # 0.5.11 has no weight series: /server_info memory_usage or the log say it.
            gpu = reported_weights
        cpu = (server_info.num("cpu_offload_gb") or 0.0) * GIB
        if gpu is not None:
            ms.add("llmb_engine_model_buffer_bytes", gpu, device="gpu", **labels)
            if cpu:
                ms.add("llmb_engine_model_buffer_bytes", cpu, device="cpu", **labels)
            ms.add("llmb_model_weights_bytes", gpu + cpu, **labels)
            return gpu + cpu  # what the engine placed
        if geom is not None:
            ms.add("llmb_model_weights_bytes", checkpoint_weight_bytes(geom), **labels)
        return None

    def _map_geometry(
        self,
        ms: MetricSet,
        expo: Exposition,
        server_info: Fields,
        geom: ModelGeometry,
        placed: float | None = None,
    ) -> None:
        labels = self._labels
        ms.add("llmb_model_parameters", geom.n_params, **labels)
        ms.add("llmb_model_layers", float(geom.n_layer), **labels)
        if structure_fits(geom, placed):
            add_model_structure(ms, geom, **labels)
        kv_dtype = self._kv_dtype(server_info) or server_info.text("kv_cache_dtype") or "auto"
        try:
            dtype_bytes = kv_type_bytes(kv_dtype)
        except ValueError:
            ms.problems.append(f"/server_info.kv_cache_dtype: unknown type {kv_dtype!r}")
            return  # bytes per element unknown: no KV estimate rather than a wrong one
        ms.add(
            "llmb_model_kv_bytes_per_token_estimated",
            geom.kv_bytes_per_token(dtype_bytes),
            **labels,
        )
        tokens = scheduler_value(expo, "max_total_num_tokens", "max")
        if tokens is None:
            tokens = server_info.num("max_total_num_tokens")
        swa_tokens = scheduler_value(expo, "max_total_num_tokens_swa", "max")
        page = scheduler_value(expo, "page_size", "max") or server_info.num("page_size") or 1
        tp = server_info.num("tp_size") or 1
        values = (tokens, swa_tokens, page, tp)
        if not tokens or not all(v is None or (math.isfinite(v) and v < 2**53) for v in values):
            return  # unknown, or an Inf/absurd value the schema would drop anyway
        est = estimate_sglang_kv(
            geom,
            int(tokens),
            kv_cache_dtype=kv_dtype,
            hybrid_swa=swa_tokens is not None,
            page_size=max(1, int(page)),
            max_total_num_tokens_swa=None if swa_tokens is None else int(swa_tokens),
            tp_size=max(1, int(tp)),
        )
        ms.add("llmb_model_kv_cache_bytes_estimated", float(est.total), **labels)
