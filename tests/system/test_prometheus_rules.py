"""The Prometheus config, rules and alerts: promtool checks, unit tests, names, runbook links."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator

import pytest
import yaml

from core.conditions import CONDITIONS, VERDICT_INFO
from core.conditions import VERDICTS as CORE_VERDICTS
from tests.plugins.exporter import served_page
from tests.plugins.prom import (
    BUILTIN_SERIES,
    PROMETHEUS_DIR,
    PROMTOOL_TESTS,
    ROOT,
    known_series,
    promql_metric_names,
    rule_groups,
    schema_series,
)

pytestmark = pytest.mark.prometheus

# The verdict vocabulary in decision order is a contract: spelled out here, not read from
# the core (users' alerts and dashboards name it).
VERDICT_ORDER = (
    "weights_not_resident kv_saturated ttft_waiting_bound scheduling_bound idle card_throttled "
    "prefill_at_card_limit decode_at_card_limit prefill_below_card_limit decode_below_card_limit"
).split()
VERDICTS = set(VERDICT_ORDER)
REQUIRED_ALERTS = {
    "LLMKVCacheSaturated",
    "LLMWeightsNotResident",
    "LLMGPUMemoryNearFull",
    "LLMRequestsQueueing",
    "LLMDecodeBelowCardLimit",
    "LLMCardThrottled",
    "LLMEngineDown",
    "LLMExporterSourceFailing",
    "LLMTokenCountMismatch",
}


def run(*args: str) -> subprocess.CompletedProcess[str]:
    """Run a command in the repository root and return its result."""
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=120)


def alerts() -> list[dict]:
    return [r for g in rule_groups() for r in g["rules"] if "alert" in r]


# Freshness of the generated rule files: tests/system/test_mixin.py (one --check for all).


def test_promtool_check_config_loads_every_rule_file() -> None:
    result = run("promtool", "check", "config", "prometheus/prometheus.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 rule files found" in result.stdout


def test_promtool_check_rules() -> None:
    files = sorted(str(p.relative_to(ROOT)) for p in (PROMETHEUS_DIR / "rules").glob("*.yml"))
    assert len(files) == 3
    result = run("promtool", "check", "rules", *files)
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_unit_tests_pass() -> None:
    files = sorted(str(p.relative_to(ROOT)) for p in PROMTOOL_TESTS.glob("*.yml"))
    assert files, "no promtool tests"
    result = run("promtool", "test", "rules", *files)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(files)


def test_alertmanager_config_is_valid() -> None:
    result = run("amtool", "check-config", "prometheus/alertmanager.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_prometheus_scrapes_only_the_exporter_and_the_load_generator() -> None:
    doc = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text(encoding="utf-8"))
    assert {job["job_name"] for job in doc["scrape_configs"]} == {"llmb-exporter", "llmb-loadgen"}
    assert doc["alerting"]["alertmanagers"]


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        (
            'rate(llmb_engine_decode_tokens_total{engine=~"a|b"}[5m])',
            {"llmb_engine_decode_tokens_total"},
        ),
        (
            "max by (engine, kind) (x) / on (engine) group_left (kind) y:z:w > bool 1e9",
            {"x", "y:z:w"},
        ),
        ('label_replace(a, "evidence", "layers", "", "") or b offset 5m', {"a", "b"}),
        (
            "histogram_quantile(0.99, sum by (le) "
            '(rate(h_bucket{engine=~"$engine"}[$__rate_interval])))',
            {"h_bucket"},
        ),
    ],
)
def test_promql_name_parser(expr: str, names: set[str]) -> None:
    assert promql_metric_names(expr) == names


def test_the_name_check_catches_a_series_that_does_not_exist() -> None:
    # vLLM's preemption alert named `vllm:num_preemptions` while the counter is `..._total`;
    # the same slip in our schema must be caught.
    assert "llmb_engine_kv_pressure_events" not in known_series()
    assert "llmb_engine_kv_pressure_events_total" in schema_series()
    assert "llmb_engine_time_to_first_token_seconds" not in schema_series()
    assert "llmb_engine_time_to_first_token_seconds_bucket" in schema_series()


def test_every_rule_names_only_real_series() -> None:
    known = known_series()
    unknown = {}
    for group in rule_groups():
        for rule in group["rules"]:
            missing = promql_metric_names(rule["expr"]) - known
            if missing:
                unknown[rule.get("record") or rule.get("alert")] = sorted(missing)
    assert unknown == {}


def test_every_recorded_series_is_used_or_is_evidence() -> None:
    # Recording rules must reference recorded series that exist before them (no typos).
    recorded: set[str] = set()
    for group in rule_groups():
        for rule in group["rules"]:
            used = {n for n in promql_metric_names(rule["expr"]) if ":" in n}
            assert used <= recorded, (rule.get("record") or rule.get("alert"), used - recorded)
            if "record" in rule:
                recorded.add(rule["record"])


def test_recording_rule_names_follow_level_metric_operation() -> None:
    for group in rule_groups():
        for rule in group["rules"]:
            if "record" in rule:
                assert re.fullmatch(r"[a-z_]+:[a-z_0-9]+:[a-z_0-9]+", rule["record"]), rule[
                    "record"
                ]


def test_the_verdict_has_one_rule_per_value_in_the_decision_order() -> None:
    verdict = [
        r["labels"]["verdict"]
        for g in rule_groups()
        for r in g["rules"]
        if r.get("record") == "llmb:engine_bottleneck:verdict"
    ]
    assert verdict == VERDICT_ORDER
    assert set(verdict) == VERDICTS
    # The rules are generated from the decision core, in its order.
    assert tuple(verdict) == CORE_VERDICTS


def test_the_conditions_are_the_cores_in_order_and_each_verdict_excludes_earlier_ones() -> None:
    rules = [r for g in rule_groups() for r in g["rules"] if r.get("record")]
    conditions = [r["record"] for r in rules if r["record"].endswith(":bool")]
    assert conditions == [c.record for c in CONDITIONS]
    verdicts = {
        r["labels"]["verdict"]: r["expr"]
        for r in rules
        if r["record"] == "llmb:engine_bottleneck:verdict"
    }
    earlier: list[str] = []
    for name in CORE_VERDICTS:
        cond = VERDICT_INFO[name].condition
        expr = verdicts[name]
        for record in earlier:
            assert f"(1 - {record})" in expr, (name, record)
        if cond is not None:
            record = next(c.record for c in CONDITIONS if c.name == cond)
            assert re.search(rf"(^|\* ){re.escape(record)}\s*$", expr), (name, expr)
            earlier.append(record)


def test_diagnose_doc_carries_the_generated_verdict_table() -> None:
    text = (ROOT / "docs" / "diagnose.md").read_text(encoding="utf-8")
    begin = text.index("<!-- verdicts:begin")
    block = text[begin : text.index("<!-- verdicts:end -->")]
    for name in CORE_VERDICTS:
        assert f"`{name}`" in block and VERDICT_INFO[name].action in block, name


def test_every_promtool_test_evaluates_the_rule_groups_in_file_order() -> None:
    # Without group_eval_order promtool runs the groups in a random order, so a verdict
    # could read the previous step's conditions and a test pass or fail by chance.
    for path in sorted(PROMTOOL_TESTS.glob("*.yml")):
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        groups = []
        for rel in doc["rule_files"]:
            rules = yaml.safe_load((path.parent / rel).read_text(encoding="utf-8"))
            groups += [g["name"] for g in rules["groups"]]
        assert doc.get("group_eval_order") == groups, path.name


def test_every_verdict_value_is_tested_by_promtool() -> None:
    text = "\n".join(p.read_text() for p in PROMTOOL_TESTS.glob("*.yml"))
    for value in VERDICTS:
        assert f'verdict="{value}"' in text, value


def test_alerts_have_summary_description_and_a_runbook_entry() -> None:
    runbook = (ROOT / "docs" / "runbook.md").read_text(encoding="utf-8")
    anchors = {
        re.sub(r"[^a-z0-9 -]", "", h.strip().lower()).replace(" ", "-")
        for h in re.findall(r"^#+ (.+)$", runbook, flags=re.M)
    }
    names = set()
    for rule in alerts():
        names.add(rule["alert"])
        ann = rule["annotations"]
        assert ann["summary"] and ann["description"], rule["alert"]
        path, _, anchor = ann["runbook_url"].partition("#")
        assert path.endswith("docs/runbook.md"), ann["runbook_url"]
        assert anchor in anchors, (rule["alert"], anchor)
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}
        assert rule["for"], rule["alert"]
    assert REQUIRED_ALERTS <= names


def test_every_alert_is_tested_before_and_after_its_for() -> None:
    text = (PROMTOOL_TESTS / "alerts-test.yml").read_text(encoding="utf-8")
    doc = yaml.safe_load(text)
    seen: dict[str, list[bool]] = {}
    for test in doc["tests"]:
        for case in test.get("alert_rule_test", []):
            seen.setdefault(case["alertname"], []).append(bool(case.get("exp_alerts")))
    for rule in alerts():
        cases = seen.get(rule["alert"], [])
        assert any(cases), f"{rule['alert']} never fires in a test"
        assert not all(cases), f"{rule['alert']} never tested quiet"


def test_per_engine_alerts_fire_for_both_engine_kinds() -> None:
    doc = yaml.safe_load((PROMTOOL_TESTS / "alerts-test.yml").read_text())
    kinds: dict[str, set[str]] = {}
    for test in doc["tests"]:
        for case in test.get("alert_rule_test", []):
            for exp in case.get("exp_alerts") or []:
                if "kind" in exp["exp_labels"]:
                    kinds.setdefault(case["alertname"], set()).add(exp["exp_labels"]["kind"])
    per_engine = [r["alert"] for r in alerts() if "$labels.kind" in r["annotations"]["description"]]
    assert per_engine
    for name in per_engine:
        assert kinds.get(name) == {"llamacpp", "sglang"}, name


def test_only_up_is_used_outside_the_schema() -> None:
    used = set()
    for group in rule_groups():
        for rule in group["rules"]:
            used |= promql_metric_names(rule["expr"])
    assert used & BUILTIN_SERIES == {"up"}


@pytest.fixture
def static_metrics() -> Iterator[tuple[str, list[str]]]:
    """A loopback HTTP server whose /metrics text the test can replace."""
    body = ["# TYPE llmb_engine_up gauge\n"]
    with served_page(lambda: "".join(body).encode()) as target:
        yield target, body


def test_real_prometheus_loads_the_rules_and_records_a_verdict(
    prometheus_server, static_metrics
) -> None:
    target, body = static_metrics
    body[:] = [
        "# TYPE llmb_engine_up gauge\n",
        'llmb_engine_up{engine="sim",kind="sglang"} 1\n',
        "# TYPE llmb_engine_requests_running gauge\n",
        'llmb_engine_requests_running{engine="sim",kind="sglang"} 0\n',
        "# TYPE llmb_engine_requests_waiting gauge\n",
        'llmb_engine_requests_waiting{engine="sim",kind="sglang"} 0\n',
    ]
    prom = prometheus_server({"llmb-exporter": [target]})
    groups = prom.get("/api/v1/rules")["groups"]
    assert {g["name"] for g in groups} >= {"llmb-engine", "llmb-verdict", "llmb-alerts"}
    assert all(r["health"] != "err" for g in groups for r in g["rules"])

    def verdict() -> list[str]:
        rows = prom.query('llmb:engine_bottleneck:verdict{engine="sim"} == 1')
        return [r["metric"]["verdict"] for r in rows]

    prom.wait_until(lambda: verdict() == ["idle"], 30, "the idle verdict")
    rows = prom.query('count(llmb:engine_bottleneck:verdict{engine="sim"})')
    assert float(rows[0]["value"][1]) == len(VERDICT_ORDER)
