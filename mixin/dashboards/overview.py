"""The overview dashboard: the verdict, then the five decision steps with their evidence."""

from __future__ import annotations

from core import series as llmb
from core.thresholds import threshold_promql
from mixin.config import MixinConfig
from mixin.dashboards.panels import (
    ACTIVE_MAPPING,
    QW,
    RW,
    SEL,
    UNLESS_MISFIT,
    Dashboard,
    Limit,
    Panel,
    Row,
    Target,
    check,
    decode_check,
    decode_vs_roofline,
    engine_share,
    pct,
    ts,
)
from mixin.dashboards.prefill import prefill_row


def _verdict_row(cfg: MixinConfig) -> Row:
    """The active verdict and its history."""
    verdict_now = Panel(
        "Verdict now",
        [Target(f"llmb:engine_bottleneck:verdict{{{SEL}}} == 1", instant=True)],
        "table",
        "none",
        "The active verdict per engine: the first of the decision steps below that holds "
        "(recording rule `llmb:engine_bottleneck:verdict`, one series per verdict, 1 on the "
        "active one). prometheus/thresholds.md gives every number behind it and "
        f"{cfg.runbook_url} what to do for each verdict.",
        width=12,
        height=6,
        options={"showHeader": True},
        defaults={"custom": {"align": "auto"}},
    )
    verdict_hist = Panel(
        "Verdict over time",
        [
            Target(
                f"llmb:engine_bottleneck:verdict{{{SEL}}} == 1", "{{host}}/{{engine}}: {{verdict}}"
            )
        ],
        "state-timeline",
        "none",
        "When each verdict was active per engine (`llmb:engine_bottleneck:verdict == 1`). A "
        "change lines up with a load step, a restart or a configuration change; compare "
        "with the panels of the step that became true.",
        width=12,
        height=6,
        defaults={"mappings": ACTIVE_MAPPING},
        options={"showValue": "never", "mergeValues": True},
    )
    return Row("Verdict", [verdict_now, verdict_hist])


def _weights_row(cfg: MixinConfig) -> Row:
    """Step 1: are the weights resident on the GPU?"""
    return Row(
        "1. Are the weights resident on the GPU?",
        [
            check(
                "Weights not resident",
                f"engine:llmb_weights_not_resident:bool{{{SEL}}}",
                "YES when any of the three ratios to the right is below its line: layers on the "
                f"GPU below {threshold_promql('layers_ratio_min')} x the model's layers, GPU "
                f"weight buffers below {threshold_promql('weights_buffer_ratio_min')} x the weight "
                "bytes, or the engine's GPU memory below "
                f"{threshold_promql('weights_memory_ratio_min')} x the weight bytes. Every decode "
                "step then waits for host memory: put all layers on the GPU (llama.cpp `-ngl "
                "999`, SGLang without `--cpu-offload-gb`), or use a smaller quantization. "
                f"{cfg.runbook_url}#llmweightsnotresident",
            ),
            engine_share(
                "Layers on the GPU / layers",
                "engine:llmb_gpu_layers_offloaded:ratio",
                Limit("layers_ratio_min", "above"),
                6,
                description=(
                    "Layers llama.cpp put on the GPU / layers of the model, from its log "
                    "(`offloaded N/M layers to GPU`). Below the line (`layers_ratio_min` = "
                    f"{threshold_promql('layers_ratio_min')}) some layers run on the CPU: raise "
                    "`-ngl` or free GPU memory. Empty for SGLang, which does not log layers."
                ),
            ),
            engine_share(
                "GPU weight buffers / weight bytes",
                "engine:llmb_weights_gpu_buffers:ratio",
                Limit("weights_buffer_ratio_min", "above"),
                6,
                description=(
                    "Weight buffers the engine reports on a GPU (llama.cpp `CUDA0 model buffer "
                    "size`, SGLang `weight_memory_usage_gb`) / model weight bytes. Below the line "
                    "(`weights_buffer_ratio_min` = "
                    f"{threshold_promql('weights_buffer_ratio_min')}) part of the weights sits in "
                    "host memory, even when a large KV cache fills the card."
                ),
            ),
            engine_share(
                "Process GPU memory / weight bytes",
                "engine:llmb_weights_gpu_memory:ratio",
                Limit("weights_memory_ratio_min", "above"),
                6,
                description=(
                    "GPU memory of the engine's processes (NVML) / model weight bytes: works "
                    "without engine logs. Below the line (`weights_memory_ratio_min` = "
                    f"{threshold_promql('weights_memory_ratio_min')}) the weights cannot all be on "
                    "the GPU. Above 1 is normal: the KV cache and compute buffers add to the "
                    "weights."
                ),
            ),
        ],
    )


def _kv_row(cfg: MixinConfig) -> Row:
    """Step 2: is the KV cache saturated?"""
    return Row(
        "2. Is the KV cache saturated?",
        [
            check(
                "KV saturated",
                f"engine:llmb_kv_saturated:bool{{{SEL}}}",
                f"YES when KV usage ({QW} average) is at least {pct('kv_usage_high')} while at "
                f"least {threshold_promql('queue_min')} requests wait on average, or when the "
                f"engine logged KV-pressure events in {threshold_promql('rate_window')}. Requests "
                "then wait for KV space, not for compute: give the KV cache more memory "
                "(llama.cpp `-c`, SGLang `--mem-fraction-static`), quantize the KV cache, or "
                f"lower the concurrency. {cfg.runbook_url}#llmkvcachesaturated",
            ),
            engine_share(
                f"KV cache usage ({QW} average)",
                f"engine:llmb_kv_cache_usage:avg{QW}",
                Limit("kv_usage_high", "below"),
                9,
                description=(
                    "KV cache tokens held / KV capacity, averaged over "
                    f"{threshold_promql('queue_window')} (`engine:llmb_kv_cache_usage:avg{QW}`). "
                    f"At or above the line (`kv_usage_high` = {threshold_promql('kv_usage_high')}) "
                    "the pool counts as full; with requests waiting that is the KV-saturated "
                    "verdict and the LLMKVCacheSaturated alert."
                ),
            ),
            ts(
                f"KV-pressure events in {threshold_promql('rate_window')}",
                Target(
                    f"engine:llmb_kv_pressure_events:increase{RW}{{{SEL}}}", "{{host}}/{{engine}}"
                ),
                unit="events",
                width=9,
                description=(
                    "Times the engine ran out of KV space: llama.cpp log lines (no KV "
                    "slot, context exceeded, context shift, truncated slot) or SGLang "
                    "retracted requests, counted over the window. Any event marks the KV "
                    "cache as saturated: each one costs a request recomputation or a "
                    "truncated answer."
                ),
            ),
        ],
    )


