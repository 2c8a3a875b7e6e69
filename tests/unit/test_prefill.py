"""The prefill roofline (issue 27): FLOPs per prompt token, the peak table, the TTFT split,
and the recording rules' arithmetic over raw samples."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from core.conditions import evaluate
from core.prefill import (
    PrefillBusy,
    PrefillStructure,
    attended_positions,
    busy_seconds,
    prefill_flops_per_token,
    prefill_physical,
    prefill_tokens_per_second,
    ttft_wait_share,
)
from core.rules import rule_values_at
from diagnose.decision.model import EngineResult, Row
from diagnose.decision.prefill import PromptTiming, histogram_split, split_text, ttft_split
from diagnose.report.tables import measurement_table
from exporter.collectors.llamacpp.log import LogState
from model.flops import hf_attention_dims, prefill_flops
from model.geometry import geometry_from_hf_config
from model.gpu_specs import table_peak_flops
from simulator.scenarios import QWEN3_30B_A3B_HF


def test_causal_attention_sees_half_the_prompt_and_a_window_caps_it() -> None:
    assert attended_positions(1) == 1 and attended_positions(4) == 2.5
    # Positions 1..4 see 1, 2, 2, 2 with a 2-token window: 7/4.
    assert attended_positions(4, 2) == 7 / 4
    assert attended_positions(3, 8) == attended_positions(3)


def test_flops_per_token_add_attention_at_the_prompts_length() -> None:
    model = PrefillStructure(1e9, attention_flops_full=100.0, attention_flops_swa=10.0,
                             sliding_window=2)  # fmt: skip
    assert prefill_flops_per_token(model, None) == 1e9
    assert prefill_flops_per_token(model, 4) == 1e9 + 100 * 2.5 + 10 * 7 / 4


def test_moe_counts_k_of_e_routed_experts() -> None:
    geo = geometry_from_hf_config(QWEN3_30B_A3B_HF)
    fl = prefill_flops(geo)
    assert fl is not None
    # Qwen3-30B-A3B per layer: attention 2048 x (4096 + 512 + 512) + 4096 x 2048, router
    # 2048 x 128, 8 of 128 experts of 3 x 2048 x 768; no embedding or output table (a
    # lookup, and the output projection runs for the last prompt token only).
    layer = 2048 * (4096 + 512 + 512) + 4096 * 2048 + 2048 * 128 + 8 * 3 * 2048 * 768
    assert fl.matmul_flops / 2 == pytest.approx(48 * layer, rel=0.001)
    assert fl.attention_flops_full == 48 * 2 * 32 * (128 + 128) and fl.sliding_window is None


def test_mla_prefill_attends_with_decompressed_heads() -> None:
    deepseek = {"kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
                "v_head_dim": 128, "num_attention_heads": 128, "hidden_size": 7168}  # fmt: skip
    assert hf_attention_dims(deepseek) == (192, 128)
    assert hf_attention_dims({"hidden_size": 4096, "num_attention_heads": 32}) == (128, 128)


def test_peak_table_is_dense_and_by_name() -> None:
    h200 = table_peak_flops("NVIDIA H200")
    assert h200 == {"bf16": 989.5e12, "fp8": 1979e12, "int8": 1979e12}
    assert table_peak_flops("NVIDIA H100 PCIe")["bf16"] == 756e12
    assert table_peak_flops("NVIDIA H200 NVL")["bf16"] == 835e12
    assert "fp8" not in table_peak_flops("NVIDIA A100-SXM4-80GB")
    assert table_peak_flops("NVIDIA GeForce RTX 4090")["bf16"] == 165.2e12
    assert table_peak_flops("NVIDIA GeForce GTX 1080") == {}


def test_physics_gate_is_the_decodes() -> None:
    assert prefill_physical(None) and prefill_physical(1.1) and not prefill_physical(1.11)


def test_the_report_table_shows_no_prefill_share_beyond_physics() -> None:
    rows = [
        Row("e", "single", 1, prefill_tok_s=900.0, prefill_efficiency=0.42),
        Row("e", "concurrency", 4, prefill_tok_s=3000.0, prefill_efficiency=1.5),
    ]
    head, cells, _ = measurement_table([EngineResult("e", "llamacpp", rows=rows)])
    shares = [dict(zip(head, r, strict=True))["of compute limit"] for r in cells]
    assert shares == ["42 %", "does not fit (beyond physics)"]


# The H200 F16 capture's four 8192-token prompts at c=4, as llama-server logged them: (the
# `total time` line's timestamp in s, total ms, prompt eval ms). The prompt spans overlap.
H200_C4 = [
    (35.216589, 7543.89, 2325.96),
    (37.233963, 8752.28, 3445.99),
    (39.085764, 8788.84, 3588.18),
    (42.286378, 10056.74, 2901.82),
]
FIXTURE = Path(__file__).parents[1] / "fixtures" / "llamacpp-h200-f16-prompt-timings"


def test_busy_seconds_is_the_union_of_the_prompt_spans() -> None:
    assert busy_seconds([(0.0, 2.0), (1.0, 3.0), (5.0, 6.0), (5.5, 5.7)]) == pytest.approx(4.0)
    busy = PrefillBusy()
    # Out of order, as requests end: each span adds only what no earlier one covered.
    assert busy.add(5.0, 6.0) == pytest.approx(1.0)
    assert busy.add(0.0, 2.0) == pytest.approx(2.0)
    assert busy.add(1.0, 5.5) == pytest.approx(3.0)
    assert busy.add(1.0, 2.0) == 0.0 and busy.add(3.0, 3.0) == 0.0
    assert busy.total == pytest.approx(6.0)
    # Any order of arrival gives the union's length.
    rng = random.Random(7)
    for _ in range(50):
        spans = [(a, a + rng.uniform(0.0, 20.0)) for a in (rng.uniform(0, 100) for _ in range(20))]
        running = PrefillBusy()
        for lo, hi in spans:
            running.add(lo, hi)
        assert running.total == pytest.approx(busy_seconds(spans), abs=1e-9)
    # Spans ending more than the horizon before the latest are forgotten: counted again.
    short = PrefillBusy(horizon_s=10.0)
    short.add(0.0, 5.0)
    short.add(100.0, 101.0)
    assert short.add(0.0, 5.0) == 5.0 and short.add(100.5, 102.0) == pytest.approx(1.0)
    assert prefill_tokens_per_second(8192.0, 2.0) == 4096.0
    assert prefill_tokens_per_second(8192.0, 0.0) is None


def test_the_logs_prompt_spans_count_prompts_computed_together_once() -> None:
    state = LogState()
    for line in (FIXTURE / "llama-server-prompt-timings.txt").read_text().splitlines():
        state.feed(line)
    # Each span ends `total - prompt` before its line, by hand: the c=4 four overlap into
    # one 7.46 s stretch; the c=1 prompt and the second c=4 round are their own.
    c4 = [(end - total / 1e3, end - total / 1e3 + prompt / 1e3) for end, total, prompt in H200_C4]
    assert c4[0][0] == pytest.approx(27.6727) and c4[3][1] == pytest.approx(35.1316, abs=1e-3)
    single = (27.072566 - 1.84037, 27.072566 - 1.84037 + 1.56029)
    second = [
        (46.713565 - 10.08110, 46.713565 - 10.08110 + 2.45230),
        (46.830462 - 9.29766, 46.830462 - 9.29766 + 4.75248),
        (46.941184 - 6.22818, 46.941184 - 6.22818 + 4.68127),
        (47.029262 - 3.11881, 47.029262 - 3.11881 + 2.71721),
    ]
    truth = busy_seconds([single, *c4, *second])
    assert state.prefill_busy_seconds == pytest.approx(truth, abs=1e-6)
    assert state.prompt_tokens == 9 * 8192
    # The sum of the prompt times counts the overlapping prompts' shared time again.
    assert state.prompt_seconds == pytest.approx(28.4255)
    assert state.prompt_seconds > 1.4 * state.prefill_busy_seconds


def test_ttft_split_takes_each_prompts_own_time_as_computing() -> None:
    # The c=4 four, each sent 30 ms before its slot started its prompt: a batch's shared
    # compute is no waiting (the old split said about 2 s of waiting for these).
    timings = [
        PromptTiming(end - total / 1e3 + prompt / 1e3, prompt / 1e3 + 0.03, prompt, 8192)
        for end, total, prompt in H200_C4
    ]
    split = ttft_split(timings)
    assert split is not None
    assert split.queue_wait_s == pytest.approx(0.03)
    assert split.prefill_s == pytest.approx(sum(p for _, _, p in H200_C4) / 4e3)
    spans = [(t.first_token_at - t.prompt_ms / 1e3, t.first_token_at) for t in timings]
    assert split.prefill_tok_s == pytest.approx(4 * 8192 / (spans[3][1] - spans[0][0]))
    # A request that waited for a slot: TTFT beyond its prompt time.
    late = ttft_split([PromptTiming(10.0, 3.0, 1000.0, 100)])
    assert late is not None and late.queue_wait_s == pytest.approx(2.0)
    assert ttft_split([PromptTiming(1.0, 1.0, 0.0, 0)]) is None
    assert ttft_wait_share(1.0, 3.0) == 0.25 and ttft_wait_share(0.0, 0.0) is None


def test_without_per_request_timings_the_split_is_the_engines_histograms_and_says_so() -> None:
    # SGLang over a step: mean TTFT 3.0 s, mean queue time 0.5 s, both its own histograms.
    split = histogram_split(3.0, 0.5)
    assert split is not None and split.source == "histograms" and split.prefill_tok_s is None
    assert (split.queue_wait_s, split.prefill_s) == (0.5, 2.5)
    assert histogram_split(3.0, None) is None and histogram_split(None, 0.5) is None
    row = Row("e", "single", 1, queue_wait_s=0.5, prefill_s=2.5, ttft_split_source="histograms")
    assert split_text(row) == (
        " (mean per request: waiting 0.500 s, prompt 2.500 s: the means of the engine's "
        "queue-time and TTFT histograms over the step)"
    )
    timed = Row("e", "single", 1, queue_wait_s=0.01, prefill_s=2.0, prefill_tok_s=4096.0,
                ttft_split_source="requests")  # fmt: skip
    assert split_text(timed) == " (mean per request: waiting 0.010 s, prompt 2.000 s at 4096 tok/s)"


def _series(rate: dict[str, float], gauges: dict[str, float]) -> dict[tuple, list]:
    key = (("engine", "e"), ("kind", "llamacpp"))
    out: dict[tuple, list] = {}
    for name, per_s in rate.items():
        out[(name, key)] = [(t, per_s * t) for t in range(0, 601, 15)]
    for name, v in gauges.items():
        out[(name, key)] = [(t, v) for t in range(0, 601, 15)]
    gpu = (("gpu", "0"),)
    out[("llmb_gpu_peak_flops", (("dtype", "bf16"), ("gpu", "0")))] = [
        (t, 1e15) for t in range(0, 601, 15)
    ]
    out[("llmb_gpu_memory_total_bytes", gpu)] = [(t, 8e10) for t in range(0, 601, 15)]
    proc = (("engine", "e"), ("gpu", "0"), ("pid", "1"))
    out[("llmb_gpu_process_memory_used_bytes", proc)] = [(t, 1e10) for t in range(0, 601, 15)]
    return out


def test_rules_arithmetic_matches_the_core() -> None:
    series = _series(
        {
            "llmb_engine_prompt_tokens_total": 2000.0,
            "llmb_engine_requests_finished_total": 0.5,
            # Two prompts computed together: 0.1 s of prompt time per second in 0.05 s.
            "llmb_engine_prompt_seconds_total": 0.1,
            "llmb_engine_prefill_busy_seconds_total": 0.05,
            "llmb_engine_decode_seconds_total": 0.3,
        },
        {
            "llmb_engine_up": 1.0,
            "llmb_engine_requests_waiting": 0.1,
            "llmb_model_prefill_flops_per_token": 1e10,
            "llmb_model_sliding_window_tokens": 1024.0,
        },
    )
    key = (("engine", "e"), ("kind", "llamacpp"), ("layers", "sliding"))
    series[("llmb_model_prefill_attention_flops_per_position", key)] = [
        (t, 1e5) for t in range(0, 601, 15)
    ]
    ((_, values),) = rule_values_at(series, 600).items()
    sig = values.signals
    assert sig.prompt_tokens_mean == pytest.approx(4000)
    flops = prefill_flops_per_token(PrefillStructure(1e10, 0.0, 1e5, 1024.0), 4000)
    assert values.prefill_tokens_per_second == pytest.approx(40000)
    assert sig.prefill_efficiency == pytest.approx(40000 * flops / 1e15)
    assert sig.ttft_wait_share == pytest.approx(0.1 / 0.2)
    assert sig.prefill_time_share == pytest.approx(0.25)


def test_llamacpp_without_its_log_has_no_ttft_split() -> None:
    """Without the log the exporter writes llama.cpp's batch-timed prompt time as the busy
    series only (issue 32 review): 4 prompts of 8192 tokens computed together in half of
    each second, 1.5 requests deferred. Each request's own prompt time is not measured, so
    the waiting and prefill time shares are absent (no `ttft_waiting_bound` from a batch
    time read as one request's), while the prefill throughput still is measured."""
    series = _series(
        {
            "llmb_engine_prompt_tokens_total": 4 * 8192 * 0.25,
            "llmb_engine_requests_finished_total": 0.25,
            "llmb_engine_prefill_busy_seconds_total": 0.5,
            "llmb_engine_decode_seconds_total": 2.0,
        },
        {
            "llmb_engine_up": 1.0,
            "llmb_engine_requests_running": 4.0,
            "llmb_engine_slots": 4.0,
            "llmb_engine_requests_waiting": 1.5,
            "llmb_model_prefill_flops_per_token": 1e10,
        },
    )
    ((_, values),) = rule_values_at(series, 600).items()
    sig = values.signals
    assert sig.prompt_tokens_mean == pytest.approx(4 * 8192)
    assert values.prefill_tokens_per_second == pytest.approx(4 * 8192 * 0.25 / 0.5)
    assert sig.ttft_wait_share is None and sig.prefill_time_share is None
    verdict = evaluate(sig)
    assert not verdict.held("ttft_waiting") and verdict.name != "ttft_waiting_bound"
