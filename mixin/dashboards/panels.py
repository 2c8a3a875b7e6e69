"""Panel building blocks shared by the dashboards: typed panels, queries, limits and the
checks of the decision steps. Every threshold line is read from the core's THRESHOLDS."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from core import series as llmb
from core.thresholds import threshold_promql
from mixin.config import MixinConfig

# The datasource variable; its value is a datasource uid (or name) chosen per dashboard.
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
# Name of the import input. It appears only as the variable's initial value, so a Grafana
# that loads the file without the import dialog never resolves it and falls back to its
# Prometheus datasource, instead of showing "datasource not found" on every panel.
DS_INPUT = "DS_PROMETHEUS"
# Every query is narrowed by both variables: one Prometheus may scrape many hosts (issue 8).
HSEL = 'host=~"$host"'
SEL = f'{HSEL}, engine=~"$engine"'
# Histogram quantiles use a fixed window (the config's dashboard_window: 1m holds enough
# requests at a few per second), so the dashboards do not depend on $__rate_interval.
# The verdict's windows, as the recorded series' names carry them.
RW, QW = threshold_promql("rate_window"), threshold_promql("queue_window")


def threshold(name: str) -> float:
    """One number of the rules' THRESHOLDS table."""
    return float(threshold_promql(name))


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
    annotations: list[Annotation] = field(default_factory=list)


def ts(title: str, *targets: Target, unit: str, description: str, **kw: Any) -> Panel:
    """A time series panel."""
    return Panel(title, list(targets), "timeseries", unit, description, **kw)


def engine_share(
    title: str,
    record: str,
    limit: Limit,
    width: int,
    description: str,
    legend: str = "",
    gate: str = "",
) -> Panel:
    """A per-engine share (0-1) of a recording rule against its threshold line `limit`;
    `gate` (PromQL after the selector) drops what must not be drawn."""
    expr = f"{record}{{{SEL}}}" + (f" {gate}" if gate else "")
    target = Target(expr, "{{host}}/{{engine}}" + legend)
    return ts(title, target, unit="percentunit", width=width, limit=limit, description=description)


def stat(title: str, *targets: Target, unit: str, description: str, **kw: Any) -> Panel:
    """A stat panel showing the last value per series."""
    return Panel(title, list(targets), "stat", unit, description, **kw)


@dataclass(frozen=True)
class Annotation:
    """An annotation query drawn on every panel; `value_is_time`: the value is the moment."""

    name: str
    expr: str
    color: str
    step: str
    title: str
    tags: str
    value_is_time: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "datasource": DATASOURCE,
            "enable": True,
            "iconColor": self.color,
            "name": self.name,
            "expr": self.expr,
            "step": self.step,
            "titleFormat": self.title,
            "tagKeys": self.tags,
            "useValueForTime": self.value_is_time,
        }


def gpu_used_and_peak() -> list[Target]:
    """GPU memory in use per card and the exporter sampler's windowed peak."""
    return [
        Target(
            f"max by (host, gpu) ({llmb.GPU_MEMORY_USED_BYTES}{{{HSEL}}})",
            "{{host}} GPU {{gpu}} used",
        ),
        Target(
            f"max by (host, gpu) ({llmb.GPU_MEMORY_USED_PEAK_BYTES}{{{HSEL}}})",
            "{{host}} GPU {{gpu}} peak",
        ),
    ]


def quantiles(cfg: MixinConfig, metric: str, by: str, label: str) -> list[Target]:
    """p50 and p99 of a histogram per `by` label over the dashboards' window."""
    return [
        Target(
            f"histogram_quantile({q}, sum by ({by}, le) "
            f"(rate({metric}_bucket{{{SEL}}}[{cfg.dashboard_window}])))",
            f"{{{{{by}}}}} {label} p{int(q * 100)}",
        )
        for q in (0.5, 0.99)
    ]


def latency_panel(
    cfg: MixinConfig, title: str, series: dict[str, str], width: int, of_what: str
) -> Panel:
    """p50 and p99 per engine of latency histograms (`series`: metric -> legend label)."""
    targets = [
        q for metric, label in series.items() for q in quantiles(cfg, metric, "engine", label)
    ]
    description = f"p50 and p99 over {cfg.dashboard_window} of {of_what}"
    return ts(title, *targets, unit="s", width=width, description=description)


BOOL_MAPPING: list[dict[str, Any]] = [
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


def decode_check(cfg: MixinConfig) -> Panel:
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
            f"{threshold_promql('decode_efficiency_at_limit')} x the roofline (bandwidth x "
            "accepted tokens / bytes per step): the card is the limit. NO means the engine leaves "
            "speed unused. NO VERDICT when decode is above "
            f"{threshold_promql('decode_efficiency_physical_max')} x the roofline (beyond "
            "physics): the bytes-per-step model does not fit and the name says why "
            "(`llmb:engine_roofline:misfit{reason}`: model_structure_unknown, "
            "expert_counts_unknown, speculative_decoding_not_detected, bandwidth_too_low). "
            f"{cfg.runbook_url}#llmdecodebelowcardlimit, {cfg.runbook_url}#llmrooflinemisfit"
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
    at_limit = threshold_promql("decode_efficiency_at_limit")
    return ts(
        "Per-sequence decode vs roofline",
        Target(
            f"engine:llmb_decode_tokens_per_second:rate{RW}{{{SEL}}}",
            "{{host}}/{{engine}} measured",
        ),
        Target(
            f"engine:llmb_decode_roofline_tokens_per_second:avg{RW}{{{SEL}}}",
            "{{host}}/{{engine}} roofline",
        ),
        Target(
            f"engine:llmb_decode_roofline_tokens_per_second:avg{RW}{{{SEL}}} * {at_limit}",
            f"{{{{host}}}}/{{{{engine}}}} at card limit ({at_limit} x roofline)",
        ),
        unit="tok/s",
        width=width,
        description=(
            "Tokens per second one sequence gets while decoding (decode tokens / decode time, "
            f"{RW}), beside the roofline: GPU memory bandwidth / bytes read per decode step "
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
