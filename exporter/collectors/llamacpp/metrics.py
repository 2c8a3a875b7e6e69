"""llama-server's `/metrics`, `/slots` and `/props` mapped onto the llmb_* schema.

* KV fill comes from `/slots` (llama.cpp removed its KV metrics in 2025): tokens held by
  *processing* slots over the KV capacity. Builds that still expose
  `llamacpp:kv_cache_usage_ratio` / `kv_cache_tokens` are used directly.
* Per-sequence decode speed comes from the counters `tokens_predicted_total` /
  `tokens_predicted_seconds_total` (both move when a request ends). The windowed
  throughput gauges are never used: llama.cpp resets them on every scrape, so they
  depend on who else scrapes.
* Without `/metrics` the per-request timing lines of the log stand in for the token/time
  counters.
"""

from __future__ import annotations

from core import series as llmb
from exporter.collectors.llamacpp.log import LogState
from exporter.fields import Fields
from exporter.promtext import Exposition
from exporter.schema import MetricSet

PREFIX = "llamacpp:"


def map_info(
    ms: MetricSet, props: Fields, model: Fields, meta: Fields, labels: dict[str, str]
) -> None:
    """`llmb_engine_info` from /props and the first /v1/models card."""
    build = props.text("build_info") or ""
    ms.info(
        llmb.ENGINE_INFO,
        model=model.text("id") or props.text("model_alias") or props.text("model_path") or "",
        version=build,
        quantization=meta.text("ftype") or props.text("model_ftype") or "",
        simulated="true" if "llmb-sim" in build else "false",
        **labels,
    )


def slot_shape(props: Fields, slots: list[Fields] | None) -> tuple[int | None, int | None]:
    """(slots, per-slot context): live /slots first, else /props."""
    if slots:
        return len(slots), slots[0].count("n_ctx")
    n_ctx = props.obj("default_generation_settings").count("n_ctx")
    return props.count("total_slots"), n_ctx


def map_scheduling(
    ms: MetricSet,
    expo: Exposition | None,
    slots: list[Fields] | None,
    props: Fields,
    kv_unified: bool,
    labels: dict[str, str],
) -> None:
    """Slots, context, running/waiting requests and the KV cache's fill."""
    n_slots, n_ctx = slot_shape(props, slots)
    ms.add(llmb.ENGINE_SLOTS, n_slots, **labels)
    ms.add(llmb.ENGINE_CONTEXT_TOKENS, n_ctx, **labels)

    running = expo.first(PREFIX + "requests_processing") if expo else None
    if running is None and slots is not None:
        running = sum(1 for s in slots if s.flag("is_processing"))
    ms.add(llmb.ENGINE_REQUESTS_RUNNING, running, **labels)
    if expo:
        ms.add(llmb.ENGINE_REQUESTS_WAITING, expo.first(PREFIX + "requests_deferred"), **labels)

    capacity: float | None = None
    if n_ctx and n_slots:
        capacity = n_ctx if kv_unified else n_ctx * n_slots
    used: float | None = None
    ratio: float | None = None
    if expo and PREFIX + "kv_cache_usage_ratio" in expo:
        # Builds before llama.cpp PR #13660 (May 2025) still report KV directly.
        ratio = expo.first(PREFIX + "kv_cache_usage_ratio")
        used = expo.first(PREFIX + "kv_cache_tokens")
        if used is not None and ratio:
            capacity = capacity or used / ratio
    if slots is not None:
        held = [
            (s.count("n_prompt_tokens") or 0, s.count("n_ctx") or 0)
            for s in slots
            if s.flag("is_processing")
        ]
        if used is None:
            used = float(sum(t for t, _ in held))
        fullest = max((t / c for t, c in held if c), default=0.0)
        ms.add(llmb.ENGINE_SLOT_CONTEXT_USAGE_MAX_RATIO, min(1.0, fullest), **labels)
    if ratio is None and used is not None and capacity:
        ratio = min(1.0, used / capacity)
    ms.add(llmb.ENGINE_KV_CACHE_CAPACITY_TOKENS, capacity, **labels)
    ms.add(llmb.ENGINE_KV_CACHE_USED_TOKENS, used, **labels)
    ms.add(llmb.ENGINE_KV_CACHE_USAGE_RATIO, ratio, **labels)


