"""Recording rules: per-engine and per-GPU signals over the normalized llmb_* schema.

`core.rules.rule_values_at` computes the same arithmetic in Python; the parity test
(tests/system/test_verdict_parity.py) requires promtool and Python to agree.
"""

from __future__ import annotations

from typing import Any

from config.kinds import preallocating_selector
from core import series as llmb
from core.thresholds import threshold_promql
from mixin.rules.card import card_rules, shortfall_rule
from mixin.rules.common import E, mx, ratio, rec
from mixin.rules.prefill import prefill_rules
from mixin.rules.roofline import roofline_rules


def recording_rules() -> list[dict[str, Any]]:
    """The groups of prometheus/rules/recording.yml."""
    return [
        {"name": "llmb-engine", "rules": engine_rules() + throughput_rules() + admission_rules()},
        {"name": "llmb-gpu", "rules": gpu_rules()},
        {"name": "llmb-card", "rules": card_rules()},
        {
            "name": "llmb-roofline",
            "rules": [*roofline_rules(), *prefill_rules(), shortfall_rule()],
        },
    ]


def _rate(metric: str) -> str:
    # max, not sum: the same engine scraped by two exporters must not count twice.
    return f"max by ({E}) (rate({metric}[{threshold_promql('rate_window')}]))"


def engine_rules() -> list[dict[str, Any]]:
    """Scheduling and KV signals per engine."""
    rw, qw = threshold_promql("rate_window"), threshold_promql("queue_window")
    return [
        rec("engine:llmb_engine_up:max", mx(llmb.ENGINE_UP)),
        rec("engine:llmb_requests_running:max", mx(llmb.ENGINE_REQUESTS_RUNNING)),
        rec("engine:llmb_requests_waiting:max", mx(llmb.ENGINE_REQUESTS_WAITING)),
        rec(
            f"engine:llmb_requests_waiting:avg{qw}",
            mx(f"avg_over_time({llmb.ENGINE_REQUESTS_WAITING}[{qw}])"),
        ),
        rec("engine:llmb_kv_cache_usage:ratio", mx(llmb.ENGINE_KV_CACHE_USAGE_RATIO)),
        rec(
            f"engine:llmb_kv_cache_usage:avg{qw}",
            mx(f"avg_over_time({llmb.ENGINE_KV_CACHE_USAGE_RATIO}[{qw}])"),
        ),
        rec(
            f"engine:llmb_kv_pressure_events:increase{rw}",
            f"""
            sum by ({E}) (
              max by ({E}, event) (increase({llmb.ENGINE_KV_PRESSURE_EVENTS_TOTAL}[{rw}]))
            )
            """,
        ),
    ]


def throughput_rules() -> list[dict[str, Any]]:
    """Token rates, prefix-cache share and weight residency per engine."""
    rw = threshold_promql("rate_window")
    return [
        ratio(
            f"engine:llmb_decode_tokens_per_second:rate{rw}",
            _rate(llmb.ENGINE_DECODE_TOKENS_TOTAL),
            _rate(llmb.ENGINE_DECODE_SECONDS_TOTAL),
        ),
        rec(
            f"engine:llmb_generation_tokens_per_second:rate{rw}",
            _rate(llmb.ENGINE_GENERATION_TOKENS_TOTAL),
        ),
        rec(
            f"engine:llmb_prompt_tokens_per_second:rate{rw}",
            _rate(llmb.ENGINE_PROMPT_TOKENS_TOTAL),
        ),
        rec(
            f"engine:llmb_prefill_tokens_per_second:rate{rw}",
            f"""
            (
                {_rate(llmb.ENGINE_PROMPT_TOKENS_TOTAL)}
              - ({_rate(llmb.ENGINE_PROMPT_TOKENS_CACHED_TOTAL)}
                 or 0 * {_rate(llmb.ENGINE_PROMPT_TOKENS_TOTAL)})
            )
              / (
                  ({_rate(llmb.ENGINE_PREFILL_BUSY_SECONDS_TOTAL)} > 0)
                or
                  (clamp_max({_rate(llmb.ENGINE_PROMPT_SECONDS_TOTAL)}, 1) > 0)
              )
            """,
        ),
        ratio(
            f"engine:llmb_prefix_cache_hit:ratio_rate{rw}",
            _rate(llmb.ENGINE_PROMPT_TOKENS_CACHED_TOTAL),
            _rate(llmb.ENGINE_PROMPT_TOKENS_TOTAL),
        ),
        *residency_rules(),
    ]


GPU_BUFFERS = f'{llmb.ENGINE_MODEL_BUFFER_BYTES}{{device!~"(?i)cpu.*"}}'


def residency_rules() -> list[dict[str, Any]]:
    """How much of the weights the GPU holds, three ways."""
    return [
        ratio(
            "engine:llmb_weights_gpu_memory:ratio",
            mx(llmb.ENGINE_PROCESS_GPU_MEMORY_BYTES),
            mx(llmb.MODEL_WEIGHTS_BYTES),
        ),
        ratio(
            "engine:llmb_weights_gpu_buffers:ratio",
            # Buffers on any device but the host ones (llama.cpp CPU, CPU_Mapped, ...); 0 when
            # the engine reports only host buffers (a CPU build, `-ngl 0`), not absent.
            f"(\n  sum by ({E}) (max by ({E}, device) ({GPU_BUFFERS}))\n"
            f"  or 0 * sum by ({E}) (max by ({E}, device) ({llmb.ENGINE_MODEL_BUFFER_BYTES}))\n)",
            mx(llmb.MODEL_WEIGHTS_BYTES),
        ),
        ratio(
            "engine:llmb_gpu_layers_offloaded:ratio",
            mx(llmb.ENGINE_GPU_LAYERS_OFFLOADED),
            mx(llmb.ENGINE_GPU_LAYERS_TOTAL),
        ),
    ]


