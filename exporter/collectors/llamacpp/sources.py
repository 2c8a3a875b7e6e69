"""Where each `llmb_*` series comes from on llama.cpp: the llama.cpp column of docs/metrics.md.

Named by its row in config/kinds.py (`sources`: `COLUMNS`); `python -m exporter.metrics_doc`
renders the table. A series not listed is absent on llama.cpp.
"""

from __future__ import annotations

from exporter.collectors.sources import SourceColumn

SOURCES: dict[str, str] = {
    "llmb_engine_up": "`/health` 200",
    "llmb_engine_loading": "`/health` 503 `Loading model`",
    "llmb_engine_info": "`/v1/models` id, `/props` build_info, `meta.ftype`",
    "llmb_engine_restarts_total": (
        "unreachable in between, or `/props` build/model/`n_ctx`/`total_slots` changed, or a "
        "new process in the log"
    ),
    "llmb_engine_endpoint_enabled": "`/metrics`, `/slots` 501 → 0",
    "llmb_engine_requests_running": "`llamacpp:requests_processing`",
    "llmb_engine_requests_waiting": "`llamacpp:requests_deferred`",
    "llmb_engine_slots": "`/slots` length (`-np`)",
    "llmb_engine_context_tokens": "`/slots` `n_ctx` (per slot)",
    "llmb_engine_kv_cache_capacity_tokens": "slot `n_ctx` × slots (unified KV: one pool)",
    "llmb_engine_kv_cache_used_tokens": (
        "Σ `n_prompt_tokens` of processing slots (old builds: `kv_cache_tokens`)"
    ),
    "llmb_engine_kv_cache_usage_ratio": "used / capacity (old builds: `kv_cache_usage_ratio`)",
    "llmb_engine_slot_context_usage_max_ratio": "`/slots` max `n_prompt_tokens/n_ctx`",
    "llmb_engine_kv_pressure_events_total": (
        "log: KV full, context exceeded, context shift, `truncated = 1`"
    ),
    "llmb_engine_kv_cache_bytes": "log `KV buffer size` (-lv 4)",
    "llmb_engine_prompt_tokens_total": "`prompt_tokens_total` + `prompt_tokens_cached_total`",
    "llmb_engine_prompt_tokens_cached_total": "`llamacpp:prompt_tokens_cached_total`",
    "llmb_engine_prompt_seconds_total": (
        "log `prompt eval time` summed per request (without a log: `prompt_seconds_total`)"
    ),
    "llmb_engine_prefill_busy_seconds_total": (
        "log: union of the requests' `prompt eval time` spans (without a log: "
        "`prompt_seconds_total`, timed per prompt batch)"
    ),
    "llmb_engine_generation_tokens_total": "`llamacpp:tokens_predicted_total` (or log)",
    "llmb_engine_decode_tokens_total": (
        "log `eval time` tokens − 1 per request (without a log: `tokens_predicted_total`)"
    ),
    "llmb_engine_decode_seconds_total": (
        "log `eval time` (without a log: `tokens_predicted_seconds_total`)"
    ),
    "llmb_engine_requests_finished_total": "log `release` lines",
    "llmb_engine_decode_steps_total": "`llamacpp:n_decode_total`",
    "llmb_engine_process_gpu_memory_bytes": "NVML processes attributed to the engine",
    "llmb_engine_process_gpu_memory_peak_bytes": "NVML background sampler",
    "llmb_engine_model_buffer_bytes": "log `model buffer size` per device (-lv 4)",
    "llmb_engine_gpu_layers_offloaded": "log `offloaded N/M layers to GPU` (-lv 4)",
    "llmb_engine_gpu_layers_total": "log `offloaded N/M layers to GPU` (-lv 4)",
    "llmb_engine_load_seconds": "log `loading model` → `model loaded`",
    "llmb_engine_experts_host_layers": (
        "log `tensor blk.N.ffn_*_exps.weight (...) buffer type overridden to CPU` (-lv 5), "
        "else host model buffers − token embedding (-lv 4) over per-layer expert bytes"
    ),
    "llmb_engine_experts_host_bytes": (
        "expert bytes of those layers (GGUF tensor infos; else the override lines' MiB)"
    ),
    "llmb_engine_spec_accept_length": (
        "log `draft acceptance rate = R (A accepted / G generated)` with the request's `eval "
        "time` tokens: Σ(n−1) / (Σ(n−1) − ΣA); else `spec_decode_num_accepted_tokens_total` / "
        "`spec_decode_num_drafts_total` + 1"
    ),
    "llmb_model_weights_bytes": "`/v1/models` `meta.size`",
    "llmb_model_parameters": "`/v1/models` `meta.n_params`",
    "llmb_model_layers": "GGUF header (or log)",
    "llmb_model_kv_bytes_per_token_estimated": "GGUF header",
    "llmb_model_kv_cache_bytes_estimated": "GGUF header + slots × n_ctx (SWA layers capped)",
    "llmb_model_weights_always_read_bytes": (
        "GGUF tensor infos: all but `*_exps` and an untied `token_embd.weight`"
    ),
    "llmb_model_weights_routed_experts_bytes": "GGUF tensor infos `blk.N.ffn_*_exps.*`",
    "llmb_model_experts": "GGUF `{arch}.expert_count`",
    "llmb_model_experts_used": "GGUF `{arch}.expert_used_count`",
    "llmb_model_token_embedding_row_bytes": (
        "GGUF `token_embd.weight` bytes / rows when `output.weight` exists"
    ),
    "llmb_model_prefill_flops_per_token": (
        "GGUF tensor infos (`blk.N.*` matrices; `*_exps` at k/E) and `{arch}.attention.*` keys"
    ),
    "llmb_model_prefill_attention_flops_per_position": (
        "same (heads, head sizes, sliding-window layers)"
    ),
    "llmb_model_sliding_window_tokens": "same (`sliding_window`)",
    "llmb_model_kv_cache_type_info": (
        "log `llama_kv_cache: size = … K (q8_0): …, V (q8_0): …` (-lv 4)"
    ),
    "llmb_model_draft_weights_bytes": "log: model buffers of the second (draft) model load (-lv 4)",
}

# The kind's columns of docs/metrics.md, the main one first.
COLUMNS: tuple[SourceColumn, ...] = (SourceColumn(SOURCES),)
