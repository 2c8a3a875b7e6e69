"""Generate the Grafana dashboards (`grafana/dashboards/*.json`) as code.

The JSON is normalized (sorted keys, fixed ids, no UI-export fields) so a change shows as a
small diff. Run `python grafana/generate.py` after editing; `--check` exits 1 when a
committed dashboard is stale (CI runs it). Every query names only series that the exporter,
the load generator or a recording rule produces, and every threshold line is read from the
rules' THRESHOLDS table (tests/integration/test_grafana.py checks both).

The dashboards import anywhere: every panel, query, variable and annotation uses the
`${datasource}` variable (type datasource, Prometheus). `__inputs` lets Grafana's import
dialog pick the datasource; provisioned copies (compose, the Kubernetes sidecar), which
skip `__inputs`, fall back to the Prometheus datasource of that Grafana.

Why plain dicts and not grafana-foundation-sdk's builders: the helpers below (`ts`, `stat`,
`check`) already say a panel in one call, and the builders' output would carry every
default field, which turns each edit into a large diff. The SDK's models still read every
dashboard back in tests/integration/test_grafana.py, so the JSON stays what Grafana expects.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

HERE = Path(__file__).resolve().parent
# Run as a script (`python grafana/generate.py`): the thresholds live in the rules' table.
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

from prometheus.generate import SEVERITY, t  # noqa: E402

OUT = HERE / "dashboards"
# The datasource variable; its value is a datasource uid (or name) chosen per dashboard.
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
# Name of the import input. It appears only as the variable's initial value, so a Grafana
# that loads the file without the import dialog never resolves it and falls back to its
# Prometheus datasource, instead of showing "datasource not found" on every panel.
DS_INPUT = "DS_PROMETHEUS"
# Every query is narrowed by both variables: one Prometheus may scrape many hosts (issue 8).
HSEL = 'host=~"$host"'
SEL = f'{HSEL}, engine=~"$engine"'
# Histogram quantiles use a fixed window: 1m holds enough requests at a few per second
# and the dashboards do not depend on Grafana's $__rate_interval.
HIST_WINDOW = "1m"
# Runbook of the alerts, relative to the repository (descriptions point at its sections).
RUNBOOK = "docs/runbook.md"


def threshold(name: str) -> float:
    """One number of the rules' THRESHOLDS table."""
    return float(t(name))


@dataclass(frozen=True)
class Limit:
    """A line that means something: a THRESHOLDS entry and the side of it that is fine."""

    name: str
    good: Literal["above", "below"]
    bad_color: str = "red"

    @property
    def value(self) -> float:
        return threshold(self.name)

    def to_json(self) -> dict[str, Any]:
        """Grafana thresholds: the base step is the colour below the line."""
        below, above = (
            ("green", self.bad_color) if self.good == "below" else (self.bad_color, "green")
        )
        return {
            "mode": "absolute",
            "steps": [{"color": below, "value": None}, {"color": above, "value": self.value}],
        }


@dataclass
class Target:
    """One query of a panel."""

    expr: str
    legend: str = ""
    instant: bool = False

    def to_json(self, ref: str) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "datasource": DATASOURCE,
            "expr": self.expr,
            "legendFormat": self.legend or "__auto",
            "refId": ref,
        }
        if self.instant:
            doc.update({"instant": True, "range": False, "format": "table"})
        else:
            doc.update({"instant": False, "range": True})
        return doc


@dataclass
class Panel:
    """A panel: type, title, queries, unit, description and its size in the 24-column grid."""

    title: str
    targets: list[Target]
    kind: str
    unit: str
    description: str
    width: int = 8
    height: int = 7
    limit: Limit | None = None
    options: dict[str, Any] = field(default_factory=dict)
    defaults: dict[str, Any] = field(default_factory=dict)
    overrides: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Row:
    """A titled row of panels."""

    title: str
    panels: list[Panel]


@dataclass
class Dashboard:
    """One dashboard: uid, title, rows and annotation queries."""

    uid: str
    title: str
    description: str
    rows: list[Row]
    annotations: list[dict[str, Any]] = field(default_factory=list)


def ts(title: str, *targets: Target, unit: str, description: str, **kw: Any) -> Panel:
    """A time series panel."""
    return Panel(title, list(targets), "timeseries", unit, description, **kw)


def stat(title: str, *targets: Target, unit: str, description: str, **kw: Any) -> Panel:
    """A stat panel showing the last value per series."""
    return Panel(title, list(targets), "stat", unit, description, **kw)


def quantiles(metric: str, by: str, label: str) -> list[Target]:
    """p50 and p99 of a histogram per `by` label."""
    return [
        Target(
            f"histogram_quantile({q}, sum by ({by}, le) "
            f"(rate({metric}_bucket{{{SEL}}}[{HIST_WINDOW}])))",
            f"{{{{{by}}}}} {label} p{int(q * 100)}",
        )
        for q in (0.5, 0.99)
    ]


BOOL_MAPPING = [
    {
        "type": "value",
        "options": {
            "0": {"text": "no", "color": "green", "index": 0},
            "1": {"text": "YES", "color": "red", "index": 1},
        },
    }
]
ACTIVE_MAPPING = [{"type": "value", "options": {"1": {"text": "active", "index": 0}}}]


def check(title: str, expr: str, description: str) -> Panel:
    """A yes/no stat for one decision step."""
    return stat(
        title,
        Target(expr, "{{host}}/{{engine}}"),
        unit="bool_yes_no",
        width=6,
        description=description,
        defaults={"mappings": BOOL_MAPPING, "color": {"mode": "thresholds"}},
        options={"colorMode": "background", "graphMode": "none", "textMode": "value_and_name"},
    )


