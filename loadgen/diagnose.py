"""`llmb-loadgen diagnose`: the seed's whole measuring procedure for one engine.

Phases, each timestamped and published as load generator metrics so Grafana can mark
them: baseline memory before the engine starts, start (load time), settle, loaded
memory, first generation (memory during), after, weights residency, single-sequence
decode, concurrency sweep, prompt-length sweep and context sweep. Every step changes
one variable: the concurrency sweep keeps the slots and context fixed, the context
sweep restarts the engine with only `{ctx}` changed. Without a launch template only
what a running server allows is measured, and the rows that could not be produced are
listed in the report.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import re
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client import CollectorRegistry, Gauge, start_http_server
from prometheus_client.parser import text_string_to_metric_families

from exporter.config import Config, ConfigError, EngineConfig, load_config
from loadgen.client import StreamClient, StreamResult, Target, TargetUnreachable
from loadgen.decision import EngineResult, Phase, Row, decide_single
from loadgen.launcher import EngineProcess, LaunchError, engine_process, template_fields
from loadgen.prompts import CalibrationError, PromptSet, calibrate

log = logging.getLogger(__name__)

PHASES = (
    "baseline",
    "start",
    "settle",
    "first_generation",
    "after",
    "weights",
    "single",
    "concurrency",
    "prompt",
    "context",
)

_OFFLOADED = re.compile(r"offloaded (\d+)/(\d+) layers to GPU")
# One line per KV cache (Gemma 3 has a sliding-window one and a full one).
_KV_SIZE = re.compile(r"llama_kv_cache: size = +([\d.]+) MiB")


@dataclass
class Options:
    """What to measure; every list is one sweep."""

    contexts: list[int] = field(default_factory=list)
    concurrency: list[int] = field(default_factory=lambda: [1, 2, 4, 8])
    prompt_tokens: list[int] = field(default_factory=lambda: [128])
    max_tokens: int = 128
    settle: float | None = None
    parallel: int | None = None
    exporter_url: str | None = None
    bandwidth_bytes_per_s: float | None = None
    request_timeout: float = 600.0
    rounds: int = 1


class PhasePublisher:
    """Publishes the current phase as `llmb_loadgen_phase_info` plus its start timestamp."""

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        self.info = Gauge(
            "llmb_loadgen_phase_info",
            "1 while the diagnose/compare phase runs, else 0.",
            ["engine", "phase"],
            registry=self.registry,
        )
        self.started = Gauge(
            "llmb_loadgen_phase_start_timestamp_seconds",
            "Unix time the diagnose/compare phase last started.",
            ["engine", "phase"],
            registry=self.registry,
        )
        self.phases: list[tuple[str, Phase]] = []

    @contextlib.contextmanager
    def phase(self, engine: str, name: str, note: str = "") -> Iterator[Phase]:
        """Mark `name` as running for `engine` for the duration of the block."""
        ph = Phase(name=name, start=time.time(), note=note)
        self.phases.append((engine, ph))
        self.info.labels(engine, name).set(1)
        self.started.labels(engine, name).set(ph.start)
        try:
            yield ph
        finally:
            ph.end = time.time()
            self.info.labels(engine, name).set(0)


class Metrics:
    """One scrape of the exporter's /metrics, indexed by name."""

    def __init__(self, text: str):
        self.samples: dict[str, list[tuple[dict[str, str], float]]] = {}
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                self.samples.setdefault(s.name, []).append((dict(s.labels), float(s.value)))

    def total(self, name: str, **labels: str) -> float | None:
        """Sum of the matching samples, None when there are none."""
        vals = [v for lbl, v in self.samples.get(name, []) if _match(lbl, labels)]
        return sum(vals) if vals else None

    def labels(self, name: str, **labels: str) -> dict[str, str] | None:
        """Labels of the first matching sample."""
        for lbl, _ in self.samples.get(name, []):
            if _match(lbl, labels):
                return lbl
        return None


def _match(have: dict[str, str], want: dict[str, str]) -> bool:
    return all(have.get(k) == v for k, v in want.items())


