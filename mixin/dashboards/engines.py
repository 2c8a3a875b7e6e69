"""The engines dashboard: llama.cpp and SGLang side by side under the same labels."""

from __future__ import annotations

from core import series as llmb
from core.thresholds import threshold_promql
from mixin.config import MixinConfig
from mixin.dashboards.panels import (
    RW,
    SEL,
    Annotation,
    Dashboard,
    Limit,
    Row,
    Target,
    decode_vs_roofline,
    engine_share,
    latency_panel,
    ts,
)


def restarts(window: str) -> str:
    """Engine restarts per host and engine over `window`."""
    return f"sum by (host, engine) (increase({llmb.ENGINE_RESTARTS_TOTAL}{{{SEL}}}[{window}]))"


def _decode_row(cfg: MixinConfig) -> Row:
    """Decode against the roofline and aggregate throughput."""
    return Row(
        "Decode",
        [
            decode_vs_roofline(12),
            ts(
                "Aggregate throughput",
                Target(
                    f"engine:llmb_generation_tokens_per_second:rate{RW}{{{SEL}}}",
                    "{{host}}/{{engine}} generated",
                ),
                Target(
                    f"engine:llmb_prompt_tokens_per_second:rate{RW}{{{SEL}}}",
                    "{{host}}/{{engine}} prompt",
                ),
                Target(
                    f"engine:llmb_prefill_tokens_per_second:rate{RW}{{{SEL}}}",
                    "{{host}}/{{engine}} prefill speed",
                ),
                unit="tok/s",
                width=12,
                description=(
                    "Generated and prompt tokens per second over all sequences "
                    f"({threshold_promql('rate_window')} rates of the engine counters), and "
                    "prefill speed (prompt tokens computed / the wall time prefill ran, the figure "
                    "diagnose reports). Use it to compare "
                    "engines under the same load; batching raises it above one sequence's speed."
                ),
            ),
        ],
    )


def _latency_row(cfg: MixinConfig) -> Row:
    """TTFT and ITL, server and load generator side."""
    return Row(
        "Latency: server and load generator",
        [
            latency_panel(
                cfg,
                "Time to first token",
                {
                    llmb.ENGINE_TIME_TO_FIRST_TOKEN_SECONDS: "server",
                    llmb.LOADGEN_TIME_TO_FIRST_TOKEN_SECONDS: "client",
                },
                12,
                (
                    "the time to the first token, "
                    "as the engine measures it (server) and as llmb-loadgen sees it (client, "
                    "includes the network and queueing in front of the engine). Client far "
                    "above server: look at the proxy or the network. TTFT rising with "
                    "load: requests wait for a slot or KV (steps 2 and 3 of the overview)."
                ),
            ),
            latency_panel(
                cfg,
                "Inter-token latency",
                {
                    llmb.ENGINE_INTER_TOKEN_LATENCY_SECONDS: "server",
                    llmb.LOADGEN_INTER_TOKEN_LATENCY_SECONDS: "client",
                },
                12,
                (
                    "the time between two streamed "
                    "tokens, server and client side. 1 / ITL is the per-sequence decode "
                    "speed a user sees; compare it with the roofline above."
                ),
            ),
        ],
    )


def _scheduling_row(cfg: MixinConfig) -> Row:
    """Running vs waiting, KV usage, prefix cache."""
    return Row(
        "Scheduling and memory",
        [
            ts(
                "Running vs waiting",
                Target(f"engine:llmb_requests_running:max{{{SEL}}}", "{{host}}/{{engine}} running"),
                Target(f"engine:llmb_requests_waiting:max{{{SEL}}}", "{{host}}/{{engine}} waiting"),
                unit="requests",
                width=8,
                description=(
                    "Requests the engine runs and the ones it queues, as it reports them. "
                    "Waiting above zero for minutes while running sits at the slot count: "
                    "more load than slots (raise them or add a replica)."
                ),
            ),
            engine_share(
                "KV cache usage",
                "engine:llmb_kv_cache_usage:ratio",
                Limit("kv_usage_high", "below"),
                8,
                description=(
                    "KV cache tokens held / KV capacity. At or above the line (`kv_usage_high` = "
                    f"{threshold_promql('kv_usage_high')}) with requests waiting, the KV pool "
                    "limits the batch: more KV memory, a quantized KV cache or shorter contexts "
                    f"help. {cfg.runbook_url}#llmkvcachesaturated"
                ),
            ),
            ts(
                "Prefix-cache share of prompt tokens",
                Target(
                    f"engine:llmb_prefix_cache_hit:ratio_rate{RW}{{{SEL}}}", "{{host}}/{{engine}}"
                ),
                unit="percentunit",
                width=8,
                description=(
                    "Prompt tokens served from the prefix cache / all prompt tokens "
                    f"({threshold_promql('rate_window')}). High shares make prefill cheap; a "
                    "shared system prompt that stays near 0 % means the cache is off or evicted."
                ),
            ),
        ],
    )


# Every restart, marked on every panel.
RESTART_MARKS = Annotation(
    "Engine restarts",
    restarts("1m"),
    "red",
    "30s",
    "{{host}}/{{engine}} restarted",
    "host,engine",
    value_is_time=False,
)


def _restarts_row(cfg: MixinConfig) -> Row:
    """Engine restarts per window."""
    return Row(
        "Restarts",
        [
            ts(
                f"Engine restarts per {threshold_promql('rate_window')}",
                Target(restarts(threshold_promql("rate_window")), "{{host}}/{{engine}}"),
                unit="restarts",
                width=24,
                height=6,
                description=(
                    f"New engine instances the exporter saw (`{llmb.ENGINE_RESTARTS_TOTAL}`, "
                    f"increase over {threshold_promql('rate_window')}): the engine was unreachable "
                    "in between, or its build, model, context, slots or start arguments changed. "
                    "The red annotations mark them on every panel. Throughput and latency right "
                    "after a restart include model loading and a cold prefix cache. Repeated "
                    "restarts: read the engine's log (out of memory, crashes) and LLMEngineDown."
                ),
            ),
        ],
    )


def engines(cfg: MixinConfig) -> Dashboard:
    """Engines side by side: decode vs roofline, throughput, latency, queue, KV, restarts."""
    rows = [_decode_row(cfg), _latency_row(cfg), _scheduling_row(cfg), _restarts_row(cfg)]
    return Dashboard(
        "llmb-engines",
        "LLM bottleneck: engines side by side",
        "llama.cpp and SGLang under the same labels: decode against the roofline, latency, "
        "scheduling, KV and restarts.",
        rows,
        [RESTART_MARKS],
    )
