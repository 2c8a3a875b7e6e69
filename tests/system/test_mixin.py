"""The monitoring mixin (`python -m mixin`): one config, one generator, one `--check`.

Another job selector changes every expression that selects the exporter's job and nothing
else, and the rules it generates pass promtool and alert on that job; `--check` names stale
files; a bad config is refused before anything is written. The config itself and the
default outputs are tested in process: tests/unit/test_mixin_config.py.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from mixin import config
from mixin.cli import outputs
from tests.plugins.cli import run_module
from tests.plugins.prom import RULE_FILES

pytestmark = pytest.mark.prometheus

DEFAULT_JOB = 'job="llmb-exporter"'
OTHER_JOB = 'job="my-llmb"'


def mixin(*args: str) -> subprocess.CompletedProcess[str]:
    """Run `python -m mixin ARGS` in the repository root."""
    return run_module("mixin", *args, timeout=120)


def test_generated_outputs_are_fresh() -> None:
    """Rules, promtool tests, dashboards and manifests as committed: one `--check` for all."""
    result = mixin("--check")
    assert result.returncode == 0, result.stderr


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    tool = shutil.which("promtool")
    assert tool, "promtool missing: run scripts/install.sh (Debian package prometheus)"
    return subprocess.run([tool, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def write_config(path: Path, doc: dict[str, object]) -> Path:
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def other_job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every output generated with exporter_selector job="my-llmb", into a fresh folder."""
    root = tmp_path_factory.mktemp("other-job")
    cfg = write_config(root / "my-llmb.yaml", {"exporter_selector": OTHER_JOB})
    result = mixin("--config", str(cfg), "--out", str(root / "out"))
    assert result.returncode == 0, result.stderr
    return root / "out"


def test_another_job_selector_changes_every_exporter_expression_consistently(
    other_job: Path,
) -> None:
    default = outputs(config.load())
    written = sorted(str(p.relative_to(other_job)) for p in other_job.rglob("*") if p.is_file())
    assert written == sorted(default)
    changed = []
    for rel, text in default.items():
        other = (other_job / rel).read_text(encoding="utf-8")
        # Rules, dashboards and manifests: no trace of the default job is left ...
        assert "llmb-exporter" not in other, rel
        # ... and the only difference is the job selector, wherever it was.
        assert other == text.replace(DEFAULT_JOB, OTHER_JOB), rel
        if other != text:
            changed.append(rel)
    # The alert reading the exporter's `up`, in the rule file and in the PrometheusRule.
    assert changed == ["prometheus/rules/alerts.yml", "deploy/kubernetes/prometheusrule.yaml"]
    (rule,) = [
        r
        for g in yaml.safe_load((other_job / changed[0]).read_text())["groups"]
        for r in g["rules"]
        if r.get("alert") == "LLMExporterDown"
    ]
    assert rule["expr"] == 'up{job="my-llmb"} == 0'


def test_rules_of_another_job_pass_promtool_and_alert_on_that_job(other_job: Path) -> None:
    rules = other_job / "prometheus" / "rules"
    result = promtool("check", "rules", *(str(rules / f) for f in RULE_FILES), cwd=rules)
    assert result.returncode == 0, result.stdout + result.stderr
    (rule,) = [
        r
        for g in yaml.safe_load((rules / "alerts.yml").read_text())["groups"]
        for r in g["rules"]
        if r.get("alert") == "LLMExporterDown"
    ]
    annotations = {
        k: v.replace("{{ $labels.instance }}", "a:9490") for k, v in rule["annotations"].items()
    }
    # Both jobs' targets are down: only the configured job's raises LLMExporterDown.
    test = {
        "rule_files": [str(rules / "alerts.yml")],
        "evaluation_interval": "15s",
        "tests": [
            {
                "interval": "15s",
                "input_series": [
                    {"series": 'up{job="my-llmb",instance="a:9490"}', "values": "0x10"},
                    {"series": 'up{job="llmb-exporter",instance="b:9490"}', "values": "0x10"},
                ],
                "alert_rule_test": [
                    {
                        "eval_time": "2m",
                        "alertname": "LLMExporterDown",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    "severity": "critical",
                                    "job": "my-llmb",
                                    "instance": "a:9490",
                                },
                                "exp_annotations": annotations,
                            }
                        ],
                    }
                ],
            }
        ],
    }
    path = write_config(other_job.parent / "exporter-down-test.yml", test)
    result = promtool("test", "rules", str(path), cwd=other_job.parent)
    assert result.returncode == 0, result.stdout + result.stderr


def test_check_names_every_stale_or_missing_file(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert mixin("--out", str(out)).returncode == 0
    assert mixin("--check", "--out", str(out)).returncode == 0
    (out / "grafana/dashboards/fleet.json").write_text("{}\n", encoding="utf-8")
    (out / "prometheus/thresholds.md").unlink()
    result = mixin("--check", "--out", str(out))
    assert result.returncode == 1
    stale = result.stderr.split("stale (run python -m mixin):")[1].split()
    assert stale == ["prometheus/thresholds.md", "grafana/dashboards/fleet.json"]
    assert not (out / "prometheus/thresholds.md").exists()  # --check writes nothing
    # A dashboard the mixin does not make is named too.
    (out / "grafana/dashboards/mine.json").write_text("{}\n", encoding="utf-8")
    assert mixin("--out", str(out)).returncode == 1
    result = mixin("--check", "--out", str(out))
    assert result.returncode == 1 and "grafana/dashboards/mine.json" in result.stderr


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"exporter_selctor": OTHER_JOB}, "exporter_selctor: Extra inputs are not permitted"),
        ({"exporter_selector": "job=my-llmb"}, "is not a list of PromQL label matchers"),
    ],
)
def test_a_bad_config_is_refused_with_the_key_and_nothing_is_written(
    tmp_path: Path, doc: dict[str, object], message: str
) -> None:
    cfg = write_config(tmp_path / "bad.yaml", doc)
    result = mixin("--config", str(cfg), "--out", str(tmp_path / "out"))
    assert result.returncode == 2
    assert message in result.stderr and str(cfg) in result.stderr
    assert not (tmp_path / "out").exists()
