"""The text exposition format (0.0.4), written faster than client_python for our families.

`generate_latest` validates and escapes every label name of every sample (UTF-8 name
support), which made it a third of the exporter's CPU per scrape. Our families use a few
dozen fixed names, so `render_text` checks each name once (cached) and writes the same
bytes as `prometheus_client.exposition.generate_latest`, which
tests/unit/test_exporter_exposition.py checks on real collections and on generated families.

Anything outside that subset (a name that is not a legacy Prometheus name, timestamps,
exemplars, native histograms, OpenMetrics-only `_created`/`_gsum`/`_gcount` samples)
makes `render_text` return None, and the caller renders with client_python instead.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from prometheus_client.metrics_core import Metric
from prometheus_client.utils import floatToGoString

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_TYPES = {"counter": "counter", "gauge": "gauge", "histogram": "histogram", "summary": "summary"}
_TYPES.update(info="gauge", stateset="gauge", gaugehistogram="histogram", unknown="untyped")
_OM_ONLY = ("_created", "_gsum", "_gcount")

# Names already checked; the schema has a few dozen, so these stay small.
_good_metric_names: set[str] = set()
_good_label_names: set[str] = set()


def _metric_name_ok(name: str) -> bool:
    if name in _good_metric_names:
        return True
    if _METRIC_NAME.fullmatch(name) is None:
        return False
    _good_metric_names.add(name)
    return True


def _label_name_ok(name: str) -> bool:
    if name in _good_label_names:
        return True
    if _LABEL_NAME.fullmatch(name) is None or name.startswith("__"):
        return False
    _good_label_names.add(name)
    return True


def _escape_value(value: str) -> str:
    if "\\" in value or "\n" in value or '"' in value:
        return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return value


def render_text(families: Iterable[Metric]) -> bytes | None:
    """The 0.0.4 text exposition of `families`, or None when client_python must render it."""
    out: list[str] = []
    append = out.append
    for metric in families:
        mtype = _TYPES.get(metric.type)
        if mtype is None:
            return None
        mname = metric.name
        if metric.type == "counter":
            mname += "_total"
        elif metric.type == "info":
            mname += "_info"
        if not _metric_name_ok(mname):
            return None
        doc = metric.documentation.replace("\\", r"\\").replace("\n", r"\n")
        append(f"# HELP {mname} {doc}\n# TYPE {mname} {mtype}\n")
        om_only = tuple(metric.name + suffix for suffix in _OM_ONLY)
        for sample in metric.samples:
            name = sample.name
            if (
                sample.timestamp is not None
                or sample.exemplar is not None
                or sample.native_histogram is not None
                or name in om_only
                or not _metric_name_ok(name)
            ):
                return None
            labels = sample.labels
            if labels:
                parts = []
                for key in sorted(labels):
                    if not _label_name_ok(key):
                        return None
                    parts.append(f'{key}="{_escape_value(labels[key])}"')
                append(f"{name}{{{','.join(parts)}}} {floatToGoString(sample.value)}\n")
            else:
                append(f"{name} {floatToGoString(sample.value)}\n")
    return "".join(out).encode("utf-8")