# Engines whose roofline does not fit their measured decode (the physics gate).
MISFIT = f"llmb:engine_roofline:misfit{{{SEL}}}"
UNLESS_MISFIT = f"unless on (host, engine, kind) {MISFIT}"
DECODE_MAPPING = [
    {
        "type": "value",
        "options": {
            **BOOL_MAPPING[0]["options"],
            "2": {"text": "NO VERDICT: roofline does not fit", "color": "orange", "index": 2},
        },
    }
]


def decode_check() -> Panel:
    """Decode at the card's limit: YES / no, or no verdict with the misfit reason."""
    return stat(
        "Decode at card limit",
        # One query, so that it has data whether or not the roofline fits: the verdict where
        # it does, 2 (NO VERDICT) with the misfit reason where it does not.
        Target(
            f"(engine:llmb_decode_at_card_limit:bool{{{SEL}}} {UNLESS_MISFIT})"
            f" or (0 * {MISFIT} + 2)",
            "{{host}}/{{engine}} {{reason}}",
        ),
        unit="none",
        width=6,
        description=(
            "YES when per-sequence decode is at least "
            f"{t('decode_efficiency_at_limit')} x the roofline (bandwidth x accepted tokens / "
            "bytes per step): the card is the limit. NO means the engine leaves speed unused. "
            "NO VERDICT when decode is above "
            f"{t('decode_efficiency_physical_max')} x the roofline (beyond physics): the "
            "bytes-per-step model does not fit and the name says why "
            "(`llmb:engine_roofline:misfit{reason}`: model_structure_unknown, "
            "expert_counts_unknown, speculative_decoding_not_detected, bandwidth_too_low). "
            f"{RUNBOOK}#llmdecodebelowcardlimit, {RUNBOOK}#llmrooflinemisfit"
        ),
        defaults={"mappings": DECODE_MAPPING, "color": {"mode": "thresholds"}},
        options={"colorMode": "background", "graphMode": "none", "textMode": "value_and_name"},
    )


def pct(name: str) -> str:
    """A ratio threshold as a percentage for descriptions (0.9 -> 90 %)."""
    return f"{threshold(name) * 100:g} %"


def mib(name: str) -> str:
    """A byte threshold in MiB for descriptions."""
    return f"{threshold(name) / 2**20:g} MiB"


