"""The JSON documents SGLang answers: `/server_info`, `/model_info`, `/v1/models`, `meta_info`,
`usage` and its errors, as the release the simulator answers as writes them."""

from __future__ import annotations

import time
from typing import Any, Protocol

from aiohttp import web

from simulator.common import SimOptions, json_response
from simulator.engine import Engine
from simulator.model import Request
from simulator.scenarios import GIB


class SglangSim(Protocol):
    """What the documents and the metrics read of the SGLang simulator (`server.SglangSim`):
    declared here so that they need not import the server that imports them."""

    opts: SimOptions
    engine: Engine

    @property
    def model_name(self) -> str: ...

    @property
    def model_path(self) -> str: ...

    def cmdline(self) -> str: ...

    def idle_seconds(self) -> float: ...


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


def bad_request(message: str) -> web.Response:
    """SGLang's HTTP 400 answer."""
    return json_response(
        {
            "object": "error",
            "message": message,
            "type": "BadRequestError",
            "param": None,
            "code": 400,
        },
        400,
    )


def server_info(sim: SglangSim) -> dict[str, Any]:
    """`/server_info`: resolved arguments + scheduler info; marked simulated."""
    e = sim.engine
    p = e.params
    args = {
        "model_path": sim.model_path,
        "tokenizer_path": sim.model_path,
        "served_model_name": sim.model_name,
        "host": sim.opts.host,
        "port": sim.opts.port,
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
        **_spec_args(sim),
        "disable_radix_cache": False,
        "attention_backend": "fa3",
        "enable_metrics": True,
        "enable_cache_report": sim.opts.enable_cache_report,
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
    if sim.opts.sglang_version == "0.5.11":  # graph memory is one number there: 0
        memory = {k: memory[k] if k != "graph" else 0 for k in MEMORY_KEYS_0_5_11}
    return versioned(
        sim,
        "server_info",
        {
            **args,
            "launch_command": sim.cmdline(),
            "status": "ready",
            "max_total_num_tokens": p.ctx_total,
            "max_req_input_len": p.context_len - 1,
            "startup_time": e.loaded_at,
            "version": sim.opts.sglang_version,
            "frontend": "python",
            "simulated": True,
            "internal_states": [
                {
                    **args,
                    "world_size": 1,
                    "effective_max_running_requests_per_dp": p.n_slots,
                    "last_gen_throughput": e.gen_throughput(),
                    **_avg_spec_accept_length(sim),
                    "memory_usage": memory,
                    "disaggregation_mode": "null",
                }
            ],
        },
    )


def versioned(sim: SglangSim, endpoint: str, doc: dict[str, Any]) -> dict[str, Any]:
    """`doc` as this release answers it (0.5.11 lacks some keys)."""
    if sim.opts.sglang_version == "0.5.11":
        doc = {k: v for k, v in doc.items() if k not in ABSENT_IN_0_5_11[endpoint]}
        inner = ABSENT_IN_0_5_11["internal_state"]
        if "internal_states" in doc:
            doc["internal_states"] = [
                {k: v for k, v in state.items() if k not in inner}
                for state in doc["internal_states"]
            ]
    return doc


def _avg_spec_accept_length(sim: SglangSim) -> dict[str, float]:
    st = sim.engine.stats
    if sim.engine.params.spec_draft_max <= 0 or not st.spec_drafts:
        return {}
    return {"avg_spec_accept_length": (st.spec_accepted + st.spec_drafts) / st.spec_drafts}


def _spec_args(sim: SglangSim) -> dict[str, Any]:
    """The speculative-decoding server args (EAGLE with one draft chain when enabled)."""
    n = sim.engine.params.spec_draft_max
    return {
        "speculative_algorithm": "EAGLE" if n > 0 else None,
        "speculative_draft_model_path": f"{sim.model_path}-eagle" if n > 0 else None,
        "speculative_num_steps": n if n > 0 else None,
        "speculative_eagle_topk": 1 if n > 0 else None,
        "speculative_num_draft_tokens": n + 1 if n > 0 else None,
    }


def model_info(sim: SglangSim) -> dict[str, Any]:
    """`/model_info`."""
    return versioned(
        sim,
        "model_info",
        {
            "model_path": sim.model_path,
            "served_model_name": sim.model_name,
            "tokenizer_path": sim.model_path,
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


def models(sim: SglangSim) -> dict[str, Any]:
    """`/v1/models`."""
    return {
        "object": "list",
        "data": [
            {
                "id": sim.model_name,
                "object": "model",
                "created": int(time.time()),
                "owned_by": "sglang",
                "root": sim.model_name,
                "parent": None,
                "max_model_len": sim.engine.params.context_len,
            }
        ],
    }


def meta_info(req: Request) -> dict[str, Any]:
    """`/generate`'s `meta_info` of a request."""
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


def usage(req: Request, cache_report: bool) -> dict[str, Any]:
    """OpenAI `usage`; cached tokens only with --enable-cache-report."""
    n_gen = len(req.generated)
    details = {"cached_tokens": req.cached} if cache_report else None
    return {
        "prompt_tokens": len(req.prompt),
        "total_tokens": len(req.prompt) + n_gen,
        "completion_tokens": n_gen,
        "prompt_tokens_details": details,
        "reasoning_tokens": 0,
    }


def oai_choice(
    piece: str | None, reason: str | None, chat: bool, stream: bool, first: bool = False
) -> dict[str, Any]:
    """One OpenAI choice: a chat message or delta (`first` carries the role), or a text."""
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
