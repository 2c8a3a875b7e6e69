"""The load-run dashboard: one llmb-loadgen run's steps as annotations over its panels."""

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
    Panel,
    Row,
    Target,
    engine_share,
    gpu_used_and_peak,
    latency_panel,
    ts,
)

# The start of every load step, marked on every panel.
STEP_MARKS = Annotation(
    "Load steps",
    f"{llmb.LOADGEN_STEP_START_TIMESTAMP_SECONDS}{{{SEL}}} * 1000",
    "purple",
    "5s",
    "{{host}}/{{engine}} step {{step}}",
    "engine,step",
    value_is_time=True,
)


def _load_row(cfg: MixinConfig) -> Row:
    """Requests in flight, outcomes and the current step."""
    return Row(
        "Load",
        [
            ts(
                "Requests in flight",
                Target(
                    f"max by (host, engine) ({llmb.LOADGEN_REQUESTS_IN_FLIGHT}{{{SEL}}})",
                    "{{host}}/{{engine}}",
                ),
                unit="requests",
                width=8,
                description=(
                    "Requests llmb-loadgen has open against each engine: the concurrency "
                    "of the current step. Below the step's concurrency, the load "
                    "generator itself is the limit (too few workers or connections)."
                ),
            ),
            ts(
                "Requests/s by outcome",
                Target(
                    "sum by (host, engine, outcome) "
                    f"(rate({llmb.LOADGEN_REQUESTS_TOTAL}{{{SEL}}}[{cfg.dashboard_window}]))",
                    "{{host}}/{{engine}} {{outcome}}",
                ),
                unit="reqps",
                width=8,
                description=(
                    "Finished requests per second by outcome (ok, error, timeout, ...), "
                    f"as llmb-loadgen counts them over {cfg.dashboard_window}. Any outcome other "
                    "than ok makes the step's numbers suspect: read the run's summary for the "
                    "errors."
                ),
            ),
            Panel(
                "Steps",
                [Target(f"{llmb.LOADGEN_STEP_INFO}{{{SEL}}}", instant=True)],
                "table",
                "none",
                "The current step of each load generator with its settings "
                "(concurrency, prompt and output tokens) as labels of "
                f"`{llmb.LOADGEN_STEP_INFO}`. The purple annotations mark when each step began.",
                width=8,
            ),
        ],
    )


def _throughput_row(cfg: MixinConfig) -> Row:
    """Client vs server tokens/s, early stops and mismatches."""
    return Row(
        "Throughput",
        [
            ts(
                "Completion tokens/s: client vs server",
                Target(
                    "sum by (host, engine) "
                    f"(rate({llmb.LOADGEN_COMPLETION_TOKENS_TOTAL}{{{SEL}}}[{cfg.dashboard_window}]))",
                    "{{host}}/{{engine}} client",
                ),
                Target(
                    f"engine:llmb_generation_tokens_per_second:rate{RW}{{{SEL}}}",
                    f"{{{{host}}}}/{{{{engine}}}} server ({RW})",
                ),
                unit="tok/s",
                width=12,
                description=(
                    "Completion tokens per second the load generator received "
                    f"({cfg.dashboard_window}) beside the tokens the engine says it generated "
                    f"({threshold_promql('rate_window')}). They should meet once a step runs "
                    "longer than the window; a lasting gap means other clients share the engine "
                    "or tokens are miscounted."
                ),
            ),
            ts(
                "Goodput within the SLO (run --slo)",
                Target(
                    "sum by (host, engine) "
                    f"(rate({llmb.LOADGEN_GOODPUT_REQUESTS_TOTAL}{{{SEL}}}[{cfg.dashboard_window}]))",
                    "{{host}}/{{engine}} requests/s within",
                ),
                Target(
                    "sum by (host, engine) "
                    f"(rate({llmb.LOADGEN_REQUESTS_TOTAL}{{{SEL}}}[{cfg.dashboard_window}]))",
                    "{{host}}/{{engine}} requests/s, all",
                ),
                unit="reqps",
                width=12,
                description=(
                    "Requests per second that finished within the run's --slo (each of their "
                    "TTFT, end-to-end time and own inter-token gap within its limit), beside "
                    f"all finished requests ({cfg.dashboard_window}). Empty "
                    f"without --slo; the SLO itself is {llmb.LOADGEN_SLO_INFO}."
                ),
            ),
            ts(
                "Early stops and token-count mismatch",
                Target(
                    "sum by (host, engine) "
                    f"(increase({llmb.LOADGEN_EARLY_STOP_REQUESTS_TOTAL}{{{SEL}}}[{RW}]))",
                    f"{{{{host}}}}/{{{{engine}}}} early stops ({RW})",
                ),
                Target(
                    f"max by (host, engine) ({llmb.LOADGEN_TOKEN_COUNT_MISMATCH}{{{SEL}}})",
                    "{{host}}/{{engine}} mismatch",
                ),
                unit="requests",
                width=12,
                description=(
                    f"Requests that stopped before their max tokens ({RW}), and 1 when the load "
                    "generator's token count disagrees with the engine's usage numbers. Early "
                    "stops shorten the decode phase and inflate tok/s per request; a mismatch "
                    f"fires LLMTokenCountMismatch. {cfg.runbook_url}#llmtokencountmismatch"
                ),
            ),
        ],
    )


