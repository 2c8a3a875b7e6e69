"""`llmb-loadgen diagnose`: the seed's whole measuring procedure for one engine.

Steps, in order: residency (are all weights on the GPU), single-request decode against the
card's roofline, concurrency, a KV-pressure step (long prompts that fill the slots) and a
context sweep (restarts with only the context changed, up to the model's trained context or
until memory gives out). Load goes through the load generator's scheduler, the llama.cpp
log through the exporter's parser, GPU bandwidth through `exporter.model.gpu_specs`, the
exporter's `/metrics` through `exporter.promtext`, and the verdict through the decision
core `core`: with an exporter, its samples are turned into the recording rules'
signals exactly as Prometheus would; without one, diagnose's own measurements fill the same
`Signals`. A step that cannot run says `not measured: <why>`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import shlex
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
from prometheus_client import CollectorRegistry, Gauge, start_http_server

import core
from diagnose.decision import (
    NOT_MEASURED,
    Decision,
    EngineResult,
    Phase,
    Row,
    RunInfo,
    Step,
    bytes_per_step,
    decide_single,
    engine_verdict,
    results_to_dict,
    roofline,
    roofline_text,
    row_batch,
    row_roofline,
    row_roofline_text,
    utc_now,
)
from diagnose.launcher import (
    EngineProcess,
    LaunchError,
    engine_process,
    launch_values,
    template_fields,
)
from exporter import __version__
from exporter.app import build_runner
from exporter.collectors.llamacpp.log import LogFollower, LogState
from exporter.config import Config, ConfigError, EngineConfig, GpuConfig, ProcessMatch, load_config
from exporter.model.geometry import geometry_from_gguf
from exporter.promtext import parse_exposition
from exporter.runner import Runner
from loadgen.client import StreamClient, Target, TargetUnreachable
from loadgen.options import (
    Command,
    HelpFormatter,
    UsageError,
    add_exporter_option,
    add_max_tokens_option,
    add_out_option,
    add_target_options,
    add_timeout_options,
    int_list,
    metrics_url,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
)
from loadgen.scheduler import RunContext, RunSpec, run_step

log = logging.getLogger(__name__)

STEPS = ("residency", "single", "concurrency", "kv_pressure", "context")
STEP_QUESTIONS = {
    "residency": "Do the weights fit and stay resident on the GPU?",
    "single": "Single-request decode: how close to the card's limit?",
    "concurrency": "Concurrency: does aggregate throughput grow, do requests queue?",
    "kv_pressure": "KV pressure: do long prompts in every slot fit in the KV cache?",
    "context": "Long context: where does memory give out?",
}
# Error kinds that mean the KV cache / context ran out (the load generator's names).
KV_ERRORS = ("kv_exhausted",)
# The longest KV-pressure prompt chosen automatically: longer prompts cost minutes of prefill.
KV_PROMPT_CAP = 16384

Series = dict[core.SeriesKey, float]


@dataclass
class Options:
    """What to measure; every list is one sweep."""

    concurrency: list[int] = field(default_factory=lambda: [1, 2, 4, 8])
    prompt_tokens: int = 128
    max_tokens: int = 128
    rounds: int = 1
    requests_per_slot: int = 2
    # None: automatic (double up to the trained context); []: no context sweep.
    contexts: list[int] | None = None
    max_context: int | None = None
    # None: automatic (half a slot's context); 0: no KV-pressure step.
    kv_prompt_tokens: int | None = None
    settle: float | None = None
    parallel: int | None = None
    exporter_url: str | None = None
    exporter_engine: str | None = None
    # GPU sampling of the embedded collectors (the config's `gpu:`; None: NVML if present).
    gpu: GpuConfig | None = None
    bandwidth_bytes_per_s: float | None = None
    timeout: float = 600.0
    connect_timeout: float = 5.0
    sample_interval: float = 0.5


def say(text: str) -> None:
    """One progress line on the terminal (stderr, so stdout keeps only the answer)."""
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


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


# --- the exporter's /metrics: the one reader -------------------------------------------------


def series_from_text(text: str) -> Series:
    """An exporter page as {(name, sorted labels): value} (ValueError when it is none)."""
    expo = parse_exposition(text, "llmb_")
    return {
        (name, tuple(sorted(s.labels.items()))): s.value
        for name, samples in expo.samples.items()
        for s in samples
    }


def read_exporter(url: str, timeout: float = 10.0) -> Series:
    """One scrape of the exporter, with or without /metrics in `url` (raises httpx/ValueError)."""
    resp = httpx.get(metrics_url(url), timeout=timeout)
    resp.raise_for_status()
    return series_from_text(resp.text)


def _pick(series: Series, name: str, **labels: str) -> list[float]:
    return [
        v
        for (n, lab), v in series.items()
        if n == name and all(dict(lab).get(k) == want for k, want in labels.items())
    ]


def _first(series: Series, name: str, **labels: str) -> float | None:
    vals = _pick(series, name, **labels)
    return max(vals) if vals else None


def counters_from_zero(
    scrapes: list[tuple[float, Series]], engine: str
) -> list[tuple[float, Series]]:
    """A window's scrapes, with 0 at its first scrape for each counter the engine began later.

    SGLang creates a metric family at its first observation (the inter-token histogram that
    gives the decode counters after the first streamed request, the retraction counter at
    the first retraction): in a step that began before it, the counter is in the step's
    later scrapes only, and a rate over a single point is none (no decode efficiency, no
    event). It stood at 0 when the step began: the engine was up and had counted nothing.
    """
    start, first = scrapes[0]
    if _first(first, "llmb_engine_up", engine=engine) != 1:
        return scrapes  # the engine unread at the start: absent says nothing
    born = {
        key
        for _, later in scrapes[1:]
        for key in later
        if key not in first and key[0].endswith("_total") and ("engine", engine) in key[1]
    }
    if not born:
        return scrapes
    return [(start, {**first, **dict.fromkeys(born, 0.0)}), *scrapes[1:]]


class Monitor:
    """Samples, while one engine is measured: the exporter's series, memory and the log.

    With `--exporter-url` the running exporter is scraped. Without it the exporter's own
    collectors run inside diagnose (same code, same `llmb_*` series), fed the launched
    engine's log and process id, so both paths go through the recording rules' arithmetic
    (`core.rule_values_at`) exactly as Prometheus would.
    """

    def __init__(self, engine: str, opts: Options):
        self.engine = engine
        self.opts = opts
        self.exporter_engine = opts.exporter_engine or engine
        self.scrapes: list[tuple[float, Series]] = []
        self.timeline: list[tuple[float, float]] = []
        self.scrape_errors = 0
        self.process: EngineProcess | None = None
        self.log: LogFollower | None = None
        self.runner: Runner | None = None
        self._nvml: Any = None
        self._nvml_tried = False
        self._task: asyncio.Task[None] | None = None

    # sources -----------------------------------------------------------------------------

    def nvml(self) -> Any:
        """(pynvml, handle of GPU 0) or None without a driver."""
        if not self._nvml_tried:
            self._nvml_tried = True
            try:
                import pynvml

                pynvml.nvmlInit()
                self._nvml = (pynvml, pynvml.nvmlDeviceGetHandleByIndex(0))
            except Exception:  # noqa: BLE001 - no driver / no GPU: other sources
                self._nvml = None
        return self._nvml

    def _gpu_config(self) -> GpuConfig | None:
        """GPU sampling of the embedded collectors: the config's, when a GPU can be read."""
        gpu = self.opts.gpu or GpuConfig()
        if gpu.fake_file or (gpu.enabled and self.nvml() is not None):
            return gpu
        return None

    @property
    def source(self) -> str | None:
        """'gpu' (exporter, GPU file or NVML), 'host rss' (launched engine) or None."""
        if self.opts.exporter_url or self._gpu_config() is not None:
            return "gpu"
        return "host rss" if self.process is not None else None

    async def attach(self, engine: EngineConfig, log_path: Path | None, pid: int | None) -> None:
        """Point the embedded collectors at this engine instance (after each launch)."""
        self.follow_log(log_path)
        if self.opts.exporter_url:
            return
        await self.detach()
        update: dict[str, Any] = {}
        if log_path is not None:
            update["log_file"] = log_path
        if pid is not None:
            update["process"] = ProcessMatch(pid=pid)
        gpu = self._gpu_config()
        config = Config(
            host="diagnose",
            engines=[engine.model_copy(update=update)],
            gpu=gpu if gpu is not None else GpuConfig(enabled=False),
        )
        self.exporter_engine = engine.name
        self.runner = build_runner(config)
        await self.runner.start()

    async def detach(self) -> None:
        """Close the embedded collectors."""
        if self.runner is not None:
            runner, self.runner = self.runner, None
            await runner.close()

    async def sample(self) -> None:
        """Take one sample of every source."""
        now = time.time()
        series: Series | None = None
        if self.opts.exporter_url:
            try:
                series = await asyncio.to_thread(read_exporter, self.opts.exporter_url)
            except (httpx.HTTPError, ValueError) as exc:
                # A failed scrape is a gap, never a reading from another source.
                self.scrape_errors += 1
                log.debug("exporter scrape failed: %s", exc)
                return
            self._resolve_engine(series)
        elif self.runner is not None:
            families = await self.runner.scrape()
            series = {
                (s.name, tuple(sorted(s.labels.items()))): float(s.value)
                for family in families
                for s in family.samples
            }
        used: float | None = None
        if series is not None:
            self.scrapes.append((now, series))
            used = _first(series, "llmb_gpu_memory_used_bytes")
        if used is None and self.process is not None and self._gpu_config() is None:
            rss = await asyncio.to_thread(self.process.rss_bytes)
            used = float(rss) if rss is not None else None
        if used is not None:
            self.timeline.append((now, used))
        if self.log is not None:
            with contextlib.suppress(OSError):
                self.log.poll()

    def _resolve_engine(self, series: Series) -> None:
        """With `--url` the exporter may know the engine by another name: take its only one."""
        names = {dict(lab).get("engine") for n, lab in series if n == "llmb_engine_up"}
        if self.exporter_engine not in names and len(names) == 1:
            only = next(iter(names))
            if only:
                log.info("exporter knows the engine as %r; using its series", only)
                self.exporter_engine = only

    async def _loop(self) -> None:
        while True:
            try:
                await self.sample()
            except Exception:  # a failed sample is a gap, not a failed run
                log.exception("sampling failed")
            await asyncio.sleep(self.opts.sample_interval)

    def start(self) -> None:
        """Begin sampling in the background."""
        if self._task is None:
            self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        """Stop sampling and close the embedded collectors."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self.detach()

    def follow_log(self, path: Path | None) -> None:
        """Read this llama.cpp log (`-lv 4`/`--log-file`) from now on."""
        self.log = LogFollower(path) if path is not None else None
        if self.log is not None:
            with contextlib.suppress(OSError):
                self.log.poll()

    def log_state(self) -> LogState | None:
        """What the engine's log said so far (None without a log)."""
        if self.log is None:
            return None
        with contextlib.suppress(OSError):
            return self.log.poll()
        return self.log.state

    # readings ------------------------------------------------------------------------------

    def memory_peak(self, t0: float, t1: float) -> float | None:
        """Largest memory reading taken in [t0, t1] (and the exporter's peak gauge)."""
        vals = [v for t, v in self.timeline if t0 <= t <= t1]
        for t, series in self.scrapes:
            if t0 <= t <= t1:
                vals += _pick(series, "llmb_gpu_memory_used_peak_bytes")
        return max(vals) if vals else None

    async def memory_now(self) -> float | None:
        """A fresh memory reading."""
        await self.sample()
        return self.timeline[-1][1] if self.timeline else None

    def rule_values(self, at: float, since: float | None = None) -> core.RuleValues | None:
        """The recording rules' values for this engine at `at`.

        With `since`, only the samples of [since, at] count: what Prometheus would say had
        it watched this load for the whole window, without the earlier steps mixed in.
        """
        # Sorted: the background sampler and a step's own samples may finish out of order.
        scrapes = sorted(
            ((t, s) for t, s in self.scrapes if since is None or since <= t <= at),
            key=lambda scrape: scrape[0],
        )
        if not scrapes:
            return None
        if since is not None:
            scrapes = counters_from_zero(scrapes, self.exporter_engine)
        series = core.series_from_scrapes(scrapes)
        for key, values in core.rule_values_at(series, at).items():
            if key.engine == self.exporter_engine:
                return values
        return None

    def engine_value(self, name: str) -> float | None:
        """The newest value of a per-engine series."""
        return _first(self.latest(), name, engine=self.exporter_engine)

    def latest(self) -> Series:
        """The newest scrape (empty without one)."""
        return self.scrapes[-1][1] if self.scrapes else {}


