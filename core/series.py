"""Every `llmb_*` series name, spelled once.

The exporter's families (`exporter/schema.py` gives each its type, help and labels), the
load generator's live `/metrics` and diagnose's phase marks. Everything else (the rules'
arithmetic in `core`, the collectors, loadgen, diagnose, the mixin's PromQL, the tools)
imports the name from here; `tests/unit/test_series_names.py` fails when a name is
spelled anywhere else. The names are contracts: never rename one.

Importers write `from core import series as llmb` and `llmb.ENGINE_UP`: the `llmb.` reads
as the `llmb_` it stands for, and `series` is a common local name in the readers.

Each constant is the name as Prometheus stores it (a counter with `_total`, an info with
`_info`); a histogram's `_bucket`, `_sum` and `_count` are the family name plus the suffix.
Recording-rule names (`engine:llmb_...:...`) are not here: they are generated beside their
expressions (`core/signals.py` and the mixin's rule modules).
"""

from __future__ import annotations

# --- The GPU (NVML collector), the card's own state included -----------------------------------
GPU_INFO = "llmb_gpu_info"
GPU_MEMORY_TOTAL_BYTES = "llmb_gpu_memory_total_bytes"
GPU_MEMORY_USED_BYTES = "llmb_gpu_memory_used_bytes"
GPU_MEMORY_FREE_BYTES = "llmb_gpu_memory_free_bytes"
GPU_MEMORY_RESERVED_BYTES = "llmb_gpu_memory_reserved_bytes"
GPU_MEMORY_USED_PEAK_BYTES = "llmb_gpu_memory_used_peak_bytes"
GPU_UTILIZATION_RATIO = "llmb_gpu_utilization_ratio"
GPU_MEMORY_CLOCK_HERTZ = "llmb_gpu_memory_clock_hertz"
GPU_MEMORY_BUS_WIDTH_BYTES = "llmb_gpu_memory_bus_width_bytes"
GPU_MEMORY_BANDWIDTH_BYTES_PER_SECOND = "llmb_gpu_memory_bandwidth_bytes_per_second"
GPU_PEAK_FLOPS = "llmb_gpu_peak_flops"
GPU_PROCESS_MEMORY_USED_BYTES = "llmb_gpu_process_memory_used_bytes"
GPU_PROCESS_MEMORY_USED_PEAK_BYTES = "llmb_gpu_process_memory_used_peak_bytes"
GPU_SAMPLES_TOTAL = "llmb_gpu_samples_total"
GPU_MEMORY_CLOCK_MAX_HERTZ = "llmb_gpu_memory_clock_max_hertz"
GPU_SM_CLOCK_HERTZ = "llmb_gpu_sm_clock_hertz"
GPU_SM_CLOCK_MAX_HERTZ = "llmb_gpu_sm_clock_max_hertz"
GPU_POWER_WATTS = "llmb_gpu_power_watts"
GPU_SM_CLOCK_BUSY_HERTZ = "llmb_gpu_sm_clock_busy_hertz"
GPU_POWER_LIMIT_WATTS = "llmb_gpu_power_limit_watts"
GPU_POWER_LIMIT_DEFAULT_WATTS = "llmb_gpu_power_limit_default_watts"
GPU_POWER_LIMIT_MAX_WATTS = "llmb_gpu_power_limit_max_watts"
GPU_TEMPERATURE_CELSIUS = "llmb_gpu_temperature_celsius"
GPU_CLOCK_EVENT_REASON_ACTIVE = "llmb_gpu_clock_event_reason_active"

