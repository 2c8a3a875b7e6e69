"""Where each `llmb_*` series comes from on llama.cpp: the llama.cpp column of docs/metrics.md.

Named by its row in config/kinds.py (`sources`: `COLUMNS`); `python -m exporter.metrics_doc`
renders the table. A series not listed is absent on llama.cpp.
"""

from __future__ import annotations

from core import series as llmb
from exporter.collectors.sources import SourceColumn

SOURCES: dict[str, str] = {
    llmb.ENGINE_UP: "`/health` 200",
    llmb.ENGINE_LOADING: "`/health` 503 `Loading model`",
    llmb.ENGINE_INFO: "`/v1/models` id, `/props` build_info, `meta.ftype`",
    llmb.ENGINE_RESTARTS_TOTAL: (
        "unreachable in between, or `/props` build/model/`n_ctx`/`total_slots` changed, or a "
        "new process in the log"
    ),
    llmb.ENGINE_ENDPOINT_ENABLED: "`/metrics`, `/slots` 501 → 0",
    llmb.ENGINE_REQUESTS_RUNNING: "`llamacpp:requests_processing`",
    llmb.ENGINE_REQUESTS_WAITING: "`llamacpp:requests_deferred`",
    llmb.ENGINE_SLOTS: "`/slots` length (`-np`)",
    llmb.ENGINE_CONTEXT_TOKENS: "`/slots` `n_ctx` (per slot)",
    llmb.ENGINE_KV_CACHE_CAPACITY_TOKENS: "slot `n_ctx` × slots (unified KV: one pool)",
    llmb.ENGINE_KV_CACHE_USED_TOKENS: (
        "Σ `n_prompt_tokens` of processing slots (old builds: `kv_cache_tokens`)"
    ),
    llmb.ENGINE_KV_CACHE_USAGE_RATIO: "used / capacity (old builds: `kv_cache_usage_ratio`)",
    llmb.ENGINE_SLOT_CONTEXT_USAGE_MAX_RATIO: "`/slots` max `n_prompt_tokens/n_ctx`",
    llmb.ENGINE_KV_PRESSURE_EVENTS_TOTAL: (
        "log: KV full, context exceeded, context shift, `truncated = 1`"
    ),
    llmb.ENGINE_KV_CACHE_BYTES: "log `KV buffer size` (-lv 4)",
    llmb.ENGINE_PROMPT_TOKENS_TOTAL: "`prompt_tokens_total` + `prompt_tokens_cached_total`",
    llmb.ENGINE_PROMPT_TOKENS_CACHED_TOTAL: "`llamacpp:prompt_tokens_cached_total`",
    llmb.ENGINE_PROMPT_SECONDS_TOTAL: (
        "log `prompt eval time` summed per request (absent without a log: llama.cpp's "
        "`prompt_seconds_total` times each prompt batch once)"
    ),
    llmb.ENGINE_PREFILL_BUSY_SECONDS_TOTAL: (
        "log: union of the requests' `prompt eval time` spans (without a log: "
        "`prompt_seconds_total`, timed per prompt batch)"
    ),
    llmb.ENGINE_GENERATION_TOKENS_TOTAL: "`llamacpp:tokens_predicted_total` (or log)",
    llmb.ENGINE_DECODE_TOKENS_TOTAL: (
        "log `eval time` tokens − 1 per request (without a log: `tokens_predicted_total`)"
    ),
    llmb.ENGINE_DECODE_SECONDS_TOTAL: (
        "log `eval time` (without a log: `tokens_predicted_seconds_total`)"
    ),
    llmb.ENGINE_REQUESTS_FINISHED_TOTAL: "log `release` lines",
    llmb.ENGINE_DECODE_STEPS_TOTAL: "`llamacpp:n_decode_total`",
    llmb.ENGINE_PROCESS_GPU_MEMORY_BYTES: "NVML processes attributed to the engine",
    llmb.ENGINE_PROCESS_GPU_MEMORY_PEAK_BYTES: "NVML background sampler",
    llmb.ENGINE_MODEL_BUFFER_BYTES: "log `model buffer size` per device (-lv 4)",
    llmb.ENGINE_GPU_LAYERS_OFFLOADED: "log `offloaded N/M layers to GPU` (-lv 4)",
    llmb.ENGINE_GPU_LAYERS_TOTAL: "log `offloaded N/M layers to GPU` (-lv 4)",
    llmb.ENGINE_LOAD_SECONDS: "log `loading model` → `model loaded`",
    llmb.ENGINE_EXPERTS_HOST_LAYERS: (
        "log `tensor blk.N.ffn_*_exps.weight (...) buffer type overridden to CPU` (-lv 5), "
        "else host model buffers − token embedding (-lv 4) over per-layer expert bytes"
    ),
    llmb.ENGINE_EXPERTS_HOST_BYTES: (
        "expert bytes of those layers (GGUF tensor infos; else the override lines' MiB)"
    ),
    llmb.ENGINE_SPEC_ACCEPT_LENGTH: (
        "log `draft acceptance rate = R (A accepted / G generated)` with the request's `eval "
        "time` tokens: Σ(n−1) / (Σ(n−1) − ΣA); else `spec_decode_num_accepted_tokens_total` / "
        "`spec_decode_num_drafts_total` + 1"
    ),
    llmb.MODEL_WEIGHTS_BYTES: "`/v1/models` `meta.size`",
    llmb.MODEL_PARAMETERS: "`/v1/models` `meta.n_params`",
    llmb.MODEL_LAYERS: "GGUF header (or log)",
    llmb.MODEL_KV_BYTES_PER_TOKEN_ESTIMATED: "GGUF header",
    llmb.MODEL_KV_CACHE_BYTES_ESTIMATED: "GGUF header + slots × n_ctx (SWA layers capped)",
    llmb.MODEL_WEIGHTS_ALWAYS_READ_BYTES: (
        "GGUF tensor infos: all but `*_exps` and an untied `token_embd.weight`"
    ),
    llmb.MODEL_WEIGHTS_ROUTED_EXPERTS_BYTES: "GGUF tensor infos `blk.N.ffn_*_exps.*`",
    llmb.MODEL_EXPERTS: "GGUF `{arch}.expert_count`",
    llmb.MODEL_EXPERTS_USED: "GGUF `{arch}.expert_used_count`",
    llmb.MODEL_TOKEN_EMBEDDING_ROW_BYTES: (
        "GGUF `token_embd.weight` bytes / rows when `output.weight` exists"
    ),
    llmb.MODEL_PREFILL_FLOPS_PER_TOKEN: (
        "GGUF tensor infos (`blk.N.*` matrices; `*_exps` at k/E) and `{arch}.attention.*` keys"
    ),
    llmb.MODEL_PREFILL_ATTENTION_FLOPS_PER_POSITION: (
        "same (heads, head sizes, sliding-window layers)"
    ),
    llmb.MODEL_SLIDING_WINDOW_TOKENS: "same (`sliding_window`)",
    llmb.MODEL_KV_CACHE_TYPE_INFO: (
        "log `llama_kv_cache: size = … K (q8_0): …, V (q8_0): …` (-lv 4)"
    ),
    llmb.MODEL_DRAFT_WEIGHTS_BYTES: "log: model buffers of the second (draft) model load (-lv 4)",
}

# The kind's columns of docs/metrics.md, the main one first.
COLUMNS: tuple[SourceColumn, ...] = (SourceColumn(SOURCES),)
