"""Grafana dashboards: fresh, real series only, importable anywhere, readable on their own.

Unit tests over the generated JSON (no Grafana runs here): every query names a series that
exists, every panel and query uses the `${datasource}` variable, every panel has a unit and
a description, threshold lines carry the rules' numbers, and grafana-foundation-sdk's typed
models read every dashboard back. The Kubernetes ConfigMaps hold the same JSON for the
Grafana sidecar.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.cog.plugins import register_default_plugins
from grafana_foundation_sdk.models import dashboard as sdk
from grafana_foundation_sdk.models import prometheus as sdk_prometheus

from core.thresholds import THRESHOLDS
from tests.plugins.prom import ROOT, known_series, promql_metric_names, rule_groups

GRAFANA = ROOT / "grafana"
VARIABLE = "${datasource}"
PROVISIONED_UID = "llmb-prometheus"
TITLES = {
    "LLM bottleneck: overview",
    "LLM bottleneck: GPU memory",
    "LLM bottleneck: engines side by side",
    "LLM bottleneck: load run",
    "LLM bottleneck: fleet",
}
# Units a panel may use: Grafana's base units, plus custom suffixes that name what is counted.
UNITS = {
    "bytes",
    "s",
    "percentunit",
    "reqps",
    "bool_yes_no",
    "none",
    "tok/s",
    "requests",
    "events",
    "restarts",
    "engines",
    "watt",
    "celsius",
}
# Panels whose threshold line is a number of the rules: (dashboard uid, panel title) ->
# (THRESHOLDS name, colour below the line, colour at and above it).
LIMITS = {
    ("llmb-overview", "Layers on the GPU / layers"): ("layers_ratio_min", "red", "green"),
    ("llmb-overview", "GPU weight buffers / weight bytes"): (
        "weights_buffer_ratio_min",
        "red",
        "green",
    ),
    ("llmb-overview", "Process GPU memory / weight bytes"): (
        "weights_memory_ratio_min",
        "red",
        "green",
    ),
    ("llmb-overview", "KV cache usage (1m average)"): ("kv_usage_high", "green", "red"),
    ("llmb-overview", "Decode efficiency (measured / roofline)"): (
        "decode_efficiency_at_limit",
        "orange",
        "green",
    ),
    ("llmb-engines", "KV cache usage"): ("kv_usage_high", "green", "red"),
    ("llmb-load-run", "KV usage"): ("kv_usage_high", "green", "red"),
    ("llmb-gpu-memory", "Headroom at the peak"): ("gpu_headroom_min_bytes", "red", "green"),
    ("llmb-gpu-memory", "Clocks / their maxima"): ("sm_clock_ratio_min", "red", "green"),
    ("llmb-gpu-memory", "Card slowed, per engine"): ("card_slowdown_share_min", "green", "red"),
    ("llmb-overview", "Prefill efficiency (measured / compute limit)"): (
        "prefill_efficiency_at_limit",
        "orange",
        "green",
    ),
}
# Where the rules compare a series with the same number (prometheus/rules/*.yml).
RULE_COMPARISONS = {
    "kv_usage_high": "engine:llmb_kv_cache_usage:avg1m >= bool {}",
    "decode_efficiency_at_limit": "engine:llmb_decode_efficiency:ratio5m >= bool {}",
    "gpu_headroom_min_bytes": "gpu:llmb_gpu_memory_headroom_bytes:peak < {}",
    "weights_buffer_ratio_min": "engine:llmb_weights_gpu_buffers:ratio < bool {}",
    "weights_memory_ratio_min": "engine:llmb_weights_gpu_memory:ratio < bool {}",
    "layers_ratio_min": "engine:llmb_gpu_layers_offloaded:ratio < bool {}",
    "sm_clock_ratio_min": "engine:llmb_gpu_sm_clock:ratio5m < bool {}",
    "card_slowdown_share_min": "engine:llmb_gpu_power_slowdown:avg5m >= bool {}",
    "prefill_efficiency_at_limit": "engine:llmb_prefill_efficiency:ratio5m >= bool {}",
}
# Keys grafana-foundation-sdk's models do not carry: the import dialog's inputs, the variable
# editor's query text, and the Prometheus annotation fields Grafana reads from the legacy
# annotation shape. Anything else lost in a round trip is a field Grafana would not read.
SDK_UNMODELLED = re.compile(
    r"^/(__inputs|__requires)$|^/templating/list\[\d+\]/definition$"
    r"|^/annotations/list\[\d+\]/(step|titleFormat|tagKeys|useValueForTime)$"
)


def dashboards() -> dict[str, dict[str, Any]]:
    return {
        p.name: json.loads(p.read_text(encoding="utf-8"))
        for p in sorted((GRAFANA / "dashboards").glob("*.json"))
    }


def by_uid(uid: str) -> dict[str, Any]:
    return next(d for d in dashboards().values() if d["uid"] == uid)


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])


def visible(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel but the row headers."""
    return (p for p in panels(dashboard) if p["type"] != "row")


