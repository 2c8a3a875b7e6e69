"""Prometheus' HTTP API answers: the one reader of an instant query's JSON.

`/api/v1/query` answers `{"status": "success", "data": {"resultType": "vector", "result":
[{"metric": {...}, "value": [t, "v"]}, ...]}}`, or `{"status": "error", "error": ...}`. The
sweep's step probe, compare's served load and the demo's verdicts all read it here.
"""

from __future__ import annotations

from typing import Any


class QueryError(ValueError):
    """Prometheus refused the query or its answer is not an instant vector (the text says which)."""


def vector_values(body: Any) -> list[tuple[dict[str, str], float]]:
    """The (labels, value) pairs of an instant query's answer; `QueryError` when it is none."""
    if not isinstance(body, dict):
        raise QueryError("the answer is not a JSON object")
    if body.get("status") != "success":
        raise QueryError(str(body.get("error") or f"status {body.get('status')!r}"))
    data = body.get("data")
    if not isinstance(data, dict) or data.get("resultType") != "vector":
        raise QueryError("the answer is not an instant vector")
    out = []
    for item in data.get("result") or []:
        try:
            labels, (_, value) = item["metric"], item["value"]
            out.append((dict(labels), float(value)))
        except (KeyError, TypeError, ValueError):
            raise QueryError(f"not a sample: {item!r:.120}") from None
    return out