# EngineResult field -> the exporter series of the model's structure (issue 17).
STRUCTURE_SERIES = {
    "always_read_bytes": "llmb_model_weights_always_read_bytes",
    "routed_expert_bytes": "llmb_model_weights_routed_experts_bytes",
    "experts": "llmb_model_experts",
    "experts_used": "llmb_model_experts_used",
    "token_embedding_row_bytes": "llmb_model_token_embedding_row_bytes",
    "draft_weights_bytes": "llmb_model_draft_weights_bytes",
    "spec_accept_length": "llmb_engine_spec_accept_length",
    "experts_host_layers": "llmb_engine_experts_host_layers",
    "experts_host_bytes": "llmb_engine_experts_host_bytes",
}


def structure_from_geometry(res: EngineResult, geo: Any) -> None:
    """The model-structure fields of a GGUF/HF geometry (`ModelGeometry`)."""
    for attr, name in (
        ("always_read_bytes", "always_read_bytes"),
        ("routed_expert_bytes", "routed_expert_bytes"),
        ("experts", "expert_count"),
        ("experts_used", "expert_used_count"),
        ("token_embedding_row_bytes", "token_embedding_row_bytes"),
    ):
        value = getattr(geo, name, None)
        if value is not None and getattr(res, attr) is None:
            setattr(res, attr, float(value))


# --- engine facts from its own endpoints -----------------------------------------------------


async def engine_facts(client: StreamClient, kind: str) -> dict[str, Any]:
    """Model, quantization, sizes, slots and contexts from the engine's own endpoints."""
    facts: dict[str, Any] = {}
    with contextlib.suppress(Exception):
        models = await client.get_json("/v1/models")
        first = (models.get("data") or [{}])[0]
        facts["model"] = first.get("id")
        meta = first.get("meta") or {}
        for src, dst in (("size", "weights_bytes"), ("n_params", "parameters")):
            if meta.get(src):
                facts[dst] = float(meta[src])
        if meta.get("n_ctx_train"):
            facts["trained_context"] = int(meta["n_ctx_train"])
        if first.get("max_model_len"):
            facts["slot_context"] = int(first["max_model_len"])
    if kind == "llamacpp":
        with contextlib.suppress(Exception):
            props = await client.get_json("/props")
            if props.get("model_ftype"):
                facts["quantization"] = str(props["model_ftype"])
            if props.get("total_slots"):
                facts["slots"] = int(props["total_slots"])
            gen = props.get("default_generation_settings") or {}
            if gen.get("n_ctx"):
                facts["slot_context"] = int(gen["n_ctx"])
            if props.get("model_path"):
                facts["model_path"] = str(props["model_path"])
    elif kind == "sglang":
        info: dict[str, Any] = {}
        for path in ("/server_info", "/get_server_info"):
            with contextlib.suppress(Exception):
                info = await client.get_json(path)
                break
        facts.update(sglang_facts(info))
    return facts


def sglang_facts(info: dict[str, Any]) -> dict[str, Any]:
    """Precision, slots, context and weight bytes from SGLang's /server_info."""
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
    if info.get("context_length"):
        facts["slot_context"] = int(info["context_length"])
    states = info.get("internal_states") or []
    if states and isinstance(states[0], dict):
        mem = states[0].get("memory_usage") or {}
        if mem.get("weight"):
            facts["weights_bytes"] = float(mem["weight"]) * 2**30
        eff = states[0].get("effective_max_running_requests_per_dp")
        if eff:
            facts["slots"] = int(eff)
    return facts