class MemoryProbe:
    """GPU memory from the exporter, else NVML, else the launched engine's host RSS."""

    def __init__(self, engine: str, exporter_url: str | None):
        self.engine = engine
        self.exporter_url = exporter_url.rstrip("/") if exporter_url else None
        self.process: EngineProcess | None = None
        self._nvml: Any = None
        self._nvml_tried = False
        self.timeline: list[tuple[float, float]] = []

    @property
    def source(self) -> str | None:
        """'gpu' (exporter or NVML), 'host rss' (launched engine, no GPU) or None."""
        if self.exporter_url or self._nvml_handle() is not None:
            return "gpu"
        return "host rss" if self.process is not None else None

    def scrape(self) -> Metrics | None:
        """The exporter's metrics now, or None without/unreachable exporter."""
        if not self.exporter_url:
            return None
        try:
            import httpx

            resp = httpx.get(self.exporter_url + "/metrics", timeout=10.0)
            resp.raise_for_status()
            return Metrics(resp.text)
        except Exception as exc:  # noqa: BLE001 - a missing sample must not stop the run
            log.warning("cannot read %s/metrics: %s", self.exporter_url, exc)
            return None

    def _nvml_handle(self) -> Any:
        if not self._nvml_tried:
            self._nvml_tried = True
            try:
                import pynvml

                pynvml.nvmlInit()
                self._nvml = (pynvml, pynvml.nvmlDeviceGetHandleByIndex(0))
            except Exception:  # noqa: BLE001 - no driver / no GPU: fall back
                self._nvml = None
        return self._nvml

    def used(self) -> tuple[float | None, float | None]:
        """(memory used now, the exporter's recent peak) in bytes."""
        used, peak = self._used()
        if used is not None:
            self.timeline.append((time.time(), used))
        return used, peak

    def _used(self) -> tuple[float | None, float | None]:
        if self.exporter_url:
            # Never mix sources: a failed scrape is a gap, not a host-memory reading.
            metrics = self.scrape()
            if metrics is None:
                return None, None
            return (
                metrics.total("llmb_gpu_memory_used_bytes"),
                metrics.total("llmb_gpu_memory_used_peak_bytes"),
            )
        nv = self._nvml_handle()
        if nv is not None:
            mod, handle = nv
            return float(mod.nvmlDeviceGetMemoryInfo(handle).used), None
        if self.process is not None:
            rss = self.process.rss_bytes()
            return (float(rss) if rss is not None else None), None
        return None, None

    def gpu_facts(self) -> dict[str, Any]:
        """Card total, bandwidth and the engine's process memory, weights, layers, quantization."""
        facts: dict[str, Any] = {}
        if self.exporter_url:
            metrics = self.scrape()
            if metrics is None:
                return facts
            e = self.engine
            facts["gpu_total_bytes"] = metrics.total("llmb_gpu_memory_total_bytes")
            bws = [
                v for _, v in metrics.samples.get("llmb_gpu_memory_bandwidth_bytes_per_second", [])
            ]
            facts["bandwidth_bytes_per_s"] = max(bws) if bws else None
            facts["process_gpu_bytes"] = metrics.total(
                "llmb_engine_process_gpu_memory_bytes", engine=e
            )
            facts["weights_bytes"] = metrics.total("llmb_model_weights_bytes", engine=e)
            facts["layers_offloaded"] = metrics.total("llmb_engine_gpu_layers_offloaded", engine=e)
            facts["layers_total"] = metrics.total("llmb_engine_gpu_layers_total", engine=e)
            facts["kv_bytes"] = metrics.total("llmb_engine_kv_cache_bytes", engine=e)
            info = metrics.labels("llmb_engine_info", engine=e)
            if info and info.get("quantization"):
                facts["quantization"] = info["quantization"]
            return facts
        nv = self._nvml_handle()
        if nv is not None:
            mod, handle = nv
            facts["gpu_total_bytes"] = float(mod.nvmlDeviceGetMemoryInfo(handle).total)
            with contextlib.suppress(Exception):
                clock = mod.nvmlDeviceGetMaxClockInfo(handle, mod.NVML_CLOCK_MEM)
                bus = mod.nvmlDeviceGetMemoryBusWidth(handle)
                # Double data rate: two transfers per memory clock.
                facts["bandwidth_bytes_per_s"] = clock * 1e6 * 2 * bus / 8
            if self.process is not None and self.process.pid is not None:
                pids = _group_pids(self.process.pid)
                used = 0.0
                with contextlib.suppress(Exception):
                    for p in mod.nvmlDeviceGetComputeRunningProcesses(handle):
                        if p.pid in pids and p.usedGpuMemory:
                            used += p.usedGpuMemory
                facts["process_gpu_bytes"] = used or None
        elif self.process is not None:
            rss = self.process.rss_bytes()
            facts["process_gpu_bytes"] = float(rss) if rss is not None else None
        return facts


