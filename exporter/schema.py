"""The normalized metric schema: every series the exporter can emit.

`SCHEMA` is the single source of truth for names, types, help texts and label
names; `docs/metrics.md` documents the same set (a test keeps them equal).
`MetricSet` builds fresh prometheus_client families for one scrape from it, so a
collector cannot emit a name, type or label set that the schema does not know.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from itertools import pairwise
from typing import TYPE_CHECKING, Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
)
from prometheus_client.metrics_core import Metric

from core import series

if TYPE_CHECKING:
    from model.geometry import ModelGeometry

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
    series.GPU_INFO: Spec(
        "info",
        "GPU identity and where its bandwidth figure comes from.",
        ("gpu", "uuid", "name", "driver", "bandwidth_source"),
    ),
    series.GPU_MEMORY_TOTAL_BYTES: _g("Total GPU memory.", GPU),
    series.GPU_MEMORY_USED_BYTES: _g(
        "GPU memory in use (NVML v2 'used': excludes driver-reserved memory, as nvidia-smi).", GPU
    ),
    series.GPU_MEMORY_FREE_BYTES: _g("Free GPU memory.", GPU),
    series.GPU_MEMORY_RESERVED_BYTES: _g("GPU memory reserved by the driver.", GPU),
    series.GPU_MEMORY_USED_PEAK_BYTES: _g(
        "Highest used GPU memory seen by the background sampler over the peak window.", GPU
    ),
    series.GPU_UTILIZATION_RATIO: _g("GPU busy ratio over NVML's last sample period (0-1).", GPU),
    series.GPU_MEMORY_CLOCK_HERTZ: _g("Current memory clock.", GPU),
    series.GPU_MEMORY_BUS_WIDTH_BYTES: _g("Memory bus width (bytes per transfer: bits / 8).", GPU),
    series.GPU_MEMORY_BANDWIDTH_BYTES_PER_SECOND: _g(
        "Theoretical peak memory bandwidth (known-GPU table, config override, or clock x bus).", GPU
    ),
    series.GPU_PEAK_FLOPS: _g(
        "Dense tensor-core peak FLOP/s per dtype (model/gpu_specs.py).", (*GPU, "dtype")
    ),
    series.GPU_PROCESS_MEMORY_USED_BYTES: _g(
        "GPU memory used by one process, attributed to a configured engine when it matches.",
        ("gpu", "pid", "process", "engine"),
    ),
    series.GPU_PROCESS_MEMORY_USED_PEAK_BYTES: _g(
        "Highest GPU memory of one process over the peak window.",
        ("gpu", "pid", "process", "engine"),
    ),
    series.GPU_SAMPLES_TOTAL: _c("NVML background samples taken.", ()),
    **{
        # --- The card's own state (issue 27): is the card itself slowed? -------------------
        series.GPU_MEMORY_CLOCK_MAX_HERTZ: _g("Maximum memory clock.", GPU),
        series.GPU_SM_CLOCK_HERTZ: _g("Current SM (graphics) clock.", GPU),
        series.GPU_SM_CLOCK_MAX_HERTZ: _g("Maximum SM (graphics) clock.", GPU),
        series.GPU_POWER_WATTS: _g("Power draw of the GPU.", GPU),
        series.GPU_SM_CLOCK_BUSY_HERTZ: _g(
            "SM clock, only in samples while the GPU is busy (utilization at or above "
            "`card_busy_utilization_min`): averaged over a window, the clock under load.",
            GPU,
        ),
        series.GPU_POWER_LIMIT_WATTS: _g(
            "Power limit the driver enforces (the lowest of the set limits).", GPU
        ),
        series.GPU_POWER_LIMIT_DEFAULT_WATTS: _g(
            "The card's default (stock) power limit: an enforced limit below it was lowered.",
            GPU,
        ),
        series.GPU_POWER_LIMIT_MAX_WATTS: _g(
            "The highest power limit the card accepts (`nvidia-smi -pl`).", GPU
        ),
        series.GPU_TEMPERATURE_CELSIUS: _g("GPU core temperature.", GPU),
        series.GPU_CLOCK_EVENT_REASON_ACTIVE: _g(
            "1 while NVML reports this reason for holding the clocks down "
            "(nvmlDeviceGetCurrentClocksEventReasons), else 0; one series per reason NVML names.",
            ("gpu", "reason"),
        ),
    },
    # --- Engine identity and health ---------------------------------------------------------
    series.ENGINE_UP: _g(
        "1 when the engine serves (llama.cpp: /health 200; SGLang: /metrics or /v1/models "
        "answered, /health only when both fail), else 0."
    ),
    series.ENGINE_LOADING: _g("1 while the engine reports that it is loading the model."),
    series.ENGINE_INFO: Spec(
        "info",
        "Engine identity: model, version/build, quantization; simulated=true for simulators.",
        (*ENGINE, "model", "version", "quantization", "simulated"),
    ),
    series.ENGINE_RESTARTS_TOTAL: _c(
        "New engine instances seen after the first one: the engine was unreachable in between, "
        "or its identity (build, model, context, slots, start arguments) changed."
    ),
    series.ENGINE_ENDPOINT_ENABLED: _g(
        "1 when an optional engine endpoint is enabled, 0 when the engine answers 501 for it.",
        (*ENGINE, "endpoint"),
    ),
    # --- Scheduling -------------------------------------------------------------------------
    series.ENGINE_REQUESTS_RUNNING: _g("Requests being processed (in a slot / running batch)."),
    series.ENGINE_REQUESTS_WAITING: _g("Requests queued for lack of a slot or KV space."),
    series.ENGINE_SLOTS: _g("Maximum concurrently running requests (llama.cpp -np; SGLang max)."),
    series.ENGINE_CONTEXT_TOKENS: _g("Maximum context per sequence in tokens."),
    # --- KV cache ---------------------------------------------------------------------------
    series.ENGINE_KV_CACHE_CAPACITY_TOKENS: _g("KV cache capacity in tokens (all sequences)."),
    series.ENGINE_KV_CACHE_USED_TOKENS: _g("KV cache tokens held by running requests."),
    series.ENGINE_KV_CACHE_USAGE_RATIO: _g("KV cache used / capacity (0-1)."),
    series.ENGINE_SLOT_CONTEXT_USAGE_MAX_RATIO: _g(
        "Fullest running slot: tokens held / per-slot context (llama.cpp, non-unified KV)."
    ),
    series.ENGINE_KV_PRESSURE_EVENTS_TOTAL: _c(
        "KV pressure events: kv_no_space, context_exceeded, context_shift, slot_truncated "
        "(llama.cpp log) or retracted (SGLang).",
        (*ENGINE, "event"),
    ),
    series.ENGINE_KV_CACHE_BYTES: _g(
        "KV cache memory the engine reports it allocated (llama.cpp log; SGLang constant).",
        (*ENGINE, "device"),
    ),
    # --- Tokens and time (counters) ---------------------------------------------------------
    series.ENGINE_PROMPT_TOKENS_TOTAL: _c(
        "Prompt tokens of finished/processed requests, incl. cached."
    ),
    series.ENGINE_PROMPT_TOKENS_CACHED_TOTAL: _c("Prompt tokens served from the prefix cache."),
    series.ENGINE_PROMPT_SECONDS_TOTAL: _c(
        "Time spent in prompt processing, each request's own prompt time summed (requests "
        "computed together each count theirs; llama.cpp without its log: absent, its own "
        "counter is timed per prompt batch)."
    ),
    series.ENGINE_PREFILL_BUSY_SECONDS_TOTAL: _c(
        "Wall time in which the engine computed prompts: the union of the requests' prompt "
        "spans, so prompts computed together count once. Prompt tokens computed / this is "
        "the prefill throughput."
    ),
    series.ENGINE_GENERATION_TOKENS_TOTAL: _c("Generated tokens."),
    series.ENGINE_DECODE_TOKENS_TOTAL: _c(
        "Tokens counted by the per-sequence decode timer; rate ratio with decode_seconds = "
        "per-sequence tok/s."
    ),
    series.ENGINE_DECODE_SECONDS_TOTAL: _c("Per-sequence decode time summed over sequences."),
    series.ENGINE_REQUESTS_FINISHED_TOTAL: _c("Requests finished (SGLang)."),
    series.ENGINE_DECODE_STEPS_TOTAL: _c("Batched decode steps (llama.cpp llama_decode calls)."),
    # --- Server-side latency histograms (SGLang exposes them; llama.cpp has none) -----------
    series.ENGINE_TIME_TO_FIRST_TOKEN_SECONDS: Spec(
        "histogram", "Server-side time to first token.", ENGINE
    ),
    series.ENGINE_INTER_TOKEN_LATENCY_SECONDS: Spec(
        "histogram", "Server-side inter-token latency.", ENGINE
    ),
    series.ENGINE_QUEUE_TIME_SECONDS: Spec("histogram", "Server-side time spent queued.", ENGINE),
    series.ENGINE_E2E_REQUEST_LATENCY_SECONDS: Spec(
        "histogram", "Server-side end-to-end request latency.", ENGINE
    ),
    # --- Per-request lengths (SGLang; llama.cpp exports only token totals) ----------------
    series.ENGINE_REQUEST_PROMPT_TOKENS: Spec(
        "histogram",
        "Prompt length of each finished request in tokens, cached ones included.",
        ENGINE,
    ),
    series.ENGINE_REQUEST_GENERATION_TOKENS: Spec(
        "histogram", "Generated tokens of each finished request.", ENGINE
    ),
    # --- Memory residency -------------------------------------------------------------------
    series.ENGINE_PROCESS_GPU_MEMORY_BYTES: _g(
        "GPU memory of all processes attributed to the engine (NVML), summed over GPUs."
    ),
    series.ENGINE_PROCESS_GPU_MEMORY_PEAK_BYTES: _g(
        "Peak of the engine's summed process GPU memory over the peak window."
    ),
    series.ENGINE_MODEL_BUFFER_BYTES: _g(
        "Model weight buffers the engine reports per device (llama.cpp log: CUDA0, CPU_Mapped; "
        "SGLang: gpu, cpu).",
        (*ENGINE, "device"),
    ),
    series.ENGINE_GPU_LAYERS_OFFLOADED: _g("Layers the engine put on the GPU (llama.cpp log)."),
    series.ENGINE_GPU_LAYERS_TOTAL: _g("Layers of the model (llama.cpp log)."),
    series.ENGINE_LOAD_SECONDS: _g(
        "Time the engine took to load the model (log / SGLang startup)."
    ),
    series.ENGINE_EXPERTS_HOST_LAYERS: _g(
        "Layers whose routed experts live in host memory (llama.cpp --n-cpu-moe, --cpu-moe, "
        "-ot exps=CPU)."
    ),
    series.ENGINE_EXPERTS_HOST_BYTES: _g(
        "Bytes of the routed-expert tensors kept in host memory; decode reads its share of them "
        "over host memory / PCIe."
    ),
    series.ENGINE_SPEC_ACCEPT_LENGTH: _g(
        "Speculative decoding: mean tokens produced per target-model decode step (>= 1); absent "
        "without speculative decoding."
    ),
    # --- Model geometry ---------------------------------------------------------------------
    series.MODEL_WEIGHTS_BYTES: _g("Size of the model weights."),
    series.MODEL_PARAMETERS: _g("Parameter count of the model."),
    series.MODEL_LAYERS: _g("Transformer layers of the model."),
    series.MODEL_KV_BYTES_PER_TOKEN_ESTIMATED: _g(
        "KV bytes per token of context from the architecture (full-attention layers)."
    ),
    series.MODEL_KV_CACHE_BYTES_ESTIMATED: _g(
        "KV cache bytes the engine should allocate for its configured context, from the "
        "architecture (sliding-window layers capped at the window)."
    ),
    series.MODEL_WEIGHTS_ALWAYS_READ_BYTES: _g(
        "Weight bytes every decode step reads whatever the batch: attention, norms, dense FFN "
        "layers, shared experts, router, output projection (a tied embedding in full)."
    ),
    series.MODEL_WEIGHTS_ROUTED_EXPERTS_BYTES: _g(
        "Bytes of all routed-expert tensors (0 for a dense model); a step reads the experts its "
        "batch is routed to."
    ),
    series.MODEL_EXPERTS: _g("Routed experts per MoE layer (E); absent for a dense model."),
    series.MODEL_EXPERTS_USED: _g("Routed experts used per token (k); absent for a dense model."),
    series.MODEL_TOKEN_EMBEDDING_ROW_BYTES: _g(
        "Bytes of one row of an untied token embedding (a step reads one per sequence); 0 when "
        "tied."
    ),
    series.MODEL_PREFILL_FLOPS_PER_TOKEN: _g("Matmul FLOPs per prompt token (model/flops.py)."),
    series.MODEL_PREFILL_ATTENTION_FLOPS_PER_POSITION: _g(
        "Attention FLOPs per prompt token and attended position, by layer kind.",
        (*ENGINE, "layers"),
    ),
    series.MODEL_SLIDING_WINDOW_TOKENS: _g("Positions a sliding-window layer attends to."),
    series.MODEL_KV_CACHE_TYPE_INFO: Spec(
        "info",
        "KV cache element types the engine stores (llama.cpp -ctk/-ctv; SGLang "
        "--kv-cache-dtype); the KV estimates use them.",
        (*ENGINE, "type_k", "type_v"),
    ),
    series.MODEL_DRAFT_WEIGHTS_BYTES: _g(
        "Weight bytes of the speculative-decoding draft model (llama.cpp -md)."
    ),
    # --- The host ---------------------------------------------------------------------------
    series.HOST_MEMORY_BANDWIDTH_BYTES_PER_SECOND: _g(
        "Host memory bandwidth for the expert-offload bound: a multi-threaded copy at exporter "
        "start, read + write counted (source=measured), or --host-bandwidth-gbs (flag) or "
        "host_memory_bandwidth_bytes_per_second (config).",
        ("source",),
    ),
    # --- Exporter self-metrics --------------------------------------------------------------
    series.SOURCE_UP: _g("1 when the source was read successfully in this scrape.", ("source",)),
    series.SOURCE_DURATION_SECONDS: _g(
        "Time taken to read the source in this scrape.", ("source",)
    ),
    series.SOURCE_ERRORS_TOTAL: _c(
        "Source read failures by reason: timeout, connect, http, parse, too_large.",
        ("source", "reason"),
    ),
    series.EXPORTER_BUILD_INFO: Spec("info", "Exporter version.", ("version",)),
}


# Bucket bounds as Prometheus (Go's ParseFloat) reads them.
_BOUND = re.compile(r"[+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|Inf)")

# Longest label value exported: an engine's model name or build string, never a document.
MAX_LABEL_CHARS = 256


def sanitize_label(value: object) -> str:
    """A label value that any Prometheus client and server accepts, whatever the engine sent.

    Lone surrogates (JSON `"\\ud800"`) cannot be encoded as UTF-8 and used to fail the whole
    answer; invalid bytes and control characters (newlines, NUL, C1) become U+FFFD; very long
    values are cut. Everything a collector turns into a label passes here (`MetricSet`), so no
    collector has to remember it.
    """
    if isinstance(value, bytes):
        text = value.decode("utf-8", errors="replace")
    else:
        text = value if isinstance(value, str) else str(value)
    if len(text) > MAX_LABEL_CHARS:
        text = text[: MAX_LABEL_CHARS - 1] + "\u2026"
    if text.isascii() and text.isprintable():
        return text  # the common case, without the per-character scan
    # Encoding with "replace" turns every lone surrogate into "?"; decode back to str.
    text = text.encode("utf-8", errors="replace").decode("utf-8")
    return "".join("\ufffd" if unicodedata.category(ch) in ("Cc", "Cs") else ch for ch in text)


def finite_number(value: Any) -> float | None:
    """`value` as a finite float, or None for anything else (bool, str, NaN, ±Inf, 10**400)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int beyond float range
        return None
    return number if math.isfinite(number) else None


