"""Simulated SGLang server (0.5.23 by default, or 0.5.11: `SimOptions.sglang_version`): HTTP API
and `/metrics` rendered by prometheus_client, in the families and answers of that release."""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

from aiohttp import web
from prometheus_client.core import CollectorRegistry, Metric
from prometheus_client.exposition import choose_encoder

from simulator.common import SimBase, SimOptions, chat_prompt, json_response, random_id, sse
from simulator.model import Request, RequestError
from simulator.scenarios import GIB
from simulator.sglang.spec import FAMILIES, FAMILIES_BY_VERSION, FamilySpec

ENGINE_TYPE = "unified"
# What 0.5.11 does not answer yet (the real server's /server_info, its internal_states and
# /get_model_info in tests/fixtures/sglang-0.5.11-cpu/); its memory_usage has only these keys.
ABSENT_IN_0_5_11 = {
    "server_info": frozenset({"launch_command", "frontend", "startup_time"}),
    "internal_state": frozenset({"world_size", "disaggregation_mode"}),
    "model_info": frozenset(
        {"served_model_name", "load_format", "reasoning_parser", "tool_call_parser"}
        | {"disaggregation_mode"}
    ),
}
MEMORY_KEYS_0_5_11 = ("weight", "kvcache", "token_capacity", "graph")
# SGLang counts a non-streaming request's output in chunks of this many tokens.
FORCE_STREAM_INTERVAL = 50


class Hist:
    """Cumulative histogram state (what prometheus_client keeps per child)."""

    def __init__(self, buckets: tuple[float, ...]):
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.sum = 0.0

    def observe(self, value: float, times: int = 1) -> None:
        """Count `value` `times` times."""
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += times
                break
        else:
            self.counts[-1] += times
        self.sum += value * times