async def detect_kind(url: str, api_key: str | None) -> str:
    """llamacpp when /props answers, sglang when /server_info does, else openai."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with httpx.AsyncClient(timeout=5.0, headers=headers) as client:
        for path, kind in (
            ("/props", "llamacpp"),
            ("/server_info", "sglang"),
            ("/get_server_info", "sglang"),
        ):
            with contextlib.suppress(httpx.HTTPError, ValueError):
                resp = await client.get(url + path)
                if resp.status_code == 200 and isinstance(resp.json(), dict):
                    return kind
    return "openai"


# --- one engine, step by step --------------------------------------------------------------


class Diagnoser:
    """Runs the steps for one engine and collects an EngineResult with its verdict."""

    def __init__(
        self,
        engine: EngineConfig,
        opts: Options,
        out: Path,
        publisher: PhasePublisher,
        ctx: RunContext | None = None,
    ):
        self.engine = engine
        self.opts = opts
        self.out = out
        self.pub = publisher
        # One RunContext per run: compare shares it, so both engines get the same prompts.
        self.ctx = ctx or RunContext(out)
        self.monitor = Monitor(engine.name, opts)
        self.result = EngineResult(name=engine.name, kind=engine.kind, url=engine.url)
        self.current: EngineProcess | None = None
        self.steps: dict[str, Step] = {}
        # (verdict, evidence) of the decision core at the end of each load step.
        self.step_verdicts: list[tuple[str, str, core.Signals]] = []
        self.step_no = 0
        self.kv_events_total = 0
        self.model_path: Path | None = engine.model_path
        self.launched_ctx: int | None = None
        self.loaded_memory: float | None = None

    # helpers ----------------------------------------------------------------------------

    def _phase(self, name: str, note: str = "") -> contextlib.AbstractContextManager[Phase]:
        return self.pub.phase(self.engine.name, name, note)

    def _say(self, step: str, text: str) -> None:
        say(f"[{self.engine.name}] {step}: {text}")

    def _not_measured(self, step: str, why: str) -> None:
        self.steps[step] = Step(step, STEP_QUESTIONS[step], NOT_MEASURED + why)
        self.result.missing.append(f"{step}: {why}")
        self._say(step, NOT_MEASURED + why)

    def _target(self) -> Target:
        url = self.engine.url
        if self.current is not None:
            url = self.current.health_url.removesuffix("/health")
        return Target(self.engine.name, url, self.engine.kind, self.engine.api_key())

    def _template(self) -> set[str]:
        launch = self.engine.launch
        return template_fields(launch.command) if launch is not None else set()

    # the run ----------------------------------------------------------------------------

    async def run(self) -> EngineResult:
        """Measure everything this engine's configuration allows, then decide."""
        res = self.result
        res.launched = self.engine.launch is not None
        self.monitor.start()
        try:
            await self._run()
        finally:
            self._stop()
            await self.monitor.stop()
        return self._finish()

    async def _run(self) -> None:
        opts = self.opts
        parallel = None
        if "parallel" in self._template():
            parallel = opts.parallel or max(opts.concurrency)
        first_ctx = opts.contexts[0] if opts.contexts else None
        if self.engine.launch is not None:
            with self._phase("baseline") as ph:
                ph.memory_bytes = await self.monitor.memory_now()
            if await self._launch(first_ctx, parallel, "start") is None:
                for step in ("residency", "single", "concurrency", "kv_pressure"):
                    self._not_measured(step, "the engine did not start (see the context row)")
                self.steps["context"] = Step(
                    "context",
                    STEP_QUESTIONS["context"],
                    f"memory gave out (or the engine failed) at the first launch: "
                    f"{self.result.rows[-1].error}",
                    True,
                )
                return
            self.loaded_memory = await self._settle()
        else:
            self.result.missing.append(
                "baseline memory and load time: the engine was already running (no launch template)"
            )
            await self.monitor.attach(self.engine, self.engine.log_file, None)
        await self._facts()
        await self._residency()
        await self._single()
        await self._concurrency()
        await self._kv_pressure()
        self._launch_context_row()
        self._stop()
        await self._context_sweep(parallel)

    # launching --------------------------------------------------------------------------

    async def _launch(
        self, ctx: int | None, parallel: int | None, phase: str
    ) -> EngineProcess | None:
        log_path = (
            self.out / f"{self.engine.name}-c{ctx or 'default'}-np{parallel or 'default'}.log"
        )
        overrides: dict[str, Any] = {"parallel": parallel}
        if ctx:
            overrides["ctx"] = ctx
        try:
            proc = engine_process(self.engine, overrides, log_path)
        except (LaunchError, KeyError) as exc:
            self._failed_launch(ctx, parallel, str(exc))
            return None
        self.monitor.process = proc
        with contextlib.suppress(KeyError, TypeError, ValueError):
            self.launched_ctx = int(launch_values(self.engine, overrides, log_path)["ctx"])
        self._say(phase, f"starting the engine ({' '.join(shlex.quote(a) for a in proc.argv)})")
        with self._phase(phase, note=" ".join(proc.argv)) as ph:
            try:
                # The health wait blocks; keep the event loop (and the sampler) free.
                load = await asyncio.to_thread(proc.start)
            except LaunchError as exc:
                ph.note = f"failed: {exc}"
                self.monitor.process = None
                self._failed_launch(ctx, parallel, str(exc))
                return None
            ph.memory_bytes = await self.monitor.memory_now()
            ph.note = f"load {load:.2f} s: " + ph.note
        self.current = proc
        engine_log = proc.engine_log if "log" in self._template() else self.engine.log_file
        await self.monitor.attach(self.engine, engine_log, proc.pid)
        if self.result.load_seconds is None:
            self.result.load_seconds = load
        return proc

    def _failed_launch(self, ctx: int | None, parallel: int | None, error: str) -> None:
        self.result.rows.append(
            Row(
                self.engine.name,
                "context",
                1,
                context=ctx,
                parallel=parallel,
                error=error.splitlines()[0],
            )
        )

    def _stop(self) -> None:
        if self.current is not None:
            self.current.stop()
        self.current = None
        self.monitor.process = None

    async def _settle(self) -> float | None:
        seconds = self.opts.settle
        if seconds is None:
            seconds = self.engine.launch.settle_seconds if self.engine.launch else 0.0
        with self._phase("settle") as ph:
            await asyncio.sleep(seconds)
            ph.memory_bytes = await self.monitor.memory_now()
            ph.note = "loaded memory after settling"
        return ph.memory_bytes

    # facts and residency ----------------------------------------------------------------

    async def _facts(self) -> None:
        res = self.result
        async with StreamClient(self._target(), pool_size=1, endpoint="completions") as client:
            await client.open()
            facts = await engine_facts(client, self.engine.kind)
        for key in (
            "model",
            "quantization",
            "weights_bytes",
            "parameters",
            "slots",
            "trained_context",
            "slot_context",
        ):
            if facts.get(key) is not None:
                setattr(res, key, facts[key])
        if self.model_path is None and facts.get("model_path"):
            self.model_path = Path(facts["model_path"])
        # One GGUF reader for the whole project: the exporter's.
        # diagnose --url: the GGUF that /props names, when it is readable here.
        if self.model_path is not None and self.model_path.suffix == ".gguf":
            with contextlib.suppress(OSError, ValueError):
                geo = await asyncio.to_thread(geometry_from_gguf, self.model_path)
                res.parameters = res.parameters or (float(geo.n_params) if geo.n_params else None)
                res.trained_context = res.trained_context or geo.n_ctx_train
                res.kv_bytes_per_token = geo.kv_bytes_per_token()
                res.layers_total = res.layers_total or float(geo.n_layer + 1)
                if res.weights_bytes is None and geo.weight_bytes:
                    res.weights_bytes = float(geo.weight_bytes)
                structure_from_geometry(res, geo)
        await self._gpu_facts()

    async def _gpu_facts(self) -> None:
        """Card, bandwidth (model/gpu_specs, via the NVML collector), memory, layers, buffers."""
        res, mon = self.result, self.monitor
        await mon.sample()
        res.memory_source = mon.source
        series = mon.latest()
        if series:
            e = mon.exporter_engine
            res.gpu_total_bytes = _first(series, "llmb_gpu_memory_total_bytes")
            res.bandwidth_bytes_per_s = _first(series, "llmb_gpu_memory_bandwidth_bytes_per_second")
            # The engine's GPUs as the rules see them (tensor parallel: their bandwidths add).
            values = mon.rule_values(time.time())
            if values is not None and values.bandwidth_bytes_per_second:
                res.bandwidth_bytes_per_s = values.bandwidth_bytes_per_second
            res.bandwidth_source = "exporter" if res.bandwidth_bytes_per_s else None
            for attr, name in (
                ("process_gpu_bytes", "llmb_engine_process_gpu_memory_bytes"),
                ("weights_bytes", "llmb_model_weights_bytes"),
                ("parameters", "llmb_model_parameters"),
                ("layers_offloaded", "llmb_engine_gpu_layers_offloaded"),
                ("layers_total", "llmb_engine_gpu_layers_total"),
                ("kv_bytes_per_token", "llmb_model_kv_bytes_per_token_estimated"),
                *STRUCTURE_SERIES.items(),
            ):
                value = _first(series, name, engine=e)
                if value is not None:
                    setattr(res, attr, value)
            buffers = [
                v
                for (n, lab), v in series.items()
                if n == "llmb_engine_model_buffer_bytes"
                and dict(lab).get("engine") == e
                and not dict(lab).get("device", "").lower().startswith("cpu")
            ]
            res.gpu_buffer_bytes = sum(buffers) if buffers else res.gpu_buffer_bytes
            for (n, lab), _ in series.items():
                info = dict(lab)
                if n == "llmb_engine_info" and info.get("engine") == e:
                    res.quantization = info.get("quantization") or res.quantization
                    res.engine_version = info.get("version") or res.engine_version
                if n == "llmb_gpu_info" and info.get("name"):
                    res.gpu_name = info["name"]
                    res.gpu_driver = info.get("driver") or res.gpu_driver
        state = mon.log_state()
        if state is not None:
            if state.layers_total is not None:
                res.layers_offloaded = float(state.layers_offloaded or 0)
                res.layers_total = float(state.layers_total)
            gpu = [
                v
                for dev, v in state.model_buffer_bytes.items()
                if not dev.lower().startswith("cpu")
            ]
            if gpu or state.model_buffer_bytes:
                res.gpu_buffer_bytes = sum(gpu)
            res.slots = res.slots or state.n_slots
            res.slot_context = res.slot_context or state.n_ctx_slot
        if self.opts.bandwidth_bytes_per_s:
            res.bandwidth_bytes_per_s = self.opts.bandwidth_bytes_per_s
            res.bandwidth_source = "--bandwidth-gbs"

    def _own_residency_signals(self) -> dict[str, Any]:
        """The residency part of `Signals` from diagnose's own readings (no exporter)."""
        res = self.result
        has_gpu = self.monitor.source == "gpu"
        out: dict[str, Any] = {
            "host_has_gpu": has_gpu,
            "experts_host_layers": res.experts_host_layers,
        }
        if res.layers_total:
            out["layers_ratio"] = (res.layers_offloaded or 0.0) / res.layers_total
        if res.weights_bytes and res.gpu_buffer_bytes is not None and has_gpu:
            out["weights_buffers_ratio"] = res.gpu_buffer_bytes / res.weights_bytes
        if res.weights_bytes and res.process_gpu_bytes is not None and has_gpu:
            out["weights_memory_ratio"] = res.process_gpu_bytes / res.weights_bytes
        return out

    async def _residency(self) -> None:
        res = self.result
        with self._phase("residency") as ph:
            await self._gpu_facts()
            ph.memory_bytes = res.process_gpu_bytes
        values = self.monitor.rule_values(time.time())
        sig = (
            values.signals if values is not None else core.Signals(**self._own_residency_signals())
        )
        cond = core.evaluate(sig).condition("weights_not_resident")
        facts = (
            f"layers {_num(res.layers_offloaded)}/{_num(res.layers_total)}, weights "
            f"{_gib(res.weights_bytes)}, GPU weight buffers {_gib(res.gpu_buffer_bytes)}, "
            f"process GPU memory {_gib(res.process_gpu_bytes)}"
        )
        if res.experts_host_layers:
            facts += (
                f", routed experts of {res.experts_host_layers:.0f} layers in host memory "
                f"({_gib(res.experts_host_bytes)}: expert offload)"
            )
        numbers: dict[str, Any] = {name: getattr(sig, name) for name, _ in RESIDENCY_SOURCES}
        numbers["host_has_gpu"] = sig.host_has_gpu
        if not sig.host_has_gpu:
            self._not_measured(
                "residency",
                "no GPU seen (no exporter with a GPU, no NVML): the weights are in host memory"
                f" ({facts})",
            )
            self.steps["residency"].numbers = numbers
            return
        measured = residency_sources(sig, self.engine.kind)
        if cond.held:
            answer = f"no: {', '.join(cond.evidence)} below the threshold; {measured} ({facts})"
        elif not measured:
            self._not_measured("residency", residency_gap(res, self.engine.kind))
            self.steps["residency"].numbers = numbers
            return
        else:
            answer = f"yes, from {measured} ({facts})"
        self.steps["residency"] = Step(
            "residency", STEP_QUESTIONS["residency"], answer, cond.held, numbers
        )
        self._say("residency", answer)

    # load steps -------------------------------------------------------------------------

    def _spec(self, concurrency: int, prompt_tokens: int, requests: int) -> RunSpec:
        extra: dict[str, Any] = {}
        if self.engine.kind == "llamacpp":
            # Unique prompt prefixes already defeat the cache; this also stops slot reuse.
            extra["cache_prompt"] = False
        return RunSpec(
            targets=[self._target()],
            max_tokens=self.opts.max_tokens,
            concurrency=concurrency,
            requests=requests,
            prompt_tokens=prompt_tokens,
            timeout=self.opts.timeout,
            connect_timeout=self.opts.connect_timeout,
            endpoint="completions",
            extra_body=extra,
        )

    async def _load(
        self,
        step: str,
        concurrency: int,
        prompt_tokens: int,
        rounds: int,
        context: int | None,
        requests: int | None = None,
    ) -> Row:
        """One load step through the scheduler, `rounds` times; the row keeps every round."""
        row = Row(
            self.engine.name,
            step,
            concurrency,
            context=context,
            parallel=self.result.slots,
            max_tokens=self.opts.max_tokens,
        )
        ttfts: list[float] = []
        per_seq: list[float] = []
        server_ms: list[float] = []
        prompts: list[float] = []
        log0 = self._log_events()
        t0 = time.time()
        # The step's window opens with a scrape of its own: every counter's value before the
        # first request (the background sampler's next scrape may come after it finished, and
        # a step seen by one scrape has no rate: `idle`, no decode efficiency).
        await self.monitor.sample()
        started = time.time()
        for _ in range(rounds):
            spec = self._spec(
                concurrency, prompt_tokens, requests or concurrency * self.opts.requests_per_slot
            )
            result = await run_step(spec, self.ctx, step=self.step_no)
            self.step_no += 1
            records = result.records.get(self.engine.name, [])
            row.requests += len(records)
            for summary in result.summaries[:1]:
                row.requests_failed += summary.requests_failed
                for kind, n in summary.errors.items():
                    row.errors[kind] = row.errors.get(kind, 0) + n
                row.completion_tokens += summary.output_tokens_total
                if summary.output_tok_s is not None:
                    row.aggregate_rounds.append(summary.output_tok_s)
                if summary.ttft_p50_s is not None:
                    ttfts.append(summary.ttft_p50_s)
                    row.ttft_rounds.append(summary.ttft_p50_s)
                if summary.ttft_p99_s is not None:
                    row.ttft_p99_s = max(row.ttft_p99_s or 0.0, summary.ttft_p99_s)
                if summary.decode_tok_s_mean is not None:
                    per_seq.append(summary.decode_tok_s_mean)
                    row.per_seq_rounds.append(summary.decode_tok_s_mean)
                if summary.server_decode_tok_s_mean:
                    server_ms.append(1000.0 / summary.server_decode_tok_s_mean)
            prompts += [float(r.prompt_tokens) for r in records if r.prompt_tokens is not None]
            if result.interrupted:
                raise KeyboardInterrupt
        row.wall_s = time.time() - started
        # llama.cpp logs a slot's release (and its truncation) after the stream has ended:
        # one more sample interval lets the log and the exporter catch up with the step.
        await asyncio.sleep(self.opts.sample_interval)
        await self.monitor.sample()
        t1 = time.time()
        # Series that appear only once requests finished (the speculative accept length).
        self._structure_facts()
        ok = row.requests - row.requests_failed
        row.tokens_ok = (
            ok > 0
            and row.completion_tokens == ok * self.opts.max_tokens
            and not (row.requests_failed)
        )
        row.prompt_tokens = sum(prompts) / len(prompts) if prompts else None
        row.aggregate_tok_s = _median(row.aggregate_rounds)
        row.ttft_s = _median(ttfts)
        row.per_seq_tok_s = _median(per_seq)
        row.per_token_ms = 1000.0 / row.per_seq_tok_s if row.per_seq_tok_s else None
        row.server_per_token_ms = _median(server_ms)
        row.memory_bytes = self.monitor.memory_peak(t0, t1)
        # KV pressure: cut requests (early stop = truncated by the engine), KV errors, log events.
        row.kv_exhausted = sum(row.errors.get(k, 0) for k in KV_ERRORS)
        row.truncated = row.errors.get("early_stop", 0)
        row.kv_events = max(0, self._log_events() - log0)
        if ok == 0:
            row.error = f"{row.requests_failed}/{row.requests} requests failed: " + ", ".join(
                f"{k} {n}" for k, n in sorted(row.errors.items())
            )
        roof = row_roofline(self.result, row)
        row.bytes_per_step, row.limit_tok_s = roof.bytes_per_step, roof.limit_tok_s
        row.efficiency, row.misfit = roof.efficiency, roof.misfit
        self._step_evidence(row, t0, t1)
        self.result.rows.append(row)
        return row

    def _log_events(self) -> int:
        state = self.monitor.log_state()
        return sum(state.events.values()) if state is not None else 0

    def _step_evidence(self, row: Row, t0: float, t1: float) -> None:
        """Signals at the end of the step: the exporter's through the rules, else our own."""
        mon = self.monitor
        values = mon.rule_values(t1, since=t0)
        if values is not None:
            sig = self._complete(values.signals, row, values)
            window = [s for t, s in mon.scrapes if t0 <= t <= t1]
            kv = [
                v
                for s in window
                for v in _pick(s, "llmb_engine_kv_cache_usage_ratio", engine=mon.exporter_engine)
            ]
            waiting = [
                v
                for s in window
                for v in _pick(s, "llmb_engine_requests_waiting", engine=mon.exporter_engine)
            ]
            row.kv_usage_max = max(kv) if kv else None
            row.waiting_avg = sum(waiting) / len(waiting) if waiting else None
        else:
            sig = self._own_signals(row)
        verdict = core.evaluate(sig)
        self.step_verdicts.append((row.step, verdict.name, sig))

    def _structure_facts(self) -> None:
        """The model-structure series of the newest scrape (exporter or embedded collectors)."""
        series = self.monitor.latest()
        for attr, name in STRUCTURE_SERIES.items():
            value = _first(series, name, engine=self.monitor.exporter_engine)
            if value is not None:
                setattr(self.result, attr, value)

    def _complete(
        self, sig: core.Signals, row: Row, values: core.RuleValues | None = None
    ) -> core.Signals:
        """Add what the client measured and the rules cannot see, and say so."""
        model = self.result.structure()
        batch = float(row_batch(self.result, row))
        moe = model is not None and model.experts_known and bool(model.routed_expert_bytes)
        if (
            values is not None
            and moe
            and values.decode_batch is not None
            and values.decode_batch < batch
            and values.decode_tokens_per_second is not None
            and values.bandwidth_bytes_per_second is not None
        ):
            # A short step's edges dilute the running average the rules take as the batch;
            # an MoE step's bytes grow with it, so use the sequences the step kept running.
            kv_tokens = None
            if row.prompt_tokens is not None:
                kv_tokens = batch * (row.prompt_tokens + row.max_tokens / 2)
            per_step, _ = bytes_per_step(self.result, kv_tokens, batch)
            roof = core.roofline_tokens_per_second(
                values.bandwidth_bytes_per_second, per_step, self.result.spec_accept_length
            )
            sig = replace(
                sig, decode_efficiency=core.decode_efficiency(values.decode_tokens_per_second, roof)
            )
            self._note(
                f"{row.step}: the mixture-of-experts roofline uses the {batch:.0f} sequences the "
                f"step kept running (the rules' running average over the step gave "
                f"{values.decode_batch:.0f})"
            )
        client_kv = row.kv_exhausted + row.truncated
        if client_kv and not (sig.kv_pressure_increase or 0) > 0:
            sig = replace(sig, kv_pressure_increase=float(client_kv))
            self._note(
                f"{row.step}: {client_kv} requests ran out of KV/context on the client side "
                "that the exporter did not count (no engine log?); counted as KV pressure"
            )
        if sig.decode_efficiency is None and self.opts.bandwidth_bytes_per_s:
            own = self._own_signals(row, count_events=False).decode_efficiency
            if own is not None:
                sig = replace(sig, decode_efficiency=own)
                self._note(
                    "decode efficiency uses --bandwidth-gbs: no GPU bandwidth series for the "
                    "rules (the Prometheus verdict cannot see it)"
                )
        return sig

    def _note(self, text: str) -> None:
        if text not in self.result.notes:
            self.result.notes.append(text)

    def _own_signals(self, row: Row, count_events: bool = True) -> core.Signals:
        """`Signals` from diagnose's own measurements of one step (no exporter)."""
        res = self.result
        slots = res.slots
        if slots and row.concurrency > slots:
            # A closed loop keeps `concurrency` in flight; beyond the slots they wait.
            row.waiting_avg = float(row.concurrency - slots)
        elif slots:
            row.waiting_avg = 0.0
        if count_events:
            self.kv_events_total += row.kv_exhausted + max(row.truncated, row.kv_events)
        eff = row_roofline(res, row).efficiency if row.per_seq_tok_s else None
        return core.Signals(
            **self._own_residency_signals(),
            waiting_avg=row.waiting_avg,
            kv_pressure_increase=float(self.kv_events_total),
            running=float(row.concurrency),
            waiting=row.waiting_avg,
            # A closed loop runs min(concurrency, slots) at once.
            running_slots_ratio=min(row.concurrency, slots) / slots if slots else None,
            generation_tokens_per_second=row.aggregate_tok_s,
            decode_efficiency=eff,
        )

    async def _single(self) -> None:
        with self._phase("single"):
            row = await self._load("single", 1, self.opts.prompt_tokens, self.opts.rounds, None)
        res = self.result
        res.roofline = roofline(res)
        if row.error or not row.per_seq_tok_s:
            answer = f"failed: {row.error}" if row.error else NOT_MEASURED + "no decode timings"
        else:
            answer = f"{row.per_seq_tok_s:.1f} tok/s per sequence ({row.per_token_ms:.1f} ms/token)"
            roof = res.roofline
            if roof.limit_tok_s and roof.efficiency is not None:
                answer += roofline_text(roof)
            else:
                answer += "; roofline unknown: pass --bandwidth-gbs (no GPU bandwidth known)"
        self.steps["single"] = Step(
            "single",
            STEP_QUESTIONS["single"],
            answer,
            False,
            {
                "per_seq_tok_s": row.per_seq_tok_s,
                "roofline_tok_s": res.roofline.limit_tok_s,
                "efficiency": res.roofline.efficiency,
                "bytes_per_step": res.roofline.bytes_per_step,
                "active_weights_bytes": res.roofline.active_weights_bytes,
                "accepted_tokens_per_step": res.roofline.accepted_tokens_per_step,
                "misfit": res.roofline.misfit,
                "rounds": row.per_seq_rounds,
            },
        )
        self._say("single", answer)

    async def _concurrency(self) -> None:
        levels = [c for c in self.opts.concurrency if c > 1]
        if not levels:
            self._not_measured("concurrency", "no --concurrency above 1")
            return
        single = self.result.single()
        parts = []
        for c in levels:
            with self._phase("concurrency", note=f"concurrency {c}"):
                row = await self._load(
                    "concurrency", c, self.opts.prompt_tokens, self.opts.rounds, None
                )
            if row.error:
                parts.append(f"c={c} failed ({row.error})")
                continue
            scale = (
                f" (x{row.aggregate_tok_s / single.per_seq_tok_s:.2f} of one sequence)"
                if single and single.per_seq_tok_s and row.aggregate_tok_s
                else ""
            )
            queue = f", {row.waiting_avg:.1f} waiting on average" if row.waiting_avg else ""
            parts.append(
                f"c={c}: {row.aggregate_tok_s or 0:.1f} tok/s aggregate{scale}, TTFT p50 "
                f"{row.ttft_s or 0:.3f} s{queue}{row_roofline_text(self.result, row)}"
            )
            self._say("concurrency", parts[-1])
        queued = any(
            v == "scheduling_bound" for s, v, _ in self.step_verdicts if s == "concurrency"
        )
        slots = f" ({self.result.slots} slots)" if self.result.slots else ""
        self.steps["concurrency"] = Step(
            "concurrency",
            STEP_QUESTIONS["concurrency"],
            "; ".join(parts) + (f"; requests queue for a slot{slots}" if queued else ""),
            queued,
        )

    def _kv_prompt_tokens(self) -> tuple[int | None, str]:
        if self.opts.kv_prompt_tokens is not None:
            return self.opts.kv_prompt_tokens, "--kv-prompt-tokens"
        ctx = self.result.slot_context
        if not ctx:
            return None, "the context per slot is unknown (pass --kv-prompt-tokens)"
        # Each request ends a little past half a slot's context: a pool that cannot hold
        # every slot at half its context runs out during decode, a per-slot one never does.
        tokens = min(ctx // 2, KV_PROMPT_CAP) - self.opts.max_tokens // 2
        if tokens < 16:
            return None, f"a slot's context ({ctx}) leaves no room beyond --max-tokens"
        return tokens, f"ending past half of a slot's context ({ctx})"

    async def _kv_pressure(self) -> None:
        tokens, why = self._kv_prompt_tokens()
        if tokens == 0:
            self._not_measured("kv_pressure", "skipped (--kv-prompt-tokens 0)")
            return
        if tokens is None:
            self._not_measured("kv_pressure", why)
            return
        conc = min(self.result.slots or max(self.opts.concurrency), max(self.opts.concurrency))
        with self._phase("kv_pressure", note=f"{conc} x {tokens} prompt tokens"):
            # One wave, one request per slot: whatever waits, waits for KV space, not a slot.
            row = await self._load("kv_pressure", conc, tokens, 1, None, requests=conc)
        pressure = row.kv_exhausted + row.truncated + row.kv_events
        saturated = any(v == "kv_saturated" for s, v, _ in self.step_verdicts if s == "kv_pressure")
        answer = (
            f"{conc} requests of {tokens} prompt tokens ({why}): "
            f"{row.requests - row.requests_failed}/{row.requests} completed in full"
            f", {row.truncated} cut short, {row.kv_exhausted} 'context size exceeded', "
            f"{row.kv_events} KV events in the log"
            + (f", KV usage up to {row.kv_usage_max * 100:.0f} %" if row.kv_usage_max else "")
            + (f", {row.waiting_avg:.1f} waiting on average" if row.waiting_avg else "")
            + ("; the KV cache is full" if saturated or pressure else "; the KV cache holds them")
        )
        self.steps["kv_pressure"] = Step(
            "kv_pressure",
            STEP_QUESTIONS["kv_pressure"],
            answer,
            saturated,
            {
                "prompt_tokens": tokens,
                "concurrency": conc,
                "truncated": row.truncated,
                "kv_exhausted": row.kv_exhausted,
                "kv_events": row.kv_events,
                "kv_usage_max": row.kv_usage_max,
            },
        )
        self._say("kv_pressure", answer)

    # context sweep ------------------------------------------------------------------------

    def _contexts(self) -> tuple[list[int], str]:
        res = self.result
        if self.engine.launch is None:
            return [], "the engine was already running (no launch template to restart it)"
        if "ctx" not in self._template():
            return [], "the launch template has no {ctx} placeholder"
        if self.opts.contexts is not None:
            given = self.opts.contexts[1:] if self.opts.contexts else []
            return given, "" if given else "no further --contexts given"
        top = self.opts.max_context or res.trained_context
        if not top:
            return [], "the model's trained context is unknown (pass --contexts or --max-context)"
        start = self.launched_ctx or res.slot_context or 4096
        out = []
        ctx = start * 2
        while ctx < top:
            out.append(ctx)
            ctx *= 2
        out.append(top)
        out = [c for c in out if c > start]
        why = "" if out else f"the launch context {start} already reaches the top ({top})"
        return out, why

    def _launch_context_row(self) -> None:
        """The launch at the first --contexts value counts as the sweep's first row."""
        if not (self.opts.contexts and "ctx" in self._template()):
            return
        single = self.result.single()
        if single is None:
            return
        row = replace(single, step="context", context=self.opts.contexts[0],
                      aggregate_rounds=[], ttft_rounds=[], per_seq_rounds=[])  # fmt: skip
        row.loaded_memory_bytes = self.loaded_memory
        row.load_seconds = self.current.load_seconds if self.current else None
        row.kv_bytes = self._kv_bytes()
        self.result.rows.append(row)

    async def _context_sweep(self, parallel: int | None) -> None:
        contexts, why = self._contexts()
        if not contexts:
            if not any(r.step == "context" for r in self.result.rows):
                self._not_measured("context", why)
                return
        gave_out: int | None = None
        for ctx in contexts:
            ok = await self._context_step(ctx, parallel)
            if not ok:
                gave_out = ctx
                break
        loaded = [r.context for r in self.result.ok_rows("context") if r.context]
        best = max(loaded) if loaded else None
        answer = (
            f"memory gives out at {gave_out} tokens (largest context loaded: {best})"
            if gave_out
            else f"every context loaded up to {best}"
        )
        self.steps["context"] = Step(
            "context",
            STEP_QUESTIONS["context"],
            answer,
            gave_out is not None,
            {"max_loaded": best, "gave_out_at": gave_out, "tried": contexts},
        )
        self._say("context", answer)

    async def _context_step(self, ctx: int, parallel: int | None) -> bool:
        """Restart at `ctx` and generate once; False when memory (or the engine) gave out."""
        if await self._launch(ctx, parallel, "context") is None:
            self._say("context", f"{ctx}: the engine did not start")
            return False
        try:
            loaded = await self._settle()
            with self._phase("context", note=f"context {ctx}"):
                row = await self._load("context", 1, self.opts.prompt_tokens, 1, ctx)
            row.loaded_memory_bytes = loaded
            row.load_seconds = self.current.load_seconds if self.current else None
            row.kv_bytes = self._kv_bytes()
            res = self.result
            headroom = None
            if res.gpu_total_bytes and row.memory_bytes and self.monitor.source == "gpu":
                headroom = res.gpu_total_bytes - row.memory_bytes
            near_full = headroom is not None and headroom < core.number("gpu_headroom_min_bytes")
            self._say(
                "context",
                f"{ctx}: loaded, {_gib(loaded)} after load, KV {_gib(row.kv_bytes)}"
                + (", the card is near full" if near_full else ""),
            )
            if near_full:
                row.error = f"GPU memory near full at context {ctx} ({_gib(headroom)} free)"
            return row.error is None
        except TargetUnreachable as exc:
            # The engine died after becoming ready (e.g. out of memory at this context).
            self.result.rows.append(
                Row(self.engine.name, "context", 1, context=ctx, parallel=parallel, error=str(exc))
            )
            return False
        finally:
            self._stop()

    def _kv_bytes(self) -> float | None:
        """KV cache bytes of the running launch: exporter first, else the engine's own log."""
        kv = self.monitor.engine_value("llmb_engine_kv_cache_bytes")
        if kv is None and (state := self.monitor.log_state()) is not None:
            kv = sum(state.kv_buffer_bytes.values()) or None
        return kv

    # the answer ------------------------------------------------------------------------

    def _finish(self) -> EngineResult:
        res = self.result
        res.phases = [p for e, p in self.pub.phases if e == self.engine.name]
        res.timeline = list(self.monitor.timeline)
        res.memory_source = res.memory_source or self.monitor.source
        if res.memory_source is None:
            res.missing.append("memory: no exporter, no NVML and the engine was not launched")
        if res.bandwidth_bytes_per_s is None:
            res.missing.append("roofline: no GPU bandwidth known (pass --bandwidth-gbs)")
        if self.opts.exporter_url and not self.monitor.scrapes:
            res.missing.append(f"exporter: no scrape of {self.opts.exporter_url} succeeded")
        self._structure_facts()
        res.roofline = roofline(res)
        roof = res.roofline
        if roof.misfit is not None and roof.efficiency is not None:
            self._note(
                "roofline: " + core.misfit_text(roof.efficiency, core.MISFIT_BY_NAME[roof.misfit])
            )
        verdict, signals = combine(self.step_verdicts)
        if verdict is not None:
            res.verdict, res.action = engine_verdict(res, signals)
            res.signals = {k: getattr(signals, k) for k in core.SIGNAL_FIELDS}
        return res

    def answer_steps(self) -> list[Step]:
        """The steps in procedure order (one per step, measured or not)."""
        return [
            self.steps.get(s) or Step(s, STEP_QUESTIONS[s], NOT_MEASURED + "did not run")
            for s in STEPS
        ]


def combine(step_verdicts: list[tuple[str, str, core.Signals]]) -> tuple[str | None, core.Signals]:
    """The run's verdict: the first in the decision order that any load step showed.

    Each step's verdict is what the rules give at its end; a bottleneck seen in one step
    (a queue at high concurrency, KV pressure under long prompts) is the answer even when
    another step did not show it. `idle` counts only when no step showed anything else.
    """
    if not step_verdicts:
        return None, core.Signals()
    for name in core.VERDICTS:
        if name == "idle":
            continue
        for _, verdict, sig in step_verdicts:
            if verdict == name:
                return name, sig
    return "idle", step_verdicts[-1][2]


def _median(values: list[float]) -> float | None:
    if not values:
        return None
    data = sorted(values)
    mid = len(data) // 2
    return data[mid] if len(data) % 2 else (data[mid - 1] + data[mid]) / 2


# Residency signals in the order diagnose names them, with where each comes from.
RESIDENCY_SOURCES: tuple[tuple[str, str], ...] = (
    ("layers_ratio", "layers on the GPU (llama.cpp log)"),
    (
        "weights_buffers_ratio",
        "GPU weight buffers the engine reports (llama.cpp log `model buffer size`; SGLang "
        "`weight_memory_usage_gb`, `/server_info` memory_usage or its log `Load weight end`)",
    ),
    (
        "weights_memory_beyond_kv_ratio",
        "process GPU memory (NVML) minus the KV pool SGLang reports, against the weights",
    ),
    ("weights_memory_ratio", "process GPU memory (NVML) against the weights"),
    ("experts_host_layers", "layers whose routed experts stay in host memory (llama.cpp log)"),
)


def residency_sources(sig: core.Signals, kind: str) -> str:
    """The residency figures that were measured, each with its ratio and source."""
    parts = []
    for name, source in RESIDENCY_SOURCES:
        value = getattr(sig, name)
        if value is None:
            continue
        if name == "weights_buffers_ratio" and kind == "llamacpp":
            source = "GPU weight buffers the engine reports (llama.cpp log `model buffer size`)"
        elif name == "weights_buffers_ratio" and kind == "sglang":
            source = (
                "GPU weight buffers SGLang reports (`weight_memory_usage_gb`, `/server_info` "
                "memory_usage or its log `Load weight end`)"
            )
        parts.append(f"{name.removesuffix('_ratio')} {value:.2f}: {source}")
    return "; ".join(parts)


def residency_gap(res: EngineResult, kind: str) -> str:
    """Why residency could not be decided: which of its inputs is missing."""
    missing = []
    if res.weights_bytes is None:
        where = (
            "no weight series, /server_info memory_usage, log or safetensors"
            if kind == "sglang"
            else "no /v1/models meta.size, GGUF or log"
        )
        missing.append(f"the weight size is not known ({where})")
    if res.process_gpu_bytes is None:
        missing.append("no process GPU memory (NVML) attributed to the engine")
    if res.gpu_buffer_bytes is None and res.layers_total is None:
        missing.append("no layer or weight-buffer figures from the engine")
    if not missing:
        missing.append("the exporter has not computed the ratios yet")
    known = [
        f"{name} {_gib(value)}"
        for name, value in (
            ("weights", res.weights_bytes),
            ("GPU weight buffers", res.gpu_buffer_bytes),
            ("process GPU memory", res.process_gpu_bytes),
        )
        if value is not None
    ]
    have = f" (known: {', '.join(known)})" if known else ""
    return "; ".join(missing) + have


def _gib(value: float | None) -> str:
    return "?" if value is None else f"{value / 2**30:.2f} GiB"


def _num(value: float | None) -> str:
    return "?" if value is None else f"{value:.0f}"


# --- command line ---------------------------------------------------------------------------


def add_measure_arguments(parser: argparse.ArgumentParser, rounds: int) -> None:
    """Flags shared by diagnose and compare (besides the shared target/timeout options)."""
    add_out_option(parser, required=True)
    m = parser.add_argument_group("measurement")
    m.add_argument(
        "--concurrency",
        type=int_list,
        default=[1, 2, 4, 8],
        metavar="N[,N...]",
        help="concurrency steps (closed loop)",
    )
    m.add_argument(
        "--prompt-tokens",
        type=positive_int,
        default=128,
        metavar="N",
        help="prompt length of the decode and concurrency steps",
    )
    add_max_tokens_option(m)
    m.add_argument(
        "--rounds",
        type=positive_int,
        default=rounds,
        metavar="N",
        help="rounds of every load step; the spread over rounds is reported",
    )
    m.add_argument(
        "--requests-per-slot",
        type=positive_int,
        default=2,
        metavar="N",
        help="requests per round = concurrency x this",
    )
    m.add_argument(
        "--contexts",
        type=int_list,
        metavar="N[,N...]",
        help="context sweep (restarts); the first is the launch context "
        "(default: double up to the trained context or where memory gives out)",
    )
    m.add_argument(
        "--max-context",
        type=positive_int,
        metavar="N",
        help="stop the automatic context sweep here (default: the trained context)",
    )
    m.add_argument(
        "--kv-prompt-tokens",
        type=non_negative_int,
        metavar="N",
        help="prompt length of the KV-pressure step; 0 skips it "
        "(default: half a slot's context, at most 16384)",
    )
    m.add_argument(
        "--settle",
        type=non_negative_float,
        metavar="S",
        help="seconds to wait after a launch (default: the config's settle_seconds)",
    )
    m.add_argument(
        "--parallel",
        type=positive_int,
        metavar="N",
        help="slots to launch with when the template has {parallel} "
        "(default: the largest concurrency)",
    )
    add_exporter_option(
        m,
        "llmb-exporter to read GPU memory, residency, KV and queue from "
        "(with or without /metrics); its samples decide the verdict",
    )
    m.add_argument(
        "--exporter-engine",
        metavar="NAME",
        help="the engine's name in the exporter when it differs (default: the same)",
    )
    m.add_argument(
        "--bandwidth-gbs",
        type=positive_float,
        metavar="GB/S",
        help="GPU memory bandwidth for the roofline (default: exporter, NVML table)",
    )
    m.add_argument(
        "--metrics-listen",
        metavar="HOST:PORT",
        help="serve the llmb_loadgen_phase_* metrics here for Grafana marks",
    )


def options_from_args(args: argparse.Namespace, config: Config | None) -> Options:
    """Options from parsed flags (the config's GPU bandwidth underneath --bandwidth-gbs)."""
    bw = args.bandwidth_gbs * 1e9 if args.bandwidth_gbs else None
    if bw is None and config is not None:
        cfg_bw = config.gpu.bandwidth_bytes_per_second
        if isinstance(cfg_bw, (int, float)):
            bw = float(cfg_bw)
    return Options(
        concurrency=args.concurrency,
        prompt_tokens=args.prompt_tokens,
        max_tokens=args.max_tokens,
        rounds=args.rounds,
        requests_per_slot=args.requests_per_slot,
        contexts=args.contexts,
        max_context=args.max_context,
        kv_prompt_tokens=args.kv_prompt_tokens,
        settle=args.settle,
        parallel=args.parallel,
        exporter_url=args.exporter_url,
        exporter_engine=args.exporter_engine,
        gpu=config.gpu if config is not None else None,
        bandwidth_bytes_per_s=bw,
        timeout=args.timeout,
        connect_timeout=args.connect_timeout,
    )


def load_config_or_usage(path: str | Path | None) -> Config | None:
    """The config, or UsageError with every validation error."""
    if not path:
        return None
    try:
        return load_config(Path(path))
    except ConfigError as exc:
        raise UsageError(
            f"invalid configuration {path}:\n" + "\n".join(f"  - {e}" for e in exc.errors)
        ) from None


def engines_from_args(args: argparse.Namespace, config: Config | None) -> list[EngineConfig]:
    """Engines from --engine (config, with launch templates) or --url (already running)."""
    if args.url and args.engine:
        raise UsageError("use either --engine NAME (with --config) or --url, not both")
    if args.url:
        import os

        key = os.environ.get(args.api_key_env) if args.api_key_env else None
        kind = args.kind
        if kind == "openai":
            kind = asyncio.run(detect_kind(args.url, key))
        if kind not in ("llamacpp", "sglang"):
            raise UsageError(
                f"{args.url} answers neither llama.cpp's /props nor SGLang's /server_info; "
                "pass --kind llamacpp or --kind sglang"
            )
        name = args.name or asyncio.run(_model_name(args.url, key)) or kind
        return [
            EngineConfig(name=_label(name), kind=kind, url=args.url, api_key_env=args.api_key_env)
        ]
    if not args.engine:
        raise UsageError("no target: give --url URL, or --config FILE with --engine NAME")
    if config is None:
        raise UsageError("--engine needs --config FILE (or env LLMB_CONFIG)")
    out = []
    for name in args.engine:
        try:
            out.append(config.engine(name))
        except KeyError as exc:
            raise UsageError(str(exc.args[0])) from None
    if len({e.name for e in out}) != len(out):
        raise UsageError("the same --engine is given twice")
    return out


async def _model_name(url: str, api_key: str | None) -> str | None:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with contextlib.suppress(httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
        async with httpx.AsyncClient(timeout=5.0, headers=headers) as client:
            data = (await client.get(url + "/v1/models")).json()
            return str(data["data"][0]["id"])
    return None


def _label(name: str) -> str:
    """A model id as an engine name (the config's name pattern)."""
    stem = Path(name).name.removesuffix(".gguf")
    clean = "".join(c if c.isalnum() or c in "_.-" else "_" for c in stem)
    return clean if clean and (clean[0].isalpha() or clean[0] == "_") else "m_" + clean


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


def run_info(argv: list[str] | None = None) -> RunInfo:
    """The metadata block: tool version, the command line as typed, the UTC start time."""
    words = ["llmb-loadgen", *(sys.argv[1:] if argv is None else argv)]
    return RunInfo(
        command=" ".join(shlex.quote(w) for w in words),
        tool_version=__version__,
        started_at=utc_now(),
    )


@contextlib.contextmanager
def quiet_libraries() -> Iterator[None]:
    """Keep the terminal to our progress lines: no per-request or per-poll logging.

    The embedded exporter collectors warn each time a relaunched engine is not up yet;
    during a context sweep that is expected, so only their errors are shown. The levels are
    restored afterwards: a caller in the same process (a test, a notebook) keeps its logging.
    """
    levels = {"exporter": logging.ERROR}
    for name in ("httpx", "loadgen.scheduler", "loadgen.client", "loadgen.prompts",
                 "matplotlib"):  # fmt: skip
        levels[name] = logging.WARNING
    saved = {name: logging.getLogger(name).level for name in levels}
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)
    try:
        yield
    finally:
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)


