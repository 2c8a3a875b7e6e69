"""Generate the Grafana dashboards (`grafana/dashboards/*.json`) as code.

The JSON is normalized (sorted keys, fixed ids, no UI-export fields) so a change shows as a
small diff. Run `python grafana/generate.py` after editing; `--check` exits 1 when a
committed dashboard is stale (CI runs it). Every query names only series that the exporter,
the load generator or a recording rule produces (tests/test_grafana.py checks it).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
OUT = HERE / "dashboards"
DATASOURCE = {"type": "prometheus", "uid": "llmb-prometheus"}
# Every query is narrowed by both variables: one Prometheus may scrape many hosts (issue 8).
HSEL = 'host=~"$host"'
SEL = f'{HSEL}, engine=~"$engine"'
# Histogram quantiles use a fixed window: 1m holds enough requests at a few per second
# and the dashboards do not depend on Grafana's $__rate_interval.
HIST_WINDOW = "1m"


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
    """A panel: type, title, queries and its size in the 24-column grid."""

    title: str
    targets: list[Target]
    kind: str = "timeseries"
    unit: str = "short"
    width: int = 8
    height: int = 7
    description: str = ""
    options: dict[str, Any] = field(default_factory=dict)
    defaults: dict[str, Any] = field(default_factory=dict)
    overrides: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Row:
    """A titled row of panels."""

    title: str
    panels: list[Panel]


def ts(title: str, *targets: Target, unit: str = "short", **kw: Any) -> Panel:
    """A time series panel."""
    return Panel(title, list(targets), "timeseries", unit, **kw)


def stat(title: str, *targets: Target, unit: str = "short", **kw: Any) -> Panel:
    """A stat panel showing the last value per series."""
    return Panel(title, list(targets), "stat", unit, **kw)


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


def check(title: str, expr: str, description: str) -> Panel:
    """A yes/no stat for one decision step."""
    return stat(
        title,
        Target(expr, "{{host}}/{{engine}}"),
        width=6,
        description=description,
        defaults={"mappings": BOOL_MAPPING, "color": {"mode": "thresholds"}},
        options={"colorMode": "background", "graphMode": "none", "textMode": "value_and_name"},
    )


def overview() -> tuple[str, str, list[Row], list[dict[str, Any]]]:
    """Bottleneck overview: the verdict, then the decision steps with their evidence."""
    verdict_now = Panel(
        "Verdict now",
        [Target(f"llmb:engine_bottleneck:verdict{{{SEL}}} == 1", instant=True)],
        "table",
        width=12,
        height=6,
        description="The active verdict per engine (prometheus/thresholds.md explains it).",
        options={"showHeader": True},
        overrides=[],
    )
    verdict_now.defaults = {"custom": {"align": "auto"}}
    verdict_hist = Panel(
        "Verdict over time",
        [
            Target(
                f"llmb:engine_bottleneck:verdict{{{SEL}}} == 1", "{{host}}/{{engine}}: {{verdict}}"
            )
        ],
        "state-timeline",
        width=12,
        height=6,
        defaults={
            "mappings": [{"type": "value", "options": {"1": {"text": "active", "index": 0}}}]
        },
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
                    "Fewer layers on the GPU than the model has, or GPU weight buffers or "
                    "process GPU memory below 0.9 x the weight bytes.",
                ),
                ts(
                    "Layers on the GPU / layers",
                    Target(
                        f"engine:llmb_gpu_layers_offloaded:ratio{{{SEL}}}", "{{host}}/{{engine}}"
                    ),
                    unit="percentunit",
                    width=6,
                ),
                ts(
                    "GPU weight buffers / weight bytes",
                    Target(
                        f"engine:llmb_weights_gpu_buffers:ratio{{{SEL}}}", "{{host}}/{{engine}}"
                    ),
                    unit="percentunit",
                    width=6,
                ),
                ts(
                    "Process GPU memory / weight bytes",
                    Target(f"engine:llmb_weights_gpu_memory:ratio{{{SEL}}}", "{{host}}/{{engine}}"),
                    unit="percentunit",
                    width=6,
                ),
            ],
        ),
        Row(
            "2. Is the KV cache saturated?",
            [
                check(
                    "KV saturated",
                    f"engine:llmb_kv_saturated:bool{{{SEL}}}",
                    "KV usage >= 0.9 with requests waiting, or KV-pressure events in 5m.",
                ),
                ts(
                    "KV cache usage (1m average)",
                    Target(f"engine:llmb_kv_cache_usage:avg1m{{{SEL}}}", "{{host}}/{{engine}}"),
                    unit="percentunit",
                    width=9,
                ),
                ts(
                    "KV-pressure events in 5m",
                    Target(
                        f"engine:llmb_kv_pressure_events:increase5m{{{SEL}}}", "{{host}}/{{engine}}"
                    ),
                    width=9,
                ),
            ],
        ),
        Row(
            "3. Are requests queueing while KV has room?",
            [
                check(
                    "Requests queueing",
                    f"engine:llmb_requests_queueing:bool{{{SEL}}}",
                    "At least 0.5 requests waiting on average over 1m.",
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
                    width=9,
                ),
                ts(
                    "Slots (max running requests)",
                    Target(
                        f"max by (host, engine) (llmb_engine_slots{{{SEL}}})", "{{host}}/{{engine}}"
                    ),
                    width=9,
                ),
            ],
        ),
        Row(
            "4. Is the engine idle?",
            [
                check(
                    "Idle",
                    f"engine:llmb_idle:bool{{{SEL}}}",
                    "Nothing running or waiting and no tokens generated in 5m.",
                ),
                ts(
                    "Generated tokens/s (aggregate, 5m)",
                    Target(
                        f"engine:llmb_generation_tokens_per_second:rate5m{{{SEL}}}",
                        "{{host}}/{{engine}}",
                    ),
                    width=18,
                ),
            ],
        ),
        Row(
            "5. Is decode at the card's memory-bandwidth limit?",
            [
                check(
                    "Decode at card limit",
                    f"engine:llmb_decode_at_card_limit:bool{{{SEL}}}",
                    "Per-sequence decode >= 0.5 x roofline (bandwidth / bytes per step).",
                ),
                ts(
                    "Decode efficiency (measured / roofline)",
                    Target(
                        f"engine:llmb_decode_efficiency:ratio5m{{{SEL}}}", "{{host}}/{{engine}}"
                    ),
                    unit="percentunit",
                    width=9,
                ),
                ts(
                    "Per-sequence decode vs roofline",
                    Target(
                        f"engine:llmb_decode_tokens_per_second:rate5m{{{SEL}}}",
                        "{{host}}/{{engine}} measured",
                    ),
                    Target(
                        f"engine:llmb_decode_roofline_tokens_per_second:avg5m{{{SEL}}}",
                        "{{host}}/{{engine}} roofline",
                    ),
                    unit="tok/s",
                    width=9,
                ),
            ],
        ),
    ]
    return "llmb-overview", "LLM bottleneck: overview", rows, []


def gpu_memory() -> tuple[str, str, list[Row], list[dict[str, Any]]]:
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
                ),
                ts(
                    "Headroom at the peak",
                    Target(
                        f"gpu:llmb_gpu_memory_headroom_bytes:peak{{{HSEL}}}", "{{host}} GPU {{gpu}}"
                    ),
                    unit="bytes",
                    width=6,
                    description="total - reserved - peak used; LLMGPUMemoryNearFull below 512 MiB.",
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
                ),
                ts(
                    "GPU memory per engine and GPU",
                    Target(
                        f"engine_gpu:llmb_gpu_process_memory_used_bytes:sum{{{SEL}}}",
                        "{{host}}/{{engine}} on GPU {{gpu}}",
                    ),
                    unit="bytes",
                    width=12,
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
                ),
            ],
        ),
    ]
    return "llmb-gpu-memory", "LLM bottleneck: GPU memory", rows, []


def engines() -> tuple[str, str, list[Row], list[dict[str, Any]]]:
    """Engines side by side: decode vs roofline, throughput, latency, queue, KV, cache."""
    rows = [
        Row(
            "Decode",
            [
                ts(
                    "Per-sequence decode vs roofline",
                    Target(
                        f"engine:llmb_decode_tokens_per_second:rate5m{{{SEL}}}",
                        "{{host}}/{{engine}} measured",
                    ),
                    Target(
                        f"engine:llmb_decode_roofline_tokens_per_second:avg5m{{{SEL}}}",
                        "{{host}}/{{engine}} roofline",
                    ),
                    unit="tok/s",
                    width=12,
                ),
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
                ),
                ts(
                    "Inter-token latency",
                    *quantiles("llmb_engine_inter_token_latency_seconds", "engine", "server"),
                    *quantiles("llmb_loadgen_inter_token_latency_seconds", "engine", "client"),
                    unit="s",
                    width=12,
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
                    width=8,
                ),
                ts(
                    "KV cache usage",
                    Target(f"engine:llmb_kv_cache_usage:ratio{{{SEL}}}", "{{host}}/{{engine}}"),
                    unit="percentunit",
                    width=8,
                ),
                ts(
                    "Prefix-cache share of prompt tokens",
                    Target(
                        f"engine:llmb_prefix_cache_hit:ratio_rate5m{{{SEL}}}", "{{host}}/{{engine}}"
                    ),
                    unit="percentunit",
                    width=8,
                ),
            ],
        ),
    ]
    return "llmb-engines", "LLM bottleneck: engines side by side", rows, []


def load_run() -> tuple[str, str, list[Row], list[dict[str, Any]]]:
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
                    width=8,
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
                ),
                Panel(
                    "Steps",
                    [Target(f"llmb_loadgen_step_info{{{SEL}}}", instant=True)],
                    "table",
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
                    width=12,
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
                ),
                ts(
                    "Inter-token latency",
                    *quantiles("llmb_loadgen_inter_token_latency_seconds", "engine", "ITL"),
                    unit="s",
                    width=8,
                ),
                ts(
                    "End-to-end latency",
                    *quantiles("llmb_loadgen_e2e_request_latency_seconds", "engine", "e2e"),
                    unit="s",
                    width=8,
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
                ),
                ts(
                    "KV usage and queue",
                    Target(f"engine:llmb_kv_cache_usage:ratio{{{SEL}}}", "{{host}}/{{engine}} KV"),
                    Target(
                        f"engine:llmb_requests_waiting:max{{{SEL}}}", "{{host}}/{{engine}} waiting"
                    ),
                    width=12,
                ),
            ],
        ),
    ]
    return "llmb-load-run", "LLM bottleneck: load run", rows, annotations


# Same ranks as prometheus/generate.py SEVERITY (tests/test_fleet.py keeps them equal).
FLEET_SEVERITY = {
    "engine_down": (7, "dark-red"),
    "weights_not_resident": (6, "red"),
    "kv_saturated": (5, "orange"),
    "scheduling_bound": (4, "yellow"),
    "decode_below_card_limit": (3, "blue"),
    "decode_at_card_limit": (2, "green"),
    "idle": (1, "text"),
}


def fleet() -> tuple[str, str, list[Row], list[dict[str, Any]]]:
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
    table = Panel(
        "Verdict per host and engine, worst first",
        [Target(f"sort_desc(llmb:engine_bottleneck:severity{{{SEL}}})", instant=True)],
        "table",
        width=14,
        height=10,
        description="One row per engine; Value is the severity rank (7 engine down ... 1 idle).",
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
        width=10,
        height=10,
        description="The worst verdict among each host's engines.",
        defaults=colored,
        options={"colorMode": "background", "graphMode": "none", "textMode": "value_and_name"},
    )
    counts = ts(
        "Engines per verdict and host",
        Target(f"host_verdict:llmb_engines:count{{{HSEL}}}", "{{host}} {{verdict}}"),
        width=12,
    )
    history = Panel(
        "Verdict over time",
        [
            Target(
                f"llmb:engine_bottleneck:verdict{{{SEL}}} == 1", "{{host}}/{{engine}}: {{verdict}}"
            )
        ],
        "state-timeline",
        width=12,
        defaults={
            "mappings": [{"type": "value", "options": {"1": {"text": "active", "index": 0}}}]
        },
        options={"showValue": "never", "mergeValues": True},
    )
    rows = [Row("Fleet now", [table, worst]), Row("Fleet over time", [counts, history])]
    return "llmb-fleet", "LLM bottleneck: fleet", rows, []


DASHBOARDS = {
    "overview.json": overview,
    "gpu-memory.json": gpu_memory,
    "engines.json": engines,
    "load-run.json": load_run,
    "fleet.json": fleet,
}


def panel_json(panel: Panel, pid: int, x: int, y: int) -> dict[str, Any]:
    """Grafana JSON of one panel."""
    defaults = {"unit": panel.unit, **panel.defaults}
    doc: dict[str, Any] = {
        "id": pid,
        "type": panel.kind,
        "title": panel.title,
        "datasource": DATASOURCE,
        "gridPos": {"h": panel.height, "w": panel.width, "x": x, "y": y},
        "fieldConfig": {"defaults": defaults, "overrides": panel.overrides},
        "options": panel.options,
        "targets": [t.to_json(chr(ord("A") + i)) for i, t in enumerate(panel.targets)],
    }
    if panel.description:
        doc["description"] = panel.description
    return doc


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


def dashboard_json(
    uid: str, title: str, rows: list[Row], annotations: list[dict[str, Any]]
) -> dict[str, Any]:
    """Grafana JSON of one dashboard, laid out row by row."""
    panels: list[dict[str, Any]] = []
    y = 0
    pid = 1
    for row in rows:
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
        "uid": uid,
        "title": title,
        "tags": ["llm-bottleneck"],
        "editable": True,
        "graphTooltip": 1,
        "refresh": "10s",
        "schemaVersion": 39,
        "time": {"from": "now-1h", "to": "now"},
        "timezone": "",
        "annotations": {"list": annotations},
        "templating": {
            "list": [
                variable("host", "Host", "label_values(llmb_source_up, host)"),
                variable("engine", "Engine", f"label_values(llmb_engine_up{{{HSEL}}}, engine)"),
            ]
        },
        "panels": panels,
    }


def render(name: str) -> str:
    """Normalized JSON text of one dashboard file."""
    uid, title, rows, annotations = DASHBOARDS[name]()
    return (
        json.dumps(dashboard_json(uid, title, rows, annotations), indent=2, sort_keys=True) + "\n"
    )


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