def _map_counters(
    ms: MetricSet, expo: Exposition, log_state: LogState | None, labels: dict[str, str]
) -> None:
    processed = expo.first(PREFIX + "prompt_tokens_total")
    cached = expo.first(PREFIX + "prompt_tokens_cached_total")
    if processed is not None:
        # llama.cpp counts processed prompt tokens without the cache hits; the schema
        # counts all prompt tokens, as SGLang does.
        ms.add(llmb.ENGINE_PROMPT_TOKENS_TOTAL, processed + (cached or 0.0), **labels)
    ms.add(llmb.ENGINE_PROMPT_TOKENS_CACHED_TOTAL, cached, **labels)
    if log_state is None:
        # Without the log: llama.cpp's own prompt time. Current builds time each prompt
        # batch once however many prompts it holds: a wall time, so the busy series only.
        # Each request's prompt time summed (llmb_engine_prompt_seconds_total) is not
        # measured then: the batch time would read prompts computed together as waiting
        # (the rules' TTFT split). The log's `prompt eval time` lines give both (map_tokens).
        seconds = expo.first(PREFIX + "prompt_seconds_total")
        ms.add(llmb.ENGINE_PREFILL_BUSY_SECONDS_TOTAL, seconds, **labels)
    predicted = expo.first(PREFIX + "tokens_predicted_total")
    ms.add(llmb.ENGINE_GENERATION_TOKENS_TOTAL, predicted, **labels)
    if log_state is None:
        # Counts every generated token, also the first one that the prompt pass
        # produced: per-sequence speed reads high by n/(n-1), and one-token requests
        # (probes) add tokens without time. The log corrects both (see below).
        ms.add(llmb.ENGINE_DECODE_TOKENS_TOTAL, predicted, **labels)
        ms.add(
            llmb.ENGINE_DECODE_SECONDS_TOTAL,
            expo.first(PREFIX + "tokens_predicted_seconds_total"),
            **labels,
        )
    ms.add(llmb.ENGINE_DECODE_STEPS_TOTAL, expo.first(PREFIX + "n_decode_total"), **labels)


def map_tokens(
    ms: MetricSet, expo: Exposition | None, log_state: LogState | None, labels: dict[str, str]
) -> None:
    """Token and time counters: /metrics, corrected (or replaced) by the log's timing lines."""
    if expo is not None:
        _map_counters(ms, expo, log_state, labels)
    elif log_state is not None:
        ms.add(llmb.ENGINE_GENERATION_TOKENS_TOTAL, log_state.eval_tokens, **labels)
    if log_state is not None:
        # Each request's own prompt time, summed (the rules' requests in prefill, by
        # Little's law), and the union of their spans (the wall time prefill ran).
        ms.add(llmb.ENGINE_PROMPT_SECONDS_TOTAL, log_state.prompt_seconds, **labels)
        ms.add(llmb.ENGINE_PREFILL_BUSY_SECONDS_TOTAL, log_state.prefill_busy_seconds, **labels)
        # Decode intervals after each request's first token over the engine's decode
        # time: what timings.predicted_per_second and SGLang's ITL histogram measure.
        ms.add(llmb.ENGINE_DECODE_TOKENS_TOTAL, log_state.eval_intervals, **labels)
        ms.add(llmb.ENGINE_DECODE_SECONDS_TOTAL, log_state.eval_seconds, **labels)
        ms.add(llmb.ENGINE_REQUESTS_FINISHED_TOTAL, log_state.requests_finished, **labels)
