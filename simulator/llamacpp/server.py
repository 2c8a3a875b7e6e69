"""Simulated llama.cpp `llama-server`: its HTTP API driven by the performance model.

`metrics` renders `/metrics`, `logs` writes the log lines, `payloads` builds the JSON answers.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, TextIO

from aiohttp import web

from simulator import common
from simulator.common import SimBase, SimOptions, route
from simulator.llamacpp import logs, metrics, payloads
from simulator.llamacpp.payloads import BOS, BUILD_INFO, error, timings, usage
from simulator.model import KvStyle, Request, RequestError

PUBLIC_PATHS = {"/health", "/v1/health", "/models", "/v1/models", "/api/tags"}


class LlamaCppSim(SimBase):
    """A llama-server stand-in driven by the performance model."""

    kind = "llamacpp"
    style = KvStyle(slots=True, split_kv_types=True, experts_on_host=True)
    demo_log = "llama-server.log"
    DOCUMENTS = ((payloads.props, ("/props",)), (payloads.models, ("/v1/models", "/models")))

    def __init__(self, opts: SimOptions):
        super().__init__(opts)
        self.t_start_us = int(time.monotonic() * 1e6)
        self._log_fh: TextIO | None = None
        if opts.log_file is not None:
            Path(opts.log_file).parent.mkdir(parents=True, exist_ok=True)
            self._log_fh = open(opts.log_file, "a", buffering=1)
        self.task_params: dict[int, dict[str, Any]] = {}  # a task's sampling params (/slots)

    @property
    def speculative(self) -> bool:
        """True when a draft model proposes tokens (-md)."""
        return self.engine.params.spec_draft_max > 0

    def log(self, level: str, text: str) -> None:
        """One line in llama-server's `M.SS.mmm.uuu L text` format."""
        if self._log_fh is not None:
            self._log_fh.write(logs.line(self.clock.now(), level, text))

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

    async def _on_startup(self, app: web.Application) -> None:
        await super()._on_startup(app)
        logs.startup(self)

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if not self.engine.ready():
            # key order of the real body differs from other errors (health_503_loading.json)
            body = {"error": {"message": "Loading model", "type": "unavailable_error", "code": 503}}
            return common.json_response(body, 503)
        key = self.opts.api_key
        if key and request.path not in PUBLIC_PATHS:
            auth = request.headers.get("Authorization", "")
            given = auth[7:] if auth.startswith("Bearer ") else request.headers.get("X-Api-Key")
            if given != key:
                return error(401, "Invalid API Key", "authentication_error")
        return await handler(request)

    @route("GET", "/health", "/v1/health")
    async def health(self, request: web.Request) -> web.Response:
        """GET /health."""
        return common.json_response({"status": "ok"})

    @route("GET", "/metrics")
    async def metrics(self, request: web.Request) -> web.Response:
        """GET /metrics (501 unless metrics are enabled)."""
        if not self.opts.metrics:
            return payloads.not_supported("metrics", "--metrics")
        resp = web.Response(text=metrics.render(self.engine))
        resp.headers["Content-Type"] = "text/plain; version=0.0.4"
        resp.headers["Process-Start-Time-Unix"] = str(self.t_start_us)
        return resp

    def sampling(self, body: dict[str, Any], n_predict: int, full: bool = False) -> dict[str, Any]:
        """A request's params; with a draft model they list its speculative type."""
        params = payloads.sampling_params(body, n_predict, full)
        if self.speculative:
            params["speculative.types"] = "none,draft-simple"
        return params

    @route("GET", "/slots")
    async def slots(self, request: web.Request) -> web.Response:
        """GET /slots (501 with --no-slots)."""
        if not self.opts.slots:
            return payloads.not_supported("slots", "--slots")
        if request.query.get("fail_on_no_slot") and all(
            s.request is not None for s in self.engine.slots
        ):
            return error(503, "no slot available", "unavailable_error")
        return common.json_response(
            [payloads.slot_json(self, i) for i in range(len(self.engine.slots))]
        )

    @route("POST", "/tokenize")
    async def tokenize(self, request: web.Request) -> web.Response:
        """POST /tokenize."""
        body = await _json(request)
        if isinstance(body, web.Response):
            return body
        text = str(body.get("content", ""))
        if body.get("add_special"):
            text = BOS + text
        return common.json_response({"tokens": self.tokenizer.encode(text)})

    # -- generation ------------------------------------------------------------------------------
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
            return error(400, str(exc), "exceed_context_size_error")
        self.task_params[req.id] = self.sampling(body, n_predict)
        # bound the memory of old params: keep the last few hundred tasks
        for old in [k for k in self.task_params if k < req.id - 512]:
            del self.task_params[old]
        return req

    async def _run(self, request: web.Request, req: Request) -> None:
        """Wait for the whole generation (abort if the client goes away)."""
        try:
            await req.done.wait()
        finally:
            if not req.done.is_set():
                self.engine.abort(req)
        if req.finish is not None:
            logs.release(self, req)

    @route("POST", "/completion", "/completions")
    async def completion(self, request: web.Request) -> web.StreamResponse:
        """POST /completion (native API)."""
        body = await _json(request)
        if isinstance(body, web.Response):
            return body
        prompt = body.get("prompt", "")
        if not isinstance(prompt, str):
            return error(400, '"prompt" must be a string', "invalid_request_error")
        text = BOS + prompt
        req = self._submit(body, text)
        if isinstance(req, web.Response):
            return req
        if req.stream:
            resp = await common.sse_start(request)
            async with common.client_stream(self.engine.abort, req):
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
                    await resp.write(common.sse(chunk))
                await self._run(request, req)
                final = payloads.completion(self, req, body, text, content="")
                await resp.write(common.sse(final))
            return resp
        await self._run(request, req)
        return common.json_response(payloads.completion(self, req, body, text))

    @route("POST", "/v1/completions")
    async def oai_completions(self, request: web.Request) -> web.StreamResponse:
        """POST /v1/completions (OpenAI text completions)."""
        body = await _json(request)
        if isinstance(body, web.Response):
            return body
        prompt = body.get("prompt", "")
        if isinstance(prompt, list):
            prompt = "".join(str(p) for p in prompt)
        return await self._oai(request, body, BOS + str(prompt), chat=False)

    @route("POST", "/v1/chat/completions", "/chat/completions")
    async def chat(self, request: web.Request) -> web.StreamResponse:
        """POST /v1/chat/completions."""
        body = await _json(request)
        if isinstance(body, web.Response):
            return body
        try:
            text = common.chat_prompt(body.get("messages"), BOS)
        except (ValueError, AttributeError) as exc:
            return error(400, str(exc), "invalid_request_error")
        return await self._oai(request, body, text, chat=True)

    async def _oai(
        self, request: web.Request, body: dict[str, Any], text: str, chat: bool
    ) -> web.StreamResponse:
        """An OpenAI (chat) completion of `text`, whole or streamed."""
        req = self._submit(body, text)
        if isinstance(req, web.Response):
            return req
        if chat:
            cid = "chatcmpl-" + common.random_id()
            obj = "chat.completion.chunk" if req.stream else "chat.completion"
        else:
            cid, obj = "cmpl-" + common.random_id(), "text_completion"
        created = int(time.time())

        def wrap(choices: list[dict[str, Any]]) -> dict[str, Any]:
            return {
                "choices": choices,
                "created": created,
                "model": self.model_name,
                "system_fingerprint": BUILD_INFO,
                "object": obj,
                "id": cid,
            }

        if req.stream:
            return await self._stream_oai(request, req, body, wrap, chat=chat)
        await self._run(request, req)
        content, reason = self.tokenizer.decode(req.generated), common.finish_reason(req)
        message = {"role": "assistant", "content": content}
        choice: dict[str, Any] = (
            {"finish_reason": reason, "index": 0, "message": message}
            if chat
            else {"text": content, "index": 0, "logprobs": None, "finish_reason": reason}
        )
        out = wrap([choice])
        out["usage"] = usage(req)
        out["id"] = out.pop("id")
        out["timings"] = timings(req, self.speculative)
        return common.json_response(out)

    async def _stream_oai(
        self, request: web.Request, req: Request, body: dict[str, Any], wrap: Any, chat: bool
    ) -> web.StreamResponse:
        resp = await common.sse_start(request)
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        per_token = bool(body.get("timings_per_token"))
        async with common.client_stream(self.engine.abort, req):
            if chat:
                first = {
                    "finish_reason": None,
                    "index": 0,
                    "delta": {"role": "assistant", "content": None},
                }
                await resp.write(common.sse(wrap([first])))
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
                    chunk["timings"] = timings(req, self.speculative)
                await resp.write(common.sse(chunk))
            await self._run(request, req)
            reason = common.finish_reason(req)
            if chat:
                last: dict[str, Any] = {"finish_reason": reason, "index": 0, "delta": {}}
            else:
                last = {"text": "", "index": 0, "logprobs": None, "finish_reason": reason}
            chunk = wrap([last])
            if include_usage:
                await resp.write(common.sse(chunk))
                chunk = wrap([])
                chunk["usage"] = usage(req)
            chunk["timings"] = timings(req, self.speculative)
            await resp.write(common.sse(chunk))
            await resp.write(b"data: [DONE]\n\n")
        return resp


async def _json(request: web.Request) -> dict[str, Any] | web.Response:
    body = await common.read_object(request, "the body must be a JSON object")
    return error(400, body, "invalid_request_error") if isinstance(body, str) else body
