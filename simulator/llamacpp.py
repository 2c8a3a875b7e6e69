"""Simulated llama.cpp `llama-server`: its HTTP API, `/metrics` text and log lines."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, TextIO

from aiohttp import web

from simulator.common import (
    SimBase,
    SimOptions,
    chat_prompt,
    json_response,
    random_id,
    sse,
)
from simulator.model import MIB, Request, RequestError

BUILD_INFO = "b0-llmb-sim"
BOS = "<bos>"
PUBLIC_PATHS = {"/health", "/v1/health", "/models", "/v1/models", "/api/tags"}

# (name, type, help) in the server's output order; values come from `_metric_values`.
METRICS: tuple[tuple[str, str, str], ...] = (
    (
        "prompt_tokens_total",
        "counter",
        "Number of prompt tokens processed, excluding cached tokens",
    ),
    ("prompt_tokens_cached_total", "counter", "Number of prompt tokens reused from the cache"),
    ("prompt_seconds_total", "counter", "Total time spent processing prompts"),
    ("tokens_predicted_total", "counter", "Number of generation tokens processed"),
    ("tokens_predicted_seconds_total", "counter", "Total time spent generating tokens"),
    (
        "n_decode_total",
        "counter",
        "Total number of llama_decode() calls, excluding speculative decoding and multimodal "
        "decoding",
    ),
    ("n_tokens_max", "counter", "Largest observed sequence length (prompt + generation)"),
    (
        "spec_decode_num_draft_tokens_total",
        "counter",
        "Speculative: Total draft tokens generated",
    ),
    (
        "spec_decode_num_accepted_tokens_total",
        "counter",
        "Speculative: Total draft tokens accepted by the target model",
    ),
    (
        "spec_decode_num_drafts_total",
        "counter",
        "Speculative: Total speculative decoding verification steps",
    ),
    ("prompt_tokens_seconds", "gauge", "Average prompt throughput in tokens/s"),
    ("predicted_tokens_seconds", "gauge", "Average generation throughput in tokens/s"),
    ("requests_processing", "gauge", "Number of requests processing"),
    ("requests_deferred", "gauge", "Number of requests deferred"),
    (
        "n_busy_slots_per_decode",
        "gauge",
        "Average number of busy slots per llama_decode() call",
    ),
)

SAMPLERS = [
    "penalties",
    "dry",
    "top_n_sigma",
    "top_k",
    "typ_p",
    "top_p",
    "min_p",
    "xtc",
    "temperature",
]


def fmt(value: float) -> str:
    """Format like `std::ostream << double` at precision 6 (1234567 -> 1.23457e+06)."""
    return f"{value:g}"


def sampling_params(body: dict[str, Any], n_predict: int, full: bool = False) -> dict[str, Any]:
    """The slot/generation `params` object, keys in the server's order."""
    temperature = float(body.get("temperature", 0.8))
    out: dict[str, Any] = {
        "seed": int(body.get("seed", 4294967295)),
        "temperature": temperature,
        "dynatemp_range": 0.0,
        "dynatemp_exponent": 1.0,
        "top_k": 40,
        "top_p": 0.949999988079071,
        "min_p": 0.05000000074505806,
        "top_n_sigma": -1.0,
        "xtc_probability": 0.0,
        "xtc_threshold": 0.10000000149011612,
        "typical_p": 1.0,
        "repeat_last_n": 64,
        "repeat_penalty": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "dry_multiplier": 0.0,
        "dry_base": 1.75,
        "dry_allowed_length": 2,
        "dry_penalty_last_n": 64,
    }
    if full:
        out["dry_sequence_breakers"] = ["\n", ":", '"', "*"]
    out.update(
        {
            "mirostat": 0,
            "mirostat_tau": 5.0,
            "mirostat_eta": 0.10000000149011612,
            "adaptive_target": -1.0,
            "adaptive_decay": 0.8999999761581421,
        }
    )
    if full:
        out["stop"] = []
    out.update(
        {
            "max_tokens": n_predict,
            "n_predict": n_predict,
            "n_keep": 0,
            "n_discard": 0,
            "ignore_eos": bool(body.get("ignore_eos", False)),
            "stream": bool(body.get("stream", False)),
        }
    )
    if full:
        out["logit_bias"] = []
    out.update({"n_probs": 0, "min_keep": 0})
    if full:
        out.update(
            {"grammar": "", "grammar_lazy": False, "grammar_triggers": [], "preserved_tokens": []}
        )
    out.update(
        {
            "chat_format": "Content-only",
            "reasoning_format": "deepseek" if body else "none",
            "reasoning_in_content": False,
            "generation_prompt": "",
            "samplers": list(SAMPLERS),
            "speculative.types": "none",
            "timings_per_token": bool(body.get("timings_per_token", False)),
            "post_sampling_probs": False,
            "backend_sampling": False,
            "lora": [],
        }
    )
    return out


