"""Where each `llmb_*` series comes from on SGLang: the SGLang columns of docs/metrics.md.

Named by its row in config/kinds.py (`sources`: `COLUMNS`); `python -m exporter.metrics_doc`
renders the table. A series not listed in SOURCES is absent on SGLang.
"""

from __future__ import annotations

from core import series as llmb
from exporter.collectors.sources import SourceColumn

SOURCES: dict[str, str] = {
    llmb.ENGINE_UP: "`/metrics` answered, else `/v1/models` 2xx, else `/health` 2xx",
    llmb.ENGINE_LOADING: (
        "`/health` 503 (asked in the background for each new instance until its first other "
        "answer, and when `/metrics` and `/v1/models` fail; while `/server_info` has not "
        "answered yet, also no answer within 0.4 s)"
    ),
    llmb.ENGINE_INFO: "`/server_info` version, dtype/quantization",
    llmb.ENGINE_RESTARTS_TOTAL: (
        "unreachable in between, or `/server_info` start arguments changed"
    ),
    llmb.ENGINE_REQUESTS_RUNNING: "`sglang:num_running_reqs`",
    llmb.ENGINE_REQUESTS_WAITING: "`sglang:num_queue_reqs`",
    llmb.ENGINE_SLOTS: (
        "`/server_info` `internal_states[].effective_max_running_requests_per_dp` (Σ DP)"
    ),
    llmb.ENGINE_CONTEXT_TOKENS: "`sglang:context_len`, else `/v1/models` `max_model_len`",
    llmb.ENGINE_KV_CACHE_CAPACITY_TOKENS: "`sglang:max_total_num_tokens`",
    llmb.ENGINE_KV_CACHE_USED_TOKENS: "`sglang:kv_used_tokens` / `num_used_tokens`",
    llmb.ENGINE_KV_CACHE_USAGE_RATIO: (
        "max(`sglang:full_token_usage`, `swa_token_usage`) (unrounded), else `token_usage`"
    ),
    llmb.ENGINE_KV_PRESSURE_EVENTS_TOTAL: (
        "`sglang:num_retracted_requests_total` (event=retracted; 0 while only declared)"
    ),
    llmb.ENGINE_KV_CACHE_BYTES: (
        "`sglang:kv_cache_memory_usage_gb` × 2^30, else `/server_info` "
        "`internal_states[0].memory_usage.kvcache`, else log `KV Cache is allocated` K + V"
    ),
    llmb.ENGINE_PROMPT_TOKENS_TOTAL: "`sglang:prompt_tokens_total`",
    llmb.ENGINE_PROMPT_TOKENS_CACHED_TOTAL: "`sglang:cached_tokens_total`",
    llmb.ENGINE_GENERATION_TOKENS_TOTAL: "`sglang:generation_tokens_total`",
    llmb.ENGINE_DECODE_TOKENS_TOTAL: "`sglang:inter_token_latency_seconds_count`",
    llmb.ENGINE_DECODE_SECONDS_TOTAL: "`sglang:inter_token_latency_seconds_sum`",
    llmb.ENGINE_PROMPT_SECONDS_TOTAL: (
        "`sglang:time_to_first_token_seconds_sum` - `sglang:queue_time_seconds_sum` (held "
        "monotonic)"
    ),
    llmb.ENGINE_REQUESTS_FINISHED_TOTAL: "`sglang:num_requests_total`",
    llmb.ENGINE_TIME_TO_FIRST_TOKEN_SECONDS: "`sglang:time_to_first_token_seconds`",
    llmb.ENGINE_INTER_TOKEN_LATENCY_SECONDS: "`sglang:inter_token_latency_seconds`",
    llmb.ENGINE_QUEUE_TIME_SECONDS: "`sglang:queue_time_seconds`",
    llmb.ENGINE_E2E_REQUEST_LATENCY_SECONDS: "`sglang:e2e_request_latency_seconds`",
    llmb.ENGINE_REQUEST_PROMPT_TOKENS: "`sglang:prompt_tokens_histogram`",
    llmb.ENGINE_REQUEST_GENERATION_TOKENS: "`sglang:generation_tokens_histogram`",
    llmb.ENGINE_PROCESS_GPU_MEMORY_BYTES: "same",
    llmb.ENGINE_PROCESS_GPU_MEMORY_PEAK_BYTES: "same",
    llmb.ENGINE_MODEL_BUFFER_BYTES: (
        "`sglang:weight_memory_usage_gb` × 2^30, else `/server_info` "
        "`internal_states[0].memory_usage.weight`, else log `Load weight end … mem usage=` "
        "(gpu); `/server_info` `cpu_offload_gb` (cpu)"
    ),
    llmb.ENGINE_LOAD_SECONDS: "`sglang:startup_time_seconds{phase=load_weight}`",
    llmb.ENGINE_SPEC_ACCEPT_LENGTH: "`sglang:spec_accept_length`",
    llmb.MODEL_WEIGHTS_BYTES: (
        "GPU + CPU-offloaded weights (else safetensors headers, else `config.json` shapes × dtype)"
    ),
    llmb.MODEL_PARAMETERS: "safetensors headers in the model dir",
    llmb.MODEL_LAYERS: "HF `config.json`",
    llmb.MODEL_KV_BYTES_PER_TOKEN_ESTIMATED: "HF `config.json`",
    llmb.MODEL_KV_CACHE_BYTES_ESTIMATED: "HF `config.json` × `max_total_num_tokens`",
    llmb.MODEL_WEIGHTS_ALWAYS_READ_BYTES: (
        "safetensors headers (all but `.experts.`, untied `embed_tokens`), else HF config × dtype"
    ),
    llmb.MODEL_WEIGHTS_ROUTED_EXPERTS_BYTES: (
        "safetensors `mlp.experts.*`, else "
        "`num_experts`/`num_local_experts`/`n_routed_experts` × `moe_intermediate_size`"
    ),
    llmb.MODEL_EXPERTS: "HF `num_experts` / `num_local_experts` / `n_routed_experts`",
    llmb.MODEL_EXPERTS_USED: "HF `num_experts_per_tok`",
    llmb.MODEL_TOKEN_EMBEDDING_ROW_BYTES: (
        "`embed_tokens` row × dtype unless `tie_word_embeddings`"
    ),
    llmb.MODEL_PREFILL_FLOPS_PER_TOKEN: (
        "HF `config.json` shapes (experts at k/E; MLA `qk_*_head_dim`, `v_head_dim`)"
    ),
    llmb.MODEL_PREFILL_ATTENTION_FLOPS_PER_POSITION: (
        "same (heads, head sizes, sliding-window layers)"
    ),
    llmb.MODEL_SLIDING_WINDOW_TOKENS: "same (`sliding_window`)",
    llmb.MODEL_KV_CACHE_TYPE_INFO: (
        "`/server_info` `kv_cache_dtype` (`auto`: `dtype`, else `config.json` `torch_dtype`)"
    ),
}