def gpu_rules() -> list[dict[str, Any]]:
    """Per-GPU memory, per-engine process memory on each GPU, and the headroom."""
    return [
        rec(
            "engine_gpu:llmb_gpu_process_memory_used_bytes:sum",
            f"""
            sum by (host, engine, gpu) (
              max by (host, engine, gpu, pid) ({llmb.GPU_PROCESS_MEMORY_USED_BYTES}{{engine!=""}})
            )
            """,
        ),
        rec(
            "gpu:llmb_gpu_memory_used:ratio",
            f"""
            max by (host, gpu) ({llmb.GPU_MEMORY_USED_BYTES})
              / (max by (host, gpu) ({llmb.GPU_MEMORY_TOTAL_BYTES}) > 0)
            """,
        ),
        rec(
            "gpu:llmb_gpu_memory_headroom_bytes:peak",
            f"""
              max by (host, gpu) ({llmb.GPU_MEMORY_TOTAL_BYTES})
            - (
                  max by (host, gpu) ({llmb.GPU_MEMORY_USED_PEAK_BYTES})
                or
                  max by (host, gpu) ({llmb.GPU_MEMORY_USED_BYTES})
              )
            - (
                  max by (host, gpu) ({llmb.GPU_MEMORY_RESERVED_BYTES})
                or
                  0 * max by (host, gpu) ({llmb.GPU_MEMORY_TOTAL_BYTES})
              )
            """,
        ),
        rec(
            "gpu:llmb_gpu_memory_headroom:ratio",
            f"""
            gpu:llmb_gpu_memory_headroom_bytes:peak
              / (max by (host, gpu) ({llmb.GPU_MEMORY_TOTAL_BYTES}) > 0)
            """,
        ),
    ]


def admission_rules() -> list[dict[str, Any]]:
    """Which limit binds while requests wait, and SGLang residency beyond its KV pool (issue 18).

    `core.rules.admission_values` computes the same, in the same order.
    """
    rw, qw = threshold_promql("rate_window"), threshold_promql("queue_window")
    peak = f"engine:llmb_requests_running:peak{qw}"
    capacity = "engine:llmb_kv_cache_capacity_tokens:max"
    tokens = f"engine:llmb_request_tokens:mean{rw}"
    sglang = preallocating_selector()  # SGLang's kind (config/kinds.py kv_pool_preallocated)
    return [
        rec(peak, mx(f"max_over_time({llmb.ENGINE_REQUESTS_RUNNING}[{qw}])")),
        rec("engine:llmb_slots:max", mx(llmb.ENGINE_SLOTS)),
        rec(capacity, mx(llmb.ENGINE_KV_CACHE_CAPACITY_TOKENS)),
        rec("engine:llmb_requests_running_slots:ratio", f"{peak} / (engine:llmb_slots:max > 0)"),
        rec(
            # The KV the running requests hold at the pool's fullest, plus one more request
            # of their size (peaks: averages count the gaps between requests).
            "engine:llmb_kv_demand_held:ratio",
            f"""
            {mx(f"max_over_time({llmb.ENGINE_KV_CACHE_USED_TOKENS}[{qw}])")}
              * ({peak} + 1) / ({peak} > 0) / ({capacity} > 0)
            """,
        ),
        rec(
            # Tokens a request holds by its end (prompt + answer): what SGLang reserves for.
            tokens,
            f"""
            (
                engine:llmb_prompt_tokens_per_second:rate{rw}
              + engine:llmb_generation_tokens_per_second:rate{rw}
            )
              / (max by ({E}) (rate({llmb.ENGINE_REQUESTS_FINISHED_TOTAL}[{rw}])) > 0)
            """,
        ),
        rec(
            "engine:llmb_kv_demand_finished:ratio",
            f"({peak} + 1) * {tokens} / ({capacity} > 0)",
        ),
        rec(
            # SGLang's process holds its weights and its preallocated KV pool (plus CUDA
            # context and graphs): what is left beyond the pool must hold the weights.
            "engine:llmb_weights_gpu_memory_beyond_kv:ratio",
            f"""
            (
                {mx(f"{llmb.ENGINE_PROCESS_GPU_MEMORY_BYTES}{{{sglang}}}")}
              - (
                    sum by ({E}) (
                      max by ({E}, device) (
                        {llmb.ENGINE_KV_CACHE_BYTES}{{{sglang},device!~"(?i)cpu.*"}}
                      )
                    )
                  or
                    {mx(f"{llmb.MODEL_KV_CACHE_BYTES_ESTIMATED}{{{sglang}}}")}
                )
            )
              / ({mx(llmb.MODEL_WEIGHTS_BYTES)} > 0)
            """,
        ),
    ]