def _queue_row(cfg: MixinConfig) -> Row:
    """Step 3: are requests queueing while KV has room?"""
    return Row(
        "3. Are requests queueing while KV has room?",
        [
            check(
                "Requests queueing",
                f"engine:llmb_requests_queueing:bool{{{SEL}}}",
                f"YES when at least {threshold_promql('queue_min')} requests wait on average over "
                f"{threshold_promql('queue_window')}. With KV below its line this is scheduling: "
                "more requests than slots or batch. Raise the parallel slots (llama.cpp `-np`, "
                "SGLang `--max-running-requests`) if memory allows, or add a replica. "
                f"{cfg.runbook_url}#llmrequestsqueueing",
            ),
            ts(
                f"Waiting ({QW} average) and running",
                Target(
                    f"engine:llmb_requests_waiting:avg{QW}{{{SEL}}}",
                    "{{host}}/{{engine}} waiting",
                ),
                Target(f"engine:llmb_requests_running:max{{{SEL}}}", "{{host}}/{{engine}} running"),
                unit="requests",
                width=9,
                description=(
                    f"Requests queued in the engine ({QW} average) beside those running "
                    "(engine metrics: llama.cpp `requests_deferred`/`requests_processing`, "
                    "SGLang `num_queue_reqs`/`num_running_reqs`). Running stuck at the "
                    "slot count while waiting grows means the slots are the limit."
                ),
            ),
            ts(
                "Slots (max running requests)",
                Target(
                    f"max by (host, engine) ({llmb.ENGINE_SLOTS}{{{SEL}}})", "{{host}}/{{engine}}"
                ),
                unit="requests",
                width=9,
                description=(
                    "The most requests the engine runs at once (llama.cpp `-np`, SGLang "
                    "max running requests), from its /props or server info. Compare with "
                    "running requests on the left."
                ),
            ),
        ],
    )


def _idle_row(cfg: MixinConfig) -> Row:
    """Step 4: is the engine idle?"""
    return Row(
        "4. Is the engine idle?",
        [
            check(
                "Idle",
                f"engine:llmb_idle:bool{{{SEL}}}",
                "YES when nothing runs or waits and no token was generated in "
                f"{threshold_promql('rate_window')}: there is no load to judge. Send load "
                "(llmb-loadgen run) before reading the other steps.",
            ),
            ts(
                f"Generated tokens/s (aggregate, {threshold_promql('rate_window')})",
                Target(
                    f"engine:llmb_generation_tokens_per_second:rate{RW}{{{SEL}}}",
                    "{{host}}/{{engine}}",
                ),
                unit="tok/s",
                width=18,
                description=(
                    "Generated tokens per second over all sequences (rate of the engine's "
                    f"generation token counter over {threshold_promql('rate_window')}). llama.cpp "
                    "counts tokens when a request ends, so short windows look bursty."
                ),
            ),
        ],
    )


def _decode_row(cfg: MixinConfig) -> Row:
    """Step 5: is decode at the card's memory-bandwidth limit?"""
    return Row(
        "5. Is decode at the card's memory-bandwidth limit?",
        [
            decode_check(cfg),
            engine_share(
                "Decode efficiency (measured / roofline)",
                f"engine:llmb_decode_efficiency:ratio{RW}",
                Limit("decode_efficiency_at_limit", "above", bad_color="orange"),
                9,
                # No number beyond physics: a misfit shows in the check, not here.
                gate=UNLESS_MISFIT,
                description=(
                    "Per-sequence decode tok/s / roofline tok/s "
                    f"(`engine:llmb_decode_efficiency:ratio{RW}`). At or above the line "
                    "(`decode_efficiency_at_limit` = "
                    f"{threshold_promql('decode_efficiency_at_limit')}) decode is at the card's "
                    "memory bandwidth limit; tuned kernels reach 0.6-0.9. Below it, look at the "
                    "engine build, batch size and attention kernels. Above "
                    "`decode_efficiency_physical_max` "
                    f"({threshold_promql('decode_efficiency_physical_max')}) the bytes-per-step "
                    "model does not fit: the line stops and the check beside it names the reason "
                    "(`llmb:engine_roofline:misfit`)."
                ),
            ),
            decode_vs_roofline(9),
        ],
    )


def overview(cfg: MixinConfig) -> Dashboard:
    """Bottleneck overview: the verdict, then the decision steps with their evidence."""
    rows = [
        _verdict_row(cfg),
        _weights_row(cfg),
        _kv_row(cfg),
        _queue_row(cfg),
        _idle_row(cfg),
        _decode_row(cfg),
        prefill_row(),
    ]
    return Dashboard(
        "llmb-overview",
        "LLM bottleneck: overview",
        "Why an engine is slow: the verdict, then the six decision steps with their evidence.",
        rows,
    )
