"""SGLang's per-request token-length histograms pass through as `llmb_engine_request_*_tokens`.

Real captures: SGLang 0.5.23 busy (Gemma 3 27B on an H200, tests/fixtures/sglang-0.5.23) and
SGLang 0.5.11 on the CPU after a short load (tests/fixtures/sglang-0.5.11-cpu). Every bucket,
the sum and the count of `sglang:prompt_tokens_histogram` / `generation_tokens_histogram` must
come out unchanged (the buckets are upper bounds in tokens, already the base unit).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.collectors.sglang.metrics import FAMILIES, PREFIX, map_metrics
from exporter.promtext import parse_exposition
from exporter.schema import SCHEMA, MetricSet
from tests.paths import FIXTURES

CAPTURES = [
    FIXTURES / "sglang-0.5.23" / "metrics-busy.txt",
    FIXTURES / "sglang-0.5.11-cpu" / "metrics-after-load.txt",
]
PAIRS = (
    ("llmb_engine_request_prompt_tokens", "prompt_tokens_histogram"),
    ("llmb_engine_request_generation_tokens", "generation_tokens_histogram"),
)
LABELS = {"engine": "sg", "kind": "sglang"}


def engine_histogram(text: str, base: str) -> dict[str | float, float]:
    """`{le: count, "sum": s, "count": n}` of one SGLang histogram, read from the raw text."""
    out: dict[str | float, float] = {}
    for line in text.splitlines():
        if line.startswith(PREFIX + base + "_bucket{"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            out[float(le)] = float(line.rsplit(" ", 1)[1])
        elif line.startswith((PREFIX + base + "_sum{", PREFIX + base + "_count{")):
            key = "sum" if "_sum{" in line else "count"
            out[key] = float(line.rsplit(" ", 1)[1])
    return out


def exported(text: str) -> dict[str, dict[str | float, float]]:
    """The exporter's histograms of the capture, as {name: {le: count, "sum", "count"}}."""
    ms = MetricSet()
    map_metrics(ms, parse_exposition(text, PREFIX, FAMILIES), (0, 5, 23), dict(LABELS))
    out: dict[str, dict[str | float, float]] = {}
    for fam in ms.metrics():
        if fam.type != "histogram":
            continue
        for s in fam.samples:
            assert {k: v for k, v in s.labels.items() if k != "le"} == LABELS
            row = out.setdefault(fam.name, {})
            if s.name.endswith("_bucket"):
                row[float(s.labels["le"])] = s.value
            else:
                row[s.name.rsplit("_", 1)[1]] = s.value
    assert not ms.problems
    return out


@pytest.mark.parametrize("capture", CAPTURES, ids=lambda p: p.parent.name)
def test_token_length_histograms_pass_through_unchanged(capture: Path) -> None:
    text = capture.read_text(encoding="utf-8")
    series = exported(text)
    for name, base in PAIRS:
        assert SCHEMA[name].type == "histogram"
        engine = engine_histogram(text, base)
        assert engine["count"] > 0, (capture, base)
        assert series[name] == engine, name


def test_the_busy_capture_reads_as_its_lengths() -> None:
    """The numbers a served mix reads: 3483 requests, 1372 prompt tokens on average."""
    series = exported(CAPTURES[0].read_text(encoding="utf-8"))
    prompt = series["llmb_engine_request_prompt_tokens"]
    assert prompt["count"] == 3483 and round(prompt["sum"] / prompt["count"]) == 1372
    assert prompt[100.0] == 5 and prompt[8000.0] == prompt[float("inf")] == 3483
    output = series["llmb_engine_request_generation_tokens"]
    assert output["count"] == 3483 and round(output["sum"] / output["count"]) == 621


def test_a_capture_without_the_histograms_exports_none() -> None:
    """An SGLang without them (lines removed): no series, nothing reported as a problem."""
    text = CAPTURES[1].read_text(encoding="utf-8")
    kept = "\n".join(line for line in text.splitlines() if "tokens_histogram" not in line)
    series = exported(kept + "\n")
    assert not {name for name, _ in PAIRS} & set(series)
    assert "llmb_engine_time_to_first_token_seconds" in series
