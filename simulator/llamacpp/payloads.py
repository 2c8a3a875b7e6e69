"""The JSON documents llama-server answers: generation settings, `/props`, `/v1/models`,
`/slots` entries, `timings`, `usage` and the native completion."""

from __future__ import annotations

import time
from typing import Any, Protocol

from aiohttp import web

from simulator.common import SimOptions, json_response
from simulator.engine import Engine
from simulator.model import Request
from simulator.tokenizer import Tokenizer


class LlamaCppSim(Protocol):
    """What the documents and the log read of the llama.cpp simulator (`server.LlamaCppSim`):
    declared here so that they need not import the server that imports them."""

    opts: SimOptions
    engine: Engine
    tokenizer: Tokenizer
    task_params: dict[int, dict[str, Any]]

    @property
    def model_name(self) -> str: ...

    @property
    def model_path(self) -> str: ...

    @property
    def speculative(self) -> bool: ...

    def log(self, level: str, text: str) -> None: ...

    def sampling(
        self, body: dict[str, Any], n_predict: int, full: bool = False
    ) -> dict[str, Any]: ...


BUILD_INFO = "b0-llmb-sim"
BOS = "<bos>"

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


def error(status: int, message: str, etype: str) -> web.Response:
    """An error answer in llama-server's shape."""
    return json_response({"error": {"code": status, "message": message, "type": etype}}, status)


def not_supported(endpoint: str, flag: str) -> web.Response:
    """The 501 of an endpoint the server was started without."""
    message = f"This server does not support {endpoint} endpoint. Start it with `{flag}`"
    return error(501, message, "not_supported_error")


def request_ms(req: Request) -> tuple[float, float]:
    """Prompt and generation milliseconds of a request (as its `timings` report them)."""
    start = req.admitted if req.admitted is not None else req.arrival
    prompt_ms = ((req.prompt_done or start) - start) * 1e3
    predicted_ms = max(1e-3, ((req.last_token or 0.0) - (req.prompt_done or 0.0)) * 1e3)
    return prompt_ms, predicted_ms


def timings(req: Request, speculative: bool) -> dict[str, Any]:
    """The `timings` object of a finished (or streaming) request."""
    prompt_ms, predicted_ms = request_ms(req)
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
        **({"draft_n": req.draft_n, "draft_n_accepted": req.draft_accepted} if speculative else {}),
    }


def usage(req: Request) -> dict[str, Any]:
    """OpenAI `usage` with cached prompt tokens."""
    n_gen = len(req.generated)
    return {
        "completion_tokens": n_gen,
        "prompt_tokens": len(req.prompt),
        "total_tokens": len(req.prompt) + n_gen,
        "prompt_tokens_details": {"cached_tokens": req.cached},
    }


def slot_json(sim: LlamaCppSim, slot_id: int) -> dict[str, Any]:
    """One `/slots` entry."""
    e = sim.engine
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
    params = sim.task_params.get(task, sim.sampling({}, -1))
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
                    "n_remain": remain(req),
                    "n_decoded": len(req.generated) if req is not None else 0,
                }
            ],
        }
    )
    return out


def remain(req: Request | None) -> int:
    if req is None or req.max_tokens < 0:
        return -1
    return req.max_tokens - len(req.generated)


def props(sim: LlamaCppSim) -> dict[str, Any]:
    """`/props`; `build_info` marks the data as simulated."""
    name = sim.model_name
    return {
        "default_generation_settings": {
            "params": sim.sampling({}, -1),
            "n_ctx": sim.engine.n_ctx_slot,
        },
        "total_slots": len(sim.engine.slots),
        "model_alias": name,
        "model_ftype": sim.opts.scenario.model.ftype,
        "model_path": sim.model_path,
        "modalities": {"vision": False, "video": False, "audio": False},
        "media_marker": "<__media_llmbsim__>",
        "endpoint_slots": sim.opts.slots,
        "endpoint_props": False,
        "endpoint_metrics": sim.opts.metrics,
        "ui": True,
        "ui_settings": {},
        "chat_template": "{%- for message in messages -%}{{- message.content -}}{%- endfor -%}",
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


def models(sim: LlamaCppSim) -> dict[str, Any]:
    """`/v1/models`: Ollama-style `models` plus OpenAI `data`."""
    m = sim.opts.scenario.model
    name = sim.model_name
    return {
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
                    "n_ctx": sim.engine.n_ctx_slot,
                    "n_ctx_train": m.n_ctx_train,
                    "n_embd": m.n_embd,
                    "n_params": m.n_params,
                    "size": m.file_bytes,
                    "ftype": m.ftype,
                },
            }
        ],
    }


def completion(
    sim: LlamaCppSim, req: Request, body: dict[str, Any], text: str, content: str | None = None
) -> dict[str, Any]:
    """The native `/completion` answer (the final chunk of a stream, with `content` "")."""
    n_predict = req.max_tokens
    return {
        "index": 0,
        "content": sim.tokenizer.decode(req.generated) if content is None else content,
        "tokens": [],
        "id_slot": req.slot,
        "stop": True,
        "model": sim.model_name,
        "tokens_predicted": len(req.generated),
        "tokens_evaluated": len(req.prompt),
        "generation_settings": sim.sampling(body, n_predict, full=True),
        "prompt": text,
        "has_new_line": False,
        "truncated": req.truncated,
        "stop_type": "eos" if req.finish == "stop" else "limit",
        "stopping_word": "",
        "tokens_cached": req.n_tokens - 1,
        "timings": timings(req, sim.speculative),
    }