def print_answer(engines: list[EngineResult], decision: Decision, out: Path) -> None:
    """The answer on stdout, once: verdict(s), recommendation, action, steps, caveats."""
    width = 16
    lines = []
    for name, v in decision.verdict.items():
        lines.append(f"{'verdict':<{width}}{name}: {v}")
    lines.append(f"{'recommendation':<{width}}{decision.recommendation}")
    lines.append(f"{'action':<{width}}{decision.action}")
    if len(engines) > 1:
        lines.append(f"{'comparable':<{width}}{'yes' if decision.comparable else 'no'}")
    for step in decision.steps:
        lines.append(f"  {step.key:<{width - 2}}{step.answer}")
    for e in engines:
        roof = e.roofline
        if roof.efficiency is not None and roof.limit_tok_s:
            if roof.misfit is not None:
                lines.append(
                    f"{'roofline':<{width}}{e.name}: does not fit ({roof.misfit}): "
                    f"{roof.efficiency * 100:.0f} % of {roof.limit_tok_s:.1f} tok/s is beyond "
                    "physics, so no decode verdict"
                )
            else:
                lines.append(
                    f"{'roofline':<{width}}{e.name}: {roof.efficiency * 100:.0f} % of "
                    f"{roof.limit_tok_s:.1f} tok/s"
                )
        if e.spec_accept_length is not None:
            lines.append(
                f"{'acceptance':<{width}}{e.name}: {e.spec_accept_length:.2f} tokens per "
                "model step (speculative decoding)"
            )
        if e.experts_host_layers:
            lines.append(
                f"{'expert offload':<{width}}{e.name}: experts of {e.experts_host_layers:.0f} "
                f"layers in host memory ({_gib(e.experts_host_bytes)})"
            )
    for est in decision.estimates:
        lines.append(f"{'estimate':<{width}}{est.basis} ≈ {est.tok_s:.1f} tok/s")
    for c in decision.caveats:
        lines.append(f"{'caveat':<{width}}{c}")
    lines.append(f"{'report':<{width}}{out / 'report.html'}")
    print("\n".join(lines))