class MetricSet:
    """Fresh families for one scrape, checked against SCHEMA as samples are added.

    Values the exporter cannot stand behind (not a number, NaN, ±Inf) are not exported: the
    sample is dropped and the reason kept in `problems`, which collectors report as
    `llmb_source_errors_total{reason="parse"}`. Label values are sanitized here. A name or a
    label set the schema does not know is a programming error and still raises.
    """

    def __init__(self) -> None:
        self._families: dict[str, Metric] = {}
        self.problems: list[str] = []
        # Label sets already added per family: two engine strings can sanitize to the same
        # label, and Prometheus rejects a whole scrape with a duplicate series.
        self._seen: set[tuple[str, tuple[str, ...]]] = set()

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
    def _values(spec: Spec, labels: Mapping[str, object]) -> list[str]:
        if set(labels) != set(spec.labels):
            raise ValueError(f"labels {sorted(labels)} do not match schema {sorted(spec.labels)}")
        return [sanitize_label(labels[k]) for k in spec.labels]

    def _first(self, name: str, values: list[str]) -> bool:
        """True the first time this series is added; a repeat is dropped and recorded."""
        key = (name, tuple(values))
        if key in self._seen:
            self.problems.append(f"{name}: duplicate series {values}")
            return False
        self._seen.add(key)
        return True

    def add(self, name: str, value: Any, **labels: str) -> None:
        """Add one gauge or counter sample; None means 'not known' and adds nothing.

        A value that is not a finite number is dropped and recorded in `problems`.
        """
        if value is None:
            return
        number = finite_number(value)
        if number is None:
            self.problems.append(f"{name}: not a finite number: {sanitize_label(repr(value))}")
            return
        fam, spec = self._family(name)
        values = self._values(spec, labels)
        if self._first(name, values):
            fam.add_metric(values, number)  # type: ignore[attr-defined]

    def info(self, name: str, /, **labels: object) -> None:
        """Add one info sample (value 1) with the given labels."""
        fam, spec = self._family(name)
        values = self._values(spec, labels)
        if self._first(name, values):
            fam.add_metric([], dict(zip(spec.labels, values, strict=True)))  # type: ignore[attr-defined]

    def histogram(
        self,
        name: str,
        buckets: Iterable[tuple[str, float]],
        sum_value: float,
        **labels: str,
    ) -> None:
        """Add one histogram: cumulative (le, count) pairs ending in +Inf, and the sum.

        A histogram whose sum or any bucket count is not finite, whose bucket bounds do not
        parse or rise, whose counts fall, or that has no +Inf bucket is dropped and recorded
        in `problems`: Prometheus would reject or misread it.
        """
        checked: list[tuple[str, float]] = []
        bounds: list[float] = []
        for le, count in buckets:
            number = finite_number(count)
            # Python's float() takes " 0.8" and "1_0"; Prometheus does not.
            bound = float(le) if isinstance(le, str) and _BOUND.fullmatch(le) else math.nan
            if number is None or math.isnan(bound):
                self.problems.append(f"{name}: bad bucket le={sanitize_label(le)!r}")
                return
            checked.append((sanitize_label(le), number))
            bounds.append(bound)
        total = finite_number(sum_value)
        ordered = all(a < b for a, b in pairwise(bounds)) and all(
            a[1] <= b[1] for a, b in pairwise(checked)
        )
        if total is None or not checked or bounds[-1] != math.inf or not ordered:
            self.problems.append(f"{name}: inconsistent histogram")
            return
        fam, spec = self._family(name)
        values = self._values(spec, labels)
        if self._first(name, values):
            fam.add_metric(values, checked, total)  # type: ignore[attr-defined]

    def metrics(self) -> list[Metric]:
        """The families that received at least one sample."""
        return [fam for fam in self._families.values() if fam.samples]


