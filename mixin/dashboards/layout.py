"""Grafana JSON of a dashboard: grid layout, variables, import inputs and requirements.

The JSON is normalized (sorted keys, fixed ids, no UI-export fields) so a change shows as a
small diff. Every panel, query, variable and annotation uses the `${datasource}` variable
(type datasource, Prometheus): `__inputs` lets Grafana's import dialog pick the datasource;
provisioned copies (compose, the Kubernetes sidecar), which skip `__inputs`, fall back to
the Prometheus datasource of that Grafana.

Why plain dicts and not grafana-foundation-sdk's builders: the helpers of panels.py (`ts`,
`stat`, `check`) already say a panel in one call, and the builders' output would carry
every default field, which turns each edit into a large diff. The SDK's models still read
every dashboard back in tests/integration/test_grafana.py, so the JSON stays what Grafana's schema
expects.
"""

from __future__ import annotations

import json
from typing import Any

from core import series as llmb
from mixin.dashboards.panels import DATASOURCE, DS_INPUT, HSEL, Dashboard, Panel


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
        "annotations": {"list": [a.to_json() for a in dash.annotations]},
        "templating": {
            "list": [
                datasource_variable(),
                variable("host", "Host", f"label_values({llmb.SOURCE_UP}, host)"),
                variable("engine", "Engine", f"label_values({llmb.ENGINE_UP}{{{HSEL}}}, engine)"),
            ]
        },
        "panels": panels,
    }


def render(dash: Dashboard) -> str:
    """Normalized JSON text of one dashboard file."""
    return json.dumps(dashboard_json(dash), indent=2, sort_keys=True) + "\n"