# --- An engine: identity, health, load, KV cache, counters, histograms, memory, log facts ------
ENGINE_UP = "llmb_engine_up"
ENGINE_LOADING = "llmb_engine_loading"
ENGINE_INFO = "llmb_engine_info"
ENGINE_RESTARTS_TOTAL = "llmb_engine_restarts_total"
ENGINE_ENDPOINT_ENABLED = "llmb_engine_endpoint_enabled"
ENGINE_REQUESTS_RUNNING = "llmb_engine_requests_running"
ENGINE_REQUESTS_WAITING = "llmb_engine_requests_waiting"
ENGINE_SLOTS = "llmb_engine_slots"
ENGINE_CONTEXT_TOKENS = "llmb_engine_context_tokens"
ENGINE_KV_CACHE_CAPACITY_TOKENS = "llmb_engine_kv_cache_capacity_tokens"
ENGINE_KV_CACHE_USED_TOKENS = "llmb_engine_kv_cache_used_tokens"
ENGINE_KV_CACHE_USAGE_RATIO = "llmb_engine_kv_cache_usage_ratio"
ENGINE_SLOT_CONTEXT_USAGE_MAX_RATIO = "llmb_engine_slot_context_usage_max_ratio"
ENGINE_KV_PRESSURE_EVENTS_TOTAL = "llmb_engine_kv_pressure_events_total"
ENGINE_KV_CACHE_BYTES = "llmb_engine_kv_cache_bytes"
ENGINE_PROMPT_TOKENS_TOTAL = "llmb_engine_prompt_tokens_total"
ENGINE_PROMPT_TOKENS_CACHED_TOTAL = "llmb_engine_prompt_tokens_cached_total"
ENGINE_PROMPT_SECONDS_TOTAL = "llmb_engine_prompt_seconds_total"
ENGINE_PREFILL_BUSY_SECONDS_TOTAL = "llmb_engine_prefill_busy_seconds_total"
ENGINE_GENERATION_TOKENS_TOTAL = "llmb_engine_generation_tokens_total"
ENGINE_DECODE_TOKENS_TOTAL = "llmb_engine_decode_tokens_total"
ENGINE_DECODE_SECONDS_TOTAL = "llmb_engine_decode_seconds_total"
ENGINE_REQUESTS_FINISHED_TOTAL = "llmb_engine_requests_finished_total"
ENGINE_DECODE_STEPS_TOTAL = "llmb_engine_decode_steps_total"
ENGINE_TIME_TO_FIRST_TOKEN_SECONDS = "llmb_engine_time_to_first_token_seconds"
ENGINE_INTER_TOKEN_LATENCY_SECONDS = "llmb_engine_inter_token_latency_seconds"
ENGINE_QUEUE_TIME_SECONDS = "llmb_engine_queue_time_seconds"
ENGINE_E2E_REQUEST_LATENCY_SECONDS = "llmb_engine_e2e_request_latency_seconds"
ENGINE_REQUEST_PROMPT_TOKENS = "llmb_engine_request_prompt_tokens"
ENGINE_REQUEST_GENERATION_TOKENS = "llmb_engine_request_generation_tokens"
ENGINE_PROCESS_GPU_MEMORY_BYTES = "llmb_engine_process_gpu_memory_bytes"
ENGINE_PROCESS_GPU_MEMORY_PEAK_BYTES = "llmb_engine_process_gpu_memory_peak_bytes"
ENGINE_MODEL_BUFFER_BYTES = "llmb_engine_model_buffer_bytes"
ENGINE_GPU_LAYERS_OFFLOADED = "llmb_engine_gpu_layers_offloaded"
ENGINE_GPU_LAYERS_TOTAL = "llmb_engine_gpu_layers_total"
ENGINE_LOAD_SECONDS = "llmb_engine_load_seconds"
ENGINE_EXPERTS_HOST_LAYERS = "llmb_engine_experts_host_layers"
ENGINE_EXPERTS_HOST_BYTES = "llmb_engine_experts_host_bytes"
ENGINE_SPEC_ACCEPT_LENGTH = "llmb_engine_spec_accept_length"

# --- The model: size, structure, KV bytes ------------------------------------------------------
MODEL_WEIGHTS_BYTES = "llmb_model_weights_bytes"
MODEL_PARAMETERS = "llmb_model_parameters"
MODEL_LAYERS = "llmb_model_layers"
MODEL_KV_BYTES_PER_TOKEN_ESTIMATED = "llmb_model_kv_bytes_per_token_estimated"
MODEL_KV_CACHE_BYTES_ESTIMATED = "llmb_model_kv_cache_bytes_estimated"
MODEL_WEIGHTS_ALWAYS_READ_BYTES = "llmb_model_weights_always_read_bytes"
MODEL_WEIGHTS_ROUTED_EXPERTS_BYTES = "llmb_model_weights_routed_experts_bytes"
MODEL_EXPERTS = "llmb_model_experts"
MODEL_EXPERTS_USED = "llmb_model_experts_used"
MODEL_TOKEN_EMBEDDING_ROW_BYTES = "llmb_model_token_embedding_row_bytes"
MODEL_PREFILL_FLOPS_PER_TOKEN = "llmb_model_prefill_flops_per_token"
MODEL_PREFILL_ATTENTION_FLOPS_PER_POSITION = "llmb_model_prefill_attention_flops_per_position"
MODEL_SLIDING_WINDOW_TOKENS = "llmb_model_sliding_window_tokens"
MODEL_KV_CACHE_TYPE_INFO = "llmb_model_kv_cache_type_info"
MODEL_DRAFT_WEIGHTS_BYTES = "llmb_model_draft_weights_bytes"

# --- The exporter's own: the host, each source's scrape, the build -----------------------------
HOST_MEMORY_BANDWIDTH_BYTES_PER_SECOND = "llmb_host_memory_bandwidth_bytes_per_second"
SOURCE_UP = "llmb_source_up"
SOURCE_DURATION_SECONDS = "llmb_source_duration_seconds"
SOURCE_ERRORS_TOTAL = "llmb_source_errors_total"
EXPORTER_BUILD_INFO = "llmb_exporter_build_info"

