"""Prometheus' HTTP API answers: the one reader of an instant query's JSON.

`/api/v1/query` answers `{"status": "success", "data": {"resultType": "vector", "result":
[{"metric": {...}, "value": [t, "v"]}, ...]}}`, or `{"status": "error", "error": ...}`. The
sweep's step probe, compare's served load, the served mix and the demo's verdicts all read it
here. `Prometheus.query` asks one instant query over HTTP and says, in one line, why it got no
vector (unreachable, not Prometheus, the query refused); `label` and `prom_duration` are the
PromQL pieces the callers build their queries from.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import httpx

# Seconds for each query (connect and read): Prometheus answers an instant query in ms.
QUERY_TIMEOUT_S = 10.0

_DURATION = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")
_UNIT_SECONDS = {
    "ms": 0.001,
    "s": 1,
    "m": 60,
    "h": 3600,
    "d": 86400,
    "w": 7 * 86400,
    "y": 365 * 86400,
}

Vector = list[tuple[dict[str, str], float]]


class QueryError(ValueError):
    """Prometheus refused the query or its answer is not an instant vector (the text says which)."""


class PrometheusUnreachable(QueryError):
    """No HTTP answer at all from the URL."""


class NotPrometheus(QueryError):
    """An HTTP answer that is not Prometheus' JSON (another server at that address)."""


def vector_values(body: Any) -> Vector:
    """The (labels, value) pairs of an instant query's answer; `QueryError` when it is none."""
    if not isinstance(body, dict):
        raise QueryError("the answer is not a JSON object")
    if body.get("status") != "success":
        raise QueryError(str(body.get("error") or f"status {body.get('status')!r}"))
    data = body.get("data")
    if not isinstance(data, dict) or data.get("resultType") != "vector":
        raise QueryError("the answer is not an instant vector")
    result = data.get("result") or []
    if not isinstance(result, list):
        raise QueryError("the answer's result is not a list of samples")
    out = []
    for item in result:
        try:
            labels, (_, value) = item["metric"], item["value"]
            # Label values are strings in Prometheus' JSON; anything else is not its answer
            # (and a caller's `float(labels["le"])` would fail on it with a traceback).
            if not isinstance(labels, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
            ):
                raise TypeError("labels")
            if not isinstance(value, (str, int, float)):
                raise TypeError("value")
            out.append((dict(labels), float(value)))
        except (KeyError, TypeError, ValueError):
            raise QueryError(f"not a sample: {item!r:.120}") from None
    return out


def label(value: str) -> str:
    """A PromQL string literal (a label value in a selector)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def prom_duration(text: str) -> str:
    """A Prometheus duration (`1h`, `30m`, `1h30m`) above zero, for a window flag."""
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text or all(int(n) == 0 for n, _ in parts):
        raise argparse.ArgumentTypeError(
            f"expected a Prometheus duration such as 1h, 30m or 1h30m, got {text!r}"
        )
    return text


def instant(text: str) -> float:
    """A time as Prometheus' API takes it, for a flag: Unix seconds (`1796612400`) or RFC 3339
    (`2026-12-07T03:00:00Z`; without a zone, UTC) → Unix seconds."""
    try:
        value = float(text)
    except ValueError:
        try:
            when = datetime.fromisoformat(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected a Unix time in seconds or an RFC 3339 time such as "
                f"2026-12-07T03:00:00Z, got {text!r}"
            ) from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=timezone.utc)
        value = when.timestamp()
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a time after 1970, got {text!r}")
    return value


def duration_seconds(text: str) -> float:
    """Seconds of a duration `prom_duration` accepted (`1h30m` → 5400.0)."""
    return float(sum(int(n) * _UNIT_SECONDS[u] for n, u in _DURATION.findall(prom_duration(text))))


@dataclass(frozen=True)
class Prometheus:
    """A Prometheus base URL (`http://HOST:9090`) to ask instant queries of."""

    url: str
    timeout: float = QUERY_TIMEOUT_S

    def client(self) -> httpx.Client:
        """An HTTP client with the query timeout (one per batch of queries)."""
        return httpx.Client(timeout=self.timeout)

    @contextlib.contextmanager
    def asking(
        self, fail: Callable[[str], Exception], who: str, instead: str = ""
    ) -> Iterator[httpx.Client]:
        """A `client` whose failed queries raise `fail(message)`: the message starts with
        `who` (the command or flag), says why, and offers `instead` (another flag) if given."""
        try:
            with self.client() as client:
                yield client
        except PrometheusUnreachable as exc:
            other = f", or {instead}" if instead else ""
            raise fail(
                f"{who}: {exc}; give the Prometheus that scrapes the exporter{other}"
            ) from None
        except QueryError as exc:
            other = f"; or pass {instead}" if instead else ""
            raise fail(f"{who}: {exc}{other}") from None

    def query(self, client: httpx.Client, expr: str, at: float | None = None) -> Vector:
        """The instant vector of `expr` (now, or at the Unix time `at`); a `QueryError`
        subclass whose text says why when there is none."""
        params: dict[str, str] = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        try:
            resp = client.get(f"{self.url}/api/v1/query", params=params)
        except httpx.HTTPError as exc:
            raise PrometheusUnreachable(
                f"cannot reach Prometheus at {self.url} ({type(exc).__name__}: {exc})"
            ) from None
        try:
            body = resp.json()
        except ValueError:
            raise NotPrometheus(
                f"{self.url}/api/v1/query answered HTTP {resp.status_code} without "
                "Prometheus' JSON: give Prometheus' base URL (http://HOST:9090)"
            ) from None
        try:
            return vector_values(body)
        except QueryError as exc:
            raise QueryError(
                f"Prometheus at {self.url} did not answer {expr!r} (HTTP {resp.status_code}: {exc})"
            ) from None

    def engines_with(self, client: httpx.Client, metric: str, window: str) -> list[str]:
        """The `engine` labels that have samples of `metric` in the last `window`, sorted."""
        expr = f"count by (engine) (count_over_time({metric}[{window}]))"
        return sorted(lab.get("engine", "") for lab, _ in self.query(client, expr))
