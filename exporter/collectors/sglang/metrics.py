"""SGLang's `/metrics` (`sglang:*` families) mapped onto the llmb_* schema.

Multi-rank servers: scheduler series carry `tp_rank`/`pp_rank` (and `dp_rank` with data
parallelism). By default only attention-TP rank 0 of each DP group reports; when several
TP/PP ranks do (`--enable-metrics-for-all-schedulers`) rank 0 is taken, so a request or a
KV pool is never counted twice. DP groups are separate schedulers with separate pools,
so their values are summed.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable

from core import series as llmb
from exporter.promtext import Exposition, Sample
from exporter.schema import MetricSet

PREFIX = "sglang:"
# First release seen with the `num_retracted_requests` counter (created at the first
# retraction); 0.5.11 has only the `num_retracted_reqs` gauge.
RETRACTION_COUNTER_SINCE = (0, 5, 23)
RANK_LABELS = ("tp_rank", "pp_rank")

# (schema histogram, SGLang histogram names in order of preference: current, older)
HISTOGRAMS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (llmb.ENGINE_TIME_TO_FIRST_TOKEN_SECONDS, ("time_to_first_token_seconds",)),
    (
        llmb.ENGINE_INTER_TOKEN_LATENCY_SECONDS,
        ("inter_token_latency_seconds", "time_per_output_token_seconds"),
    ),
    (llmb.ENGINE_QUEUE_TIME_SECONDS, ("queue_time_seconds",)),
    (llmb.ENGINE_E2E_REQUEST_LATENCY_SECONDS, ("e2e_request_latency_seconds",)),
    # Per-request lengths in tokens (the served mix, loadgen/served_mix.py).
    (llmb.ENGINE_REQUEST_PROMPT_TOKENS, ("prompt_tokens_histogram",)),
    (llmb.ENGINE_REQUEST_GENERATION_TOKENS, ("generation_tokens_histogram",)),
)

# Families the mapping reads (without `sglang:` and without _total/_bucket/_sum/_count);
# only their lines are parsed (exporter.promtext). A test keeps this list complete.
FAMILIES = (
    "context_len",
    "kv_cache_memory_usage_gb",
    "kv_used_tokens",
    "max_total_num_tokens",
    "max_total_num_tokens_swa",
    "num_queue_reqs",
    "num_retracted_requests",
    "num_retracted_reqs",
    "num_paused_reqs",
    "num_running_reqs",
    "num_used_tokens",
    "page_size",
    "token_usage",
    "full_token_usage",
    "swa_token_usage",
    "spec_accept_length",
    "weight_memory_usage_gb",
    "cached_tokens",
    "generation_tokens",
    "num_requests",
    "prompt_tokens",
    "startup_time_seconds",
    *(name for _, names in HISTOGRAMS for name in names),
)


def finite(samples: Iterable[Sample]) -> list[Sample]:
    """The samples with a value: NaN is an engine's "no value" (SGLang writes it for idle
    ratios) and is skipped silently; ±Inf is kept, so the MetricSet drops the series it
    reaches and counts it."""
    return [s for s in samples if not math.isnan(s.value)]


def _rank0(samples: list[Sample]) -> list[Sample]:
    """Keep the rank-0 samples of one DP group (all samples when no rank 0 reports)."""
    for label in RANK_LABELS:
        zero = [s for s in samples if s.labels.get(label, "0") == "0"]
        if zero:
            samples = zero
    return samples


def _priority_total(samples: list[Sample]) -> list[Sample]:
    # With priority scheduling SGLang adds per-priority series and the total under priority="".
    if any("priority" in s.labels for s in samples):
        total = [s for s in samples if s.labels.get("priority", "") == ""]
        return total or samples
    return samples


def _by_dp(samples: list[Sample]) -> dict[str, list[Sample]]:
    groups: dict[str, list[Sample]] = defaultdict(list)
    for s in samples:
        groups[s.labels.get("dp_rank", "")].append(s)
    return groups


def scheduler_value(expo: Exposition, name: str, reduce: str = "sum") -> float | None:
    """One scheduler series: rank 0 of each DP group, then summed (or max) over DP groups."""
    samples = _priority_total(finite(expo.get(PREFIX + name)))
    if not samples:
        return None
    per_group = [max(s.value for s in _rank0(g)) for g in _by_dp(samples).values()]
    return max(per_group) if reduce == "max" else sum(per_group)


def total_value(expo: Exposition, name: str, **match: str) -> float | None:
    """A tokenizer-side series (no rank labels): sum over label sets like `is_streaming`."""
    samples = _priority_total(finite(expo.get(PREFIX + name, **match)))
    if not samples:
        return None
    if any(label in s.labels for s in samples for label in RANK_LABELS):
        return sum(max(s.value for s in _rank0(g)) for g in _by_dp(samples).values())
    return sum(s.value for s in samples)


def _histogram(expo: Exposition, base: str) -> tuple[list[tuple[str, float]], float] | None:
    """Buckets (summed per `le` over label sets, rank 0 only) and the summed `_sum`."""
    buckets = _priority_total(finite(expo.get(PREFIX + base + "_bucket")))
    if not buckets:
        return None
    selected: list[Sample] = []
    for group in _by_dp(buckets).values():
        selected.extend(_rank0(group))
    by_le: dict[float, tuple[str, float]] = {}
    for s in selected:
        le = s.labels.get("le")
        if le is None:
            continue
        try:
            key = float(le)
        except ValueError:
            key = math.nan
        if math.isnan(key):
            raise ValueError(f"{base}: bucket bound le={le!r} is not a number")
        text, value = by_le.get(key, (le, 0.0))
        by_le[key] = (text, value + s.value)
    if math.inf not in by_le:
        return None
    keep = {tuple(sorted((k, v) for k, v in s.labels.items() if k != "le")) for s in selected}
    total = 0.0
    for s in finite(expo.get(PREFIX + base + "_sum")):
        if tuple(sorted(s.labels.items())) in keep:
            total += s.value
    return [by_le[k] for k in sorted(by_le)], total


def kv_usage_ratio(expo: Exposition) -> float | None:
    """KV usage 0-1 of the fullest pool.

    SGLang rounds `token_usage` to two decimals (0.0038 reads 0.0 on the H200 capture);
    `full_token_usage` / `swa_token_usage` (0.5.11 and 0.5.23) are unrounded, and
    `token_usage` is their maximum. Older servers have only `token_usage`.
    """
    full = scheduler_value(expo, "full_token_usage", "max")
    if full is None:
        return scheduler_value(expo, "token_usage", "max")
    swa = scheduler_value(expo, "swa_token_usage", "max")
    return full if swa is None else max(full, swa)


def map_metrics(
    ms: MetricSet, expo: Exposition, version: tuple[int, ...] | None, labels: dict[str, str]
) -> None:
    """Every series that comes from /metrics alone."""
    _map_scheduling(ms, expo, labels)
    _map_tokens(ms, expo, labels)
    ms.add(
        llmb.ENGINE_KV_PRESSURE_EVENTS_TOTAL,
        _retracted(expo, version),
        event="retracted",
        **labels,
    )
    load_samples = finite(expo.get(PREFIX + "startup_time_seconds", phase="load_weight"))
    load = max((s.value for s in load_samples), default=None)
    ms.add(llmb.ENGINE_LOAD_SECONDS, load, **labels)
    _map_histograms(ms, expo, labels)


def _map_scheduling(ms: MetricSet, expo: Exposition, labels: dict[str, str]) -> None:
    ms.add(llmb.ENGINE_REQUESTS_RUNNING, scheduler_value(expo, "num_running_reqs"), **labels)
    ms.add(llmb.ENGINE_REQUESTS_WAITING, scheduler_value(expo, "num_queue_reqs"), **labels)
    ms.add(llmb.ENGINE_CONTEXT_TOKENS, scheduler_value(expo, "context_len", "max"), **labels)
    capacity = scheduler_value(expo, "max_total_num_tokens")
    ms.add(llmb.ENGINE_KV_CACHE_CAPACITY_TOKENS, capacity, **labels)
    used = scheduler_value(expo, "kv_used_tokens")
    if used is None:
        used = scheduler_value(expo, "num_used_tokens")
    ms.add(llmb.ENGINE_KV_CACHE_USED_TOKENS, used, **labels)
    # The fullest DP group throttles admission; token_usage is already max over pools.
    ms.add(llmb.ENGINE_KV_CACHE_USAGE_RATIO, kv_usage_ratio(expo), **labels)


def _cached_tokens(expo: Exposition) -> float | None:
    cached = total_value(expo, "cached_tokens_total", cache_source="total")
    if cached is not None:
        return cached
    parts = [
        total_value(expo, "cached_tokens_total", cache_source=src)
        for src in ("device", "host", "storage")
    ]
    known = [p for p in parts if p is not None]
    if known:
        return sum(known)
    return total_value(expo, "cached_tokens_total")  # older: no cache_source


def _map_tokens(ms: MetricSet, expo: Exposition, labels: dict[str, str]) -> None:
    ms.add(llmb.ENGINE_PROMPT_TOKENS_TOTAL, total_value(expo, "prompt_tokens_total"), **labels)
    ms.add(llmb.ENGINE_PROMPT_TOKENS_CACHED_TOTAL, _cached_tokens(expo), **labels)
    ms.add(
        llmb.ENGINE_GENERATION_TOKENS_TOTAL,
        total_value(expo, "generation_tokens_total"),
        **labels,
    )
    for itl in ("inter_token_latency_seconds", "time_per_output_token_seconds"):
        count = total_value(expo, itl + "_count")
        if count is not None:
            ms.add(llmb.ENGINE_DECODE_TOKENS_TOTAL, count, **labels)
            ms.add(llmb.ENGINE_DECODE_SECONDS_TOTAL, total_value(expo, itl + "_sum"), **labels)
            break
    ms.add(llmb.ENGINE_REQUESTS_FINISHED_TOTAL, total_value(expo, "num_requests_total"), **labels)


def _retracted(expo: Exposition, version: tuple[int, ...] | None) -> float | None:
    retracted = scheduler_value(expo, "num_retracted_requests_total")
    if (
        retracted is None
        and PREFIX + "num_retracted_reqs" in expo
        and version is not None
        and version >= RETRACTION_COUNTER_SINCE
    ):
        # The counter appears at the first retraction, the gauge at the first stats
        # publish: on a release with the counter, gauge without counter is a true zero.
        # Older ones (0.5.11) have only the gauge (retracted in the last step), which
        # says nothing about how many there were: unknown, so absent.
        return 0.0
    return retracted


def _map_histograms(ms: MetricSet, expo: Exposition, labels: dict[str, str]) -> None:
    for schema_name, candidates in HISTOGRAMS:
        for base in candidates:
            try:
                hist = _histogram(expo, base)
            except ValueError as exc:  # a bucket bound that is no number
                ms.problems.append(str(exc))
                break
            if hist is not None:
                ms.histogram(schema_name, hist[0], hist[1], **labels)
                break


class PromptSeconds:
    """`llmb_engine_prompt_seconds_total` for SGLang: the time from admission to the first
    token summed over requests (TTFT histogram sum - queue-time histogram sum).

    A request adds its queue time at admission and its TTFT only at its first token, so the
    difference dips meanwhile; held at its highest value it stays a counter (a lower TTFT
    sum is a restart, which starts it over).
    """

    def __init__(self) -> None:
        self._ttft = 0.0
        self._value = 0.0

    def read(self, expo: Exposition) -> float | None:
        """The counter's value now, None without both histograms."""
        ttft = total_value(expo, "time_to_first_token_seconds_sum")
        queue = total_value(expo, "queue_time_seconds_sum")
        if ttft is None or queue is None:
            return None
        if ttft < self._ttft:
            self._value = 0.0
        self._ttft = ttft
        self._value = max(self._value, ttft - queue, 0.0)
        return self._value