# What each series comes from on SGLang 0.5.11 (54 families: no weight/KV memory or startup
# series, retractions only as a gauge) where it differs from the SGLang column;
# "" = the series is absent on 0.5.11. Series not listed come from the same source.
SOURCES_0_5_11: dict[str, str] = {
    llmb.ENGINE_KV_CACHE_USED_TOKENS: "`sglang:kv_used_tokens`",
    llmb.ENGINE_KV_CACHE_USAGE_RATIO: "max(`sglang:full_token_usage`, `swa_token_usage`)",
    llmb.ENGINE_KV_PRESSURE_EVENTS_TOTAL: "",
    llmb.ENGINE_KV_CACHE_BYTES: (
        "`/server_info` `internal_states[0].memory_usage.kvcache`, else log `KV Cache is "
        "allocated` K + V"
    ),
    llmb.ENGINE_MODEL_BUFFER_BYTES: (
        "`/server_info` `internal_states[0].memory_usage.weight`, else log `Load weight end … "
        "mem usage=` (gpu); `cpu_offload_gb` (cpu)"
    ),
    llmb.ENGINE_LOAD_SECONDS: "",
    llmb.MODEL_WEIGHTS_BYTES: (
        "`memory_usage.weight` + `cpu_offload_gb` (else safetensors, else `config.json`)"
    ),
}

# The kind's columns of docs/metrics.md, the main one first.
COLUMNS: tuple[SourceColumn, ...] = (
    SourceColumn(SOURCES),
    SourceColumn(SOURCES_0_5_11, release="0.5.11"),
)
