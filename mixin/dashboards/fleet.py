"""The fleet dashboard: every engine of every host on one Prometheus, worst verdict first."""

from __future__ import annotations

from core.conditions import SEVERITY
from mixin.config import MixinConfig
from mixin.dashboards.panels import (
    ACTIVE_MAPPING,
    HSEL,
    SEL,
    Dashboard,
    Panel,
    Row,
    Target,
    stat,
    ts,
)

# Colours of the fleet verdicts; the ranks come from the core (SEVERITY), as in the fleet rules.
FLEET_COLORS = {
    "engine_down": "dark-red",
    "weights_not_resident": "red",
    "kv_saturated": "orange",
    "scheduling_bound": "yellow",
    "ttft_waiting_bound": "yellow",
    "card_throttled": "purple",
    "prefill_below_card_limit": "blue",
    "decode_below_card_limit": "blue",
    "prefill_at_card_limit": "green",
    "decode_at_card_limit": "green",
    "idle": "text",
}
FLEET_SEVERITY = {
    verdict: (SEVERITY[verdict], color)
    for verdict, color in sorted(FLEET_COLORS.items(), key=lambda kv: -SEVERITY[kv[0]])
}


def rank_texts() -> dict[int, tuple[str, str]]:
    """Each severity rank's text and colour: verdicts that share a rank share its line
    ("a or b"), the colour of the first (worst first, as FLEET_SEVERITY lists them)."""
    out: dict[int, tuple[str, str]] = {}
    for verdict, (rank, color) in FLEET_SEVERITY.items():
        text, first_color = out.get(rank, ("", color))
        out[rank] = (f"{text} or {verdict}" if text else verdict, first_color)
    return out


def _now_row() -> Row:
    """Every engine's severity, worst first, and the worst verdict per host."""
    mapping = [
        {
            "type": "value",
            "options": {
                str(rank): {"text": text, "color": color, "index": i}
                for i, (rank, (text, color)) in enumerate(rank_texts().items())
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
    return Row("Fleet now", [table, worst])


def _history_row() -> Row:
    """Verdict counts per host and each engine's verdict over time."""
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
    return Row("Fleet over time", [counts, history])


def fleet(cfg: MixinConfig) -> Dashboard:
    """Many hosts on one Prometheus: every engine's verdict, worst first."""
    rows = [_now_row(), _history_row()]
    return Dashboard(
        "llmb-fleet",
        "LLM bottleneck: fleet",
        "Every engine of every host on one Prometheus, worst verdict first.",
        rows,
    )
