# ruff: noqa: E501
"""Families of SGLang 0.5.23's `/metrics`, as its collectors declare them, one line a family.

Derived from tests/fixtures/sglang-0.5.23/metrics-busy.txt (rendered by SGLang's own
metric classes): name, type, HELP, label scope, extra label names, the label values a
family is pre-seeded with, histogram buckets, and whether the family only appears after
its first observation (`lazy`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

GAUGE, COUNTER, HISTOGRAM = "gauge", "counter", "histogram"


@dataclass(frozen=True)
class FamilySpec:
    """One metric family; `scope` is 'rank' (scheduler labels), 'model', 'cache' or 'none'."""

    name: str
    type: str
    help: str
    scope: str
    extra: tuple[str, ...]
    seeds: tuple[tuple[str, ...], ...]
    buckets: tuple[float, ...]
    lazy: bool = False


def _family(
    name: str,
    type_: str,
    help_: str,
    scope: str = "rank",
    labels: str = "",
    seeds: str = "",
    buckets: tuple[float, ...] = (),
    lazy: bool = False,
) -> FamilySpec:
    """A FamilySpec from the table's short form: label names space-separated, seeds as
    comma-separated rows of space-separated values (one value per label)."""
    extra = tuple(labels.split())
    rows = tuple(tuple(row.split()) for row in seeds.split(",")) if seeds else ()
    assert all(len(row) == len(extra) for row in rows), name
    return FamilySpec(name, type_, help_, scope, extra, rows, buckets, lazy)


# Histogram buckets, as SGLang's collectors declare them.
IMBALANCE_BUCKETS = (1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0)
SYNC_WAIT_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
)  # fmt: skip
STAGE_BUCKETS = tuple(0.001 * 1.62**i for i in range(30))  # exponential, factor 1.62
_QUEUE_TIME_TAIL = (
    0.1, 0.2, 0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0,
    90.0, 100.0, 200.0, 300.0, 400.0, 500.0, 600.0, 700.0, 800.0, 900.0, 1000.0, 1200.0, 1400.0,
    1600.0, 1800.0, 2000.0, 2500.0, 3000.0,
)  # fmt: skip
QUEUE_TIME_BUCKETS = (0.0, 0.001, 0.005, 0.01, 0.05, *_QUEUE_TIME_TAIL)
EVICTION_BUCKETS = (
    0.001, 0.002, 0.003, 0.004, 0.005, 0.006, 0.007, 0.008, 0.009, 0.01, 0.02, 0.03, 0.04, 0.05,
    0.1, 0.2, 0.5, 1.0,
)  # fmt: skip
TTFT_BUCKETS = (
    0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0,
    400.0,
)  # fmt: skip
E2E_BUCKETS = (*TTFT_BUCKETS, 600.0, 1200.0, 1800.0, 2400.0)
TPOT_BUCKETS = (
    0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.06, 0.08, 0.1, 0.2,
    0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0,
)  # fmt: skip
TOKEN_LENGTH_BUCKETS = (
    100.0, 300.0, 500.0, 700.0, 1000.0, 1500.0, 2000.0, 3000.0, 4000.0, 5000.0, 6000.0, 7000.0,
    8000.0, 9000.0, 10000.0, 12500.0, 15000.0, 17500.0, 20000.0, 22500.0, 25000.0, 27500.0,
    30000.0, 35000.0, 40000.0, 60000.0, 80000.0, 100000.0, 200000.0, 300000.0, 400000.0,
    600000.0, 800000.0, 1000000.0, 1100000.0,
)  # fmt: skip
# Label values several families are pre-seeded with.
GRAPH_PHASES = "prefill, decode, target_verify, draft_prefill, draft_decode, draft_extend"
ROUTING_KEY_RANGES = "0 1, 1 2, 2 3, 3 5, 5 7, 7 10, 10 20, 20 50, 50 100, 100 200, 200 +Inf"
ENDPOINTS = "/metrics GET, /v1/chat/completions POST, /health GET, /v1/models GET"
STREAMING = "true, false"

# In the server's output order.
# fmt: off
FAMILIES: tuple[FamilySpec, ...] = (
    _family("sglang:max_total_num_tokens", GAUGE, "Maximum total number of tokens in the KV cache pool."),
    _family("sglang:weight_memory_usage_gb", GAUGE, "Memory used by model weights in GB."),
    _family("sglang:kv_cache_memory_usage_gb", GAUGE, "Memory used by the KV cache pools in GB."),
    _family("sglang:graph_memory_usage_gb", GAUGE, "Memory used by captured device graphs in GB.", labels="phase", seeds=GRAPH_PHASES),
    _family("sglang:page_size", GAUGE, "KV cache page size in tokens."),
    _family("sglang:num_pages", GAUGE, "Number of KV cache pages."),
    _family("sglang:context_len", GAUGE, "Maximum context length."),
    _family("sglang:startup_available_gpu_memory_gb", GAUGE, "Available GPU memory in GB at startup."),
    _family("sglang:num_running_reqs", GAUGE, "The number of running requests."),
    _family("sglang:num_queue_reqs", GAUGE, "The number of requests in the waiting queue."),
    _family("sglang:num_grammar_queue_reqs", GAUGE, "The number of requests in the grammar waiting queue."),
    _family("sglang:gen_throughput", GAUGE, "The generation throughput (token/s)."),
    _family("sglang:cache_hit_rate", GAUGE, "The prefix cache hit rate."),
    _family("sglang:decode_sum_seq_lens", GAUGE, "The sum of all sequence lengths in decode."),
    _family("sglang:token_usage", GAUGE, "The token usage."),
    _family("sglang:full_token_usage", GAUGE, "The token usage for full attention layers."),
    _family("sglang:swa_token_usage", GAUGE, "The token usage for SWA layers."),
    _family("sglang:mamba_usage", GAUGE, "The token usage for Mamba layers."),
    _family("sglang:num_used_tokens", GAUGE, "The number of used tokens."),
    _family("sglang:kv_available_tokens", GAUGE, "Number of free token slots in the KV cache pool."),
    _family("sglang:kv_evictable_tokens", GAUGE, "Number of evictable (radix-cached) token slots in the KV cache pool."),
    _family("sglang:kv_used_tokens", GAUGE, "Number of actively used token slots in the KV cache pool."),
    _family("sglang:swa_available_tokens", GAUGE, "Number of free token slots in the SWA pool (hybrid-SWA only)."),
    _family("sglang:swa_evictable_tokens", GAUGE, "Number of evictable (radix-cached) token slots in the SWA pool."),
    _family("sglang:swa_used_tokens", GAUGE, "Number of actively used token slots in the SWA pool."),
    _family("sglang:mamba_available_tokens", GAUGE, "Number of free state slots in the mamba SSM pool (hybrid-SSM only)."),
    _family("sglang:mamba_evictable_tokens", GAUGE, "Number of evictable (radix-cached) state slots in the mamba SSM pool."),
    _family("sglang:mamba_used_tokens", GAUGE, "Number of actively used state slots in the mamba SSM pool."),
    _family("sglang:spec_accept_length", GAUGE, "Mean acceptance length of speculative decoding (accepted drafts + bonus token per forward)."),
    _family("sglang:spec_accept_rate", GAUGE, "Speculative acceptance rate (`accepted drafts / proposed drafts` in batch)."),
    _family("sglang:spec_cap_length", GAUGE, "Mean DSpark confidence-scheduled verify window per verify step, incl the bonus slot (0 when no cap is scheduled)."),
    _family("sglang:spec_block_accept_length", GAUGE, "Mean uncapped full-block accept length per verify step (accept + cap-trimmed drafts; exact only in DSpark cap-accept mode)."),
    _family("sglang:spec_num_steps", GAUGE, "Currently active speculative_num_steps."),
    _family("sglang:spec_num_draft_tokens", GAUGE, "Currently active speculative_num_draft_tokens (decouples from steps under topk>1)."),
    _family("sglang:num_prefill_bootstrap_queue_reqs", GAUGE, "The number of requests in the prefill bootstrap queue."),
    _family("sglang:num_prefill_inflight_queue_reqs", GAUGE, "The number of requests in the prefill inflight queue."),
    _family("sglang:num_decode_prealloc_queue_reqs", GAUGE, "The number of requests in the decode prealloc queue."),
    _family("sglang:num_decode_transfer_queue_reqs", GAUGE, "The number of requests in the decode transfer queue."),
    _family("sglang:num_decode_host_receive_queue_reqs", GAUGE, "Requests in the decode transfer queue receiving into host memory or waiting for device admission."),
    _family("sglang:num_decode_deferred_kv_release_reqs", GAUGE, "The number of failed decode requests whose KV allocations are held pending transfer drain acknowledgement or timeout."),
    _family("sglang:pending_prealloc_token_usage", GAUGE, "The token usage for pending preallocated tokens (not preallocated yet)."),
    _family("sglang:prealloc_full_token_usage", GAUGE, "Share of the full-attention KV pool held by decode requests whose KV transfer is pending (preallocated, not yet running); same capacity basis as sglang:full_token_usage."),
    _family("sglang:prealloc_swa_token_usage", GAUGE, "Share of the SWA KV pool held by decode requests whose KV transfer is pending; same capacity basis as sglang:swa_token_usage."),
    _family("sglang:utilization", GAUGE, "The utilization."),
    _family("sglang:fwd_occupancy", GAUGE, "Forward pass GPU occupancy percentage."),
    _family("sglang:new_token_ratio", GAUGE, "The new token ratio."),
    _family("sglang:is_cuda_graph", GAUGE, "Whether the batch is using CUDA graph."),
    _family("sglang:num_unique_running_routing_keys", GAUGE, "Number of unique routing keys in running batch."),
    _family("sglang:routing_key_running_req_count", GAUGE, "Distribution of routing keys by running request count (gt < count <= le).", labels="gt le", seeds=ROUTING_KEY_RANGES),
    _family("sglang:routing_key_all_req_count", GAUGE, "Distribution of routing keys by running+waiting request count (gt < count <= le).", labels="gt le", seeds=ROUTING_KEY_RANGES),
    _family("sglang:dp_attention_token_imbalance_ratio", HISTOGRAM, "Per MLP-sync step, max tokens over mean tokens across the DP ranks (1.0 = balanced, num_dp_ranks = one busy rank). Reported once per engine, by the scheduler of DP rank 0.", buckets=IMBALANCE_BUCKETS),
    _family("sglang:dp_attention_sync_wait_seconds", HISTOGRAM, "Wall time of this DP rank's scheduler MLP-sync all-gather per step. On the gloo path (the default with overlap scheduling) this is waiting for the slowest rank; on the device-group paths it also includes the gather's stream sync.", buckets=SYNC_WAIT_BUCKETS),
    _family("sglang:per_stage_req_latency_seconds", HISTOGRAM, "The latency of each stage of requests.", labels="stage", seeds="request_process, prefill_forward", buckets=STAGE_BUCKETS, lazy=True),
    _family("sglang:queue_time_seconds", HISTOGRAM, "Histogram of queueing time in seconds.", buckets=QUEUE_TIME_BUCKETS, lazy=True),
    _family("sglang:eviction_duration_seconds", HISTOGRAM, "End-to-end time of a device eviction pass in seconds; under --hicache-write-policy write_back this includes the blocking D->H backup (see sglang:hicache_backup_duration_seconds for the copy alone).", scope="cache", labels="cache_type dp_rank", seeds="UnifiedRadixCache 0", buckets=EVICTION_BUCKETS, lazy=True),
    _family("sglang:time_to_first_token_seconds", HISTOGRAM, "Histogram of time to first token in seconds.", scope="model", labels="is_streaming", seeds=STREAMING, buckets=TTFT_BUCKETS, lazy=True),
    _family("sglang:inter_token_latency_seconds", HISTOGRAM, "Histogram of inter-token latency in seconds.", scope="model", buckets=TPOT_BUCKETS, lazy=True),
    _family("sglang:e2e_request_latency_seconds", HISTOGRAM, "Histogram of End-to-end request latency in seconds", scope="model", labels="is_streaming", seeds=STREAMING, buckets=E2E_BUCKETS, lazy=True),
    _family("sglang:request_time_per_output_token_seconds", HISTOGRAM, "Per-request TPOT in seconds: (finished_time - first_token_time) / (completion_tokens - 1).", scope="model", labels="is_streaming", seeds=STREAMING, buckets=TPOT_BUCKETS, lazy=True),
    _family("sglang:prompt_tokens_histogram", HISTOGRAM, "Histogram of prompt token length.", scope="model", buckets=TOKEN_LENGTH_BUCKETS, lazy=True),
    _family("sglang:uncached_prompt_tokens_histogram", HISTOGRAM, "Histogram of uncached (compute) prompt token length.", scope="model", buckets=TOKEN_LENGTH_BUCKETS, lazy=True),
    _family("sglang:generation_tokens_histogram", HISTOGRAM, "Histogram of generation token length.", scope="model", buckets=TOKEN_LENGTH_BUCKETS, lazy=True),
    _family("sglang:process_cpu_seconds", COUNTER, "Total CPU time consumed by this process (user + system)", scope="none", labels="component", seeds="tokenizer, detokenizer"),
    _family("sglang:http_requests", COUNTER, "Total number of HTTP requests by endpoint and method", scope="none", labels="endpoint method", seeds=ENDPOINTS),
    _family("sglang:http_responses", COUNTER, "Total number of HTTP responses by endpoint and status code", scope="none", labels="endpoint method status_code", seeds="/metrics GET 200, /v1/chat/completions POST 200, /health GET 200, /v1/chat/completions POST 400, /v1/models GET 200", lazy=True),
    _family("sglang:prompt_tokens", COUNTER, "Number of prefill tokens processed.", scope="model", labels="is_streaming", seeds=STREAMING, lazy=True),
    _family("sglang:generation_tokens", COUNTER, "Number of generation tokens processed.", scope="model", labels="is_streaming", seeds=STREAMING, lazy=True),
    _family("sglang:cached_tokens", COUNTER, "Number of cached prompt tokens by source (device/host/storage).", scope="model", labels="cache_source", seeds="device", lazy=True),
    _family("sglang:num_requests", COUNTER, "Number of requests processed.", scope="model", labels="is_streaming", seeds=STREAMING, lazy=True),
    _family("sglang:num_aborted_requests", COUNTER, "Number of requests aborted.", scope="model", lazy=True),
    _family("sglang:startup_time_seconds", GAUGE, "Engine startup duration by phase in seconds.", scope="model", labels="phase", seeds="load_weight, kv_cache_allocation, scheduler_e2e, tokenizer_e2e"),
    _family("sglang:startup_cuda_graph_time_seconds", GAUGE, "CUDA graph capture duration by phase in seconds.", scope="model", labels="phase", seeds=GRAPH_PHASES),
    _family("sglang:num_retracted_reqs", GAUGE, "The number of retracted requests.", labels="pid", seeds="27069"),
    _family("sglang:num_paused_reqs", GAUGE, "The number of paused requests by async weight sync.", labels="pid", seeds="27069"),
    _family("sglang:prefill_effective_tokens", COUNTER, "Effective prefill tokens with retracted-request re-counts excluded, updated on each log interval. mode: device_hit, host_hit, storage_hit, input. Windowed prefix cache hit rate = rate(sum of *_hit) / rate(sum of all modes); per-tier rate uses a single *_hit mode in the numerator.", labels="mode", seeds="input, device_hit, host_hit, storage_hit"),
    _family("sglang:scheduler_idle_seconds", COUNTER, "Total wall time while the scheduler has no runnable or queued work."),
    _family("sglang:scheduler_process_cpu_seconds", COUNTER, "Total CPU time consumed by the scheduler process across all threads."),
    _family("sglang:scheduler_stage_seconds", COUNTER, "Total scheduler-loop wall time exclusively attributed to each stage. forward_overlap (full, partial, none): full=both endpoints active, partial=one, none=no observed overlap (including unavailable timing). Not exact overlapped/exposed seconds.", labels="category forward_overlap", seeds="other none, recv_requests none, process_input_requests none, get_next_batch_to_run none, process_queue none, run_batch none, process_batch_result none, sanity_check_cache none, idle none"),
    _family("sglang:dp_attention_tokens", COUNTER, "Tokens of MLP-sync steps on this DP rank. kind=scheduled: tokens this rank ran; kind=imbalance: tokens the busiest rank ran beyond this rank, i.e. capacity lost to DP imbalance on this rank. On speculative-decode steps the unit is batch rows (requests).", labels="kind", seeds="scheduled, imbalance"),
    _family("sglang:dp_attention_steps", COUNTER, "MLP-sync steps on this DP rank. rank_state=idle: this rank had no tokens and only ran to keep the DP collectives in lockstep.", labels="rank_state", seeds="active, idle"),
    _family("sglang:dp_attention_pairs", COUNTER, "Causal (query, key) pairs attended by MLP-sync steps on this DP rank, pricing every layer as full attention: a decode row reads its sequence, a prefill chunk its prefix plus the pairs within the chunk. kind=scheduled: this rank; kind=imbalance: the busiest rank's excess over this rank. The context-length counterpart of sglang:dp_attention_tokens_total; like it, speculative-decode steps count one query per row. Sliding-window layers execute fewer pairs than counted, so on hybrid-SWA models long rows are overstated.", labels="kind", seeds="scheduled, imbalance"),
    _family("sglang:cuda_graph_passes", COUNTER, "Total number of forward passes categorized by CUDA graph.", labels="mode", seeds="prefill_none, decode_cuda_graph", lazy=True),
    _family("sglang:realtime_tokens", COUNTER, "Total number of tokens processed (updated on each log interval). mode: prefill_compute, prefill_cache, decode.", labels="mode", seeds="prefill_compute, prefill_cache, decode", lazy=True),
    _family("sglang:num_retracted_requests", COUNTER, "Total number of retracted requests.", lazy=True),
    _family("sglang:num_retracted_input_tokens", COUNTER, "Total number of retracted input tokens.", lazy=True),
    _family("sglang:num_retracted_output_tokens", COUNTER, "Total number of retracted output tokens.", lazy=True),
    _family("sglang:evicted_tokens", COUNTER, "The number of device KV token slots freed by eviction, regardless of whether the data was backed up to host (see sglang:hicache_backup_tokens_total) or destroyed (see sglang:hicache_dropped_tokens_total).", scope="cache", labels="cache_type dp_rank", seeds="UnifiedRadixCache 0", lazy=True),
    _family("sglang:routing_keys_active", GAUGE, "Number of unique routing keys with active requests", scope="none"),
    _family("sglang:http_requests_active", GAUGE, "Number of currently active HTTP requests", scope="none", labels="endpoint method", seeds=ENDPOINTS),
)
# fmt: on


# -- Versions -------------------------------------------------------------------------------------
# The simulator answers as one SGLang release. 0.5.23 is FAMILIES above; 0.5.11 is what the real
# 0.5.11 server wrote (tests/fixtures/sglang-0.5.11-cpu/ on the CPU, sglang-0.5.11-h200/ on the
# H200): 0.5.23's families less ABSENT_IN_0_5_11, plus ONLY_IN_0_5_11, with the label and bucket
# changes below. tests/integration/test_sim_sglang_fidelity.py holds each version to its captures.
# Lazy families are alike in both: 0.5.11 too declares `num_retracted_requests_total` (and the
# retracted token counters) and `num_aborted_requests_total`, which appear after the first
# retraction or abort (tests/system/test_sglang_real.py sees the retraction counter on the real server).
# Its `evicted_tokens`/`eviction_duration_seconds` exist only as HiCache's GPU-to-CPU series.
DEFAULT_VERSION = "0.5.23"

ABSENT_IN_0_5_11 = frozenset(
    {
        "sglang:dp_attention_pairs",
        "sglang:dp_attention_steps",
        "sglang:dp_attention_sync_wait_seconds",
        "sglang:dp_attention_token_imbalance_ratio",
        "sglang:dp_attention_tokens",
        "sglang:evicted_tokens",
        "sglang:eviction_duration_seconds",
        "sglang:fwd_occupancy",
        "sglang:graph_memory_usage_gb",
        "sglang:kv_cache_memory_usage_gb",
        "sglang:mamba_available_tokens",
        "sglang:mamba_evictable_tokens",
        "sglang:mamba_used_tokens",
        "sglang:num_decode_deferred_kv_release_reqs",
        "sglang:num_decode_host_receive_queue_reqs",
        "sglang:num_prefill_bootstrap_queue_reqs",
        "sglang:prealloc_full_token_usage",
        "sglang:prealloc_swa_token_usage",
        "sglang:prefill_effective_tokens",
        "sglang:request_time_per_output_token_seconds",
        "sglang:scheduler_idle_seconds",
        "sglang:scheduler_process_cpu_seconds",
        "sglang:scheduler_stage_seconds",
        "sglang:spec_block_accept_length",
        "sglang:spec_cap_length",
        "sglang:spec_num_draft_tokens",
        "sglang:spec_num_steps",
        "sglang:startup_cuda_graph_time_seconds",
        "sglang:startup_time_seconds",
        "sglang:swa_available_tokens",
        "sglang:swa_evictable_tokens",
        "sglang:swa_used_tokens",
        "sglang:uncached_prompt_tokens_histogram",
        "sglang:weight_memory_usage_gb",
    }
)
# (family, the 0.5.23 family it comes right before)
ONLY_IN_0_5_11: tuple[tuple[FamilySpec, str], ...] = (
    (_family("sglang:engine_startup_time", GAUGE, "The time taken for the engine to start up."), "sglang:page_size"),
    (_family("sglang:engine_load_weights_time", GAUGE, "The time taken for the engine to load weights."), "sglang:page_size"),
    (_family("sglang:num_prefill_prealloc_queue_reqs", GAUGE, "The number of requests in the prefill prealloc queue."), "sglang:num_prefill_inflight_queue_reqs"),
)  # fmt: skip
# 0.5.11's request counters and latency histograms have no `is_streaming` label.
NO_STREAMING_LABEL_IN_0_5_11 = frozenset(
    {
        "sglang:e2e_request_latency_seconds",
        "sglang:generation_tokens",
        "sglang:num_requests",
        "sglang:prompt_tokens",
        "sglang:time_to_first_token_seconds",
    }
)
# 0.5.11's queue-time buckets start 0, 0.1 (the ms-scale bounds came later).
QUEUE_TIME_BUCKETS_0_5_11 = (0.0, *_QUEUE_TIME_TAIL)


def _as_0_5_11(spec: FamilySpec) -> FamilySpec:
    if spec.name in NO_STREAMING_LABEL_IN_0_5_11:
        keep = [i for i, name in enumerate(spec.extra) if name != "is_streaming"]
        seeds = tuple(dict.fromkeys(tuple(s[i] for i in keep) for s in spec.seeds))
        return replace(spec, extra=tuple(spec.extra[i] for i in keep), seeds=seeds)
    if spec.name == "sglang:queue_time_seconds":
        return replace(spec, buckets=QUEUE_TIME_BUCKETS_0_5_11)
    return spec


def _families_0_5_11() -> tuple[FamilySpec, ...]:
    before: dict[str, list[FamilySpec]] = {}
    for spec, anchor in ONLY_IN_0_5_11:
        before.setdefault(anchor, []).append(spec)
    out: list[FamilySpec] = []
    for spec in FAMILIES:
        out.extend(before.get(spec.name, ()))
        if spec.name not in ABSENT_IN_0_5_11:
            out.append(_as_0_5_11(spec))
    return tuple(out)


FAMILIES_BY_VERSION: dict[str, tuple[FamilySpec, ...]] = {
    "0.5.23": FAMILIES,
    "0.5.11": _families_0_5_11(),
}
VERSIONS = tuple(FAMILIES_BY_VERSION)