def write_outputs(
    out: Path, engines: list[EngineResult], decision: Decision, run: RunInfo, title: str
) -> None:
    """report.md, report.html and results.json (one renderer for all three)."""
    from diagnose.report.html import write_report

    run.finished_at = utc_now()
    write_report(out, engines, decision, title, run)
    # results.json carries the run's metadata whatever the renderer adds to it.
    doc = results_to_dict(engines, decision, run)
    doc["title"] = title
    (out / "results.json").write_text(json.dumps(doc, indent=2, default=str) + "\n", "utf-8")


async def diagnose(
    engine: EngineConfig, opts: Options, out: Path, pub: PhasePublisher | None = None
) -> tuple[EngineResult, Decision]:
    """Run every step for one engine; return what was measured and the answer."""
    await asyncio.to_thread(out.mkdir, parents=True, exist_ok=True)
    ctx = RunContext(out)
    try:
        d = Diagnoser(engine, opts, out, pub or PhasePublisher(), ctx)
        result = await d.run()
    finally:
        ctx.close()
    return result, decide_single(result, d.answer_steps())


def configure(parser: argparse.ArgumentParser) -> None:
    """Arguments of `llmb-loadgen diagnose`."""
    parser.formatter_class = HelpFormatter
    parser.description = (
        "Measure one engine step by step (residency, single-request decode against the "
        "roofline, concurrency, KV pressure, context sweep) and say why it is slow."
    )
    add_target_options(parser)
    add_timeout_options(parser)
    add_measure_arguments(parser, rounds=1)


