"""Prometheus' query answers (`loadgen.prom_api.vector_values`) against mangled JSON.

Property-based (hypothesis), seeded from the real answers of Prometheus 2.42 in
tests/fixtures/served-mix-{sglang,llamacpp}/queries.json (the served mix's queries). Whatever
the answer, the reader returns (labels, value) pairs whose labels are strings, or raises
`QueryError` (one message, exit 2 in the commands): never another exception, which the
commands would print as a traceback.
"""

from __future__ import annotations

import copy
import json
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loadgen.prom_api import QueryError, vector_values
from tests.paths import FIXTURES
from tools.fuzz_mutators import json_paths, set_at

REAL = [
    answer["body"]
    for folder in ("served-mix-sglang", "served-mix-llamacpp")
    for answer in json.loads((FIXTURES / folder / "queries.json").read_text(encoding="utf-8"))
]
FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=6,
)


def _check(body: Any) -> None:
    try:
        pairs = vector_values(body)
    except QueryError:
        return
    for labels, value in pairs:
        assert isinstance(labels, dict)
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items())
        assert isinstance(value, float)


def test_the_real_answers_read_whole() -> None:
    # Seeds first: every real answer is a vector of string labels and numbers.
    read = [vector_values(body) for body in REAL]
    assert sum(len(pairs) for pairs in read) > 10
    for pairs in read:
        for labels, value in pairs:
            assert all(isinstance(v, str) for v in labels.values()) and not math.isnan(value)


@FUZZ
@given(st.data())
def test_a_mangled_answer_is_read_or_refused_in_one_message(data: st.DataObject) -> None:
    body = data.draw(st.sampled_from(REAL))
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(json_paths(body)))
        drop = bool(path) and data.draw(st.booleans())
        body = set_at(copy.deepcopy(body), path, data.draw(JSON), delete=drop)
    _check(body)


@pytest.mark.parametrize(
    "result",
    [
        [{"metric": {"le": 100}, "value": [1, "3"]}],  # a number where a label is a string
        [{"metric": {"engine": ["a"]}, "value": [1, "3"]}],
        [{"metric": [["engine", "a"]], "value": [1, "3"]}],  # pairs, not an object
        [{"metric": {}, "value": [1, [2]]}],
        [{"metric": {}, "value": [1]}],
    ],
)
def test_labels_and_values_of_the_wrong_type_are_refused(result: list[Any]) -> None:
    body = {"status": "success", "data": {"resultType": "vector", "result": result}}
    with pytest.raises(QueryError, match="not a sample"):
        vector_values(body)