# --- The load generator's live `/metrics` (`llmb-loadgen run --metrics-port`) ------------
LOADGEN_TIME_TO_FIRST_TOKEN_SECONDS = "llmb_loadgen_time_to_first_token_seconds"
LOADGEN_INTER_TOKEN_LATENCY_SECONDS = "llmb_loadgen_inter_token_latency_seconds"
LOADGEN_E2E_REQUEST_LATENCY_SECONDS = "llmb_loadgen_e2e_request_latency_seconds"
LOADGEN_REQUESTS_IN_FLIGHT = "llmb_loadgen_requests_in_flight"
LOADGEN_REQUESTS_TOTAL = "llmb_loadgen_requests_total"
LOADGEN_COMPLETION_TOKENS_TOTAL = "llmb_loadgen_completion_tokens_total"
LOADGEN_PROMPT_TOKENS_TOTAL = "llmb_loadgen_prompt_tokens_total"
LOADGEN_EARLY_STOP_REQUESTS_TOTAL = "llmb_loadgen_early_stop_requests_total"
LOADGEN_STEP_INFO = "llmb_loadgen_step_info"
LOADGEN_STEP_START_TIMESTAMP_SECONDS = "llmb_loadgen_step_start_timestamp_seconds"
LOADGEN_TOKEN_COUNT_MISMATCH = "llmb_loadgen_token_count_mismatch"
LOADGEN_GOODPUT_REQUESTS_TOTAL = "llmb_loadgen_goodput_requests_total"
LOADGEN_GOODPUT_COMPLETION_TOKENS_TOTAL = "llmb_loadgen_goodput_completion_tokens_total"
LOADGEN_SLO_INFO = "llmb_loadgen_slo_info"

# --- diagnose's phase marks (`diagnose/phase_marks.py`) ------------------------------------
LOADGEN_PHASE_INFO = "llmb_loadgen_phase_info"
LOADGEN_PHASE_START_TIMESTAMP_SECONDS = "llmb_loadgen_phase_start_timestamp_seconds"

# --- Groups -----------------------------------------------------------------------------------
# Every name's namespace (what the exporter's own page is read by).
PREFIX = "llmb_"
# The NVML collector's families: one source on every engine (docs/metrics.md).
NVML_PREFIX = "llmb_gpu_"
# The exporter's own families, read by no engine collector.
EXPORTER_OWN = (
    HOST_MEMORY_BANDWIDTH_BYTES_PER_SECOND,
    SOURCE_UP,
    SOURCE_DURATION_SECONDS,
    SOURCE_ERRORS_TOTAL,
    EXPORTER_BUILD_INFO,
)

# --- Fields read from series -------------------------------------------------------------
# A field -> the series it is read from: the one map. core's `ModelStructure` and diagnose's
# `EngineResult` name a field the same where it is the same fact, so the rules' structure,
# diagnose's facts and diagnose's readings-as-samples each take the fields they hold from it
# (`field_series`).
FIELD_SERIES: dict[str, str] = {
    # The model's size and structure (`ModelStructure`).
    "weights_bytes": MODEL_WEIGHTS_BYTES,
    "always_read_bytes": MODEL_WEIGHTS_ALWAYS_READ_BYTES,
    "routed_expert_bytes": MODEL_WEIGHTS_ROUTED_EXPERTS_BYTES,
    "experts": MODEL_EXPERTS,
    "experts_used": MODEL_EXPERTS_USED,
    "token_embedding_row_bytes": MODEL_TOKEN_EMBEDDING_ROW_BYTES,
    "draft_weights_bytes": MODEL_DRAFT_WEIGHTS_BYTES,
    # What diagnose reports beside them.
    "spec_accept_length": ENGINE_SPEC_ACCEPT_LENGTH,
    "experts_host_layers": ENGINE_EXPERTS_HOST_LAYERS,
    "experts_host_bytes": ENGINE_EXPERTS_HOST_BYTES,
    "kv_bytes_per_token": MODEL_KV_BYTES_PER_TOKEN_ESTIMATED,
    "parameters": MODEL_PARAMETERS,
    "process_gpu_bytes": ENGINE_PROCESS_GPU_MEMORY_BYTES,
    "layers_offloaded": ENGINE_GPU_LAYERS_OFFLOADED,
    "layers_total": ENGINE_GPU_LAYERS_TOTAL,
}


def field_series(*fields: str) -> dict[str, str]:
    """`FIELD_SERIES` for these fields, in their order (a `KeyError` names a missing one)."""
    return {f: FIELD_SERIES[f] for f in fields}