def decode_vs_roofline(width: int) -> Panel:
    """Per-sequence decode, the roofline and the at-limit line (overview and engines)."""
    at_limit = t("decode_efficiency_at_limit")
    return ts(
        "Per-sequence decode vs roofline",
        Target(
            f"engine:llmb_decode_tokens_per_second:rate5m{{{SEL}}}", "{{host}}/{{engine}} measured"
        ),
        Target(
            f"engine:llmb_decode_roofline_tokens_per_second:avg5m{{{SEL}}}",
            "{{host}}/{{engine}} roofline",
        ),
        Target(
            f"engine:llmb_decode_roofline_tokens_per_second:avg5m{{{SEL}}} * {at_limit}",
            f"{{{{host}}}}/{{{{engine}}}} at card limit ({at_limit} x roofline)",
        ),
        unit="tok/s",
        width=width,
        description=(
            "Tokens per second one sequence gets while decoding (decode tokens / decode time, "
            "5m), beside the roofline: GPU memory bandwidth / bytes read per decode step "
            "(weights + KV in use). The dashed third line is "
            f"{at_limit} x roofline (`decode_efficiency_at_limit`): measured above it, decode is "
            "at the card's limit and only a faster card or a smaller model (quantization) "
            "helps; below it the engine or its settings leave speed unused (check batch size, "
            "flash attention, CUDA graphs). The aggregate throughput of a batch can exceed the "
            "roofline; this per-sequence figure cannot."
        ),
        overrides=[
            {
                "matcher": {"id": "byRegexp", "options": ".*at card limit.*"},
                "properties": [
                    {"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}}
                ],
            }
        ],
    )


def overview() -> Dashboard:
    """Bottleneck overview: the verdict, then the decision steps with their evidence."""
    verdict_now = Panel(
        "Verdict now",
        [Target(f"llmb:engine_bottleneck:verdict{{{SEL}}} == 1", instant=True)],
        "table",
        "none",
        "The active verdict per engine: the first of the decision steps below that holds "
        "(recording rule `llmb:engine_bottleneck:verdict`, one series per verdict, 1 on the "
        "active one). prometheus/thresholds.md gives every number behind it and "
        f"{RUNBOOK} what to do for each verdict.",
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
    rows = [
        Row("Verdict", [verdict_now, verdict_hist]),
        Row(
            "1. Are the weights resident on the GPU?",
            [
                check(
                    "Weights not resident",
                    f"engine:llmb_weights_not_resident:bool{{{SEL}}}",
                    "YES when any of the three ratios to the right is below its line: layers "
                    f"on the GPU below {t('layers_ratio_min')} x the model's layers, GPU weight "
                    f"buffers below {t('weights_buffer_ratio_min')} x the weight bytes, or the "
                    f"engine's GPU memory below {t('weights_memory_ratio_min')} x the weight "
                    "bytes. Every decode step then waits for host memory: put all layers on "
                    "the GPU (llama.cpp `-ngl 999`, SGLang without `--cpu-offload-gb`), or use "
                    f"a smaller quantization. {RUNBOOK}#llmweightsnotresident",
                ),
                ts(
                    "Layers on the GPU / layers",
                    Target(
                        f"engine:llmb_gpu_layers_offloaded:ratio{{{SEL}}}", "{{host}}/{{engine}}"
                    ),
                    unit="percentunit",
                    width=6,
                    limit=Limit("layers_ratio_min", "above"),
                    description=(
                        "Layers llama.cpp put on the GPU / layers of the model, from its log "
                        "(`offloaded N/M layers to GPU`). Below the line "
                        f"(`layers_ratio_min` = {t('layers_ratio_min')}) some layers run on "
                        "the CPU: raise `-ngl` or free GPU memory. Empty for SGLang, which "
                        "does not log layers."
                    ),
                ),
                ts(
                    "GPU weight buffers / weight bytes",
                    Target(
                        f"engine:llmb_weights_gpu_buffers:ratio{{{SEL}}}", "{{host}}/{{engine}}"
                    ),
                    unit="percentunit",
                    width=6,
                    limit=Limit("weights_buffer_ratio_min", "above"),
                    description=(
                        "Weight buffers the engine reports on a GPU (llama.cpp `CUDA0 model "
                        "buffer size`, SGLang `weight_memory_usage_gb`) / model weight bytes. "
                        f"Below the line (`weights_buffer_ratio_min` = "
                        f"{t('weights_buffer_ratio_min')}) part of the weights sits in host "
                        "memory, even when a large KV cache fills the card."
                    ),
                ),
                ts(
                    "Process GPU memory / weight bytes",
                    Target(f"engine:llmb_weights_gpu_memory:ratio{{{SEL}}}", "{{host}}/{{engine}}"),
                    unit="percentunit",
                    width=6,
                    limit=Limit("weights_memory_ratio_min", "above"),
                    description=(
                        "GPU memory of the engine's processes (NVML) / model weight bytes: "
                        "works without engine logs. Below the line "
                        f"(`weights_memory_ratio_min` = {t('weights_memory_ratio_min')}) the "
                        "weights cannot all be on the GPU. Above 1 is normal: the KV cache "
                        "and compute buffers add to the weights."
                    ),
                ),
            ],
        ),
        Row(
            "2. Is the KV cache saturated?",
            [
                check(
                    "KV saturated",
                    f"engine:llmb_kv_saturated:bool{{{SEL}}}",
                    f"YES when KV usage (1m average) is at least {pct('kv_usage_high')} while "
                    f"at least {t('queue_min')} requests wait on average, or when the engine "
                    f"logged KV-pressure events in {t('rate_window')}. Requests then wait for "
                    "KV space, not for compute: give the KV cache more memory (llama.cpp "
                    "`-c`, SGLang `--mem-fraction-static`), quantize the KV cache, or lower "
                    f"the concurrency. {RUNBOOK}#llmkvcachesaturated",
                ),
                ts(
                    "KV cache usage (1m average)",
                    Target(f"engine:llmb_kv_cache_usage:avg1m{{{SEL}}}", "{{host}}/{{engine}}"),
                    unit="percentunit",
                    width=9,
                    limit=Limit("kv_usage_high", "below"),
                    description=(
                        "KV cache tokens held / KV capacity, averaged over "
                        f"{t('queue_window')} (`engine:llmb_kv_cache_usage:avg1m`). At or "
                        f"above the line (`kv_usage_high` = {t('kv_usage_high')}) the pool "
                        "counts as full; with requests waiting that is the KV-saturated "
                        "verdict and the LLMKVCacheSaturated alert."
                    ),
                ),
                ts(
                    f"KV-pressure events in {t('rate_window')}",
                    Target(
                        f"engine:llmb_kv_pressure_events:increase5m{{{SEL}}}", "{{host}}/{{engine}}"
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
        ),
        Row(
            "3. Are requests queueing while KV has room?",
            [
                check(
                    "Requests queueing",
                    f"engine:llmb_requests_queueing:bool{{{SEL}}}",
                    f"YES when at least {t('queue_min')} requests wait on average over "
                    f"{t('queue_window')}. With KV below its line this is scheduling: more "
                    "requests than slots or batch. Raise the parallel slots (llama.cpp `-np`, "
                    "SGLang `--max-running-requests`) if memory allows, or add a replica. "
                    f"{RUNBOOK}#llmrequestsqueueing",
                ),
                ts(
                    "Waiting (1m average) and running",
                    Target(
                        f"engine:llmb_requests_waiting:avg1m{{{SEL}}}",
                        "{{host}}/{{engine}} waiting",
                    ),
                    Target(
                        f"engine:llmb_requests_running:max{{{SEL}}}", "{{host}}/{{engine}} running"
                    ),
                    unit="requests",
                    width=9,
                    description=(
                        "Requests queued in the engine (1m average) beside those running "
                        "(engine metrics: llama.cpp `requests_deferred`/`requests_processing`, "
                        "SGLang `num_queue_reqs`/`num_running_reqs`). Running stuck at the "
                        "slot count while waiting grows means the slots are the limit."
                    ),
                ),
                ts(
                    "Slots (max running requests)",
                    Target(
                        f"max by (host, engine) (llmb_engine_slots{{{SEL}}})", "{{host}}/{{engine}}"
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
        ),
        Row(
            "4. Is the engine idle?",
            [
                check(
                    "Idle",
                    f"engine:llmb_idle:bool{{{SEL}}}",
                    "YES when nothing runs or waits and no token was generated in "
                    f"{t('rate_window')}: there is no load to judge. Send load (llmb-loadgen "
                    "run) before reading the other steps.",
                ),
                ts(
                    f"Generated tokens/s (aggregate, {t('rate_window')})",
                    Target(
                        f"engine:llmb_generation_tokens_per_second:rate5m{{{SEL}}}",
                        "{{host}}/{{engine}}",
                    ),
                    unit="tok/s",
                    width=18,
                    description=(
                        "Generated tokens per second over all sequences (rate of the engine's "
                        f"generation token counter over {t('rate_window')}). llama.cpp counts "
                        "tokens when a request ends, so short windows look bursty."
                    ),
                ),
            ],
        ),
        Row(
            "5. Is decode at the card's memory-bandwidth limit?",
            [
                decode_check(),
                ts(
                    "Decode efficiency (measured / roofline)",
                    Target(
                        # No number beyond physics: a misfit shows in the check, not here.
                        f"engine:llmb_decode_efficiency:ratio5m{{{SEL}}} {UNLESS_MISFIT}",
                        "{{host}}/{{engine}}",
                    ),
                    unit="percentunit",
                    width=9,
                    limit=Limit("decode_efficiency_at_limit", "above", bad_color="orange"),
                    description=(
                        "Per-sequence decode tok/s / roofline tok/s "
                        "(`engine:llmb_decode_efficiency:ratio5m`). At or above the line "
                        "(`decode_efficiency_at_limit` = "
                        f"{t('decode_efficiency_at_limit')}) decode is at the card's memory "
                        "bandwidth limit; tuned kernels reach 0.6-0.9. Below it, look at the "
                        "engine build, batch size and attention kernels. Above "
                        f"`decode_efficiency_physical_max` ({t('decode_efficiency_physical_max')})"
                        " the bytes-per-step model does not fit: the line stops and the check "
                        "beside it names the reason (`llmb:engine_roofline:misfit`)."
                    ),
                ),
                decode_vs_roofline(9),
            ],
        ),
    ]
    return Dashboard(
        "llmb-overview",
        "LLM bottleneck: overview",
        "Why an engine is slow: the verdict, then the five decision steps with their evidence.",
        rows,
    )


def gpu_memory() -> Dashboard:
    """GPU memory: device, peak, per process with engine attribution, expected vs actual."""
    rows = [
        Row(
            "Device",
            [
                ts(
                    "Used, windowed peak and total",
                    Target(
                        f"max by (host, gpu) (llmb_gpu_memory_used_bytes{{{HSEL}}})",
                        "{{host}} GPU {{gpu}} used",
                    ),
                    Target(
                        f"max by (host, gpu) (llmb_gpu_memory_used_peak_bytes{{{HSEL}}})",
                        "{{host}} GPU {{gpu}} peak",
                    ),
                    Target(
                        f"max by (host, gpu) (llmb_gpu_memory_total_bytes{{{HSEL}}})",
                        "{{host}} GPU {{gpu}} total",
                    ),
                    unit="bytes",
                    width=12,
                    description=(
                        "GPU memory in use per card (NVML, as nvidia-smi shows it), the highest "
                        "use the exporter's background sampler saw over its peak window, and "
                        "the card's total. The peak catches short spikes (prefill, CUDA graph "
                        "capture) that a scrape every few seconds misses."
                    ),
                ),
                ts(
                    "Headroom at the peak",
                    Target(
                        f"gpu:llmb_gpu_memory_headroom_bytes:peak{{{HSEL}}}", "{{host}} GPU {{gpu}}"
                    ),
                    unit="bytes",
                    width=6,
                    limit=Limit("gpu_headroom_min_bytes", "above"),
                    description=(
                        "Memory left at the windowed peak: total - driver-reserved - peak used "
                        "(`gpu:llmb_gpu_memory_headroom_bytes:peak`). Below the line "
                        f"(`gpu_headroom_min_bytes` = {mib('gpu_headroom_min_bytes')}) the "
                        "next larger batch or context can fail to allocate and "
                        "LLMGPUMemoryNearFull fires: lower the engine's memory fraction or "
                        f"context, or move another process off the card. "
                        f"{RUNBOOK}#llmgpumemorynearfull"
                    ),
                ),
                ts(
                    "Used / total and utilization",
                    Target(
                        f"gpu:llmb_gpu_memory_used:ratio{{{HSEL}}}", "{{host}} GPU {{gpu}} memory"
                    ),
                    Target(
                        f"max by (host, gpu) (llmb_gpu_utilization_ratio{{{HSEL}}})",
                        "{{host}} GPU {{gpu}} busy",
                    ),
                    unit="percentunit",
                    width=6,
                    description=(
                        "Share of the card's memory in use, and the share of time a kernel "
                        "ran (NVML utilization). Engines preallocate their KV pool, so high "
                        "memory use alone is normal; busy near 100 % with slow decode points "
                        "at compute, low busy at the host side or the scheduler."
                    ),
                ),
            ],
        ),
        Row(
            "Processes",
            [
                ts(
                    "GPU memory per process",
                    Target(
                        "max by (host, gpu, pid, process, engine) "
                        f"(llmb_gpu_process_memory_used_bytes{{{HSEL}}})",
                        "{{host}} GPU {{gpu}} {{process}} ({{pid}}) -> {{engine}}",
                    ),
                    unit="bytes",
                    width=12,
                    description=(
                        "GPU memory of each process on each card (NVML), with the engine it "
                        "is attributed to (empty when no configured engine matches its PID "
                        "or command line). An unknown process here takes memory the engines "
                        "could use."
                    ),
                ),
                ts(
                    "GPU memory per engine and GPU",
                    Target(
                        f"engine_gpu:llmb_gpu_process_memory_used_bytes:sum{{{SEL}}}",
                        "{{host}}/{{engine}} on GPU {{gpu}}",
                    ),
                    unit="bytes",
                    width=12,
                    description=(
                        "Process GPU memory summed per engine and card. An engine split over "
                        "several GPUs (tensor parallel, llama.cpp `--split-mode`) shows one "
                        "line per card; an uneven split shows here first."
                    ),
                ),
            ],
        ),
        Row(
            "Expected beside actual",
            [
                ts(
                    "Engine process memory vs weights and KV",
                    Target(
                        f"max by (host, engine) (llmb_engine_process_gpu_memory_bytes{{{SEL}}})",
                        "{{host}}/{{engine}} process (actual)",
                    ),
                    Target(
                        "max by (host, engine) "
                        f"(llmb_engine_process_gpu_memory_peak_bytes{{{SEL}}})",
                        "{{host}}/{{engine}} process peak",
                    ),
                    Target(
                        f"max by (host, engine) (llmb_model_weights_bytes{{{SEL}}})",
                        "{{host}}/{{engine}} weights (expected)",
                    ),
                    Target(
                        f"max by (host, engine) (llmb_model_kv_cache_bytes_estimated{{{SEL}}})",
                        "{{host}}/{{engine}} KV (expected)",
                    ),
                    unit="bytes",
                    width=12,
                    description=(
                        "What the engine holds on the GPUs (NVML, summed over its processes) "
                        "beside what the model needs: weight bytes (GGUF / safetensors size) "
                        "and the KV cache its context should take (from the architecture). "
                        "Actual well below weights + KV means offloaded weights or a smaller "
                        "KV pool than configured."
                    ),
                ),
                ts(
                    "Buffers the engine reports",
                    Target(
                        f"max by (host, engine, device) (llmb_engine_model_buffer_bytes{{{SEL}}})",
                        "{{host}}/{{engine}} weights on {{device}}",
                    ),
                    Target(
                        f"max by (host, engine, device) (llmb_engine_kv_cache_bytes{{{SEL}}})",
                        "{{host}}/{{engine}} KV on {{device}}",
                    ),
                    unit="bytes",
                    width=12,
                    description=(
                        "Weight and KV buffers per device as the engine reports them "
                        "(llama.cpp log: CUDA0, CPU_Mapped; SGLang: gpu, cpu). Weights on a "
                        "CPU device mean offloaded layers: every decode step reads them over "
                        "PCIe."
                    ),
                ),
            ],
        ),
    ]
    return Dashboard(
        "llmb-gpu-memory",
        "LLM bottleneck: GPU memory",
        "GPU memory per card, per process and per engine, with what the model should need.",
        rows,
    )


def engines() -> Dashboard:
    """Engines side by side: decode vs roofline, throughput, latency, queue, KV, restarts."""

    def restarts(window: str) -> str:
        return f"sum by (host, engine) (increase(llmb_engine_restarts_total{{{SEL}}}[{window}]))"

    annotations = [
        {
            "datasource": DATASOURCE,
            "enable": True,
            "iconColor": "red",
            "name": "Engine restarts",
            "expr": restarts("1m"),
            "step": "30s",
            "titleFormat": "{{host}}/{{engine}} restarted",
            "tagKeys": "host,engine",
            "useValueForTime": False,
        }
    ]
    rows = [
        Row(
            "Decode",
            [
                decode_vs_roofline(12),
                ts(
                    "Aggregate throughput",
                    Target(
                        f"engine:llmb_generation_tokens_per_second:rate5m{{{SEL}}}",
                        "{{host}}/{{engine}} generated",
                    ),
                    Target(
                        f"engine:llmb_prompt_tokens_per_second:rate5m{{{SEL}}}",
                        "{{host}}/{{engine}} prompt",
                    ),
                    Target(
                        f"engine:llmb_prefill_tokens_per_second:rate5m{{{SEL}}}",
                        "{{host}}/{{engine}} prefill speed",
                    ),
                    unit="tok/s",
                    width=12,
                    description=(
                        "Generated and prompt tokens per second over all sequences "
                        f"({t('rate_window')} rates of the engine counters), and prefill speed "
                        "(prompt tokens / prompt time, llama.cpp). Use it to compare engines "
                        "under the same load; batching raises it above one sequence's speed."
                    ),
                ),
            ],
        ),
        Row(
            "Latency: server and load generator",
            [
                ts(
                    "Time to first token",
                    *quantiles("llmb_engine_time_to_first_token_seconds", "engine", "server"),
                    *quantiles("llmb_loadgen_time_to_first_token_seconds", "engine", "client"),
                    unit="s",
                    width=12,
                    description=(
                        f"p50 and p99 over {HIST_WINDOW} of the time to the first token, as the "
                        "engine measures it (server) and as llmb-loadgen sees it (client, "
                        "includes the network and queueing in front of the engine). Client far "
                        "above server: look at the proxy or the network. TTFT rising with "
                        "load: requests wait for a slot or KV (steps 2 and 3 of the overview)."
                    ),
                ),
                ts(
                    "Inter-token latency",
                    *quantiles("llmb_engine_inter_token_latency_seconds", "engine", "server"),
                    *quantiles("llmb_loadgen_inter_token_latency_seconds", "engine", "client"),
                    unit="s",
                    width=12,
                    description=(
                        f"p50 and p99 over {HIST_WINDOW} of the time between two streamed "
                        "tokens, server and client side. 1 / ITL is the per-sequence decode "
                        "speed a user sees; compare it with the roofline above."
                    ),
                ),
            ],
        ),
        Row(
            "Scheduling and memory",
            [
                ts(
                    "Running vs waiting",
                    Target(
                        f"engine:llmb_requests_running:max{{{SEL}}}", "{{host}}/{{engine}} running"
                    ),
                    Target(
                        f"engine:llmb_requests_waiting:max{{{SEL}}}", "{{host}}/{{engine}} waiting"
                    ),
                    unit="requests",
                    width=8,
                    description=(
                        "Requests the engine runs and the ones it queues, as it reports them. "
                        "Waiting above zero for minutes while running sits at the slot count: "
                        "more load than slots (raise them or add a replica)."
                    ),
                ),
                ts(
                    "KV cache usage",
                    Target(f"engine:llmb_kv_cache_usage:ratio{{{SEL}}}", "{{host}}/{{engine}}"),
                    unit="percentunit",
                    width=8,
                    limit=Limit("kv_usage_high", "below"),
                    description=(
                        "KV cache tokens held / KV capacity. At or above the line "
                        f"(`kv_usage_high` = {t('kv_usage_high')}) with requests waiting, the "
                        "KV pool limits the batch: more KV memory, a quantized KV cache or "
                        f"shorter contexts help. {RUNBOOK}#llmkvcachesaturated"
                    ),
                ),
                ts(
                    "Prefix-cache share of prompt tokens",
                    Target(
                        f"engine:llmb_prefix_cache_hit:ratio_rate5m{{{SEL}}}", "{{host}}/{{engine}}"
                    ),
                    unit="percentunit",
                    width=8,
                    description=(
                        "Prompt tokens served from the prefix cache / all prompt tokens "
                        f"({t('rate_window')}). High shares make prefill cheap; a shared system "
                        "prompt that stays near 0 % means the cache is off or evicted."
                    ),
                ),
            ],
        ),
        Row(
            "Restarts",
            [
                ts(
                    f"Engine restarts per {t('rate_window')}",
                    Target(restarts(t("rate_window")), "{{host}}/{{engine}}"),
                    unit="restarts",
                    width=24,
                    height=6,
                    description=(
                        "New engine instances the exporter saw (`llmb_engine_restarts_total`, "
                        f"increase over {t('rate_window')}): the engine was unreachable in "
                        "between, or its build, model, context, slots or start arguments "
                        "changed. The red annotations mark them on "
                        "every panel. Throughput and latency right after a restart include "
                        "model loading and a cold prefix cache. Repeated restarts: read the "
                        "engine's log (out of memory, crashes) and LLMEngineDown."
                    ),
                ),
            ],
        ),
    ]
    return Dashboard(
        "llmb-engines",
        "LLM bottleneck: engines side by side",
        "llama.cpp and SGLang under the same labels: decode against the roofline, latency, "
        "scheduling, KV and restarts.",
        rows,
        annotations,
    )


def load_run() -> Dashboard:
    """The load generator's steps as annotations over throughput, latency and memory."""
    annotations = [
        {
            "datasource": DATASOURCE,
            "enable": True,
            "iconColor": "purple",
            "name": "Load steps",
            "expr": f"llmb_loadgen_step_start_timestamp_seconds{{{SEL}}} * 1000",
            "step": "5s",
            "titleFormat": "{{host}}/{{engine}} step {{step}}",
            "tagKeys": "engine,step",
            "useValueForTime": True,
        }
    ]
    rows = [
        Row(
            "Load",
            [
                ts(
                    "Requests in flight",
                    Target(
                        f"max by (host, engine) (llmb_loadgen_requests_in_flight{{{SEL}}})",
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
                        f"(rate(llmb_loadgen_requests_total{{{SEL}}}[1m]))",
                        "{{host}}/{{engine}} {{outcome}}",
                    ),
                    unit="reqps",
                    width=8,
                    description=(
                        "Finished requests per second by outcome (ok, error, timeout, ...), "
                        "as llmb-loadgen counts them over 1m. Any outcome other than ok makes "
                        "the step's numbers suspect: read the run's summary for the errors."
                    ),
                ),
                Panel(
                    "Steps",
                    [Target(f"llmb_loadgen_step_info{{{SEL}}}", instant=True)],
                    "table",
                    "none",
                    "The current step of each load generator with its settings "
                    "(concurrency, prompt and output tokens) as labels of "
                    "`llmb_loadgen_step_info`. The purple annotations mark when each step began.",
                    width=8,
                ),
            ],
        ),
        Row(
            "Throughput",
            [
                ts(
                    "Completion tokens/s: client vs server",
                    Target(
                        "sum by (host, engine) "
                        f"(rate(llmb_loadgen_completion_tokens_total{{{SEL}}}[1m]))",
                        "{{host}}/{{engine}} client",
                    ),
                    Target(
                        f"engine:llmb_generation_tokens_per_second:rate5m{{{SEL}}}",
                        "{{host}}/{{engine}} server (5m)",
                    ),
                    unit="tok/s",
                    width=12,
                    description=(
                        "Completion tokens per second the load generator received (1m) "
                        f"beside the tokens the engine says it generated ({t('rate_window')}). "
                        "They should meet once a step runs longer than the window; a lasting "
                        "gap means other clients share the engine or tokens are miscounted."
                    ),
                ),
                ts(
                    "Early stops and token-count mismatch",
                    Target(
                        "sum by (host, engine) "
                        f"(increase(llmb_loadgen_early_stop_requests_total{{{SEL}}}[5m]))",
                        "{{host}}/{{engine}} early stops (5m)",
                    ),
                    Target(
                        f"max by (host, engine) (llmb_loadgen_token_count_mismatch{{{SEL}}})",
                        "{{host}}/{{engine}} mismatch",
                    ),
                    unit="requests",
                    width=12,
                    description=(
                        "Requests that stopped before their max tokens (5m), and 1 when the "
                        "load generator's token count disagrees with the engine's usage "
                        "numbers. Early stops shorten the decode phase and inflate tok/s per "
                        f"request; a mismatch fires LLMTokenCountMismatch. "
                        f"{RUNBOOK}#llmtokencountmismatch"
                    ),
                ),
            ],
        ),
        Row(
            "Latency (client side)",
            [
                ts(
                    "Time to first token",
                    *quantiles("llmb_loadgen_time_to_first_token_seconds", "engine", "TTFT"),
                    unit="s",
                    width=8,
                    description=(
                        f"p50 and p99 over {HIST_WINDOW} of the time from sending a request to "
                        "its first streamed token, as llmb-loadgen measures it. It grows with "
                        "prompt length (prefill) and with queueing."
                    ),
                ),
                ts(
                    "Inter-token latency",
                    *quantiles("llmb_loadgen_inter_token_latency_seconds", "engine", "ITL"),
                    unit="s",
                    width=8,
                    description=(
                        f"p50 and p99 over {HIST_WINDOW} of the gap between streamed tokens. "
                        "It grows with the batch: each decode step serves every running "
                        "sequence."
                    ),
                ),
                ts(
                    "End-to-end latency",
                    *quantiles("llmb_loadgen_e2e_request_latency_seconds", "engine", "e2e"),
                    unit="s",
                    width=8,
                    description=(
                        f"p50 and p99 over {HIST_WINDOW} of the whole request: TTFT + output "
                        "tokens x ITL. The number a user waits for."
                    ),
                ),
            ],
        ),
        Row(
            "Memory and KV during the run",
            [
                ts(
                    "GPU memory used and peak",
                    Target(
                        f"max by (host, gpu) (llmb_gpu_memory_used_bytes{{{HSEL}}})",
                        "{{host}} GPU {{gpu}} used",
                    ),
                    Target(
                        f"max by (host, gpu) (llmb_gpu_memory_used_peak_bytes{{{HSEL}}})",
                        "{{host}} GPU {{gpu}} peak",
                    ),
                    unit="bytes",
                    width=12,
                    description=(
                        "GPU memory in use and the sampler's windowed peak during the run "
                        "(NVML). A peak that climbs with each step shows how close a larger "
                        "step gets to the card's total (GPU memory dashboard)."
                    ),
                ),
                ts(
                    "KV usage",
                    Target(f"engine:llmb_kv_cache_usage:ratio{{{SEL}}}", "{{host}}/{{engine}} KV"),
                    unit="percentunit",
                    width=6,
                    limit=Limit("kv_usage_high", "below"),
                    description=(
                        "KV cache tokens held / capacity per step. Reaching the line "
                        f"(`kv_usage_high` = {t('kv_usage_high')}) while requests wait: this "
                        "step's concurrency or context is more than the KV pool holds."
                    ),
                ),
                ts(
                    "Waiting requests",
                    Target(
                        f"engine:llmb_requests_waiting:max{{{SEL}}}", "{{host}}/{{engine}} waiting"
                    ),
                    unit="requests",
                    width=6,
                    description=(
                        "Requests the engine queues during the run. A queue from the first "
                        "step on: the step's concurrency is above the engine's slots."
                    ),
                ),
            ],
        ),
    ]
    return Dashboard(
        "llmb-load-run",
        "LLM bottleneck: load run",
        "One llmb-loadgen run: its steps as annotations over load, throughput, latency and memory.",
        rows,
        annotations,
    )


# Colours of the fleet verdicts; the ranks come from the rules (prometheus/generate.py SEVERITY).
FLEET_COLORS = {
    "engine_down": "dark-red",
    "weights_not_resident": "red",
    "kv_saturated": "orange",
    "scheduling_bound": "yellow",
    "decode_below_card_limit": "blue",
    "decode_at_card_limit": "green",
    "idle": "text",
}
FLEET_SEVERITY = {
    verdict: (SEVERITY[verdict], color)
    for verdict, color in sorted(FLEET_COLORS.items(), key=lambda kv: -SEVERITY[kv[0]])
}


def fleet() -> Dashboard:
    """Many hosts on one Prometheus: every engine's verdict, worst first."""
    mapping = [
        {
            "type": "value",
            "options": {
                str(rank): {"text": verdict, "color": color, "index": i}
                for i, (verdict, (rank, color)) in enumerate(FLEET_SEVERITY.items())
            },
        }
    ]
    colored = {"mappings": mapping, "color": {"mode": "thresholds"}}
    ranks = ", ".join(f"{rank} {verdict}" for verdict, (rank, _) in FLEET_SEVERITY.items())
    table = Panel(
        "Verdict per host and engine, worst first",
        [Target(f"sort_desc(llmb:engine_bottleneck:severity{{{SEL}}})", instant=True)],
        "table",
        "none",
        "One row per engine with the severity rank of its verdict "
        f"(`llmb:engine_bottleneck:severity`: {ranks}). Start at the top: open the overview "
        "dashboard for that host and engine.",
        width=14,
        height=10,
        options={"showHeader": True, "sortBy": [{"displayName": "Value", "desc": True}]},
        defaults={"custom": {"align": "auto"}},
        overrides=[
            {
                "matcher": {"id": "byName", "options": "Value"},
                "properties": [
                    {"id": "displayName", "value": "Severity"},
                    {"id": "custom.cellOptions", "value": {"type": "color-background"}},
                    {"id": "mappings", "value": mapping},
                ],
            }
        ],
    )
    worst = stat(
        "Worst verdict per host",
        Target(f"sort_desc(host:llmb_engine_bottleneck_severity:max{{{HSEL}}})", "{{host}}"),
        unit="none",
        width=10,
        height=10,
        description=(
            "The worst verdict among each host's engines "
            "(`host:llmb_engine_bottleneck_severity:max`). A host in red or orange has an "
            "engine whose weights are off the GPU, whose KV cache is full, or that is down."
        ),
        defaults=colored,
        options={"colorMode": "background", "graphMode": "none", "textMode": "value_and_name"},
    )
    counts = ts(
        "Engines per verdict and host",
        Target(f"host_verdict:llmb_engines:count{{{HSEL}}}", "{{host}} {{verdict}}"),
        unit="engines",
        width=12,
        description=(
            "How many engines of each host have each verdict over time "
            "(`host_verdict:llmb_engines:count`). A jump after a deployment or a load change "
            "dates the start of a problem."
        ),
    )
    history = Panel(
        "Verdict over time",
        [
            Target(
                f"llmb:engine_bottleneck:verdict{{{SEL}}} == 1", "{{host}}/{{engine}}: {{verdict}}"
            )
        ],
        "state-timeline",
        "none",
        "When each verdict was active per host and engine (`llmb:engine_bottleneck:verdict == 1`).",
        width=12,
        defaults={"mappings": ACTIVE_MAPPING},
        options={"showValue": "never", "mergeValues": True},
    )
    rows = [Row("Fleet now", [table, worst]), Row("Fleet over time", [counts, history])]
    return Dashboard(
        "llmb-fleet",
        "LLM bottleneck: fleet",
        "Every engine of every host on one Prometheus, worst verdict first.",
        rows,
    )


DASHBOARDS = {
    "overview.json": overview,
    "gpu-memory.json": gpu_memory,
    "engines.json": engines,
    "load-run.json": load_run,
    "fleet.json": fleet,
}


def panel_json(panel: Panel, pid: int, x: int, y: int) -> dict[str, Any]:
    """Grafana JSON of one panel."""
    if not panel.description or not panel.unit:
        raise ValueError(f"panel {panel.title!r} needs a unit and a description")
    defaults: dict[str, Any] = {"unit": panel.unit, **panel.defaults}
    if panel.limit is not None:
        defaults["thresholds"] = panel.limit.to_json()
        if panel.kind == "timeseries":
            # Draw the threshold as a dashed line so the panel shows where it is crossed.
            defaults["custom"] = {
                **defaults.get("custom", {}),
                "thresholdsStyle": {"mode": "dashed"},
            }
        else:
            defaults["color"] = {"mode": "thresholds"}
    return {
        "id": pid,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": {"h": panel.height, "w": panel.width, "x": x, "y": y},
        "fieldConfig": {"defaults": defaults, "overrides": panel.overrides},
        "options": panel.options,
        "targets": [tg.to_json(chr(ord("A") + i)) for i, tg in enumerate(panel.targets)],
    }


def datasource_variable() -> dict[str, Any]:
    """The Prometheus datasource every query uses.

    Its initial value is the import input: the import dialog replaces it with the chosen
    datasource. Provisioned copies keep the placeholder, which matches no datasource, so
    Grafana selects its first Prometheus datasource (compose: the provisioned one).
    """
    placeholder = "${" + DS_INPUT + "}"
    return {
        "name": "datasource",
        "label": "Data source",
        "type": "datasource",
        "query": "prometheus",
        "regex": "",
        "refresh": 1,
        "hide": 0,
        "multi": False,
        "includeAll": False,
        "current": {"selected": True, "text": placeholder, "value": placeholder},
        "options": [],
    }


def variable(name: str, label: str, query: str) -> dict[str, Any]:
    """A multi-value query variable that defaults to All (`.*` also matches an absent label)."""
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DATASOURCE,
        "query": {"query": query, "refId": name},
        "definition": query,
        "refresh": 2,
        "multi": True,
        "includeAll": True,
        "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "sort": 1,
    }


# Names Grafana's import dialog shows for the panel plugins we use.
PANEL_NAMES = {
    "stat": "Stat",
    "state-timeline": "State timeline",
    "table": "Table",
    "timeseries": "Time series",
}


def requires(panels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`__requires` of the import dialog: Grafana, Prometheus and the panel plugins used."""
    kinds = sorted({p["type"] for p in panels if p["type"] != "row"})
    return [
        {"type": "grafana", "id": "grafana", "name": "Grafana", "version": "10.0.0"},
        {"type": "datasource", "id": "prometheus", "name": "Prometheus", "version": "1.0.0"},
        *(
            {"type": "panel", "id": kind, "name": PANEL_NAMES[kind], "version": ""}
            for kind in kinds
        ),
    ]


def dashboard_json(dash: Dashboard) -> dict[str, Any]:
    """Grafana JSON of one dashboard, laid out row by row."""
    panels: list[dict[str, Any]] = []
    y = 0
    pid = 1
    for row in dash.rows:
        panels.append(
            {
                "id": pid,
                "type": "row",
                "title": row.title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                "panels": [],
            }
        )
        pid += 1
        y += 1
        x = 0
        height = 0
        for panel in row.panels:
            if x + panel.width > 24:
                x, y = 0, y + height
                height = 0
            panels.append(panel_json(panel, pid, x, y))
            pid += 1
            x += panel.width
            height = max(height, panel.height)
        y += height
    return {
        "__inputs": [
            {
                "name": DS_INPUT,
                "label": "Prometheus",
                "description": "The Prometheus that scrapes the llm-bottleneck exporter and "
                "evaluates its rules (prometheus/rules/).",
                "type": "datasource",
                "pluginId": "prometheus",
                "pluginName": "Prometheus",
            }
        ],
        "__requires": requires(panels),
        "uid": dash.uid,
        "title": dash.title,
        "description": dash.description,
        "tags": ["llm-bottleneck"],
        "editable": True,
        "graphTooltip": 1,
        "refresh": "10s",
        "schemaVersion": 39,
        "time": {"from": "now-1h", "to": "now"},
        "timezone": "",
        "annotations": {"list": dash.annotations},
        "templating": {
            "list": [
                datasource_variable(),
                variable("host", "Host", "label_values(llmb_source_up, host)"),
                variable("engine", "Engine", f"label_values(llmb_engine_up{{{HSEL}}}, engine)"),
            ]
        },
        "panels": panels,
    }


def render(name: str) -> str:
    """Normalized JSON text of one dashboard file."""
    return json.dumps(dashboard_json(DASHBOARDS[name]()), indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a dashboard is stale")
    args = parser.parse_args(argv)
    stale = []
    for name in DASHBOARDS:
        path = OUT / name
        text = render(name)
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current == text:
            continue
        if args.check:
            stale.append(str(path.relative_to(HERE.parent)))
        else:
            OUT.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path.relative_to(HERE.parent)}")
    extra = sorted(p.name for p in OUT.glob("*.json") if p.name not in DASHBOARDS)
    if extra:
        print("dashboards not made by this generator:", *extra, sep="\n  ", file=sys.stderr)
        return 1
    if stale:
        print("stale (run python grafana/generate.py):", *stale, sep="\n  ", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