class SglangMetrics:
    """Metric state fed by the simulator and rendered like SGLang's collectors."""

    def __init__(self, sim: SglangSim):
        self.sim = sim
        self.version = sim.opts.sglang_version
        self.families = FAMILIES_BY_VERSION[self.version]
        self.specs = {f.name: f for f in self.families}
        # Values are fed in 0.5.23's label shape; an older release's children drop the labels it
        # lacks (0.5.11 counts streaming and non-streaming requests together).
        self.fed = {f.name: f.extra for f in FAMILIES}
        self.counters: dict[str, dict[tuple[str, ...], float]] = defaultdict(dict)
        self.hists: dict[str, dict[tuple[str, ...], Hist]] = defaultdict(dict)
        self.active: dict[tuple[str, ...], float] = {}
        self.t0 = time.monotonic()
        self.cpu0 = time.process_time()

    def inc(self, name: str, labels: tuple[str, ...] = (), value: float = 1.0) -> None:
        """Add to a counter child."""
        labels = self._project(name, labels)
        fam = self.counters[name]
        fam[labels] = fam.get(labels, 0.0) + value

    def observe(
        self, name: str, value: float, labels: tuple[str, ...] = (), times: int = 1
    ) -> None:
        """Observe into a histogram child (families this release lacks are not kept)."""
        if name not in self.specs:
            return
        labels = self._project(name, labels)
        fam = self.hists[name]
        if labels not in fam:
            fam[labels] = Hist(self.specs[name].buckets)
        fam[labels].observe(value, times)

    def _project(self, name: str, labels: tuple[str, ...]) -> tuple[str, ...]:
        spec = self.specs.get(name)
        fed = self.fed.get(name, ())
        if spec is None or spec.extra == fed or len(labels) != len(fed):
            return labels
        by_name = dict(zip(fed, labels, strict=True))
        return tuple(by_name[n] for n in spec.extra)

    def _gauges(self) -> dict[str, float]:
        e = self.sim.engine
        total = e.params.ctx_total
        used = e.kv_used()
        evictable = e.kv_cached_idle()
        return {
            "sglang:max_total_num_tokens": total,
            "sglang:weight_memory_usage_gb": round(e.weights_gpu / GIB, 2),
            "sglang:kv_cache_memory_usage_gb": round(e.kv_pool_bytes * e.kv_gpu_share / GIB, 2),
            "sglang:page_size": 1,
            "sglang:num_pages": total,
            "sglang:context_len": e.params.context_len,
            "sglang:startup_available_gpu_memory_gb": round(
                (e.gpu.total_bytes - e.gpu.driver_bytes - e.weights_gpu) / GIB, 2
            ),
            "sglang:num_running_reqs": len(e.running),
            "sglang:num_queue_reqs": min(len(e.waiting), e.queued_after_admit),
            "sglang:gen_throughput": e.gen_throughput(),
            "sglang:cache_hit_rate": e.stats.last_cache_hit_rate,
            "sglang:decode_sum_seq_lens": used,
            "sglang:token_usage": round(used / total, 2) if total else 0.0,
            "sglang:full_token_usage": used / total if total else 0.0,
            "sglang:num_used_tokens": used,
            "sglang:kv_available_tokens": max(0, total - used - evictable),
            "sglang:kv_evictable_tokens": evictable,
            "sglang:kv_used_tokens": used,
            "sglang:new_token_ratio": e.params.new_token_ratio,
            "sglang:is_cuda_graph": 1.0 if e.running else 0.0,
            "sglang:fwd_occupancy": float("nan"),
            "sglang:num_retracted_reqs": sum(1 for r in e.waiting if r.retractions),
            # 0.5.11 declares these two but never sets them: the real server reads 0.
            "sglang:engine_startup_time": 0.0,
            "sglang:engine_load_weights_time": 0.0,
            **self._spec_gauges(),
        }

    def _spec_gauges(self) -> dict[str, float]:
        """Speculative decoding gauges (EAGLE): tokens per verify step and acceptance."""
        e, st = self.sim.engine, self.sim.engine.stats
        if e.params.spec_draft_max <= 0 or not st.spec_drafts:
            return {}
        return {
            "sglang:spec_accept_length": (st.spec_accepted + st.spec_drafts) / st.spec_drafts,
            "sglang:spec_accept_rate": st.spec_accepted / st.spec_draft_tokens,
            "sglang:spec_num_steps": float(e.params.spec_draft_max),
            "sglang:spec_num_draft_tokens": float(e.params.spec_draft_max + 1),
        }

    def _values(self, spec: FamilySpec) -> dict[tuple[str, ...], float]:
        name = spec.name
        sim = self.sim
        if name in self.counters or spec.type == "counter":
            seeded = {} if spec.lazy else {s: 0.0 for s in spec.seeds or ((),)}
            seeded.update(self.counters.get(name, {}))
            if name == "sglang:process_cpu_seconds":
                cpu = time.process_time() - self.cpu0
                return {("tokenizer",): cpu * 0.3, ("detokenizer",): cpu * 0.05}
            if name == "sglang:scheduler_idle_seconds":
                return {(): self.sim.idle_seconds()}
            return seeded
        if name == "sglang:graph_memory_usage_gb":
            return {
                s: (round(sim.engine.params.graph_bytes / GIB, 2) if s == ("decode",) else 0.0)
                for s in spec.seeds
            }
        if name == "sglang:startup_time_seconds":
            load = sim.engine.loaded_at
            return {
                ("load_weight",): load * 0.5,
                ("kv_cache_allocation",): load * 0.05,
                ("scheduler_e2e",): load * 0.95,
                ("tokenizer_e2e",): load,
            }
        if name in ("sglang:num_retracted_reqs", "sglang:num_paused_reqs"):
            value = self._gauges().get(name, 0.0)
            return {(str(os.getpid()),): float(value)}
        if name == "sglang:http_requests_active":
            return dict(self.active)
        gauges = self._gauges()
        return {s: float(gauges.get(name, 0.0)) for s in spec.seeds or ((),)}

    def _labels(self, spec: FamilySpec, values: tuple[str, ...]) -> dict[str, str]:
        labels: dict[str, str] = {}
        if spec.scope in ("rank", "model"):
            labels["engine_type"] = ENGINE_TYPE
            labels["model_name"] = self.sim.model_name
        if spec.scope == "rank":
            labels.update(moe_ep_rank="0", pp_rank="0", tp_rank="0")
        elif spec.scope == "cache":  # radix-cache metrics carry only the ranks
            labels.update(pp_rank="0", tp_rank="0")
        labels.update(zip(spec.extra, values, strict=True))
        return labels

    def collect(self) -> Iterator[Metric]:
        """Families in SGLang's shape: sorted labels, `_sum` first, no `_created`."""
        prefix = "sglang_" if self.sim.opts.metric_spelling == "underscore" else "sglang:"
        for spec in self.families:
            name = prefix + spec.name.split(":", 1)[1]
            metric = Metric(name, spec.help, spec.type)
            if spec.type == "histogram":
                children = dict(self.hists.get(spec.name, {}))
                if not spec.lazy:
                    for seed in spec.seeds or ((),):
                        children.setdefault(seed, Hist(spec.buckets))
                if not children:
                    continue
                for key, hist in children.items():
                    base = self._labels(spec, key)
                    metric.add_sample(name + "_sum", dict(sorted(base.items())), hist.sum)
                    acc = 0
                    bounds = [*(_le(b) for b in spec.buckets), "+Inf"]
                    for bound, count in zip(bounds, hist.counts, strict=True):
                        acc += count
                        labels = dict(sorted({**base, "le": bound}.items()))
                        metric.add_sample(name + "_bucket", labels, float(acc))
                    metric.add_sample(name + "_count", dict(sorted(base.items())), float(acc))
            else:
                values = self._values(spec)
                if not values:
                    continue
                suffix = "_total" if spec.type == "counter" else ""
                for key, value in values.items():
                    labels = dict(sorted(self._labels(spec, key).items()))
                    metric.add_sample(name + suffix, labels, float(value))
            yield metric


