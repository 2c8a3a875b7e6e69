"""The prefill roofline (issue 27): FLOPs per prompt token, the peak table, the TTFT split,
and the recording rules' arithmetic over raw samples."""

from __future__ import annotations

import pytest

from core.prefill import (
    PrefillStructure,
    attended_positions,
    prefill_flops_per_token,
    prefill_physical,
    ttft_wait_share,
)
from core.rules import rule_values_at
from diagnose.decision.model import EngineResult, Row
from diagnose.decision.prefill import PromptTiming, ttft_split
from diagnose.report.tables import measurement_table
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


def test_ttft_split_counts_overlapping_prompts_once() -> None:
    # Two 8192-token prompts sent together, computed one after the other in 2.7 s each: the
    # second's prompt span (5.4 s) covers the first's. 3034 tok/s, the second waits 2.7 s.
    timings = [PromptTiming(102.7, 2.7, 2700.0, 8192), PromptTiming(105.4, 5.4, 5400.0, 8192)]
    split = ttft_split(timings)
    assert split is not None
    assert split.prefill_tok_s == pytest.approx(16384 / 5.4)
    assert split.prefill_s == pytest.approx(2.7)
    assert split.queue_wait_s == pytest.approx(2.7 / 2)
    assert ttft_split([PromptTiming(1.0, 1.0, 0.0, 0)]) is None
    assert ttft_wait_share(1.0, 3.0) == 0.25 and ttft_wait_share(0.0, 0.0) is None


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
            "llmb_engine_prompt_seconds_total": 0.1,
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
    assert sig.prefill_efficiency == pytest.approx(20000 * flops / 1e15)
    assert sig.ttft_wait_share == pytest.approx(0.1 / 0.2)
    assert sig.prefill_time_share == pytest.approx(0.25)
