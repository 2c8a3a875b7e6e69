"""Grafana dashboards and provisioning: fresh, real series only, fixed datasource uid."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.plugins.prom import ROOT, known_series, promql_metric_names

GRAFANA = ROOT / "grafana"
UID = "llmb-prometheus"
TITLES = {
    "LLM bottleneck: overview",
    "LLM bottleneck: GPU memory",
    "LLM bottleneck: engines side by side",
    "LLM bottleneck: load run",
    "LLM bottleneck: fleet",
}


def dashboards() -> dict[str, dict[str, Any]]:
    return {
        p.name: json.loads(p.read_text(encoding="utf-8"))
        for p in sorted((GRAFANA / "dashboards").glob("*.json"))
    }


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])


def queries(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, expr) for every panel target and annotation of a dashboard."""
    for panel in panels(dashboard):
        for target in panel.get("targets", []):
            yield panel["title"], target["expr"]
    for ann in dashboard["annotations"]["list"]:
        yield f"annotation {ann['name']}", ann["expr"]


def test_dashboards_are_fresh() -> None:
    result = subprocess.run(
        [sys.executable, "grafana/generate.py", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr


def test_the_four_dashboards_exist_with_unique_uids() -> None:
    docs = dashboards()
    assert {d["title"] for d in docs.values()} == TITLES
    uids = [d["uid"] for d in docs.values()]
    assert len(set(uids)) == len(uids)


def test_every_query_names_only_real_series() -> None:
    known = known_series()
    unknown = {}
    for name, doc in dashboards().items():
        for where, expr in queries(doc):
            missing = promql_metric_names(expr) - known
            if missing:
                unknown[f"{name}: {where}"] = sorted(missing)
    assert unknown == {}


def test_every_panel_and_query_uses_the_fixed_datasource() -> None:
    for name, doc in dashboards().items():
        for panel in panels(doc):
            if panel["type"] == "row":
                continue
            assert panel["datasource"]["uid"] == UID, (name, panel["title"])
            assert panel["targets"], (name, panel["title"])
            for target in panel["targets"]:
                assert target["datasource"]["uid"] == UID
        for var in doc["templating"]["list"]:
            assert var["datasource"]["uid"] == UID
        for ann in doc["annotations"]["list"]:
            assert ann["datasource"]["uid"] == UID


def test_panels_do_not_overlap() -> None:
    for name, doc in dashboards().items():
        cells: set[tuple[int, int]] = set()
        for panel in panels(doc):
            g = panel["gridPos"]
            assert g["x"] + g["w"] <= 24, (name, panel["title"])
            area = {
                (x, y)
                for x in range(g["x"], g["x"] + g["w"])
                for y in range(g["y"], g["y"] + g["h"])
            }
            assert not cells & area, (name, panel["title"])
            cells |= area


def test_overview_follows_the_decision_order() -> None:
    doc = next(d for d in dashboards().values() if d["uid"] == "llmb-overview")
    rows = [p["title"] for p in doc["panels"] if p["type"] == "row"]
    assert rows[0] == "Verdict"
    assert [r.split(".")[0] for r in rows[1:]] == ["1", "2", "3", "4", "5"]


def test_load_run_marks_steps_as_annotations() -> None:
    doc = next(d for d in dashboards().values() if d["uid"] == "llmb-load-run")
    exprs = [a["expr"] for a in doc["annotations"]["list"]]
    assert any("llmb_loadgen_step_start_timestamp_seconds" in e for e in exprs)


def test_provisioning_points_at_the_fixed_uid_and_the_dashboards() -> None:
    ds = yaml.safe_load((GRAFANA / "provisioning/datasources/prometheus.yml").read_text())
    assert [d["uid"] for d in ds["datasources"]] == [UID]
    dash = yaml.safe_load((GRAFANA / "provisioning/dashboards/llmb.yml").read_text())
    paths = [p["options"]["path"] for p in dash["providers"]]
    compose = (ROOT / "docker-compose.yml").read_text(encoding="utf-8")
    for path in paths:
        assert f"./grafana/dashboards:{path}" in compose


@pytest.mark.parametrize("name", sorted(p.name for p in (GRAFANA / "dashboards").glob("*.json")))
def test_dashboard_json_is_normalized(name: str) -> None:
    text = (GRAFANA / "dashboards" / name).read_text(encoding="utf-8")
    doc = json.loads(text)
    assert text == json.dumps(doc, indent=2, sort_keys=True) + "\n"
    assert "$$hashKey" not in text
    assert "version" not in doc and "iteration" not in doc
