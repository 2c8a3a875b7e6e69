"""The exposition line reader (exporter.promtext) against prometheus_client's parser.

Property-based (hypothesis), seeded from the real llama.cpp and SGLang answers in
tests/fixtures/. The reader must agree with client_python wherever client_python reads the
text and the reader found nothing wrong, must never raise anything but ValueError, and its
family prefilter (one regular expression) must pick exactly the lines the full read gives.
"""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from exporter.collectors.sglang.metrics import FAMILIES
from exporter.promtext import _base_name, parse_exposition, parse_sample_line
from tests.paths import FIXTURES
from tools.fuzz_mutators import mutate_bytes, mutate_exposition

FIXTURES = FIXTURES
REAL = {
    "llamacpp:": (FIXTURES / "llamacpp-cpu-gemma3-270m" / "llamacpp_metrics_busy.txt").read_text(),
    "sglang:": (FIXTURES / "sglang-0.5.23" / "metrics-busy.txt").read_text(),
    "sglang:om": (FIXTURES / "sglang-0.5.23" / "metrics-busy.openmetrics.txt").read_text(),
}
FUZZ = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
Samples = list[tuple[str, tuple[tuple[str, str], ...], float | str]]


def _norm(value: float) -> float | str:
    # client_python returns an int for an integer literal; Prometheus (Go) reads a 400-digit
    # one as +Inf, as float() does.
    try:
        value = float(value)
    except OverflowError:
        value = math.inf if value > 0 else -math.inf
    return "nan" if math.isnan(value) else value


def _reference(text: str, prefix: str) -> Samples:
    """client_python's samples; comments dropped so TYPE lines cannot rename counters."""
    body = "\n".join(ln for ln in text.split("\n") if not ln.lstrip().startswith("#")) + "\n"
    escaped = prefix.rstrip(":") + "_"
    out: Samples = []
    for fam in text_string_to_metric_families(body):
        for s in fam.samples:
            name = prefix + s.name[len(escaped) :] if s.name.startswith(escaped) else s.name
            out.append((name, tuple(sorted(s.labels.items())), _norm(s.value)))
    return sorted(out, key=repr)


def _ours(text: str, prefix: str, families: tuple[str, ...] | None = None) -> Samples:
    expo = parse_exposition(text, prefix, families)
    return sorted(
        (
            (name, tuple(sorted(s.labels.items())), _norm(s.value))
            for name, samples in expo.samples.items()
            for s in samples
        ),
        key=repr,
    )


@pytest.mark.parametrize("key", sorted(REAL))
def test_real_answers_read_like_prometheus_client(key: str) -> None:
    prefix = key.removesuffix("om")
    expo = parse_exposition(REAL[key], prefix)
    assert expo.problems == []
    assert _ours(REAL[key], prefix) == _reference(REAL[key], prefix)


@pytest.mark.parametrize("key", sorted(REAL))
@FUZZ
@given(rng=st.randoms(use_true_random=False), rounds=st.integers(1, 4))
def test_mutated_answers_agree_or_are_flagged(key: str, rng: random.Random, rounds: int) -> None:
    prefix = key.removesuffix("om")
    text = REAL[key]
    for _ in range(rounds):
        if rng.random() < 0.2:
            text = mutate_bytes(text.encode(), rng).decode("utf-8", "replace")
        else:
            text = mutate_exposition(text, rng)
    try:
        expo = parse_exposition(text, prefix)
    except ValueError:
        return  # rejected as a whole: the collector counts one parse error
    try:
        reference = _reference(text, prefix)
    except (ValueError, IndexError, KeyError, TypeError):
        return  # client_python cannot read it; the reader only has to stay within ValueError
    if not expo.problems:
        assert _ours(text, prefix) == reference


@FUZZ
@given(rng=st.randoms(use_true_random=False), rounds=st.integers(1, 4))
def test_family_prefilter_picks_exactly_the_mapped_lines(rng: random.Random, rounds: int) -> None:
    text = REAL["sglang:"]
    for _ in range(rounds):
        text = mutate_exposition(text, rng)
    try:
        full = parse_exposition(text, "sglang:")
    except ValueError:
        with pytest.raises(ValueError):
            parse_exposition(text, "sglang:", FAMILIES)
        return
    mapped = parse_exposition(text, "sglang:", FAMILIES)
    keep = {"sglang:" + f for f in FAMILIES}
    expected = {
        name: [(s.labels, _norm(s.value)) for s in samples]
        for name, samples in full.samples.items()
        if name in keep or _base_name(name) in keep
    }
    got = {
        name: [(s.labels, _norm(s.value)) for s in samples]
        for name, samples in mapped.samples.items()
    }
    assert got == expected


# Names that begin with "__" are reserved for Prometheus' own use, and the reference parser
# rejects them (`__=""` failed there), so no exporter line carries one.
label_names = st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,10}", fullmatch=True).filter(
    lambda n: not n.startswith("__")
)
# NUL anywhere makes a body "binary" and rejected as a whole (tested elsewhere).
label_values = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\x00"),
    max_size=20,
)
values = st.floats(allow_nan=True, allow_infinity=True) | st.integers(-(10**15), 10**15)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _spell(value: float | int) -> str:
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


@FUZZ
@given(
    name=st.from_regex(r"[a-zA-Z_:][a-zA-Z0-9_:]{0,20}", fullmatch=True),
    labels=st.dictionaries(label_names, label_values, max_size=4),
    value=values,
    timestamp=st.none() | st.integers(0, 2**40),
)
def test_any_valid_sample_line_reads_back(
    name: str, labels: dict[str, str], value: float, timestamp: int | None
) -> None:
    block = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
    line = name + (f"{{{block}}}" if labels else "") + " " + _spell(value)
    if timestamp is not None:
        line += f" {timestamp}"
    parsed = parse_sample_line(line)
    assert parsed is not None, line
    assert parsed[0] == name and parsed[1] == labels
    assert _norm(parsed[2]) == _norm(float(value))
    assert _ours(line + "\n", "x:") == _reference(line + "\n", "x:")


@FUZZ
@given(text=st.text(max_size=300))
def test_any_text_is_read_or_rejected_with_value_error(text: str) -> None:
    try:
        expo = parse_exposition(text, "sglang:", FAMILIES)
    except ValueError:
        return
    for samples in expo.samples.values():
        assert all(isinstance(s.value, float) for s in samples)