def queries(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, expr) for every panel target and annotation of a dashboard."""
    for panel in panels(dashboard):
        for target in panel.get("targets", []):
            yield panel["title"], target["expr"]
    for ann in dashboard["annotations"]["list"]:
        yield f"annotation {ann['name']}", ann["expr"]


def lost_in_round_trip(before: Any, after: Any, path: str = "") -> list[str]:
    """JSON paths present in `before` but missing or changed in `after`."""
    if isinstance(before, dict) and isinstance(after, dict):
        out = []
        for key, value in before.items():
            if key not in after:
                out.append(f"{path}/{key}")
            else:
                out += lost_in_round_trip(value, after[key], f"{path}/{key}")
        return out
    if isinstance(before, list) and isinstance(after, list):
        if len(before) != len(after):
            return [path]
        return [
            lost
            for i, (b, a) in enumerate(zip(before, after, strict=True))
            for lost in lost_in_round_trip(b, a, f"{path}[{i}]")
        ]
    return [] if before == after else [path]


# --- generated, real series, layout ----------------------------------------------------


# Freshness of the generated dashboards: tests/system/test_mixin.py (one --check for all).


def test_the_five_dashboards_exist_with_unique_uids() -> None:
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
    doc = by_uid("llmb-overview")
    rows = [p["title"] for p in doc["panels"] if p["type"] == "row"]
    assert rows[0] == "Verdict"
    assert [r.split(".")[0] for r in rows[1:]] == ["1", "2", "3", "4", "5", "6"]


def test_load_run_marks_steps_as_annotations() -> None:
    doc = by_uid("llmb-load-run")
    exprs = [a["expr"] for a in doc["annotations"]["list"]]
    assert any("llmb_loadgen_step_start_timestamp_seconds" in e for e in exprs)


def test_engines_dashboard_shows_engine_restarts_as_panel_and_annotation() -> None:
    doc = by_uid("llmb-engines")
    restart_panels = [
        p
        for p in visible(doc)
        if any("llmb_engine_restarts_total" in tg["expr"] for tg in p["targets"])
    ]
    assert [p["fieldConfig"]["defaults"]["unit"] for p in restart_panels] == ["restarts"]
    (ann,) = [a for a in doc["annotations"]["list"] if "llmb_engine_restarts_total" in a["expr"]]
    assert ann["enable"] is True
    # Grafana marks a time where the value is above 0; the increase is 0 between restarts.
    assert ann["expr"].startswith("sum by (host, engine) (increase(")
    assert not ann["useValueForTime"]


@pytest.mark.parametrize("name", sorted(p.name for p in (GRAFANA / "dashboards").glob("*.json")))
def test_dashboard_json_is_normalized(name: str) -> None:
    text = (GRAFANA / "dashboards" / name).read_text(encoding="utf-8")
    doc = json.loads(text)
    assert text == json.dumps(doc, indent=2, sort_keys=True) + "\n"
    assert "$$hashKey" not in text
    assert "version" not in doc and "iteration" not in doc


# --- imports anywhere: the datasource variable ------------------------------------------


def test_every_panel_query_variable_and_annotation_uses_the_datasource_variable() -> None:
    for name, doc in dashboards().items():
        for panel in visible(doc):
            assert panel["datasource"] == {"type": "prometheus", "uid": VARIABLE}, (
                name,
                panel["title"],
            )
            assert panel["targets"], (name, panel["title"])
            for target in panel["targets"]:
                assert target["datasource"] == {"type": "prometheus", "uid": VARIABLE}
        for var in doc["templating"]["list"][1:]:
            assert var["datasource"] == {"type": "prometheus", "uid": VARIABLE}, (name, var)
        for ann in doc["annotations"]["list"]:
            assert ann["datasource"] == {"type": "prometheus", "uid": VARIABLE}, (name, ann)
        # No fixed uid anywhere: a Grafana without it would show "datasource not found".
        assert PROVISIONED_UID not in json.dumps(doc), name


def test_datasource_variable_comes_first_and_the_import_input_feeds_it() -> None:
    for name, doc in dashboards().items():
        var = doc["templating"]["list"][0]
        assert (var["name"], var["type"], var["query"]) == (
            "datasource",
            "datasource",
            "prometheus",
        )
        assert var["multi"] is False and var["includeAll"] is False
        (inp,) = doc["__inputs"]
        assert (inp["type"], inp["pluginId"]) == ("datasource", "prometheus")
        placeholder = "${" + inp["name"] + "}"
        assert var["current"]["value"] == placeholder, name
        # The placeholder appears nowhere else: a Grafana that skips `__inputs` (provisioning,
        # the Kubernetes sidecar) leaves it unresolved, which must not reach a panel.
        text = json.dumps(doc)
        assert text.count(placeholder) == 2, name  # the variable's current text and value
        assert "${DS_" not in json.dumps([doc["panels"], doc["annotations"]])


def test_requires_lists_prometheus_and_every_panel_type() -> None:
    for name, doc in dashboards().items():
        required = {(r["type"], r["id"]) for r in doc["__requires"]}
        assert ("datasource", "prometheus") in required, name
        assert ("grafana", "grafana") in required, name
        used = {("panel", p["type"]) for p in visible(doc)}
        assert {r for r in required if r[0] == "panel"} == used, name


def test_provisioned_datasource_is_the_only_prometheus_and_the_default() -> None:
    """In compose the variable falls back to the provisioned datasource."""
    ds = yaml.safe_load((GRAFANA / "provisioning/datasources/prometheus.yml").read_text())
    prometheus = [d for d in ds["datasources"] if d["type"] == "prometheus"]
    assert [(d["uid"], d["isDefault"]) for d in prometheus] == [(PROVISIONED_UID, True)]
    dash = yaml.safe_load((GRAFANA / "provisioning/dashboards/llmb.yml").read_text())
    paths = [p["options"]["path"] for p in dash["providers"]]
    compose = (ROOT / "docker-compose.yml").read_text(encoding="utf-8")
    for path in paths:
        assert f"./grafana/dashboards:{path}" in compose


# --- readable on their own: units, descriptions, thresholds -----------------------------


def test_every_panel_has_a_unit_and_a_description() -> None:
    for name, doc in dashboards().items():
        assert len(doc["description"]) > 30, name
        for panel in visible(doc):
            where = (name, panel["title"])
            assert panel["fieldConfig"]["defaults"]["unit"] in UNITS, where
            assert len(panel.get("description", "")) >= 80, where


def test_ratio_panels_use_percentunit_and_latency_panels_seconds() -> None:
    for name, doc in dashboards().items():
        for panel in visible(doc):
            unit = panel["fieldConfig"]["defaults"]["unit"]
            exprs = " ".join(tg["expr"] for tg in panel["targets"])
            if panel["type"] == "timeseries" and re.search(r":ratio\w*\{", exprs):
                assert unit == "percentunit", (name, panel["title"])
            if "_seconds_bucket" in exprs:
                assert unit == "s", (name, panel["title"])
            if re.search(r"_bytes\b|_bytes:|_bytes_", exprs) and "per_second" not in exprs:
                assert unit == "bytes", (name, panel["title"])


def test_threshold_lines_carry_the_rules_numbers() -> None:
    seen = set()
    for doc in dashboards().values():
        for panel in visible(doc):
            thresholds = panel["fieldConfig"]["defaults"].get("thresholds")
            key = (doc["uid"], panel["title"])
            if key not in LIMITS:
                assert thresholds is None, key
                continue
            seen.add(key)
            name, below, above = LIMITS[key]
            assert thresholds == {
                "mode": "absolute",
                "steps": [
                    {"color": below, "value": None},
                    {"color": above, "value": float(THRESHOLDS[name].value)},
                ],
            }, key
            assert panel["fieldConfig"]["defaults"]["custom"]["thresholdsStyle"] == {
                "mode": "dashed"
            }
            # The description names the threshold and its current value.
            assert f"`{name}`" in panel["description"], key
    assert seen == set(LIMITS)


def test_the_rules_compare_with_the_same_numbers() -> None:
    """A threshold changed in THRESHOLDS moves the rule and the panel line together."""
    exprs = " ".join(
        " ".join(rule["expr"].split()) for group in rule_groups() for rule in group["rules"]
    )
    for name, comparison in RULE_COMPARISONS.items():
        assert comparison.format(THRESHOLDS[name].value) in exprs, name
    assert {limit[0] for limit in LIMITS.values()} <= set(RULE_COMPARISONS)


def test_decode_panels_draw_the_at_limit_line_of_the_roofline() -> None:
    at_limit = THRESHOLDS["decode_efficiency_at_limit"].value
    for uid in ("llmb-overview", "llmb-engines"):
        (panel,) = [
            p for p in visible(by_uid(uid)) if p["title"] == "Per-sequence decode vs roofline"
        ]
        exprs = [tg["expr"] for tg in panel["targets"]]
        roofline = next(e for e in exprs if "roofline" in e and "*" not in e)
        assert f"{roofline} * {at_limit}" in exprs, uid
        assert panel["fieldConfig"]["defaults"]["unit"] == "tok/s"


def test_check_descriptions_quote_the_current_thresholds() -> None:
    doc = by_uid("llmb-overview")
    text = {p["title"]: p["description"] for p in visible(doc)}
    assert f"{float(THRESHOLDS['kv_usage_high'].value) * 100:g} %" in text["KV saturated"]
    assert THRESHOLDS["queue_min"].value in text["Requests queueing"]
    assert THRESHOLDS["decode_efficiency_at_limit"].value in text["Decode at card limit"]
    for name in ("layers_ratio_min", "weights_buffer_ratio_min", "weights_memory_ratio_min"):
        assert THRESHOLDS[name].value in text["Weights not resident"], name


# --- grafana-foundation-sdk's models read every dashboard -------------------------------


@pytest.mark.parametrize("name", sorted(p.name for p in (GRAFANA / "dashboards").glob("*.json")))
def test_dashboard_parses_with_grafana_foundation_sdk(name: str) -> None:
    register_default_plugins()
    doc = json.loads((GRAFANA / "dashboards" / name).read_text(encoding="utf-8"))
    model = sdk.Dashboard.from_json(doc)
    assert model.uid == doc["uid"]
    assert model.templating.list_val is not None
    var = model.templating.list_val[0]
    assert (var.type_val, var.query) == ("datasource", "prometheus")
    assert model.panels is not None
    for panel in model.panels:
        if isinstance(panel, sdk.RowPanel):
            continue
        assert panel.datasource is not None and panel.datasource.uid == VARIABLE
        assert panel.field_config is not None and panel.field_config.defaults.unit in UNITS
        assert panel.description
        assert panel.targets
        for target in panel.targets:
            assert isinstance(target, sdk_prometheus.Dataquery), panel.title
            assert target.expr
        thresholds = panel.field_config.defaults.thresholds
        if thresholds is not None:
            assert thresholds.mode == sdk.ThresholdsMode.ABSOLUTE
            assert [type(s) for s in thresholds.steps] == [sdk.Threshold, sdk.Threshold]
    back = json.loads(json.dumps(model, cls=JSONEncoder))
    lost = [p for p in lost_in_round_trip(doc, back) if not SDK_UNMODELLED.match(p)]
    assert lost == []


# --- Kubernetes: ConfigMaps for kube-prometheus-stack's Grafana sidecar ----------------


def test_configmaps_follow_the_sidecar_contract() -> None:
    """Label `grafana_dashboard: "1"`, a folder annotation, one prefixed file per dashboard."""
    text = (ROOT / "deploy/kubernetes/grafana-dashboards.yaml").read_text(encoding="utf-8")
    maps = list(yaml.safe_load_all(text))
    files = {p.name: p.read_text(encoding="utf-8") for p in (GRAFANA / "dashboards").glob("*.json")}
    keys = []
    for cm in maps:
        meta = cm["metadata"]
        assert meta["labels"]["grafana_dashboard"] == "1"
        assert meta["annotations"]["grafana_folder"] == "LLM bottleneck"
        ((key, body),) = cm["data"].items()
        keys.append(key)
        # The sidecar writes every key of every labelled ConfigMap into one folder.
        assert key.startswith("llmb-") and key.endswith(".json"), key
        assert body == files[key.removeprefix("llmb-")]
        # kubectl apply keeps the object in an annotation limited to 256 KiB.
        assert len(body.encode()) < 256 * 1024, key
        doc = json.loads(body)
        assert "${DS_" not in json.dumps([doc["panels"], doc["annotations"]]), key
    assert sorted(keys) == sorted(f"llmb-{name}" for name in files)


def test_no_panel_shows_a_decode_efficiency_beyond_physics() -> None:
    """Every efficiency query drops engines whose roofline does not fit (issue 17), and the
    decode check names the misfit reason instead of a verdict."""
    seen = 0
    for doc in dashboards().values():
        for panel in visible(doc):
            for target in panel.get("targets", []):
                if "engine:llmb_decode_efficiency:ratio5m" in target["expr"]:
                    assert (
                        "unless on (host, engine, kind) llmb:engine_roofline:misfit"
                        in (target["expr"])
                    ), panel["title"]
                    seen += 1
    assert seen
    (check,) = [p for p in visible(by_uid("llmb-overview")) if p["title"] == "Decode at card limit"]
    exprs = [tg["expr"] for tg in check["targets"]]
    assert any("llmb:engine_roofline:misfit" in e and "unless" in e for e in exprs)
    misfit = next(
        tg for tg in check["targets"] if " or (0 * llmb:engine_roofline:misfit" in tg["expr"]
    )
    assert "{{reason}}" in misfit["legendFormat"]
    mapping = check["fieldConfig"]["defaults"]["mappings"][0]["options"]
    assert "does not fit" in mapping["2"]["text"]
