"""Signals: the recording-rule-level inputs of the verdict, and the series each is read from."""

from __future__ import annotations

from dataclasses import dataclass, fields

from core.thresholds import threshold_promql

# ------------------------------------------------------------------------------ signals


@dataclass(frozen=True)
class Signals:
    """The recording-rule-level inputs of the verdict for one engine that is up.

    `None` means the series is absent (as in PromQL: no data, or a zero denominator).
    """

    # engine:llmb_gpu_layers_offloaded:ratio: layers on the GPU / layers of the model
    layers_ratio: float | None = None
    # engine:llmb_weights_gpu_buffers:ratio: weight buffers on a GPU / weight bytes
    weights_buffers_ratio: float | None = None
    # engine:llmb_weights_gpu_memory:ratio: engine process GPU memory / weight bytes
    weights_memory_ratio: float | None = None
    # the engine's host exports llmb_gpu_memory_total_bytes (it has a GPU at all)
    host_has_gpu: bool = False
    # engine:llmb_kv_cache_usage:avg<queue_window>
    kv_usage_avg: float | None = None
    # engine:llmb_requests_waiting:avg<queue_window>
    waiting_avg: float | None = None
    # engine:llmb_kv_pressure_events:increase<rate_window> (all event kinds summed)
    kv_pressure_increase: float | None = None
    # engine:llmb_requests_running:max / engine:llmb_requests_waiting:max (now)
    running: float | None = None
    waiting: float | None = None
    # --- admission and SGLang residency (issue 18) ---
    # engine:llmb_requests_running_slots:ratio: peak running <queue_window> / the running cap
    running_slots_ratio: float | None = None
    # engine:llmb_kv_demand_held:ratio: peak KV held x (peak running + 1) / peak running
    # / capacity (<queue_window>)
    kv_demand_held_ratio: float | None = None
    # engine:llmb_kv_demand_finished:ratio: (peak running + 1) x tokens per finished request
    # / capacity
    kv_demand_finished_ratio: float | None = None
    # engine:llmb_weights_gpu_memory_beyond_kv:ratio (SGLang): (process GPU memory - KV pool)
    # / weight bytes
    weights_memory_beyond_kv_ratio: float | None = None
    # engine:llmb_generation_tokens_per_second:rate<rate_window>
    generation_tokens_per_second: float | None = None
    # engine:llmb_decode_efficiency:ratio<rate_window>: per-sequence decode tok/s / roofline
    decode_efficiency: float | None = None
    # engine:llmb_experts_host_layers:max: layers whose routed experts live in host memory
    experts_host_layers: float | None = None
    # --- the card's own state (issue 27), over the engine's GPUs ---
    # engine:llmb_gpu_power_slowdown:avg<rate_window>: share of the window's busy samples in
    # which a power reason (SW power cap, HW slowdown, HW power brake) held the clocks down
    card_power_slowdown: float | None = None
    # engine:llmb_gpu_thermal_slowdown:avg<rate_window>: the same for SW/HW thermal slowdown
    card_thermal_slowdown: float | None = None
    # engine:llmb_gpu_sm_clock:ratio<rate_window>: the mean SM clock of the window's busy
    # samples / its maximum (absent without a busy sample)
    sm_clock_ratio: float | None = None
    # engine:llmb_gpu_brake_slowdown:avg<rate_window>: the share for HW slowdown or the HW
    # power brake alone (a power supply or external signal, not the power limit)
    card_brake_slowdown: float | None = None
    # engine:llmb_gpu_power_limit:ratio: enforced power limit / the card's default (lowest
    # of the engine's GPUs)
    power_limit_ratio: float | None = None
    # engine:llmb_card_shortfall_explained:ratio<rate_window>: (1 - the lower clock ratio) /
    # (1 - the lowest of decode and prefill efficiency at the maximum clocks), at most 1
    card_shortfall_explained: float | None = None
    # engine:llmb_gpu_memory_clock:ratio<rate_window>: the highest memory clock of the window
    # / its maximum, at most 1 (lowest of the engine's GPUs; absent while idle throughout)
    memory_clock_ratio: float | None = None
    # --- prefill and the time before the first token (issue 27) ---
    # engine:llmb_request_prompt_tokens:mean<rate_window>: prompt tokens per finished request
    prompt_tokens_mean: float | None = None
    # engine:llmb_prefill_efficiency:ratio<rate_window>: prefill tok/s / the compute limit
    prefill_efficiency: float | None = None
    # engine:llmb_ttft_wait:ratio<rate_window>: waiting / (waiting + in prefill), averages
    ttft_wait_share: float | None = None
    # engine:llmb_prefill_time:ratio<rate_window>: prompt seconds / (prompt + decode seconds)
    prefill_time_share: float | None = None


SIGNAL_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(Signals))


def _records() -> dict[str, str]:
    rw, qw = threshold_promql("rate_window"), threshold_promql("queue_window")
    return {
        "layers_ratio": "engine:llmb_gpu_layers_offloaded:ratio",
        "weights_buffers_ratio": "engine:llmb_weights_gpu_buffers:ratio",
        "weights_memory_ratio": "engine:llmb_weights_gpu_memory:ratio",
        "kv_usage_avg": f"engine:llmb_kv_cache_usage:avg{qw}",
        "waiting_avg": f"engine:llmb_requests_waiting:avg{qw}",
        "kv_pressure_increase": f"engine:llmb_kv_pressure_events:increase{rw}",
        "running": "engine:llmb_requests_running:max",
        "waiting": "engine:llmb_requests_waiting:max",
        "running_slots_ratio": "engine:llmb_requests_running_slots:ratio",
        "kv_demand_held_ratio": "engine:llmb_kv_demand_held:ratio",
        "kv_demand_finished_ratio": "engine:llmb_kv_demand_finished:ratio",
        "weights_memory_beyond_kv_ratio": "engine:llmb_weights_gpu_memory_beyond_kv:ratio",
        "generation_tokens_per_second": f"engine:llmb_generation_tokens_per_second:rate{rw}",
        "decode_efficiency": f"engine:llmb_decode_efficiency:ratio{rw}",
        "experts_host_layers": "engine:llmb_experts_host_layers:max",
        # the card's own state (mixin/rules/card.py)
        "card_power_slowdown": f"engine:llmb_gpu_power_slowdown:avg{rw}",
        "card_thermal_slowdown": f"engine:llmb_gpu_thermal_slowdown:avg{rw}",
        "sm_clock_ratio": f"engine:llmb_gpu_sm_clock:ratio{rw}",
        "card_brake_slowdown": f"engine:llmb_gpu_brake_slowdown:avg{rw}",
        "power_limit_ratio": "engine:llmb_gpu_power_limit:ratio",
        "card_shortfall_explained": f"engine:llmb_card_shortfall_explained:ratio{rw}",
        "memory_clock_ratio": f"engine:llmb_gpu_memory_clock:ratio{rw}",
        # prefill (mixin/rules/prefill.py)
        "prompt_tokens_mean": f"engine:llmb_request_prompt_tokens:mean{rw}",
        "prefill_efficiency": f"engine:llmb_prefill_efficiency:ratio{rw}",
        "ttft_wait_share": f"engine:llmb_ttft_wait:ratio{rw}",
        "prefill_time_share": f"engine:llmb_prefill_time:ratio{rw}",
    }


# Signals field -> the recorded series (prometheus/rules/recording.yml) the rules read it
# from. `host_has_gpu` has none: the rules test `llmb_gpu_memory_total_bytes` directly.
SIGNAL_RECORDS: dict[str, str] = _records()