def _group_pids(pgid: int) -> set[int]:
    pids = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[2]) == pgid:
                    pids.add(int(entry.name))
    return pids


class Sampler:
    """Samples memory in a background thread while a block runs; keeps the maximum."""

    def __init__(self, probe: MemoryProbe, interval: float = 0.2):
        self.probe = probe
        self.interval = interval
        self.peak: float | None = None

    def _take(self) -> None:
        used, peak = self.probe.used()
        for v in (used, peak):
            if v is not None and (self.peak is None or v > self.peak):
                self.peak = v

    async def run_while(self, coro: Any) -> Any:
        """Await `coro`, sampling memory every `interval` seconds until it finishes."""
        task = asyncio.ensure_future(coro)
        while not task.done():
            await asyncio.to_thread(self._take)
            await asyncio.wait([task], timeout=self.interval)
        await asyncio.to_thread(self._take)
        return task.result()


def request_params(kind: str, max_tokens: int) -> dict[str, Any]:
    """Sampling parameters: temperature 0, ignore_eos, usage in the stream."""
    params: dict[str, Any] = {
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if kind == "llamacpp":
        # Unique prompt prefixes already defeat the cache; this also stops slot reuse.
        params["cache_prompt"] = False
    return params


def row_from_results(
    results: list[StreamResult],
    *,
    engine: str,
    step: str,
    concurrency: int,
    max_tokens: int,
    wall: float,
) -> Row:
    """Summarize one wave of requests into a Row (client-side and server-side figures)."""
    row = Row(engine=engine, step=step, concurrency=concurrency, max_tokens=max_tokens)
    row.requests = len(results)
    row.wall_s = wall
    errors = [r for r in results if r.error]
    if errors:
        row.error = f"{len(errors)}/{len(results)} requests failed: {errors[0].error_detail}"
    good = [r for r in results if not r.error]
    tokens = [int((r.usage or {}).get("completion_tokens") or 0) for r in good]
    prompts = [int((r.usage or {}).get("prompt_tokens") or 0) for r in good]
    row.completion_tokens = sum(tokens)
    row.tokens_ok = bool(good) and not errors and all(t == max_tokens for t in tokens)
    row.prompt_tokens = statistics.mean(prompts) if prompts else None
    ttfts = [r.chunk_times[0] - r.t_send for r in good if r.chunk_times]
    row.ttft_s = statistics.mean(ttfts) if ttfts else None
    per_tok = []
    for r, n in zip(good, tokens, strict=True):
        # Decode time covers n-1 tokens after the first (the first comes from prefill),
        # the same convention as llama.cpp's `timings.predicted_per_token_ms`.
        if len(r.chunk_times) >= 2 and n >= 2:
            per_tok.append((r.chunk_times[-1] - r.chunk_times[0]) / (n - 1))
    if per_tok:
        row.per_token_ms = statistics.mean(per_tok) * 1000
        row.per_seq_tok_s = statistics.mean(1 / t for t in per_tok)
    server = [
        float(r.timings["predicted_per_token_ms"])
        for r in good
        if r.timings and r.timings.get("predicted_per_token_ms")
    ]
    row.server_per_token_ms = statistics.mean(server) if server else None
    row.aggregate_tok_s = row.completion_tokens / wall if wall > 0 and good else None
    return row


async def run_wave(
    client: StreamClient,
    prompts: PromptSet,
    first_index: int,
    concurrency: int,
    rounds: int,
    params: dict[str, Any],
    timeout: float,
) -> tuple[list[StreamResult], float]:
    """Send `concurrency * rounds` requests with exactly `concurrency` in flight."""
    queue = list(range(first_index, first_index + concurrency * rounds))
    results: list[StreamResult] = []

    async def worker() -> None:
        while queue:
            idx = queue.pop(0)
            results.append(
                await client.stream(client.build_body(prompts.text(idx), params), timeout)
            )

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return results, time.perf_counter() - t0


async def engine_facts(client: StreamClient, kind: str) -> dict[str, Any]:
    """Model, quantization, weight bytes, slots and context from the engine's own endpoints."""
    facts: dict[str, Any] = {}
    with contextlib.suppress(Exception):
        models = await client.get_json("/v1/models")
        first = (models.get("data") or [{}])[0]
        facts["model"] = first.get("id")
        meta = first.get("meta") or {}
        if meta.get("size"):
            facts["weights_bytes"] = float(meta["size"])
        if meta.get("ftype"):
            facts["quantization"] = str(meta["ftype"])
        if meta.get("n_ctx"):
            facts["context"] = int(meta["n_ctx"])
        if first.get("max_model_len"):
            facts["context"] = int(first["max_model_len"])
    if kind == "llamacpp":
        with contextlib.suppress(Exception):
            props = await client.get_json("/props")
            if props.get("model_ftype"):
                facts["quantization"] = str(props["model_ftype"])
            if props.get("total_slots"):
                facts["slots"] = int(props["total_slots"])
    else:
        with contextlib.suppress(Exception):
            info = await client.get_json("/server_info")
            facts.update(sglang_facts(info))
    return facts


def sglang_facts(info: dict[str, Any]) -> dict[str, Any]:
    """Precision, slots and weight bytes from SGLang's /server_info."""
    facts: dict[str, Any] = {}
    # "auto" means the checkpoint's own dtype, which /server_info does not name: unknown.
    quant = next(
        (str(info[k]) for k in ("quantization", "dtype") if info.get(k) and info[k] != "auto"),
        None,
    )
    kv = info.get("kv_cache_dtype")
    if quant:
        facts["quantization"] = quant + (f" kv {kv}" if kv and kv != "auto" else "")
    if info.get("max_running_requests"):
        facts["slots"] = int(info["max_running_requests"])
    states = info.get("internal_states") or []
    if states and isinstance(states[0], dict):
        mem = states[0].get("memory_usage") or {}
        if mem.get("weight"):
            facts["weights_bytes"] = float(mem["weight"]) * 2**30
        eff = states[0].get("effective_max_running_requests_per_dp")
        if eff:
            facts["slots"] = int(eff)
    return facts


def layers_from_log(path: Path | None) -> tuple[float | None, float | None]:
    """(offloaded, total) layers from a llama.cpp log (`-lv 4`), or (None, None)."""
    if path is None:
        return None, None
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None, None
    found = _OFFLOADED.findall(text)
    if not found:
        return None, None
    n, m = found[-1]
    return float(n), float(m)


def kv_bytes_from_log(path: Path | None) -> float | None:
    """KV cache bytes a llama.cpp log reports for one launch (sum over its caches)."""
    if path is None:
        return None
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None
    sizes = [float(m) for m in _KV_SIZE.findall(text)]
    return sum(sizes) * 2**20 if sizes else None


class Diagnoser:
    """Runs the phases for one engine and collects an EngineResult."""

    def __init__(
        self,
        engine: EngineConfig,
        opts: Options,
        out: Path,
        publisher: PhasePublisher,
        prompts: dict[int, PromptSet] | None = None,
    ):
        self.engine = engine
        self.opts = opts
        self.out = out
        self.pub = publisher
        self.prompts: dict[int, PromptSet] = dict(prompts or {})
        self.probe = MemoryProbe(engine.name, opts.exporter_url)
        self.result = EngineResult(name=engine.name, kind=engine.kind)
        self.next_index = 0
        self.current: EngineProcess | None = None

    def _phase(self, name: str, note: str = "") -> contextlib.AbstractContextManager[Phase]:
        return self.pub.phase(self.engine.name, name, note)

    def _target(self) -> Target:
        url = self.engine.url
        if self.current is not None:
            url = self.current.health_url.removesuffix("/health")
        return Target(self.engine.name, url, self.engine.kind, self.engine.api_key())

    async def run(self) -> EngineResult:
        """Measure everything this engine's configuration allows."""
        res = self.result
        res.launched = self.engine.launch is not None
        contexts = self.opts.contexts or []
        # Only a template with {parallel} lets the tool choose the slots; else the engine's own.
        parallel = None
        if self.engine.launch is not None and "parallel" in template_fields(
            self.engine.launch.command
        ):
            parallel = self.opts.parallel or max(self.opts.concurrency)
        if self.engine.launch is None:
            res.missing += [
                "baseline memory before start (engine was already running; no launch template)",
                "load time (no launch template)",
                "context sweep (needs a launch template to restart with only the context changed)",
            ]
            await self._measure_running(first_context=None, parallel=None)
            return self._finish()
        first_ctx = contexts[0] if contexts else None
        with self._phase("baseline") as ph:
            ph.memory_bytes, _ = self.probe.used()
            if self.probe.source != "gpu":
                ph.note = "no GPU memory source; host memory of the engine is used instead"
        proc = await self._launch(first_ctx, parallel, "start")
        if proc is None:
            return self._finish()
        try:
            await self._measure_running(first_context=first_ctx, parallel=parallel)
        finally:
            self._stop()
        for ctx in contexts[1:]:
            await self._context_step(ctx, parallel)
        return self._finish()

    async def _launch(
        self, ctx: int | None, parallel: int | None, phase: str
    ) -> EngineProcess | None:
        log_path = (
            self.out / f"{self.engine.name}-c{ctx or 'default'}-np{parallel or 'default'}.log"
        )
        overrides: dict[str, Any] = {"parallel": parallel}
        if ctx:
            overrides["ctx"] = ctx
        proc = engine_process(self.engine, overrides, log_path)
        self.probe.process = proc
        with self._phase(phase, note=" ".join(proc.argv)) as ph:
            try:
                # The health wait blocks; keep the event loop (and its timers) free.
                load = await asyncio.to_thread(proc.start)
            except (LaunchError, KeyError) as exc:
                ph.note = f"failed: {exc}"
                self.result.rows.append(
                    Row(
                        self.engine.name,
                        "context",
                        1,
                        context=ctx,
                        parallel=parallel,
                        error=str(exc).splitlines()[0],
                    )
                )
                self.probe.process = None
                return None
            ph.memory_bytes, _ = self.probe.used()
            ph.note = f"load {load:.2f} s: " + ph.note
        self.current = proc
        if self.result.load_seconds is None:
            self.result.load_seconds = load
        return proc

    def _stop(self) -> None:
        if self.current is not None:
            self.current.stop()
        self.current = None
        self.probe.process = None

    def _settle_seconds(self) -> float:
        if self.opts.settle is not None:
            return self.opts.settle
        return self.engine.launch.settle_seconds if self.engine.launch else 0.0

    async def _settle(self) -> float | None:
        with self._phase("settle") as ph:
            await asyncio.sleep(self._settle_seconds())
            ph.memory_bytes, _ = await asyncio.to_thread(self.probe.used)
            ph.note = "loaded memory after settling"
        return ph.memory_bytes

    async def _prompt(self, client: StreamClient, tokens: int) -> PromptSet:
        if tokens not in self.prompts:

            async def count(text: str) -> int:
                if self.engine.kind == "llamacpp":
                    data = await client.post_json(
                        "/tokenize", {"content": text, "add_special": True}
                    )
                    return len(data["tokens"])
                body = {
                    "model": client.model or "default",
                    "prompt": text,
                    "max_tokens": 1,
                    "temperature": 0,
                }
                data = await client.post_json("/v1/completions", body)
                return int(data["usage"]["prompt_tokens"])

            try:
                self.prompts[tokens] = await calibrate(tokens, count)
            except (CalibrationError, aiohttp.ClientError, KeyError, ValueError) as exc:
                log.warning("prompt calibration failed (%s); using an uncalibrated prompt", exc)
                from loadgen.prompts import filler

                self.prompts[tokens] = PromptSet(filler(max(tokens - 8, 1)), "unique", tokens)
        return self.prompts[tokens]

    async def _wave(
        self,
        client: StreamClient,
        step: str,
        concurrency: int,
        prompt_tokens: int,
        context: int | None,
        parallel: int | None,
        rounds: int = 1,
    ) -> Row:
        prompts = await self._prompt(client, prompt_tokens)
        params = request_params(self.engine.kind, self.opts.max_tokens)
        sampler = Sampler(self.probe)
        results, wall = await sampler.run_while(
            run_wave(
                client,
                prompts,
                self.next_index,
                concurrency,
                rounds,
                params,
                self.opts.request_timeout,
            )
        )
        self.next_index += concurrency * rounds
        row = row_from_results(
            results,
            engine=self.engine.name,
            step=step,
            concurrency=concurrency,
            max_tokens=self.opts.max_tokens,
            wall=wall,
        )
        row.context, row.memory_bytes = context, sampler.peak
        row.parallel = self.result.slots or parallel
        self.result.rows.append(row)
        return row

    async def _measure_running(self, first_context: int | None, parallel: int | None) -> None:
        res = self.result
        opts = self.opts
        loaded = await self._settle() if self.current is not None else None
        async with StreamClient(
            self._target(), pool_size=max(opts.concurrency), endpoint="completions"
        ) as client:
            await client.open()
            facts = await engine_facts(client, self.engine.kind)
            for key in ("model", "quantization", "weights_bytes", "slots"):
                if facts.get(key) is not None:
                    setattr(res, key, facts[key])
            context = first_context or facts.get("context")
            ptoks = opts.prompt_tokens[0]
            with self._phase("first_generation") as ph:
                row = await self._wave(client, "first", 1, ptoks, context, parallel)
                ph.peak_memory_bytes = row.memory_bytes
                ph.memory_bytes = row.memory_bytes
                ph.note = "memory during the first generation (peak)"
            with self._phase("after") as ph:
                ph.memory_bytes, _ = await asyncio.to_thread(self.probe.used)
            with self._phase("weights") as ph:
                self._weights(facts)
                ph.memory_bytes = res.process_gpu_bytes
                ph.note = (
                    f"process memory {_gib(res.process_gpu_bytes)} vs weights "
                    f"{_gib(res.weights_bytes)}; layers {res.layers_offloaded}/{res.layers_total}"
                )
            with self._phase("single"):
                single = await self._wave(
                    client, "single", 1, ptoks, context, parallel, rounds=opts.rounds
                )
            single.loaded_memory_bytes = loaded
            if self.current is not None:
                single.load_seconds = self.current.load_seconds
            for c in opts.concurrency:
                if c == 1:
                    continue
                with self._phase("concurrency", note=f"concurrency {c}"):
                    await self._wave(
                        client, "concurrency", c, ptoks, context, parallel, rounds=opts.rounds
                    )
            for p in opts.prompt_tokens[1:]:
                with self._phase("prompt", note=f"prompt tokens {p}"):
                    await self._wave(client, "prompt", 1, p, context, parallel)
            if self.current is not None and first_context:
                ctx_row = await self._wave(client, "context", 1, ptoks, first_context, parallel)
                ctx_row.loaded_memory_bytes = loaded
                ctx_row.load_seconds = self.current.load_seconds
                ctx_row.kv_bytes = self._kv_bytes()
        if self.current is None:
            res.missing.append("loaded memory after settle (engine not launched by the tool)")

    def _weights(self, facts: dict[str, Any]) -> None:
        res = self.result
        gpu = self.probe.gpu_facts()
        res.memory_source = self.probe.source
        for key in (
            "gpu_total_bytes",
            "bandwidth_bytes_per_s",
            "process_gpu_bytes",
            "layers_offloaded",
            "layers_total",
            "weights_bytes",
            "quantization",
        ):
            if gpu.get(key) is not None and (getattr(res, key) is None or key != "weights_bytes"):
                setattr(res, key, gpu[key])
        if self.opts.bandwidth_bytes_per_s:
            res.bandwidth_bytes_per_s = self.opts.bandwidth_bytes_per_s
        if res.layers_total is None and self.current is not None:
            for path in (self.current.engine_log, self.current.log_path):
                if res.layers_total is None:
                    res.layers_offloaded, res.layers_total = layers_from_log(path)
        if res.layers_total is None and self.engine.log_file is not None:
            res.layers_offloaded, res.layers_total = layers_from_log(self.engine.log_file)

    async def _context_step(self, ctx: int, parallel: int | None) -> None:
        if await self._launch(ctx, parallel, "context") is None:
            return
        try:
            loaded = await self._settle()
            async with StreamClient(self._target(), pool_size=1, endpoint="completions") as client:
                await client.open()
                with self._phase("context", note=f"context {ctx}"):
                    row = await self._wave(
                        client, "context", 1, self.opts.prompt_tokens[0], ctx, parallel
                    )
                row.loaded_memory_bytes = loaded
                row.load_seconds = self.current.load_seconds if self.current else None
                row.kv_bytes = self._kv_bytes()
        except TargetUnreachable as exc:
            # The engine died after becoming ready (e.g. out of memory at this context).
            self.result.rows.append(
                Row(self.engine.name, "context", 1, context=ctx, parallel=parallel, error=str(exc))
            )
        finally:
            self._stop()

    def _kv_bytes(self) -> float | None:
        """KV cache bytes of the running launch: exporter first, else the engine's own log."""
        kv = self.probe.gpu_facts().get("kv_bytes")
        if kv is None and self.current is not None:
            kv = kv_bytes_from_log(self.current.engine_log) or kv_bytes_from_log(
                self.current.log_path
            )
        return kv

    def _finish(self) -> EngineResult:
        self.result.phases = [p for e, p in self.pub.phases if e == self.engine.name]
        self.result.timeline = list(self.probe.timeline)
        if self.result.memory_source is None:
            self.result.memory_source = self.probe.source
        if self.result.memory_source is None:
            self.result.missing.append(
                "memory (no exporter, no NVML and the engine was not launched)"
            )
        if self.result.bandwidth_bytes_per_s is None:
            self.result.missing.append("roofline (no GPU bandwidth: pass --bandwidth-gbs)")
        return self.result


def _gib(value: float | None) -> str:
    return "?" if value is None else f"{value / 2**30:.2f} GiB"


def _ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError("values must be positive integers")
    return values


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags shared by diagnose and compare."""
    parser.add_argument("--out", required=True, type=Path, help="report folder")
    parser.add_argument("--config", type=Path, help="llm-bottleneck YAML config")
    parser.add_argument("--contexts", type=_ints, default=[], help="context sweep, e.g. 2048,8192")
    parser.add_argument("--concurrency", type=_ints, default=[1, 2, 4, 8])
    parser.add_argument("--prompt-tokens", type=_ints, default=[128])
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--settle", type=float, help="seconds after load (default 30 / config)")
    parser.add_argument(
        "--parallel", type=int, help="slots to launch with (default max concurrency)"
    )
    parser.add_argument("--rounds", type=int, default=1, help="waves per concurrency step")
    parser.add_argument("--exporter-url", help="llmb-exporter base URL for GPU memory")
    parser.add_argument("--bandwidth-gbs", type=float, help="memory bandwidth override in GB/s")
    parser.add_argument("--request-timeout", type=float, default=600.0)
    parser.add_argument("--metrics-listen", help="HOST:PORT to serve the phase metrics on")


def options_from_args(args: argparse.Namespace, config: Config) -> Options:
    """Options from parsed flags, with the config's `loadgen:` defaults underneath."""
    bw = args.bandwidth_gbs * 1e9 if args.bandwidth_gbs else None
    if bw is None and isinstance(config.gpu.bandwidth_bytes_per_second, (int, float)):
        bw = float(config.gpu.bandwidth_bytes_per_second)
    return Options(
        contexts=args.contexts,
        concurrency=args.concurrency,
        prompt_tokens=args.prompt_tokens,
        max_tokens=args.max_tokens,
        settle=args.settle,
        parallel=args.parallel,
        exporter_url=args.exporter_url,
        bandwidth_bytes_per_s=bw,
        request_timeout=args.request_timeout,
        rounds=args.rounds,
    )


def load_or_exit(path: Path | None) -> Config:
    """The config, or exit 2 with every validation error."""
    try:
        return load_config(path)
    except ConfigError as exc:
        sys.stderr.write("config error:\n  " + "\n  ".join(exc.errors) + "\n")
        raise SystemExit(2) from None


def serve_metrics(pub: PhasePublisher, listen: str | None) -> Callable[[], None]:
    """Serve the phase metrics on HOST:PORT when asked; returns the function that stops it."""
    if not listen:
        return lambda: None
    host, _, port = listen.rpartition(":")
    try:
        server, _thread = start_http_server(
            int(port), addr=host or "127.0.0.1", registry=pub.registry
        )
    except (OSError, ValueError) as exc:
        # The measurement matters more than the Grafana marks: warn and go on.
        log.warning("cannot serve phase metrics on %s: %s", listen, exc)
        return lambda: None

    def stop() -> None:
        server.shutdown()
        server.server_close()

    return stop


async def diagnose(
    engine: EngineConfig, opts: Options, out: Path, pub: PhasePublisher | None = None
) -> EngineResult:
    """Run every phase for one engine and return the measured result."""
    await asyncio.to_thread(out.mkdir, parents=True, exist_ok=True)
    return await Diagnoser(engine, opts, out, pub or PhasePublisher()).run()


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """Arguments of `llmb-loadgen diagnose`."""
    parser = parser or argparse.ArgumentParser(prog="llmb-loadgen diagnose")
    parser.description = "Measure one engine phase by phase and say why it is slow."
    parser.add_argument("--engine", required=True, help="engine name from the config")
    add_common_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of `llmb-loadgen diagnose`."""
    from loadgen.htmlreport import write_report

    args = build_parser().parse_args(argv)
    return run_diagnose(args, write_report)


def run_diagnose(args: argparse.Namespace, write_report: Callable[..., Any]) -> int:
    """Run diagnose from parsed arguments and write the report; return the exit status."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    # One line per health poll would bury the phase log.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    config = load_or_exit(args.config)
    try:
        engine = config.engine(args.engine)
    except KeyError as exc:
        sys.stderr.write(f"{exc.args[0]}\n")
        return 2
    opts = options_from_args(args, config)
    pub = PhasePublisher()
    stop_metrics = serve_metrics(pub, args.metrics_listen)
    try:
        result = asyncio.run(diagnose(engine, opts, args.out, pub))
    except TargetUnreachable as exc:
        sys.stderr.write(f"llmb-loadgen diagnose: {exc}\n")
        return 1
    finally:
        stop_metrics()
    decision = decide_single(result)
    write_report(args.out, [result], decision, title=f"diagnose {engine.name}")
    print(f"verdict: {decision.verdict}\n{decision.recommendation}")
    print(f"report: {args.out / 'report.html'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


def _configure(parser: argparse.ArgumentParser) -> None:
    build_parser(parser)


def command() -> Any:
    """The `diagnose` subcommand for `llmb-loadgen` (picked up by loadgen.__main__)."""
    from loadgen.__main__ import Command

    def run(args: argparse.Namespace) -> int:
        from loadgen.htmlreport import write_report

        return run_diagnose(args, write_report)

    return Command(
        "diagnose",
        "measure one engine phase by phase and say why it is slow",
        _configure,
        run,
    )
