"""The prefill recording rules' arithmetic over raw samples (mixin/rules/prefill.py), in the
same order as the PromQL: mean prompt, the engine's peak compute, FLOPs per prompt token at
that prompt, the compute limit, the efficiency, and the time before the first token split.
"""

from __future__ import annotations

from collections.abc import Callable

from core import promql
from core import series as llmb
from core.card import clock_scaled_peak
from core.card_rules import sm_clock_ratio
from core.prefill import (
    PEAK_DTYPE,
    PrefillStructure,
    prefill_efficiency,
    prefill_flops_per_token,
    prefill_limit_tokens_per_second,
    prefill_tokens_per_second,
    ttft_wait_share,
)
from core.promql import Data, EngineKey
from core.thresholds import threshold_seconds

# The prefill model's series (exporter/schema.py).
# The wall time in which prefill ran (exporter/schema.py).


def prefill_values(d: Data) -> dict[str, dict[EngineKey, float]]:
    """The prefill Signals fields per engine (field -> {EngineKey: value}) at `d`'s time."""
    rw = threshold_seconds("rate_window")
    rate: Callable[[str], dict[EngineKey, float]] = lambda name: promql.rate_max(d, name, rw)  # noqa: E731
    prompt_s = rate(llmb.ENGINE_PROMPT_SECONDS_TOTAL)
    prompt = promql.divide(
        rate(llmb.ENGINE_PROMPT_TOKENS_TOTAL), rate(llmb.ENGINE_REQUESTS_FINISHED_TOTAL)
    )
    peaks = promql.max_by(
        ((lab.get("host", ""), lab.get("gpu", "")), v)
        for lab, v in d.instant(llmb.GPU_PEAK_FLOPS, lambda lab: lab.get("dtype") == PEAK_DTYPE)
    )
    # At the SM clock each GPU ran under load (issue 32: a card slowed to 96 % computes 96 %).
    sm = sm_clock_ratio(d)
    peak = promql.engine_gpus(d, {k: clock_scaled_peak(v, sm.get(k)) for k, v in peaks.items()})
    measured = measured_tokens_per_second(d)
    efficiency: dict[EngineKey, float] = {}
    for key, matmul in promql.instant_max(d, llmb.MODEL_PREFILL_FLOPS_PER_TOKEN).items():
        model = structure(d, key, matmul)
        limit = prefill_limit_tokens_per_second(
            peak.get(key), prefill_flops_per_token(model, prompt.get(key))
        )
        value = prefill_efficiency(measured.get(key), limit)
        if value is not None:
            efficiency[key] = value
    waiting = promql.avg_max(d, llmb.ENGINE_REQUESTS_WAITING, rw)
    decode_s = rate(llmb.ENGINE_DECODE_SECONDS_TOTAL)
    wait_share: dict[EngineKey, float] = {}
    time_share: dict[EngineKey, float] = {}
    for key, p in prompt_s.items():
        share = ttft_wait_share(waiting.get(key), p)
        if share is not None:
            wait_share[key] = share
        if key in decode_s and p + decode_s[key] > 0:
            time_share[key] = p / (p + decode_s[key])
    return {
        "prompt_tokens_mean": prompt,
        "prefill_efficiency": efficiency,
        "ttft_wait_share": wait_share,
        "prefill_time_share": time_share,
    }


def measured_tokens_per_second(d: Data) -> dict[EngineKey, float]:
    """`engine:llmb_prefill_tokens_per_second:rate<rw>` (mixin/rules/recording.py): prompt
    tokens computed (cache hits left out) over the wall time in which prefill ran
    (`core.prefill.prefill_tokens_per_second`; a PromQL rate of the busy counter is the
    busy seconds per second)."""
    rw = threshold_seconds("rate_window")
    rate: Callable[[str], dict[EngineKey, float]] = lambda name: promql.rate_max(d, name, rw)  # noqa: E731
    tokens = rate(llmb.ENGINE_PROMPT_TOKENS_TOTAL)
    cached = rate(llmb.ENGINE_PROMPT_TOKENS_CACHED_TOTAL)
    busy = rate(llmb.ENGINE_PREFILL_BUSY_SECONDS_TOTAL)
    # Without a busy series (SGLang times each request, not the batch): its requests' prompt
    # seconds, at most one per second of wall time. Prompts computed together count their
    # shared time more than once there, so the rate is a lower bound (docs/metrics.md).
    summed = rate(llmb.ENGINE_PROMPT_SECONDS_TOTAL)
    out: dict[EngineKey, float] = {}
    for key, total in tokens.items():
        wall = busy.get(key)
        if (wall is None or not wall > 0) and summed.get(key, 0.0) > 0:
            wall = min(summed[key], 1.0)
        value = prefill_tokens_per_second(total - cached.get(key, 0 * total), wall)
        if value is not None:
            out[key] = value
    return out


def structure(d: Data, key: EngineKey, matmul: float) -> PrefillStructure:
    """One engine's prefill structure from the model series (absent attention counts 0)."""
    attention = promql.max_by(
        ((promql.engine_key(lab), lab.get("layers", "")), v)
        for lab, v in d.instant(llmb.MODEL_PREFILL_ATTENTION_FLOPS_PER_POSITION)
    )
    window = promql.instant_max(d, llmb.MODEL_SLIDING_WINDOW_TOKENS).get(key)
    return PrefillStructure(
        matmul,
        attention.get((key, "full"), 0.0),
        attention.get((key, "sliding"), 0.0),
        window,
    )