def _latency_row(cfg: MixinConfig) -> Row:
    """Client-side TTFT, ITL and end-to-end latency."""
    return Row(
        "Latency (client side)",
        [
            latency_panel(
                cfg,
                "Time to first token",
                {llmb.LOADGEN_TIME_TO_FIRST_TOKEN_SECONDS: "TTFT"},
                8,
                (
                    "the time from sending a "
                    "request to its first streamed token, as llmb-loadgen measures it. It grows "
                    "with prompt length (prefill) and with queueing."
                ),
            ),
            latency_panel(
                cfg,
                "Inter-token latency",
                {llmb.LOADGEN_INTER_TOKEN_LATENCY_SECONDS: "ITL"},
                8,
                (
                    "the gap between streamed tokens. "
                    "It grows with the batch: each decode step serves every running "
                    "sequence."
                ),
            ),
            latency_panel(
                cfg,
                "End-to-end latency",
                {llmb.LOADGEN_E2E_REQUEST_LATENCY_SECONDS: "e2e"},
                8,
                ("the whole request: TTFT + output tokens x ITL. The number a user waits for."),
            ),
        ],
    )


def _memory_row(cfg: MixinConfig) -> Row:
    """GPU memory, KV usage and queue during the run."""
    return Row(
        "Memory and KV during the run",
        [
            ts(
                "GPU memory used and peak",
                *gpu_used_and_peak(),
                unit="bytes",
                width=12,
                description=(
                    "GPU memory in use and the sampler's windowed peak during the run "
                    "(NVML). A peak that climbs with each step shows how close a larger "
                    "step gets to the card's total (GPU memory dashboard)."
                ),
            ),
            engine_share(
                "KV usage",
                "engine:llmb_kv_cache_usage:ratio",
                Limit("kv_usage_high", "below"),
                6,
                description=(
                    "KV cache tokens held / capacity per step. Reaching the line (`kv_usage_high` "
                    f"= {threshold_promql('kv_usage_high')}) while requests wait: this step's "
                    "concurrency or context is more than the KV pool holds."
                ),
                legend=" KV",
            ),
            ts(
                "Waiting requests",
                Target(f"engine:llmb_requests_waiting:max{{{SEL}}}", "{{host}}/{{engine}} waiting"),
                unit="requests",
                width=6,
                description=(
                    "Requests the engine queues during the run. A queue from the first "
                    "step on: the step's concurrency is above the engine's slots."
                ),
            ),
        ],
    )


def load_run(cfg: MixinConfig) -> Dashboard:
    """The load generator's steps as annotations over throughput, latency and memory."""
    rows = [_load_row(cfg), _throughput_row(cfg), _latency_row(cfg), _memory_row(cfg)]
    return Dashboard(
        "llmb-load-run",
        "LLM bottleneck: load run",
        "One llmb-loadgen run: its steps as annotations over load, throughput, latency and memory.",
        rows,
        [STEP_MARKS],
    )
