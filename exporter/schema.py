"""The normalized metric schema: every series the exporter can emit.

`SCHEMA` is the single source of truth for names, types, help texts and label
names; `docs/metrics.md` documents the same set (a test keeps them equal).
`MetricSet` builds fresh prometheus_client families for one scrape from it, so a
collector cannot emit a name, type or label set that the schema does not know.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
)
from prometheus_client.metrics_core import Metric

ENGINE = ("engine", "kind")
GPU = ("gpu",)


@dataclass(frozen=True)
class Spec:
    """Type, help text and label names of one family."""

    type: str  # gauge | counter | histogram | info
    help: str
    labels: tuple[str, ...]


def _g(help_: str, labels: tuple[str, ...] = ENGINE) -> Spec:
    return Spec("gauge", help_, labels)


def _c(help_: str, labels: tuple[str, ...] = ENGINE) -> Spec:
    return Spec("counter", help_, labels)


SCHEMA: dict[str, Spec] = {
    # --- GPU (NVML) -------------------------------------------------------------------------
    "llmb_gpu_info": Spec(
        "info",
        "GPU identity and where its bandwidth figure comes from.",
        ("gpu", "uuid", "name", "driver", "bandwidth_source"),
    ),
    "llmb_gpu_memory_total_bytes": _g("Total GPU memory.", GPU),
    "llmb_gpu_memory_used_bytes": _g(
        "GPU memory in use (NVML v2 'used': excludes driver-reserved memory, as nvidia-smi).", GPU
    ),
    "llmb_gpu_memory_free_bytes": _g("Free GPU memory.", GPU),
    "llmb_gpu_memory_reserved_bytes": _g("GPU memory reserved by the driver.", GPU),
    "llmb_gpu_memory_used_peak_bytes": _g(
        "Highest used GPU memory seen by the background sampler over the peak window.", GPU
    ),
    "llmb_gpu_utilization_ratio": _g("GPU busy ratio over NVML's last sample period (0-1).", GPU),
    "llmb_gpu_memory_clock_hertz": _g("Current memory clock.", GPU),
    "llmb_gpu_memory_bus_width_bits": _g("Memory bus width.", GPU),
    "llmb_gpu_memory_bandwidth_bytes_per_second": _g(
        "Theoretical peak memory bandwidth (known-GPU table, config override, or clock x bus).", GPU
    ),
    "llmb_gpu_process_memory_used_bytes": _g(
        "GPU memory used by one process, attributed to a configured engine when it matches.",
        ("gpu", "pid", "process", "engine"),
    ),
    "llmb_gpu_process_memory_used_peak_bytes": _g(
        "Highest GPU memory of one process over the peak window.",
        ("gpu", "pid", "process", "engine"),
    ),
    "llmb_gpu_samples_total": _c("NVML background samples taken.", ()),
    # --- Engine identity and health ---------------------------------------------------------
    "llmb_engine_up": _g("1 when the engine answers its health endpoint with success, else 0."),
    "llmb_engine_loading": _g("1 while the engine reports that it is loading the model."),
    "llmb_engine_info": Spec(
        "info",
        "Engine identity: model, version/build, quantization; simulated=true for simulators.",
        (*ENGINE, "model", "version", "quantization", "simulated"),
    ),
    "llmb_engine_endpoint_enabled": _g(
        "1 when an optional engine endpoint is enabled, 0 when the engine answers 501 for it.",
        (*ENGINE, "endpoint"),
    ),
    # --- Scheduling -------------------------------------------------------------------------
    "llmb_engine_requests_running": _g("Requests being processed (in a slot / running batch)."),
    "llmb_engine_requests_waiting": _g("Requests queued for lack of a slot or KV space."),
    "llmb_engine_slots": _g("Maximum concurrently running requests (llama.cpp -np; SGLang max)."),
    "llmb_engine_context_tokens": _g("Maximum context per sequence in tokens."),
    # --- KV cache ---------------------------------------------------------------------------
    "llmb_engine_kv_cache_capacity_tokens": _g("KV cache capacity in tokens (all sequences)."),
    "llmb_engine_kv_cache_used_tokens": _g("KV cache tokens held by running requests."),
    "llmb_engine_kv_cache_usage_ratio": _g("KV cache used / capacity (0-1)."),
    "llmb_engine_slot_context_usage_max_ratio": _g(
        "Fullest running slot: tokens held / per-slot context (llama.cpp, non-unified KV)."
    ),
    "llmb_engine_kv_pressure_events_total": _c(
        "KV pressure events: kv_no_space, context_exceeded, context_shift, slot_truncated "
        "(llama.cpp log) or retracted (SGLang).",
        (*ENGINE, "event"),
    ),
    "llmb_engine_kv_cache_bytes": _g(
        "KV cache memory the engine reports it allocated (llama.cpp log; SGLang constant).",
        (*ENGINE, "device"),
    ),
    # --- Tokens and time (counters) ---------------------------------------------------------
    "llmb_engine_prompt_tokens_total": _c("Prompt tokens of finished/processed requests, incl. cached."),
    "llmb_engine_prompt_tokens_cached_total": _c("Prompt tokens served from the prefix cache."),
    "llmb_engine_prompt_seconds_total": _c("Time spent in prompt processing (llama.cpp)."),
    "llmb_engine_generation_tokens_total": _c("Generated tokens."),
    "llmb_engine_decode_tokens_total": _c(
        "Tokens counted by the per-sequence decode timer; rate ratio with decode_seconds = "
        "per-sequence tok/s."
    ),
    "llmb_engine_decode_seconds_total": _c("Per-sequence decode time summed over sequences."),
    "llmb_engine_requests_finished_total": _c("Requests finished (SGLang)."),
    "llmb_engine_decode_steps_total": _c("Batched decode steps (llama.cpp llama_decode calls)."),
    # --- Server-side latency histograms (SGLang exposes them; llama.cpp has none) -----------
    "llmb_engine_time_to_first_token_seconds": Spec(
        "histogram", "Server-side time to first token.", ENGINE
    ),
    "llmb_engine_inter_token_latency_seconds": Spec(
        "histogram", "Server-side inter-token latency.", ENGINE
    ),
    "llmb_engine_queue_time_seconds": Spec("histogram", "Server-side time spent queued.", ENGINE),
    "llmb_engine_e2e_request_latency_seconds": Spec(
        "histogram", "Server-side end-to-end request latency.", ENGINE
    ),
    # --- Memory residency -------------------------------------------------------------------
    "llmb_engine_process_gpu_memory_bytes": _g(
        "GPU memory of all processes attributed to the engine (NVML), summed over GPUs."
    ),
    "llmb_engine_process_gpu_memory_peak_bytes": _g(
        "Peak of the engine's summed process GPU memory over the peak window."
    ),
    "llmb_engine_model_buffer_bytes": _g(
        "Model weight buffers the engine reports per device (llama.cpp log, e.g. CUDA0, CPU_Mapped).",
        (*ENGINE, "device"),
    ),
    "llmb_engine_gpu_layers_offloaded": _g("Layers the engine put on the GPU (llama.cpp log)."),
    "llmb_engine_gpu_layers_total": _g("Layers of the model (llama.cpp log)."),
    "llmb_engine_load_seconds": _g("Time the engine took to load the model (log / SGLang startup)."),
    # --- Model geometry ---------------------------------------------------------------------
    "llmb_model_weights_bytes": _g("Size of the model weights."),
    "llmb_model_parameters": _g("Parameter count of the model."),
    "llmb_model_layers": _g("Transformer layers of the model."),
    "llmb_model_kv_bytes_per_token_estimated": _g(
        "KV bytes per token of context from the architecture (full-attention layers)."
    ),
    "llmb_model_kv_cache_bytes_estimated": _g(
        "KV cache bytes the engine should allocate for its configured context, from the "
        "architecture (sliding-window layers capped at the window)."
    ),
    # --- Exporter self-metrics --------------------------------------------------------------
    "llmb_source_up": _g("1 when the source was read successfully in this scrape.", ("source",)),
    "llmb_source_duration_seconds": _g("Time taken to read the source in this scrape.", ("source",)),
    "llmb_source_errors_total": _c(
        "Source read failures by reason: timeout, connect, http, parse.", ("source", "reason")
    ),
    "llmb_exporter_build_info": Spec("info", "Exporter version.", ("version",)),
}


class MetricSet:
    """Fresh families for one scrape, checked against SCHEMA as samples are added."""

    def __init__(self) -> None:
        self._families: dict[str, Metric] = {}

    def _family(self, name: str) -> tuple[Metric, Spec]:
        spec = SCHEMA[name]  # KeyError: not in the schema
        fam = self._families.get(name)
        if fam is None:
            labels = list(spec.labels)
            if spec.type == "gauge":
                fam = GaugeMetricFamily(name, spec.help, labels=labels)
            elif spec.type == "counter":
                fam = CounterMetricFamily(name, spec.help, labels=labels)
            elif spec.type == "histogram":
                fam = HistogramMetricFamily(name, spec.help, labels=labels)
            elif spec.type == "info":
                # client_python appends "_info" to the sample name itself.
                fam = InfoMetricFamily(name.removesuffix("_info"), spec.help, labels=[])
            else:  # pragma: no cover - schema typo
                raise ValueError(spec.type)
            self._families[name] = fam
        return fam, spec

    @staticmethod
    def _values(spec: Spec, labels: Mapping[str, str]) -> list[str]:
        if set(labels) != set(spec.labels):
            raise ValueError(f"labels {sorted(labels)} do not match schema {sorted(spec.labels)}")
        return [str(labels[k]) for k in spec.labels]

    def add(self, name: str, value: float | None, **labels: str) -> None:
        """Add one gauge or counter sample; None means 'not known' and adds nothing."""
        if value is None:
            return
        fam, spec = self._family(name)
        values = self._values(spec, labels)
        fam.add_metric(values, float(value))  # type: ignore[attr-defined]

    def info(self, name: str, **labels: str) -> None:
        """Add one info sample (value 1) with the given labels."""
        fam, spec = self._family(name)
        values = self._values(spec, labels)
        fam.add_metric([], dict(zip(spec.labels, values)))  # type: ignore[attr-defined]

    def histogram(
        self,
        name: str,
        buckets: Iterable[tuple[str, float]],
        sum_value: float,
        **labels: str,
    ) -> None:
        """Add one histogram: cumulative (le, count) pairs ending in +Inf, and the sum."""
        fam, spec = self._family(name)
        values = self._values(spec, labels)
        fam.add_metric(values, list(buckets), sum_value)  # type: ignore[attr-defined]

    def metrics(self) -> list[Metric]:
        return list(self._families.values())
