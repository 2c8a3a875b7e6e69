"""The mixin's typed configuration: `mixin/config.yaml`, optionally overlaid by a user file.

Every setting has its value in `config.yaml` (one place); a `--config FILE` holds only the
keys it changes, merged over it. Unknown keys and malformed selectors, labels or windows
are errors. The verdict's thresholds and windows are not settings: they are the decision
core's `THRESHOLDS`, so Prometheus and `llmb-loadgen diagnose` always decide alike.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from core.thresholds import THRESHOLDS, Threshold

DEFAULT_CONFIG = Path(__file__).resolve().parent / "config.yaml"

_LABEL = r"[a-zA-Z_][a-zA-Z0-9_]*"
_VALUE = r'"(?:[^"\\]|\\.)*"'
_MATCHER = rf"\s*{_LABEL}\s*(?:=~|!~|!=|=)\s*{_VALUE}\s*"
_MATCHERS = re.compile(rf"{_MATCHER}(?:,{_MATCHER})*")
_DURATION = re.compile(r"(?:\d+(?:ms|s|m|h|d|w|y))+")
# Labels the generated alerts set themselves; an extra label must not replace them.
_ALERT_OWN_LABELS = {"severity", "alertname"}


class ConfigError(ValueError):
    """A mixin config file that cannot be used (the message says which key and why)."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _check_labels(labels: dict[str, str]) -> dict[str, str]:
    bad = [k for k in labels if not re.fullmatch(_LABEL, k)]
    if bad:
        raise ValueError(f"not a Prometheus label name: {', '.join(bad)}")
    return labels


class KubernetesConfig(_Model):
    """The generated Kubernetes manifests (deploy/kubernetes/)."""

    # Labels of the PrometheusRule besides app.kubernetes.io/name (the operator's selector).
    rule_labels: dict[str, str]
    # Grafana folder annotation of the dashboard ConfigMaps.
    dashboard_folder: str = Field(min_length=1)

    @field_validator("rule_labels")
    @classmethod
    def _labels(cls, value: dict[str, str]) -> dict[str, str]:
        return _check_labels(value)


class MixinConfig(_Model):
    """What an installation sets; the outputs are generated from exactly this."""

    # Label matchers of the exporter's scrape job, e.g. `job="llmb-exporter"`.
    exporter_selector: str
    # Labels added to every alert.
    alert_labels: dict[str, str]
    # Runbook the alerts and panels link to (`<runbook_url>#<alert name in lower case>`).
    runbook_url: str = Field(min_length=1)
    # Window of the dashboards' client-side rates and histogram quantiles.
    dashboard_window: str
    kubernetes: KubernetesConfig

    @field_validator("exporter_selector")
    @classmethod
    def _selector(cls, value: str) -> str:
        if not _MATCHERS.fullmatch(value):
            raise ValueError(
                f"{value!r} is not a list of PromQL label matchers "
                '(name="value", name=~"regex", ... separated by commas)'
            )
        return value.strip()

    @field_validator("alert_labels")
    @classmethod
    def _alert_labels(cls, value: dict[str, str]) -> dict[str, str]:
        own = sorted(_ALERT_OWN_LABELS & set(value))
        if own:
            raise ValueError(f"set by the alerts themselves: {', '.join(own)}")
        return _check_labels(value)

    @field_validator("dashboard_window")
    @classmethod
    def _window(cls, value: str) -> str:
        if not _DURATION.fullmatch(value):
            raise ValueError(f"{value!r} is not a Prometheus duration (e.g. 1m, 90s)")
        return value

    @property
    def thresholds(self) -> Mapping[str, Threshold]:
        """The verdict's thresholds and windows: the core's table, not a copy."""
        return THRESHOLDS


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """`over` on top of `base`; nested mappings merge key by key."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict) and value:
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _read(path: Path) -> dict[str, Any]:
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not YAML: {exc}") from exc
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: expected a mapping of settings, got {type(doc).__name__}")
    return doc


def load(path: Path | None = None) -> MixinConfig:
    """The default config, with the settings of `path` (if given) merged over it."""
    doc = _read(DEFAULT_CONFIG)
    if path is not None:
        doc = _merge(doc, _read(path))
    try:
        return MixinConfig.model_validate(doc)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '(top)'}: {err['msg']}"
            for err in exc.errors()
        )
        raise ConfigError(f"{path or DEFAULT_CONFIG}: {problems}") from exc
