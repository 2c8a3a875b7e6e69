"""The weight-buffer ratio from an engine's own buffer report (llama.cpp's log, `-lv 4`).

Host buffers alone (a CPU build, `-ngl 0`) are the engine saying that none of the weights is
on the GPU: the ratio is 0, not absent, so the log decides residency even where NVML sees no
process. The same arithmetic is the recording rule `engine:llmb_weights_gpu_buffers:ratio`
(promtool's side: prometheus/rules/tests/residency-test.yml).
"""

from __future__ import annotations

import pytest

from core.conditions import evaluate
from core.promql import EngineKey, series_from_scrapes
from core.rules import rule_values_at
from core.signals import Signals

KEY = EngineKey("h", "llama", "llamacpp")
LABELS = {"host": "h", "engine": "llama", "kind": "llamacpp"}
WEIGHTS = 241_410_000.0  # the Gemma 3 270M Q4_K_M's weights


def _key(name: str, **extra: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    return name, tuple(sorted({**LABELS, **extra}.items()))


def _signals(buffers: dict[str, float]) -> Signals:
    samples = {
        _key("llmb_engine_up"): 1.0,
        _key("llmb_model_weights_bytes"): WEIGHTS,
        # The host has a GPU (residency is only asked there).
        ("llmb_gpu_memory_total_bytes", (("gpu", "0"), ("host", "h"))): 141e9,
        **{_key("llmb_engine_model_buffer_bytes", device=d): v for d, v in buffers.items()},
    }
    values = rule_values_at(series_from_scrapes([(0.0, samples), (15.0, samples)]), 15.0)
    return values[KEY].signals


def _ratio(buffers: dict[str, float]) -> float | None:
    return _signals(buffers).weights_buffers_ratio


def test_only_host_buffers_mean_none_on_the_gpu() -> None:
    assert _ratio({"CPU_Mapped": WEIGHTS}) == 0.0
    verdict = evaluate(_signals({"CPU_Mapped": WEIGHTS}))
    assert verdict.name == "weights_not_resident" and verdict.evidence == ("buffers",)


def test_gpu_buffers_count_and_host_ones_do_not() -> None:
    assert _ratio({"CUDA0": WEIGHTS * 0.75, "CPU_Mapped": WEIGHTS * 0.25}) == pytest.approx(0.75)
    assert _ratio({"CUDA0": WEIGHTS}) == pytest.approx(1.0)


def test_no_buffer_report_is_absent() -> None:
    assert _ratio({}) is None


def test_two_samples_of_one_millisecond_have_no_rate() -> None:
    """diagnose may sample twice within a millisecond: no interval, no rate (not a crash)."""
    from core.promql import extrapolated

    assert extrapolated([(1000, 1.0), (1000, 5.0)], 1000, 30.0, rate=True) is None
    # A second apart at the window's end: +4, extrapolated back to the counter's zero (0.25 s).
    assert extrapolated([(29_000, 1.0), (30_000, 5.0)], 30_000, 30.0, rate=False) == 5.0