def _le(bound: float) -> str:
    """Bucket bound as prometheus_client writes it (0.1 -> '0.1', 1 -> '1.0')."""
    return repr(float(bound))


class SglangSim(SimBase):
    """An SGLang stand-in driven by the performance model."""

    kind = "sglang"

    def __init__(self, opts: SimOptions):
        super().__init__(opts)
        self.metrics_state = SglangMetrics(self)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.metrics_state)
        self.engine.on_evict = self._evicted
        self.engine.on_retract = self._retracted

    def _evicted(self, tokens: int) -> None:
        m = self.metrics_state
        labels = ("UnifiedRadixCache", "0")
        m.inc("sglang:evicted_tokens", labels, tokens)
        m.observe("sglang:eviction_duration_seconds", 2e-5 * tokens / 1000, labels)

    def _retracted(self, req: Request) -> None:
        m = self.metrics_state
        m.inc("sglang:num_retracted_requests")
        m.inc("sglang:num_retracted_input_tokens", (), len(req.prompt))
        m.inc("sglang:num_retracted_output_tokens", (), len(req.generated))

    def _abort(self, req: Request) -> None:
        """Forget a request whose client went away, counting it as SGLang does."""
        if not req.done.is_set():
            self.engine.abort(req)
            self.metrics_state.inc("sglang:num_aborted_requests")

    def idle_seconds(self) -> float:
        """Scheduler idle time (wall seconds without running requests)."""
        return max(0.0, self.clock.now() - self.engine.stats.prompt_seconds - self._decode_time())

    def _decode_time(self) -> float:
        return self.engine.stats.predicted_seconds

    def cmdline(self) -> str:
        """An SGLang command line naming this simulator's port."""
        p = self.engine.params
        return (
            f"python3 -m sglang.launch_server --model-path {self.model_path} "
            f"--host {self.opts.host} --port {self.opts.port} --enable-metrics "
            f"--max-running-requests {p.n_slots} --max-total-tokens {p.ctx_total} "
            f"--cpu-offload-gb {round(self.engine.weights_cpu / 1e9)}"
            f"{self._extra_flags()} (llmb-sim)"
        )

    def _extra_flags(self) -> str:
        p, flags = self.engine.params, ""
        if p.kv_cache_dtype != "auto":
            flags += f" --kv-cache-dtype {p.kv_cache_dtype}"
        if p.spec_draft_max > 0:
            flags += (
                f" --speculative-algorithm EAGLE --speculative-num-steps {p.spec_draft_max} "
                f"--speculative-eagle-topk 1 --speculative-num-draft-tokens {p.spec_draft_max + 1}"
            )
        return flags

    def build_app(self) -> web.Application:
        """Routes of SGLang's HTTP server."""
        app = super().build_app()
        app.middlewares.append(self._middleware)
        r = app.router
        r.add_get("/health", self.health)
        r.add_get("/health_generate", self.health)
        r.add_get("/metrics", self.metrics)
        r.add_get("/server_info", self.server_info)
        r.add_get("/get_server_info", self.server_info)
        r.add_get("/model_info", self.model_info)
        r.add_get("/get_model_info", self.model_info)
        r.add_get("/v1/models", self.models)
        r.add_post("/generate", self.generate)
        r.add_post("/v1/chat/completions", self.chat)
        r.add_post("/v1/completions", self.completions)
        return app

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if not self.engine.ready():
            return web.Response(status=503)
        m = self.metrics_state
        key = (request.path, request.method)
        m.inc("sglang:http_requests", key)
        m.active[key] = m.active.get(key, 0.0) + 1
        status = 500
        try:
            if self.opts.api_key and request.path not in ("/health", "/metrics"):
                auth = request.headers.get("Authorization", "")
                if auth != f"Bearer {self.opts.api_key}":
                    status = 401
                    return json_response({"error": "Unauthorized"}, 401)
            resp = await handler(request)
            status = resp.status
            return resp
        finally:
            m.active[key] -= 1
            m.inc("sglang:http_responses", (*key, str(status)))

    async def health(self, request: web.Request) -> web.Response:
        """GET /health: empty 200 once ready."""
        return web.Response(status=200)

    async def metrics(self, request: web.Request) -> web.Response:
        """GET /metrics in text 0.0.4 or OpenMetrics, as the Accept header asks."""
        encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
        body = encoder(self.registry)
        return web.Response(body=body, headers={"Content-Type": content_type})

    def _max_tokens(self) -> int:
        return self.engine.params.ctx_total

    async def server_info(self, request: web.Request) -> web.Response:
        """GET /server_info: resolved arguments + scheduler info; marked simulated."""
        e = self.engine
        p = e.params
        args = {
            "model_path": self.model_path,
            "tokenizer_path": self.model_path,
            "served_model_name": self.model_name,
            "host": self.opts.host,
            "port": self.opts.port,
            "tp_size": 1,
            "dp_size": 1,
            "pp_size": 1,
            "mem_fraction_static": 0.88,
            "context_length": p.context_len,
            "max_running_requests": p.n_slots,
            "max_total_tokens": p.ctx_total,
            "chunked_prefill_size": 8192,
            "max_prefill_tokens": 16384,
            "schedule_policy": "fcfs",
            "schedule_conservativeness": 1.0,
            "page_size": 1,
            "kv_cache_dtype": p.kv_cache_dtype,
            **self._spec_args(),
            "disable_radix_cache": False,
            "attention_backend": "fa3",
            "enable_metrics": True,
            "enable_cache_report": self.opts.enable_cache_report,
            "quantization": None,
            "dtype": "auto",
            # weights that do not fit stay in host memory (SGLang's --cpu-offload-gb)
            "cpu_offload_gb": round(e.weights_cpu / 1e9),
            "decode_log_interval": 40,
        }
        memory: dict[str, Any] = {
            "weight": round(e.weights_gpu / GIB, 2),
            "kvcache": round(e.kv_pool_bytes * e.kv_gpu_share / GIB, 2),
            "startup_available": round((e.gpu.total_bytes - e.weights_gpu) / GIB, 2),
            "token_capacity": p.ctx_total,
            "token_capacity_swa": None,
            "graph": {"decode": round(p.graph_bytes / GIB, 2)},
        }
        if self.opts.sglang_version == "0.5.11":  # graph memory is one number there: 0
            memory = {k: memory[k] if k != "graph" else 0 for k in MEMORY_KEYS_0_5_11}
        return self._versioned(
            "server_info",
            {
                **args,
                "launch_command": self.cmdline(),
                "status": "ready",
                "max_total_num_tokens": p.ctx_total,
                "max_req_input_len": p.context_len - 1,
                "startup_time": e.loaded_at,
                "version": self.opts.sglang_version,
                "frontend": "python",
                "simulated": True,
                "internal_states": [
                    {
                        **args,
                        "world_size": 1,
                        "effective_max_running_requests_per_dp": p.n_slots,
                        "last_gen_throughput": e.gen_throughput(),
                        **self._avg_spec_accept_length(),
                        "memory_usage": memory,
                        "disaggregation_mode": "null",
                    }
                ],
            },
        )

    def _versioned(self, endpoint: str, doc: dict[str, Any]) -> web.Response:
        """`doc` as this release answers it (0.5.11 lacks some keys)."""
        if self.opts.sglang_version == "0.5.11":
            doc = {k: v for k, v in doc.items() if k not in ABSENT_IN_0_5_11[endpoint]}
            inner = ABSENT_IN_0_5_11["internal_state"]
            if "internal_states" in doc:
                doc["internal_states"] = [
                    {k: v for k, v in state.items() if k not in inner}
                    for state in doc["internal_states"]
                ]
        return json_response(doc)

    def _avg_spec_accept_length(self) -> dict[str, float]:
        st = self.engine.stats
        if self.engine.params.spec_draft_max <= 0 or not st.spec_drafts:
            return {}
        return {"avg_spec_accept_length": (st.spec_accepted + st.spec_drafts) / st.spec_drafts}

    def _spec_args(self) -> dict[str, Any]:
        """The speculative-decoding server args (EAGLE with one draft chain when enabled)."""
        n = self.engine.params.spec_draft_max
        return {
            "speculative_algorithm": "EAGLE" if n > 0 else None,
            "speculative_draft_model_path": f"{self.model_path}-eagle" if n > 0 else None,
            "speculative_num_steps": n if n > 0 else None,
            "speculative_eagle_topk": 1 if n > 0 else None,
            "speculative_num_draft_tokens": n + 1 if n > 0 else None,
        }

    async def model_info(self, request: web.Request) -> web.Response:
        """GET /model_info."""
        return self._versioned(
            "model_info",
            {
                "model_path": self.model_path,
                "served_model_name": self.model_name,
                "tokenizer_path": self.model_path,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": "default",
                "load_format": "auto",
                "reasoning_parser": None,
                "tool_call_parser": None,
                "disaggregation_mode": "null",
                "has_image_understanding": False,
                "has_audio_understanding": False,
                "model_type": "gemma3",
                "architectures": ["Gemma3ForCausalLM"],
            },
        )

    async def models(self, request: web.Request) -> web.Response:
        """GET /v1/models."""
        return json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": self.model_name,
                        "object": "model",
                        "created": int(time.time()),
                        "owned_by": "sglang",
                        "root": self.model_name,
                        "parent": None,
                        "max_model_len": self.engine.params.context_len,
                    }
                ],
            }
        )

    # -- generation ------------------------------------------------------------------------------
    def _submit(
        self, prompt: list[int], sp: dict[str, Any], stream: bool
    ) -> Request | web.Response:
        try:
            max_new = sp.get("max_new_tokens")
            return self.engine.new_request(
                prompt,
                int(max_new) if max_new is not None else 128,
                bool(sp.get("ignore_eos", False)),
                float(sp.get("temperature", 1.0)),
                int(sp["seed"]) if sp.get("seed") is not None else None,
                stream,
            )
        except RequestError as exc:
            return json_response(
                {
                    "object": "error",
                    "message": str(exc),
                    "type": "BadRequestError",
                    "param": None,
                    "code": 400,
                },
                400,
            )

    async def _wait(self, req: Request) -> None:
        try:
            await req.done.wait()
        finally:
            if not req.done.is_set():
                self._abort(req)
            elif not req.observed:
                req.observed = True
                self._observe_finished(req)

    def _observe_finished(self, req: Request) -> None:
        m = self.metrics_state
        streaming = ("true",) if req.stream else ("false",)
        n_gen = len(req.generated)
        first = req.prompt_done or req.arrival
        end = req.last_token or first
        m.inc("sglang:prompt_tokens", streaming, len(req.prompt))
        m.inc("sglang:generation_tokens", streaming, n_gen)
        if req.cached:  # SGLang counts cache hits only (the family appears at the first one)
            m.inc("sglang:cached_tokens", ("device",), req.cached)
        m.inc("sglang:num_requests", streaming)
        m.observe("sglang:time_to_first_token_seconds", first - req.arrival, streaming)
        m.observe("sglang:e2e_request_latency_seconds", end - req.arrival, streaming)
        if n_gen > 1:
            tpot = (end - first) / (n_gen - 1)
            m.observe("sglang:request_time_per_output_token_seconds", tpot, streaming)
            chunk = 1 if req.stream else FORCE_STREAM_INTERVAL
            m.observe("sglang:inter_token_latency_seconds", tpot, (), n_gen - 1)
            del chunk
        m.observe("sglang:prompt_tokens_histogram", len(req.prompt))
        m.observe("sglang:uncached_prompt_tokens_histogram", len(req.prompt) - req.cached)
        m.observe("sglang:generation_tokens_histogram", n_gen)
        queue = (req.admitted or req.arrival) - req.arrival
        m.observe("sglang:queue_time_seconds", queue)
        m.observe("sglang:per_stage_req_latency_seconds", queue, ("request_process",))
        m.observe(
            "sglang:per_stage_req_latency_seconds",
            first - (req.admitted or req.arrival),
            ("prefill_forward",),
        )
        m.inc("sglang:realtime_tokens", ("prefill_compute",), len(req.prompt) - req.cached)
        m.inc("sglang:realtime_tokens", ("prefill_cache",), req.cached)
        m.inc("sglang:realtime_tokens", ("decode",), n_gen)
        m.inc("sglang:prefill_effective_tokens", ("input",), len(req.prompt))
        m.inc("sglang:prefill_effective_tokens", ("device_hit",), req.cached)
        m.inc("sglang:cuda_graph_passes", ("prefill_none",))
        m.inc("sglang:cuda_graph_passes", ("decode_cuda_graph",), max(0, n_gen - 1))

    def _meta(self, req: Request) -> dict[str, Any]:
        n_gen = len(req.generated)
        if req.finish == "stop":
            reason: dict[str, Any] = {"type": "stop", "matched": 1}
        else:
            reason = {"type": "length", "length": n_gen}
        first = req.prompt_done or req.arrival
        end = req.last_token or first
        return {
            "id": f"{req.id:032x}",
            "finish_reason": reason if req.finish else None,
            "prompt_tokens": len(req.prompt),
            "weight_version": "default",
            "num_retractions": req.retractions,
            "reasoning_tokens": 0,
            "completion_tokens": n_gen,
            "cached_tokens": req.cached,
            "e2e_latency": end - req.arrival,
            "queue_time": (req.admitted or req.arrival) - req.arrival,
            "first_token_latency": first - req.arrival,
            "decode_throughput": (n_gen - 1) / (end - first) if n_gen > 1 and end > first else 0.0,
        }

    async def generate(self, request: web.Request) -> web.StreamResponse:
        """POST /generate (native API) with `meta_info`."""
        body = await _json(request)
        if isinstance(body, web.Response):
            return body
        if "input_ids" in body:
            prompt = [int(t) for t in body["input_ids"]]
        else:
            prompt = self.tokenizer.encode(str(body.get("text", "")))
        stream = bool(body.get("stream", False))
        req = self._submit(prompt, body.get("sampling_params") or {}, stream)
        if isinstance(req, web.Response):
            return req
        if stream:
            resp = await _sse_start(request)
            try:
                while (await req.events.get()) is not None:
                    out = {
                        "text": self.tokenizer.decode(req.generated),
                        "output_ids": list(req.generated),
                        "meta_info": self._meta(req),
                    }
                    await resp.write(sse(out))
                await self._wait(req)
                await resp.write(b"data: [DONE]\n\n")
            except ConnectionResetError:
                pass  # the client went away; `finally` aborts the request
            finally:
                self._abort(req)
            return resp
        await self._wait(req)
        return json_response(
            {
                "text": self.tokenizer.decode(req.generated),
                "output_ids": list(req.generated),
                "meta_info": self._meta(req),
            }
        )

    def _usage(self, req: Request) -> dict[str, Any]:
        n_gen = len(req.generated)
        details = {"cached_tokens": req.cached} if self.opts.enable_cache_report else None
        return {
            "prompt_tokens": len(req.prompt),
            "total_tokens": len(req.prompt) + n_gen,
            "completion_tokens": n_gen,
            "prompt_tokens_details": details,
            "reasoning_tokens": 0,
        }

    async def chat(self, request: web.Request) -> web.StreamResponse:
        """POST /v1/chat/completions."""
        body = await _json(request)
        if isinstance(body, web.Response):
            return body
        try:
            text = chat_prompt(body.get("messages"), "<bos>")
        except (ValueError, AttributeError) as exc:
            return json_response(
                {
                    "object": "error",
                    "message": str(exc),
                    "type": "BadRequestError",
                    "param": None,
                    "code": 400,
                },
                400,
            )
        return await self._oai(request, body, text, chat=True)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        """POST /v1/completions."""
        body = await _json(request)
        if isinstance(body, web.Response):
            return body
        return await self._oai(request, body, str(body.get("prompt", "")), chat=False)

    async def _oai(
        self, request: web.Request, body: dict[str, Any], text: str, chat: bool
    ) -> web.StreamResponse:
        sp = {
            "max_new_tokens": body.get("max_completion_tokens", body.get("max_tokens")),
            "ignore_eos": body.get("ignore_eos", False),
            "temperature": body.get("temperature", 1.0),
            "seed": body.get("seed"),
        }
        stream = bool(body.get("stream", False))
        req = self._submit(self.tokenizer.encode(text), sp, stream)
        if isinstance(req, web.Response):
            return req
        rid = random_id(32)
        created = int(time.time())
        obj = ("chat.completion" if chat else "text_completion") + (
            ".chunk" if stream and chat else ""
        )

        def wrap(choices: list[dict[str, Any]], usage: Any = None) -> dict[str, Any]:
            return {
                "id": rid,
                "object": obj,
                "created": created,
                "model": self.model_name,
                "choices": choices,
                "usage": usage,
            }

        def choice(piece: str | None, reason: str | None, first: bool = False) -> dict[str, Any]:
            if chat:
                delta: dict[str, Any] = (
                    {"role": "assistant", "content": piece} if first else {"content": piece}
                )
                delta.update(reasoning_content=None, tool_calls=None)
                key = "delta" if stream else "message"
                return {
                    "index": 0,
                    key: delta,
                    "logprobs": None,
                    "finish_reason": reason,
                    "matched_stop": None,
                }
            return {
                "index": 0,
                "text": piece or "",
                "logprobs": None,
                "finish_reason": reason,
                "matched_stop": None,
            }

        if not stream:
            await self._wait(req)
            out = wrap(
                [choice(self.tokenizer.decode(req.generated), self._reason(req), first=True)],
                self._usage(req),
            )
            out["metadata"] = {"weight_version": "default"}
            return json_response(out)
        resp = await _sse_start(request)
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        try:
            first = True
            cut = self.opts.faults.stream_cut()
            while (token := await req.events.get()) is not None:
                if cut is not None and len(req.generated) > cut:
                    return resp  # simulated truncated stream: no [DONE]
                await resp.write(sse(wrap([choice(self.tokenizer.decode([token]), None, first)])))
                first = False
            await self._wait(req)
            await resp.write(sse(wrap([choice("", self._reason(req))])))
            if include_usage:
                await resp.write(sse(wrap([], self._usage(req))))
            await resp.write(b"data: [DONE]\n\n")
        except ConnectionResetError:
            pass  # the client went away; `finally` aborts the request
        finally:
            self._abort(req)
        return resp

    @staticmethod
    def _reason(req: Request) -> str:
        return "stop" if req.finish == "stop" else "length"


async def _sse_start(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    return resp


async def _json(request: web.Request) -> dict[str, Any] | web.Response:
    try:
        body = json.loads(await request.text() or "{}")
    except json.JSONDecodeError as exc:
        return json_response(
            {
                "object": "error",
                "message": f"invalid JSON: {exc}",
                "type": "BadRequestError",
                "param": None,
                "code": 400,
            },
            400,
        )
    if not isinstance(body, dict):
        return json_response(
            {
                "object": "error",
                "message": "body must be an object",
                "type": "BadRequestError",
                "param": None,
                "code": 400,
            },
            400,
        )
    return body
