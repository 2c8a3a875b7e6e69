"""Simulated SGLang server (0.5.23 by default, or 0.5.11: `SimOptions.sglang_version`): its
HTTP API driven by the performance model.

`metrics` holds and renders `/metrics` (through prometheus_client), `spec` each release's
families, `payloads` the JSON answers.
"""

from __future__ import annotations

import time
from typing import Any, ClassVar

from aiohttp import web
from prometheus_client.core import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from simulator import common
from simulator.common import SimBase, SimOptions, route
from simulator.model import KvStyle, Request, RequestError
from simulator.sglang import payloads
from simulator.sglang.metrics import SglangMetrics
from simulator.sglang.payloads import bad_request


class SglangSim(SimBase):
    """An SGLang stand-in driven by the performance model."""

    kind = "sglang"
    style = KvStyle(slots=False, checkpoint_weights=True, padding_page=True)
    # Its pool holds more tokens than llama.cpp's slots: more and longer requests fill it.
    demo_loads: ClassVar[dict[str, tuple[int, int, int]]] = {"kv_saturated": (12, 1500, 600)}
    DOCUMENTS = (
        (payloads.server_info, ("/server_info", "/get_server_info")),
        (payloads.model_info, ("/model_info", "/get_model_info")),
        (payloads.models, ("/v1/models",)),
    )

    def __init__(self, opts: SimOptions):
        super().__init__(opts)
        self.metrics_state = SglangMetrics(self)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.metrics_state)
        self.engine.on_evict = self.metrics_state.evicted
        self.engine.on_retract = self.metrics_state.retracted

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
                    return common.json_response({"error": "Unauthorized"}, 401)
            resp = await handler(request)
            status = resp.status
            return resp
        finally:
            m.active[key] -= 1
            m.inc("sglang:http_responses", (*key, str(status)))

    @route("GET", "/health", "/health_generate")
    async def health(self, request: web.Request) -> web.Response:
        """GET /health: empty 200 once ready."""
        return web.Response(status=200)

    @route("GET", "/metrics")
    async def metrics(self, request: web.Request) -> web.Response:
        """GET /metrics in text 0.0.4 or OpenMetrics, as the Accept header asks."""
        encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
        body = encoder(self.registry)
        return web.Response(body=body, headers={"Content-Type": content_type})

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
            return bad_request(str(exc))

    async def _wait(self, req: Request) -> None:
        try:
            await req.done.wait()
        finally:
            if not req.done.is_set():
                self._abort(req)
            elif not req.observed:
                req.observed = True
                self.metrics_state.finished(req)

    @route("POST", "/generate")
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
            resp = await common.sse_start(request)
            async with common.client_stream(self._abort, req):
                while (await req.events.get()) is not None:
                    out = {
                        "text": self.tokenizer.decode(req.generated),
                        "output_ids": list(req.generated),
                        "meta_info": payloads.meta_info(req),
                    }
                    await resp.write(common.sse(out))
                await self._wait(req)
                await resp.write(b"data: [DONE]\n\n")
            return resp
        await self._wait(req)
        return common.json_response(
            {
                "text": self.tokenizer.decode(req.generated),
                "output_ids": list(req.generated),
                "meta_info": payloads.meta_info(req),
            }
        )

    @route("POST", "/v1/chat/completions")
    async def chat(self, request: web.Request) -> web.StreamResponse:
        """POST /v1/chat/completions."""
        body = await _json(request)
        if isinstance(body, web.Response):
            return body
        try:
            text = common.chat_prompt(body.get("messages"), "<bos>")
        except (ValueError, AttributeError) as exc:
            return bad_request(str(exc))
        return await self._oai(request, body, text, chat=True)

    @route("POST", "/v1/completions")
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
        rid = common.random_id(32)
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
            return payloads.oai_choice(piece, reason, chat, stream, first)

        if not stream:
            await self._wait(req)
            out = wrap(
                [
                    choice(
                        self.tokenizer.decode(req.generated), common.finish_reason(req), first=True
                    )
                ],
                payloads.usage(req, self.opts.enable_cache_report),
            )
            out["metadata"] = {"weight_version": "default"}
            return common.json_response(out)
        resp = await common.sse_start(request)
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        async with common.client_stream(self._abort, req):
            first = True
            cut = self.opts.faults.stream_cut()
            while (token := await req.events.get()) is not None:
                if cut is not None and len(req.generated) > cut:
                    return resp  # simulated truncated stream: no [DONE]
                await resp.write(
                    common.sse(wrap([choice(self.tokenizer.decode([token]), None, first)]))
                )
                first = False
            await self._wait(req)
            await resp.write(common.sse(wrap([choice("", common.finish_reason(req))])))
            if include_usage:
                await resp.write(
                    common.sse(wrap([], payloads.usage(req, self.opts.enable_cache_report)))
                )
            await resp.write(b"data: [DONE]\n\n")
        return resp


async def _json(request: web.Request) -> dict[str, Any] | web.Response:
    body = await common.read_object(request, "body must be an object")
    return bad_request(body) if isinstance(body, str) else body
