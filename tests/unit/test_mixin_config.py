"""The mixin's config (mixin/config.yaml + mixin/config.py) and its outputs, in process.

tests/system/test_mixin.py runs `python -m mixin` itself, with another job selector, and
promtool on what it writes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from core.thresholds import THRESHOLDS
from mixin import config
from mixin.cli import outputs
from tests.paths import ROOT


def write(path: Path, doc: object) -> Path:
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


def test_default_config_generates_the_committed_files() -> None:
    files = outputs(config.load())
    assert len(files) == 12  # 3 rule files, 2 docs, 5 dashboards, 2 manifests
    for rel, text in files.items():
        assert (ROOT / rel).read_text(encoding="utf-8") == text, rel


def test_the_thresholds_are_the_cores_not_a_copy() -> None:
    assert config.load().thresholds is THRESHOLDS
    assert "thresholds" not in yaml.safe_load(config.DEFAULT_CONFIG.read_text(encoding="utf-8"))


def test_a_user_file_changes_only_its_keys(tmp_path: Path) -> None:
    cfg = config.load(write(tmp_path / "c.yaml", {"kubernetes": {"dashboard_folder": "GPU"}}))
    default = config.load()
    assert cfg.kubernetes.dashboard_folder == "GPU"
    assert cfg.kubernetes.rule_labels == default.kubernetes.rule_labels
    assert cfg.exporter_selector == default.exporter_selector
    # An empty mapping replaces (no PrometheusRule label besides the app's).
    cfg = config.load(write(tmp_path / "c.yaml", {"kubernetes": {"rule_labels": {}}}))
    assert cfg.kubernetes.rule_labels == {}
    assert config.load(write(tmp_path / "empty.yaml", None)) == default


def test_several_matchers_select_the_exporter_job() -> None:
    doc = {**config.load().model_dump(), "exporter_selector": 'job="a", namespace=~"gpu-.*"'}
    cfg = config.MixinConfig.model_validate(doc)
    alerts = outputs(cfg)["prometheus/rules/alerts.yml"]
    assert 'up{job="a", namespace=~"gpu-.*"} == 0' in alerts


def test_alert_labels_reach_every_alert_and_nothing_else() -> None:
    doc = {**config.load().model_dump(), "alert_labels": {"team": "ml-serving"}}
    files = outputs(config.MixinConfig.model_validate(doc))
    default = outputs(config.load())
    groups = yaml.safe_load(files["prometheus/rules/alerts.yml"])["groups"]
    rules = [r for g in groups for r in g["rules"]]
    assert rules and all(r["labels"]["team"] == "ml-serving" for r in rules)
    for rel in ("prometheus/rules/recording.yml", "prometheus/rules/verdict.yml"):
        assert files[rel] == default[rel], rel


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"exporter_selctor": 'job="x"'}, "exporter_selctor: Extra inputs are not permitted"),
        ({"kubernetes": {"folder": "x"}}, "kubernetes.folder: Extra inputs are not permitted"),
        ({"exporter_selector": "job=my-llmb"}, "is not a list of PromQL label matchers"),
        ({"exporter_selector": ""}, "is not a list of PromQL label matchers"),
        ({"alert_labels": {"severity": "page"}}, "set by the alerts themselves: severity"),
        ({"alert_labels": {"bad-name": "x"}}, "not a Prometheus label name: bad-name"),
        ({"kubernetes": {"rule_labels": {"9x": "y"}}}, "not a Prometheus label name: 9x"),
        ({"dashboard_window": "1 minute"}, "is not a Prometheus duration"),
        ({"runbook_url": ""}, "runbook_url: String should have at least 1 character"),
        ({"thresholds": {"kv_usage_high": "0.5"}}, "thresholds: Extra inputs are not permitted"),
    ],
)
def test_a_bad_setting_is_refused_with_its_key(
    tmp_path: Path, doc: dict[str, object], message: str
) -> None:
    path = write(tmp_path / "bad.yaml", doc)
    with pytest.raises(config.ConfigError) as err:
        config.load(path)
    assert message in str(err.value) and str(path) in str(err.value)


def test_a_file_that_is_not_a_mapping_or_missing_is_refused(tmp_path: Path) -> None:
    with pytest.raises(config.ConfigError, match="expected a mapping"):
        config.load(write(tmp_path / "list.yaml", ["job"]))
    (tmp_path / "broken.yaml").write_text("a: [\n", encoding="utf-8")
    with pytest.raises(config.ConfigError, match="not YAML"):
        config.load(tmp_path / "broken.yaml")
    with pytest.raises(config.ConfigError, match="cannot read"):
        config.load(tmp_path / "missing.yaml")