def _error(status: int, message: str, etype: str) -> web.Response:
    return json_response({"error": {"code": status, "message": message, "type": etype}}, status)


class LlamaCppSim(SimBase):
    """A llama-server stand-in driven by the performance model."""

    kind = "llamacpp"

    def __init__(self, opts: SimOptions):
        super().__init__(opts)
        self.t_start_us = int(time.monotonic() * 1e6)
        self._log_fh: TextIO | None = None
        if opts.log_file is not None:
            Path(opts.log_file).parent.mkdir(parents=True, exist_ok=True)
            self._log_fh = open(opts.log_file, "a", buffering=1)
        self._params: dict[int, dict[str, Any]] = {}

    # -- log ---------------------------------------------------------------------------------
    def log(self, level: str, text: str) -> None:
        """One line in llama-server's `M.SS.mmm.uuu L text` format."""
        if self._log_fh is None:
            return
        t = self.clock.now()
        us = int(t * 1e6)
        minutes, rest = divmod(us, 60_000_000)
        secs, rest = divmod(rest, 1_000_000)
        ms, us_part = divmod(rest, 1000)
        self._log_fh.write(f"{minutes}.{secs:02d}.{ms:03d}.{us_part:03d} {level} {text}\n")

    def _log_startup(self) -> None:
        e = self.engine
        gpu_layers = e.gpu_layers
        total = e.n_layers_total
        self.log("I", f"srv    load_model: loading model '{self.model_name}'")
        self._log_model_info()
        self.log("I", "load_tensors: offloading output layer to GPU") if gpu_layers else None
        self.log("I", f"load_tensors: offloading {max(0, gpu_layers - 1)} repeating layers to GPU")
        self.log("I", f"load_tensors: offloaded {gpu_layers}/{total} layers to GPU")
        if e.host_expert_layers:
            self.log(
                "W",
                "llama_model_loader: tensor overrides to CPU are used with mmap enabled - "
                "consider using --load-mode none for better performance",
            )
        if e.weights_cpu:
            # the token embedding stays on the host (tied: the output projection's copy)
            cpu = e.weights_cpu + (e.model.token_embd_bytes or e.model.output_bytes)
            self.log(
                "I", f"load_tensors: {'CPU_Mapped':>12s} model buffer size = {cpu / MIB:8.2f} MiB"
            )
        self.log(
            "I", f"load_tensors: {'CUDA0':>12s} model buffer size = {e.weights_gpu / MIB:8.2f} MiB"
        )
        self._log_kv_cache()
        self.log(
            "I",
            f"sched_reserve: {'CUDA0':>10s} compute buffer size = "
            f"{e.params.compute_buffer_bytes / MIB:8.2f} MiB",
        )
        if e.params.spec_draft_max > 0:
            self._log_draft_load()
        unified = "true" if e.params.kv_unified else "false"
        self.log(
            "I",
            f"srv    load_model: initializing, n_slots = {len(e.slots)}, "
            f"n_ctx_slot = {e.n_ctx_slot}, kv_unified = '{unified}'",
        )
        if e.params.spec_draft_max > 0:
            self.log("I", "srv    load_model: speculative decoding context initialized")
        self.log("I", "srv  llama_server: model loaded")
        self.log("I", f"srv  llama_server: listening on http://{self.opts.host}:{self.opts.port}")

    def _log_model_info(self) -> None:
        m = self.opts.scenario.model
        if m.expert_count:
            self.log("I", f"print_info: n_expert              = {m.expert_count}")
            self.log("I", f"print_info: n_expert_used         = {m.expert_used}")

    def _log_draft_load(self) -> None:
        """The draft model loads after the target's context, with buffers of its own."""
        p = self.engine.params
        draft = f"{self.model_path}-draft"
        self.log("I", f"common_speculative_init_result: loading draft model '{draft}'")
        weights = p.draft_bytes / MIB
        self.log("I", f"load_tensors: {'CUDA0':>12s} model buffer size = {weights:8.2f} MiB")
        draft_kv = p.ctx_total * p.draft_kv_bytes_per_token
        self.log("I", f"llama_kv_cache: {'CUDA0':>10s} KV buffer size = {draft_kv / MIB:8.2f} MiB")

    def _log_kv_cache(self) -> None:
        """The KV cache lines of llama_kv_cache's constructor (types as -ctk/-ctv set them)."""
        e, p = self.engine, self.engine.params
        if "q" in p.cache_type_v:
            self.log(
                "I",
                "llama_init_from_model: enabling flash_attn since it is required for quantized "
                "V cache",
            )
        kv = e.kv_pool_bytes
        if e.kv_gpu_share < 1:
            kv_cpu = kv * (1 - e.kv_gpu_share) / MIB
            self.log("I", f"llama_kv_cache: {'CPU':>10s} KV buffer size = {kv_cpu:8.2f} MiB")
        self.log(
            "I",
            f"llama_kv_cache: {'CUDA0':>10s} KV buffer size = {kv * e.kv_gpu_share / MIB:8.2f} MiB",
        )
        k_bytes, v_bytes = e.kv_type_bytes
        k_mib = kv * k_bytes / (k_bytes + v_bytes) / MIB
        n_stream = 1 if p.kv_unified else p.n_slots
        cells = p.ctx_total // n_stream
        self.log(
            "I",
            f"llama_kv_cache: size = {kv / MIB:7.2f} MiB ({cells:6d} cells, "
            f"{e.model.n_layer:3d} layers, {n_stream:2d}/{n_stream} seqs), "
            f"K ({p.cache_type_k}): {k_mib:7.2f} MiB, V ({p.cache_type_v}): "
            f"{kv / MIB - k_mib:7.2f} MiB",
        )

    def _log_release(self, req: Request) -> None:
        prompt_ms, predicted_ms = self._ms(req)
        n_prompt = req.uncached
        n_gen = len(req.generated)
        slot, task = req.slot, req.id
        pre = f"slot print_timing: id {slot:2d} | task {task} | "
        pps = n_prompt / prompt_ms * 1e3 if prompt_ms else 0.0
        ppt = prompt_ms / n_prompt if n_prompt else 0.0
        gps = (n_gen - 1) / predicted_ms * 1e3 if predicted_ms and n_gen > 1 else 0.0
        gpt = predicted_ms / (n_gen - 1) if n_gen > 1 else 0.0
        self.log(
            "I",
            pre + f"prompt eval time = {prompt_ms:10.2f} ms / {n_prompt:5d} tokens "
            f"({ppt:8.2f} ms per token, {pps:8.2f} tokens per second)",
        )
        self.log(
            "I",
            pre + f"       eval time = {predicted_ms:10.2f} ms / {n_gen:5d} tokens "
            f"({gpt:8.2f} ms per token, {gps:8.2f} tokens per second)",
        )
        self.log(
            "I",
            pre + f"      total time = {prompt_ms + predicted_ms:10.2f} ms / "
            f"{n_prompt + n_gen:5d} tokens",
        )
        if req.draft_accepted:  # the real server prints nothing when no draft token was kept
            acc = req.draft_accepted / req.draft_n if req.draft_n else 0.0
            mean_len = 1 + req.draft_accepted / req.n_drafts
            self.log(
                "I",
                pre + f"draft acceptance = {acc:.5f} ({req.draft_accepted:5d} accepted / "
                f"{req.draft_n:5d} generated), mean len = {mean_len:5.2f}",
            )
        self.log(
            "I",
            f"slot      release: id {slot:2d} | task {task} | stop processing: "
            f"n_tokens = {req.n_tokens - 1}, truncated = {int(req.truncated)}",
        )

    def cmdline(self) -> str:
        """A llama-server command line naming this simulator's port."""
        p = self.engine.params
        flags = f"-c {p.ctx_total} -np {p.n_slots} -ngl {self.engine.params.n_gpu_layers}"
        if p.kv_unified:
            flags += " --kv-unified"
        if p.n_cpu_moe:
            flags += f" --n-cpu-moe {p.n_cpu_moe}"
        if (p.cache_type_k, p.cache_type_v) != ("f16", "f16"):
            flags += f" -ctk {p.cache_type_k} -ctv {p.cache_type_v}"
        if p.spec_draft_max > 0:
            flags += f" -md {self.model_path}-draft --spec-type draft-simple"
            flags += f" --spec-draft-n-max {p.spec_draft_max}"
        return (
            f"llama-server -m {self.model_path} --host {self.opts.host} "
            f"--port {self.opts.port} --metrics {flags} (llmb-sim)"
        )

    # -- app -----------------------------------------------------------------------------------
    def build_app(self) -> web.Application:
        """Routes of llama-server."""
        app = super().build_app()
        app.middlewares.append(self._middleware)
        r = app.router
        r.add_get("/health", self.health)
        r.add_get("/v1/health", self.health)
        r.add_get("/metrics", self.metrics)
        r.add_get("/slots", self.slots)
        r.add_get("/props", self.props)
        r.add_get("/v1/models", self.models)
        r.add_get("/models", self.models)
        r.add_post("/tokenize", self.tokenize)
        r.add_post("/completion", self.completion)
        r.add_post("/completions", self.completion)
        r.add_post("/v1/completions", self.oai_completions)
        r.add_post("/v1/chat/completions", self.chat)
        r.add_post("/chat/completions", self.chat)
        app.on_startup.append(self._after_start)
        return app

    async def _after_start(self, app: web.Application) -> None:
        self._log_startup()

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if not self.engine.ready():
            # key order of the real body differs from other errors (health_503_loading.json)
            body = {"error": {"message": "Loading model", "type": "unavailable_error", "code": 503}}
            return json_response(body, 503)
        key = self.opts.api_key
        if key and request.path not in PUBLIC_PATHS:
            auth = request.headers.get("Authorization", "")
            given = auth[7:] if auth.startswith("Bearer ") else request.headers.get("X-Api-Key")
            if given != key:
                return _error(401, "Invalid API Key", "authentication_error")
        return await handler(request)

    async def health(self, request: web.Request) -> web.Response:
        """GET /health."""
        return json_response({"status": "ok"})

    def _metric_values(self) -> list[float]:
        e, st = self.engine, self.engine.stats
        prompt_tps = st.win_prompt_tokens / st.win_prompt_seconds if st.win_prompt_seconds else 0.0
        pred_tps = st.win_pred_tokens / st.win_pred_seconds if st.win_pred_seconds else 0.0
        # The two throughput gauges cover the window since the previous scrape.
        st.win_prompt_tokens = st.win_pred_tokens = 0
        st.win_prompt_seconds = st.win_pred_seconds = 0.0
        busy = st.busy_slot_sum / st.n_decode if st.n_decode else 0.0
        return [
            st.prompt_tokens,
            st.prompt_cached,
            st.prompt_seconds,
            st.predicted_tokens,  # added when a request ends, as the server does
            st.predicted_seconds,
            st.n_decode,
            st.n_tokens_max,
            st.spec_draft_tokens,
            st.spec_accepted,
            st.spec_drafts,
            prompt_tps,
            pred_tps,
            len(e.running),
            # Deferred: tasks with no free slot. A request that arrived during a step and
            # takes a free slot at the next one was never parked in the deferred queue.
            max(0, len(e.waiting) - sum(1 for s in e.slots if s.request is None)),
            busy,
        ]

    async def metrics(self, request: web.Request) -> web.Response:
        """GET /metrics (501 unless metrics are enabled)."""
        if not self.opts.metrics:
            return _error(
                501,
                "This server does not support metrics endpoint. Start it with `--metrics`",
                "not_supported_error",
            )
        lines = []
        for (name, mtype, help_text), value in zip(METRICS, self._metric_values(), strict=True):
            lines.append(f"# HELP llamacpp:{name} {help_text}")
            lines.append(f"# TYPE llamacpp:{name} {mtype}")
            lines.append(f"llamacpp:{name} {fmt(value)}")
        per_pos = self.engine.stats.spec_accepted_per_pos
        if per_pos and self.engine.stats.spec_drafts:
            name = "llamacpp:spec_decode_num_accepted_tokens_per_pos_total"
            lines.append(f"# HELP {name} Accepted tokens per draft position")
            lines.append(f"# TYPE {name} counter")
            lines += [f'{name}{{position="{i}"}} {fmt(n)}' for i, n in enumerate(per_pos)]
        resp = web.Response(text="\n".join(lines) + "\n")
        resp.headers["Content-Type"] = "text/plain; version=0.0.4"
        resp.headers["Process-Start-Time-Unix"] = str(self.t_start_us)
        return resp

    def _slot_json(self, slot_id: int) -> dict[str, Any]:
        e = self.engine
        slot = e.slots[slot_id]
        out: dict[str, Any] = {
            "id": slot.id,
            "n_ctx": e.n_ctx_slot,
            "speculative": e.params.spec_draft_max > 0,
            "is_processing": slot.request is not None,
        }
        req = slot.request
        task = req.id if req is not None else slot.last_task
        if task is None:
            return out
        params = self._params.get(task, sampling_params({}, -1))
        n_tokens = (req.n_tokens - 1) if req is not None else len(slot.tokens)
        out.update(
            {
                "id_task": task,
                "n_prompt_tokens": max(0, n_tokens),
                "n_prompt_tokens_processed": req.uncached if req is not None else 0,
                "n_prompt_tokens_cache": req.cached if req is not None else 0,
                "params": params,
                "next_token": [
                    {
                        "has_next_token": req is not None,
                        "has_new_line": False,
                        "n_remain": self._remain(req),
                        "n_decoded": len(req.generated) if req is not None else 0,
                    }
                ],
            }
        )
        return out

    @staticmethod
    def _remain(req: Request | None) -> int:
        if req is None or req.max_tokens < 0:
            return -1
        return req.max_tokens - len(req.generated)

    async def slots(self, request: web.Request) -> web.Response:
        """GET /slots (501 with --no-slots)."""
        if not self.opts.slots:
            return _error(
                501,
                "This server does not support slots endpoint. Start it with `--slots`",
                "not_supported_error",
            )
        if request.query.get("fail_on_no_slot") and all(
            s.request is not None for s in self.engine.slots
        ):
            return _error(503, "no slot available", "unavailable_error")
        return json_response([self._slot_json(i) for i in range(len(self.engine.slots))])

    async def props(self, request: web.Request) -> web.Response:
        """GET /props; `build_info` marks the data as simulated."""
        name = self.model_name
        return json_response(
            {
                "default_generation_settings": {
                    "params": sampling_params({}, -1),
                    "n_ctx": self.engine.n_ctx_slot,
                },
                "total_slots": len(self.engine.slots),
                "model_alias": name,
                "model_ftype": self.opts.scenario.model.ftype,
                "model_path": self.model_path,
                "modalities": {"vision": False, "video": False, "audio": False},
                "media_marker": "<__media_llmbsim__>",
                "endpoint_slots": self.opts.slots,
                "endpoint_props": False,
                "endpoint_metrics": self.opts.metrics,
                "ui": True,
                "ui_settings": {},
                "chat_template": "{%- for message in messages -%}{{- message.content -}}"
                "{%- endfor -%}",
                "chat_template_caps": {
                    "supports_object_arguments": False,
                    "supports_parallel_tool_calls": False,
                    "supports_preserve_reasoning": False,
                    "supports_reasoning_effort": False,
                    "supports_string_content": True,
                    "supports_system_role": True,
                    "supports_tool_calls": False,
                    "supports_tools": False,
                    "supports_typed_content": False,
                },
                "bos_token": BOS,
                "eos_token": "<eos>",
                "build_info": BUILD_INFO,
                "is_sleeping": False,
                "cors_proxy_enabled": False,
            }
        )

    async def models(self, request: web.Request) -> web.Response:
        """GET /v1/models: Ollama-style `models` plus OpenAI `data`."""
        m = self.opts.scenario.model
        name = self.model_name
        return json_response(
            {
                "models": [
                    {
                        "name": name,
                        "model": name,
                        "modified_at": "",
                        "size": "",
                        "digest": "",
                        "type": "model",
                        "description": "",
                        "tags": [""],
                        "capabilities": ["completion"],
                        "parameters": "",
                        "details": {
                            "parent_model": "",
                            "format": "gguf",
                            "family": "",
                            "families": [""],
                            "parameter_size": "",
                            "quantization_level": "",
                        },
                    }
                ],
                "object": "list",
                "data": [
                    {
                        "id": name,
                        "aliases": [name],
                        "tags": [],
                        "object": "model",
                        "architecture": {
                            "input_modalities": ["text"],
                            "output_modalities": ["text"],
                        },
                        "created": int(time.time()),
                        "owned_by": "llamacpp",
                        "meta": {
                            "vocab_type": 1,
                            "n_vocab": m.n_vocab,
                            "n_ctx": self.engine.n_ctx_slot,
                            "n_ctx_train": m.n_ctx_train,
                            "n_embd": m.n_embd,
                            "n_params": m.n_params,
                            "size": m.file_bytes,
                            "ftype": m.ftype,
                        },
                    }
                ],
            }
        )

    async def tokenize(self, request: web.Request) -> web.Response:
        """POST /tokenize."""
        body = await _json(request)
        if isinstance(body, web.Response):
            return body
        text = str(body.get("content", ""))
        if body.get("add_special"):
            text = BOS + text
        return json_response({"tokens": self.tokenizer.encode(text)})

    # -- generation ------------------------------------------------------------------------------
    def _ms(self, req: Request) -> tuple[float, float]:
        start = req.admitted if req.admitted is not None else req.arrival
        prompt_ms = ((req.prompt_done or start) - start) * 1e3
        predicted_ms = max(1e-3, ((req.last_token or 0.0) - (req.prompt_done or 0.0)) * 1e3)
        return prompt_ms, predicted_ms

    def timings(self, req: Request) -> dict[str, Any]:
        """The `timings` object of a finished (or streaming) request."""
        prompt_ms, predicted_ms = self._ms(req)
        n_prompt = req.uncached
        n_gen = len(req.generated)
        return {
            "cache_n": req.cached,
            "prompt_n": n_prompt,
            "prompt_ms": prompt_ms,
            "prompt_per_token_ms": prompt_ms / n_prompt if n_prompt else 0.0,
            "prompt_per_second": n_prompt / prompt_ms * 1e3 if prompt_ms else 0.0,
            "predicted_n": n_gen,
            "predicted_ms": predicted_ms,
            "predicted_per_token_ms": predicted_ms / (n_gen - 1) if n_gen > 1 else 0.0,
            "predicted_per_second": (n_gen - 1) / predicted_ms * 1e3 if n_gen > 1 else 0.0,
            **(
                {"draft_n": req.draft_n, "draft_n_accepted": req.draft_accepted}
                if self.engine.params.spec_draft_max > 0
                else {}
            ),
        }

    @staticmethod
    def usage(req: Request) -> dict[str, Any]:
        """OpenAI `usage` with cached prompt tokens."""
        n_gen = len(req.generated)
        return {
            "completion_tokens": n_gen,
            "prompt_tokens": len(req.prompt),
            "total_tokens": len(req.prompt) + n_gen,
            "prompt_tokens_details": {"cached_tokens": req.cached},
        }

    def _submit(self, body: dict[str, Any], prompt_text: str) -> Request | web.Response:
        n_predict = int(
            body.get("max_tokens", body.get("n_predict", body.get("max_completion_tokens", -1)))
        )
        if body.get("n_predict") is not None and body.get("max_tokens") is None:
            n_predict = int(body["n_predict"])
        try:
            req = self.engine.new_request(
                self.tokenizer.encode(prompt_text),
                n_predict,
                bool(body.get("ignore_eos", False)),
                float(body.get("temperature", 0.8)),
                int(body["seed"]) if body.get("seed") is not None else None,
                bool(body.get("stream", False)),
            )
        except RequestError as exc:
            return _error(400, str(exc), "exceed_context_size_error")
        self._params[req.id] = sampling_params(body, n_predict)
        # bound the memory of old params: keep the last few hundred tasks
        for old in [k for k in self._params if k < req.id - 512]:
            del self._params[old]
        return req

    async def _run(self, request: web.Request, req: Request) -> None:
        """Wait for the whole generation (abort if the client goes away)."""
        try:
            await req.done.wait()
        finally:
            if not req.done.is_set():
                self.engine.abort(req)
        if req.finish is not None:
            self._log_release(req)

    def _finish_reason(self, req: Request) -> str:
        return "stop" if req.finish == "stop" else "length"

    async def completion(self, request: web.Request) -> web.StreamResponse:
        """POST /completion (native API)."""
        body = await _json(request)
        if isinstance(body, web.Response):
            return body
        prompt = body.get("prompt", "")
        if not isinstance(prompt, str):
            return _error(400, '"prompt" must be a string', "invalid_request_error")
        text = BOS + prompt
        req = self._submit(body, text)
        if isinstance(req, web.Response):
            return req
        if req.stream:
            resp = await self._sse_start(request)
            try:
                cut = self.opts.faults.stream_cut()
                while (token := await req.events.get()) is not None:
                    if cut is not None and len(req.generated) > cut:
                        return resp  # simulated truncated stream: no final chunk
                    chunk = {
                        "index": 0,
                        "content": self.tokenizer.decode([token]),
                        "tokens": [token],
                        "stop": False,
                        "id_slot": -1,
                        "tokens_predicted": len(req.generated),
                        "tokens_evaluated": len(req.prompt),
                    }
                    await resp.write(sse(chunk))
                await self._run(request, req)
                final = self._completion_json(req, body, text, content="")
                await resp.write(sse(final))
            except ConnectionResetError:
                pass  # the client went away; `finally` aborts the request
            finally:
                self.engine.abort(req)
            return resp
        await self._run(request, req)
        return json_response(self._completion_json(req, body, text))

    def _completion_json(
        self, req: Request, body: dict[str, Any], text: str, content: str | None = None
    ) -> dict[str, Any]:
        n_predict = req.max_tokens
        return {
            "index": 0,
            "content": self.tokenizer.decode(req.generated) if content is None else content,
            "tokens": [],
            "id_slot": req.slot,
            "stop": True,
            "model": self.model_name,
            "tokens_predicted": len(req.generated),
            "tokens_evaluated": len(req.prompt),
            "generation_settings": sampling_params(body, n_predict, full=True),
            "prompt": text,
            "has_new_line": False,
            "truncated": req.truncated,
            "stop_type": "eos" if req.finish == "stop" else "limit",
            "stopping_word": "",
            "tokens_cached": req.n_tokens - 1,
            "timings": self.timings(req),
        }

    async def oai_completions(self, request: web.Request) -> web.StreamResponse:
        """POST /v1/completions (OpenAI text completions)."""
        body = await _json(request)
        if isinstance(body, web.Response):
            return body
        prompt = body.get("prompt", "")
        if isinstance(prompt, list):
            prompt = "".join(str(p) for p in prompt)
        req = self._submit(body, BOS + str(prompt))
        if isinstance(req, web.Response):
            return req
        cid = "cmpl-" + random_id()
        created = int(time.time())

        def wrap(choices: list[dict[str, Any]]) -> dict[str, Any]:
            return {
                "choices": choices,
                "created": created,
                "model": self.model_name,
                "system_fingerprint": BUILD_INFO,
                "object": "text_completion",
                "id": cid,
            }

        if req.stream:
            return await self._stream_oai(request, req, body, wrap, chat=False)
        await self._run(request, req)
        out = wrap(
            [
                {
                    "text": self.tokenizer.decode(req.generated),
                    "index": 0,
                    "logprobs": None,
                    "finish_reason": self._finish_reason(req),
                }
            ]
        )
        out["usage"] = self.usage(req)
        out["id"] = out.pop("id")
        out["timings"] = self.timings(req)
        return json_response(out)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        """POST /v1/chat/completions."""
        body = await _json(request)
        if isinstance(body, web.Response):
            return body
        try:
            text = chat_prompt(body.get("messages"), BOS)
        except (ValueError, AttributeError) as exc:
            return _error(400, str(exc), "invalid_request_error")
        req = self._submit(body, text)
        if isinstance(req, web.Response):
            return req
        cid = "chatcmpl-" + random_id()
        created = int(time.time())

        def wrap(choices: list[dict[str, Any]]) -> dict[str, Any]:
            return {
                "choices": choices,
                "created": created,
                "model": self.model_name,
                "system_fingerprint": BUILD_INFO,
                "object": "chat.completion.chunk" if req.stream else "chat.completion",
                "id": cid,
            }

        if req.stream:
            return await self._stream_oai(request, req, body, wrap, chat=True)
        await self._run(request, req)
        out = wrap(
            [
                {
                    "finish_reason": self._finish_reason(req),
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": self.tokenizer.decode(req.generated),
                    },
                }
            ]
        )
        out["usage"] = self.usage(req)
        out["id"] = out.pop("id")
        out["timings"] = self.timings(req)
        return json_response(out)

    async def _sse_start(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        return resp

    async def _stream_oai(
        self, request: web.Request, req: Request, body: dict[str, Any], wrap: Any, chat: bool
    ) -> web.StreamResponse:
        resp = await self._sse_start(request)
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        per_token = bool(body.get("timings_per_token"))
        try:
            if chat:
                first = {
                    "finish_reason": None,
                    "index": 0,
                    "delta": {"role": "assistant", "content": None},
                }
                await resp.write(sse(wrap([first])))
            cut = self.opts.faults.stream_cut()
            while (token := await req.events.get()) is not None:
                if cut is not None and len(req.generated) > cut:
                    return resp  # simulated truncated stream: no [DONE]
                piece = self.tokenizer.decode([token])
                if chat:
                    choice: dict[str, Any] = {
                        "finish_reason": None,
                        "index": 0,
                        "delta": {"content": piece},
                    }
                else:
                    choice = {"text": piece, "index": 0, "logprobs": None, "finish_reason": None}
                chunk = wrap([choice])
                if per_token:
                    chunk["timings"] = self.timings(req)
                await resp.write(sse(chunk))
            await self._run(request, req)
            reason = self._finish_reason(req)
            if chat:
                last: dict[str, Any] = {"finish_reason": reason, "index": 0, "delta": {}}
            else:
                last = {"text": "", "index": 0, "logprobs": None, "finish_reason": reason}
            chunk = wrap([last])
            if include_usage:
                await resp.write(sse(chunk))
                chunk = wrap([])
                chunk["usage"] = self.usage(req)
            chunk["timings"] = self.timings(req)
            await resp.write(sse(chunk))
            await resp.write(b"data: [DONE]\n\n")
        except ConnectionResetError:
            pass  # the client went away; `finally` aborts the request
        finally:
            self.engine.abort(req)
        return resp


async def _json(request: web.Request) -> dict[str, Any] | web.Response:
    try:
        body = json.loads(await request.text() or "{}")
    except json.JSONDecodeError as exc:
        return _error(400, f"invalid JSON: {exc}", "invalid_request_error")
    if not isinstance(body, dict):
        return _error(400, "the body must be a JSON object", "invalid_request_error")
    return body