def run(args: argparse.Namespace) -> int:
    """`llmb-loadgen diagnose` from parsed arguments; returns the exit status."""
    with quiet_libraries():
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    info = run_info(getattr(args, "argv", None))
    config = load_config_or_usage(args.config)
    engines = engines_from_args(args, config)
    if len(engines) != 1:
        raise UsageError("diagnose measures one engine: give one --engine (compare takes two)")
    engine = engines[0]
    opts = options_from_args(args, config)
    pub = PhasePublisher()
    stop_metrics = serve_metrics(pub, args.metrics_listen)
    say(f"diagnose {engine.name} ({engine.kind}, {engine.url}): steps {', '.join(STEPS)}")
    try:
        result, decision = asyncio.run(diagnose(engine, opts, args.out, pub))
    except TargetUnreachable as exc:
        sys.stderr.write(f"llmb-loadgen diagnose: {exc}\n")
        return 1
    finally:
        stop_metrics()
    write_outputs(args.out, [result], decision, info, title=f"diagnose {engine.name}")
    print_answer([result], decision, args.out)
    return 0


COMMAND = Command(
    "diagnose",
    "measure one engine step by step and say why it is slow (verdict, then the action)",
    configure,
    run,
)


def command() -> Command:
    """The `diagnose` subcommand, registered explicitly by `loadgen.__main__`."""
    return COMMAND