def add_model_structure(ms: MetricSet, geom: ModelGeometry, **labels: str) -> None:
    """The llmb_model_* series of what a decode step reads (CONTRACT-roofline.md).

    Every collector that knows a model's geometry calls this, so the series mean the same for
    both engines. The geometry is static per model (computed once); this only adds samples.
    Nothing is added when the structure is unknown (`always_read_bytes` None).
    """
    if geom.always_read_bytes is None:
        return
    ms.add(series.MODEL_WEIGHTS_ALWAYS_READ_BYTES, geom.always_read_bytes, **labels)
    ms.add(series.MODEL_WEIGHTS_ROUTED_EXPERTS_BYTES, geom.routed_expert_bytes, **labels)
    ms.add(series.MODEL_TOKEN_EMBEDDING_ROW_BYTES, geom.token_embedding_row_bytes, **labels)
    if geom.is_moe:
        ms.add(series.MODEL_EXPERTS, geom.expert_count, **labels)
        ms.add(series.MODEL_EXPERTS_USED, geom.expert_used_count, **labels)


def add_kv_cache_type(ms: MetricSet, type_k: str, type_v: str, **labels: str) -> None:
    """`llmb_model_kv_cache_type_info{type_k,type_v}`: the KV element types the engine stores."""
    ms.info(series.MODEL_KV_CACHE_TYPE_INFO, type_k=type_k, type_v=type_v, **labels)
