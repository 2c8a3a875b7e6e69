"""Where each `llmb_*` series comes from on SGLang: the SGLang columns of docs/metrics.md.

Named by its row in config/kinds.py (`sources`: `COLUMNS`); `python -m exporter.metrics_doc`
renders the table. A series not listed in SOURCES is absent on SGLang.
"""

from __future__ import annotations

from exporter.collectors.sources import SourceColumn

SOURCES: dict[str, str] = {
    "llmb_engine_up": "`/metrics` answered, else `/v1/models` 2xx, else `/health` 2xx",
    "llmb_engine_loading": (
        "`/health` 503 (asked in the background for each new instance until its first other "
        "answer, and when `/metrics` and `/v1/models` fail; while `/server_info` has not "
        "answered yet, also no answer within 0.4 s)"
    ),
    "llmb_engine_info": "`/server_info` version, dtype/quantization",
    "llmb_engine_restarts_total": (
        "unreachable in between, or `/server_info` start arguments changed"
    ),
    "llmb_engine_requests_running": "`sglang:num_running_reqs`",
    "llmb_engine_requests_waiting": "`sglang:num_queue_reqs`",
    "llmb_engine_slots": (
        "`/server_info` `internal_states[].effective_max_running_requests_per_dp` (Σ DP)"
    ),
    "llmb_engine_context_tokens": "`sglang:context_len`, else `/v1/models` `max_model_len`",
    "llmb_engine_kv_cache_capacity_tokens": "`sglang:max_total_num_tokens`",
    "llmb_engine_kv_cache_used_tokens": "`sglang:kv_used_tokens` / `num_used_tokens`",
    "llmb_engine_kv_cache_usage_ratio": (
        "max(`sglang:full_token_usage`, `swa_token_usage`) (unrounded), else `token_usage`"
    ),
    "llmb_engine_kv_pressure_events_total": (
        "`sglang:num_retracted_requests_total` (event=retracted; 0 while only declared)"
    ),
    "llmb_engine_kv_cache_bytes": (
        "`sglang:kv_cache_memory_usage_gb` × 2^30, else `/server_info` "
        "`internal_states[0].memory_usage.kvcache`, else log `KV Cache is allocated` K + V"
    ),
    "llmb_engine_prompt_tokens_total": "`sglang:prompt_tokens_total`",
    "llmb_engine_prompt_tokens_cached_total": "`sglang:cached_tokens_total`",
    "llmb_engine_generation_tokens_total": "`sglang:generation_tokens_total`",
    "llmb_engine_decode_tokens_total": "`sglang:inter_token_latency_seconds_count`",
    "llmb_engine_decode_seconds_total": "`sglang:inter_token_latency_seconds_sum`",
    "llmb_engine_prompt_seconds_total": (
        "`sglang:time_to_first_token_seconds_sum` - `sglang:queue_time_seconds_sum` (held "
        "monotonic)"
    ),
    "llmb_engine_requests_finished_total": "`sglang:num_requests_total`",
    "llmb_engine_time_to_first_token_seconds": "`sglang:time_to_first_token_seconds`",
    "llmb_engine_inter_token_latency_seconds": "`sglang:inter_token_latency_seconds`",
    "llmb_engine_queue_time_seconds": "`sglang:queue_time_seconds`",
    "llmb_engine_e2e_request_latency_seconds": "`sglang:e2e_request_latency_seconds`",
    "llmb_engine_request_prompt_tokens": "`sglang:prompt_tokens_histogram`",
    "llmb_engine_request_generation_tokens": "`sglang:generation_tokens_histogram`",
    "llmb_engine_process_gpu_memory_bytes": "same",
    "llmb_engine_process_gpu_memory_peak_bytes": "same",
    "llmb_engine_model_buffer_bytes": (
        "`sglang:weight_memory_usage_gb` × 2^30, else `/server_info` "
        "`internal_states[0].memory_usage.weight`, else log `Load weight end … mem usage=` "
        "(gpu); `/server_info` `cpu_offload_gb` (cpu)"
    ),
    "llmb_engine_load_seconds": "`sglang:startup_time_seconds{phase=load_weight}`",
    "llmb_engine_spec_accept_length": "`sglang:spec_accept_length`",
    "llmb_model_weights_bytes": (
        "GPU + CPU-offloaded weights (else safetensors headers, else `config.json` shapes × dtype)"
    ),
    "llmb_model_parameters": "safetensors headers in the model dir",
    "llmb_model_layers": "HF `config.json`",
    "llmb_model_kv_bytes_per_token_estimated": "HF `config.json`",
    "llmb_model_kv_cache_bytes_estimated": "HF `config.json` × `max_total_num_tokens`",
    "llmb_model_weights_always_read_bytes": (
        "safetensors headers (all but `.experts.`, untied `embed_tokens`), else HF config × dtype"
    ),
    "llmb_model_weights_routed_experts_bytes": (
        "safetensors `mlp.experts.*`, else "
        "`num_experts`/`num_local_experts`/`n_routed_experts` × `moe_intermediate_size`"
    ),
    "llmb_model_experts": "HF `num_experts` / `num_local_experts` / `n_routed_experts`",
    "llmb_model_experts_used": "HF `num_experts_per_tok`",
    "llmb_model_token_embedding_row_bytes": (
        "`embed_tokens` row × dtype unless `tie_word_embeddings`"
    ),
    "llmb_model_prefill_flops_per_token": (
        "HF `config.json` shapes (experts at k/E; MLA `qk_*_head_dim`, `v_head_dim`)"
    ),
    "llmb_model_prefill_attention_flops_per_position": (
        "same (heads, head sizes, sliding-window layers)"
    ),
    "llmb_model_sliding_window_tokens": "same (`sliding_window`)",
    "llmb_model_kv_cache_type_info": (
        "`/server_info` `kv_cache_dtype` (`auto`: `dtype`, else `config.json` `torch_dtype`)"
    ),
}

# What each series comes from on SGLang 0.5.11 (54 families: no weight/KV memory or startup
# series, retractions only as a gauge) where it differs from the SGLang column;
# "" = the series is absent on 0.5.11. Series not listed come from the same source.
SOURCES_0_5_11: dict[str, str] = {
    "llmb_engine_kv_cache_used_tokens": "`sglang:kv_used_tokens`",
    "llmb_engine_kv_cache_usage_ratio": "max(`sglang:full_token_usage`, `swa_token_usage`)",
    "llmb_engine_kv_pressure_events_total": "",
    "llmb_engine_kv_cache_bytes": (
        "`/server_info` `internal_states[0].memory_usage.kvcache`, else log `KV Cache is "
        "allocated` K + V"
    ),
    "llmb_engine_model_buffer_bytes": (
        "`/server_info` `internal_states[0].memory_usage.weight`, else log `Load weight end … "
        "mem usage=` (gpu); `cpu_offload_gb` (cpu)"
    ),
    "llmb_engine_load_seconds": "",
    "llmb_model_weights_bytes": (
        "`memory_usage.weight` + `cpu_offload_gb` (else safetensors, else `config.json`)"
    ),
}

# The kind's columns of docs/metrics.md, the main one first.
COLUMNS: tuple[SourceColumn, ...] = (
    SourceColumn(SOURCES),
    SourceColumn(SOURCES_0_5_11, release="0.5.11"),
)
