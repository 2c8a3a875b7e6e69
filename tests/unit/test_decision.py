"""Unit tests of the diagnose/decision package: comparability, spread, recommendation, results.json.

The verdict itself is never decided here (the decision core is); these tables check
what compare adds on top of it.
"""

from __future__ import annotations

import json
from dataclasses import fields, replace
from typing import Any

import pytest

from core.conditions import LAYERS_ACTION, VERDICT_INFO, VERDICTS, evaluate
from core.signals import Signals
from core.stats import relative_spread
from diagnose.decision.model import (
    FIX_MEMORY_FIRST,
    INCONCLUSIVE,
    STAY,
    STAY_AND_TUNE,
    EngineResult,
    Row,
    RunInfo,
    switch_to,
)
from diagnose.decision.one_engine import decide_single, engine_verdict, recommendation_for
from diagnose.decision.results import engine_from_dict, results_to_dict
from diagnose.decision.roofline import roofline
from diagnose.decision.two_engines import comparability, decide_compare

GIB = 2**30


def engine(
    name: str,
    *,
    single: list[float] | None = None,
    agg: dict[int, list[float]] | None = None,
    weights: float = 15 * GIB,
    params: float | None = 27e9,
    verdict: str = "decode_below_card_limit",
    bandwidth: float | None = 1.344e12,
    quant: str = "Q4_0",
    contexts: dict[int, str | None] | None = None,
) -> EngineResult:
    """An engine with single-request rounds, concurrency rounds and a context sweep."""
    e = EngineResult(
        name=name,
        kind="llamacpp",
        quantization=quant,
        weights_bytes=weights,
        parameters=params,
        bandwidth_bytes_per_s=bandwidth,
        verdict=verdict,
        action=VERDICT_INFO[verdict].action,
    )
    single = single or [50.0, 51.0, 50.5]
    e.rows.append(
        Row(name, "single", 1, prompt_tokens=128, max_tokens=128, per_seq_tok_s=sum(single) / 3,
            per_seq_rounds=single, aggregate_rounds=single, aggregate_tok_s=single[0],
            ttft_rounds=[0.1, 0.1, 0.1], tokens_ok=True, requests=3, completion_tokens=384)
    )  # fmt: skip
    for c, rounds in (agg or {}).items():
        mid = sorted(rounds)[len(rounds) // 2]
        e.rows.append(
            Row(name, "concurrency", c, aggregate_rounds=rounds, aggregate_tok_s=mid,
                ttft_rounds=[0.2, 0.2, 0.2], ttft_s=0.2, tokens_ok=True, requests=3 * c,
                completion_tokens=3 * c * 128, max_tokens=128)
        )  # fmt: skip
    for ctx, err in (contexts or {}).items():
        e.rows.append(Row(name, "context", 1, context=ctx, error=err))
    return replace(e, roofline=roofline(e))


def test_spread_needs_two_rounds() -> None:
    assert relative_spread([10.0]) is None
    assert relative_spread([9.0, 10.0, 11.0]) == pytest.approx(0.2)


def test_q4_vs_bf16_is_not_comparable_and_gives_estimates() -> None:
    """The rtx-pro-5000-27b pair: 14.2 GiB of Q4_0 against 51.1 GiB of bf16."""
    a = engine("llama", weights=14.2 * GIB, single=[53.0, 53.5, 54.0])
    b = engine("sglang", weights=51.1 * GIB, single=[20.5, 21.0, 21.2], quant="bf16")
    ok, why = comparability(a, b)
    assert not ok and "different precision" in why and "> 20 %" in why
    d = decide_compare(a, b)
    assert d.comparable is False and d.recommendation == INCONCLUSIVE
    assert any("different precision" in c for c in d.caveats)
    assert "Share of the card's decode limit" in d.steps[1].answer
    # Each engine at the other's precision: its share of the roofline x the other's limit.
    est = {e.engine: e for e in d.estimates}
    assert est["llama"].tok_s == pytest.approx(
        a.roofline.efficiency * b.roofline.limit_tok_s  # type: ignore[operator]
    )
    assert all(e.basis.startswith("estimate:") for e in d.estimates)


def test_within_20_percent_is_comparable() -> None:
    ok, _ = comparability(engine("a", weights=15 * GIB), engine("b", weights=16.5 * GIB))
    assert ok


def test_unknown_parameters_fall_back_to_weight_bytes() -> None:
    ok, why = comparability(
        engine("a", weights=15 * GIB, params=None), engine("b", weights=30 * GIB, params=None)
    )
    assert not ok and "weight bytes" in why


def test_batching_beyond_spread_recommends_the_better_engine_at_that_concurrency() -> None:
    """Same single-request speed; B gives 2x the aggregate at 8 with tight rounds."""
    a = engine("np1", agg={8: [50.0, 52.0, 51.0]})
    b = engine("np8", agg={8: [180.0, 185.0, 182.0]})
    d = decide_compare(a, b)
    assert d.recommendation == switch_to("np8")
    assert "at c=8" in d.action
    batching = next(s for s in d.steps if s.key == "batching")
    assert batching.decisive and "np8 ahead" in batching.answer
    # The single-request step did not gate it: equal speeds there.
    assert "no difference beyond the noise" in next(s for s in d.steps if s.key == "decode").answer


def test_difference_within_spread_is_stay() -> None:
    a = engine("a", agg={4: [100.0, 130.0, 110.0]})
    b = engine("b", agg={4: [105.0, 125.0, 120.0]})
    d = decide_compare(a, b)
    # Nothing differs beyond the noise: the engine in use stays (not "inconclusive").
    assert d.recommendation == STAY
    assert d.action.startswith("stay on a: no difference beyond the noise at c=1, c=4")
    assert "spread" in d.action


def test_one_round_calls_nothing() -> None:
    a = engine("a", agg={4: [100.0]})
    b = engine("b", agg={4: [300.0]})
    d = decide_compare(a, b)
    assert "one round: no spread" in next(s for s in d.steps if s.key == "batching").answer
    # c=4 could not be compared at all (one round, no requests): that is what is missing.
    assert d.recommendation == INCONCLUSIVE
    assert "too few samples to call a difference (c=4: not decided" in d.action


def test_engine_in_use_winning_means_stay_and_tune() -> None:
    a = engine("a", agg={4: [200.0, 205.0, 202.0]})
    b = engine("b", agg={4: [100.0, 104.0, 101.0]})
    d = decide_compare(a, b)
    assert d.recommendation == STAY_AND_TUNE and d.action.startswith("stay on a")


def test_weights_not_resident_comes_first() -> None:
    a = engine("a", verdict="weights_not_resident", agg={4: [10.0, 11.0, 10.5]})
    b = engine("b", agg={4: [100.0, 104.0, 101.0]})
    d = decide_compare(a, b)
    assert d.recommendation == FIX_MEMORY_FIRST
    assert d.verdict == {"a": "weights_not_resident", "b": "decode_below_card_limit"}
    assert VERDICT_INFO["weights_not_resident"].action in d.action


def test_compare_gives_the_engines_own_expert_offload_action_not_the_layers_advice() -> None:
    # Issue 32: every layer on the GPU, experts of 20 layers on the host (diagnose's action).
    a = moe_engine(structure=True, tok_s=46.0, experts_host_layers=20.0, experts_host_bytes=12.8e9)
    a = replace(a, host_bandwidth_bytes_per_s=40e9, host_bandwidth_source="flag")
    signals = Signals(layers_ratio=1.0, experts_host_layers=20.0, host_has_gpu=True)
    verdict, action = engine_verdict(a, signals)
    a = replace(a, verdict=verdict, action=action)
    b = engine("b", agg={4: [100.0, 104.0, 101.0]})
    d = decide_compare(a, b)
    assert d.recommendation == FIX_MEMORY_FIRST
    assert a.action in d.action and "host memory is the limit" in d.action
    assert "-ngl" not in d.action and LAYERS_ACTION not in d.action


def test_long_context_decides_when_only_one_engine_loads_it() -> None:
    a = engine("a", contexts={8192: None, 32768: "out of memory"})
    b = engine("b", contexts={8192: None, 32768: None})
    d = decide_compare(a, b)
    assert d.recommendation == switch_to("b")
    step = next(s for s in d.steps if s.key == "long_context")
    assert step.decisive and "memory gave out at 32768" in step.answer


def test_no_context_sweep_says_not_measured() -> None:
    d = decide_compare(engine("a"), engine("b"))
    assert next(s for s in d.steps if s.key == "long_context").answer.startswith("not measured:")


@pytest.mark.parametrize(
    ("verdict", "rec"),
    [
        ("weights_not_resident", FIX_MEMORY_FIRST),
        ("kv_saturated", STAY_AND_TUNE),
        ("scheduling_bound", STAY_AND_TUNE),
        ("decode_at_card_limit", STAY_AND_TUNE),
        ("decode_below_card_limit", STAY_AND_TUNE),
        ("idle", INCONCLUSIVE),
        (None, INCONCLUSIVE),
    ],
)
def test_single_engine_recommendation(verdict: str | None, rec: str) -> None:
    assert recommendation_for(verdict) == rec


def test_every_verdict_of_the_core_has_a_recommendation() -> None:
    assert {recommendation_for(v) for v in VERDICTS} <= {
        STAY_AND_TUNE, FIX_MEMORY_FIRST, INCONCLUSIVE,
    }  # fmt: skip


def test_results_json_fields_and_round_trip() -> None:
    e = engine("llama", verdict="kv_saturated", agg={4: [10.0, 11.0, 12.0]})
    d = decide_single(e, [])
    run = RunInfo("llmb-loadgen diagnose --url x", "0.1.0", "2026-01-01T00:00:00Z")
    run.finished_at = "2026-01-01T00:01:00Z"
    doc = json.loads(json.dumps(results_to_dict([e], d, run)))
    for key in ("verdict", "recommendation", "comparable", "caveats", "tool_version", "command",
                "started_at", "finished_at"):  # fmt: skip
        assert key in doc, key
    assert doc["verdict"] == {"llama": "kv_saturated"}
    assert doc["recommendation"] == STAY_AND_TUNE and doc["comparable"] is True
    back = engine_from_dict(doc["engines"][0])
    assert back == e
    # Every Facts field under its own name, flat (the inherited model structure included),
    # and the engine opens with its name and kind.
    assert list(doc["engines"][0])[:2] == ["name", "kind"]
    assert set(doc["engines"][0]) == {f.name for f in fields(EngineResult)}


# --- issue 17: the roofline knows the model, and no answer beyond physics -----------------

# Qwen3-30B-A3B Q8_0 as its GGUF splits (model: geometry, weights): always-read,
# routed experts, one untied embedding row; f16 KV of 48 layers x 4 heads x 128 x 2.
QWEN3 = {
    "weights_bytes": 32_477_962_240.0,
    "always_read_bytes": 1_344_380_928.0,
    "routed_expert_bytes": 30_802_968_576.0,
    "experts": 128.0,
    "experts_used": 8.0,
    "token_embedding_row_bytes": 2176.0,
}


def moe_engine(structure: bool, tok_s: float = 238.6, **extra: float) -> EngineResult:
    """Issue 17's H200 run: 238.6 tok/s per sequence at 4.8 TB/s."""
    e = engine("moe", single=[tok_s] * 3, weights=QWEN3["weights_bytes"], bandwidth=4.8e12)
    known: dict[str, Any] = {"kv_bytes_per_token": 98304.0, **(QWEN3 if structure else {}), **extra}
    e = replace(e, **known)
    return replace(e, roofline=roofline(e))


def as_written(e: EngineResult) -> dict[str, Any]:
    """The engine's results.json form, as diagnose writes it (through JSON text)."""
    return json.loads(json.dumps(results_to_dict([e], decide_single(e, []))))["engines"][0]


def test_issue_capture_as_dense_is_beyond_physics_and_never_at_the_card_limit() -> None:
    e = moe_engine(structure=False)
    roof = e.roofline
    assert (roof.bytes_per_step, roof.limit_tok_s, roof.efficiency) == (
        pytest.approx(32.47e9, rel=0.002),
        pytest.approx(147.8, abs=0.2),
        pytest.approx(1.61, abs=0.01),
    )
    assert roof.misfit == "model_structure_unknown" and not roof.physical
    # The rules' signal at this efficiency: no decode claim, the misfit named instead.
    signals = Signals(decode_efficiency=roof.efficiency, host_has_gpu=True)
    verdict, action = engine_verdict(e, signals)
    assert verdict != "decode_at_card_limit"
    assert "does not fit" in action and "mixture-of-experts" in action
    assert "Tune the engine" not in action
    assert as_written(e)["roofline"]["misfit"] == "model_structure_unknown"


def test_issue_capture_with_the_moe_structure_is_below_the_card_limit() -> None:
    e = moe_engine(structure=True)
    roof = e.roofline
    assert roof.active_weights_bytes == pytest.approx(3.27e9, rel=0.005)
    assert (roof.bytes_per_step, roof.limit_tok_s, roof.efficiency) == (
        pytest.approx(3.24e9, rel=0.02),
        pytest.approx(1480, rel=0.02),
        pytest.approx(0.16, abs=0.01),
    )
    assert roof.misfit is None and roof.accepted_tokens_per_step == 1.0
    verdict, action = engine_verdict(e, Signals(decode_efficiency=roof.efficiency))
    assert verdict == "decode_below_card_limit"
    assert action == VERDICT_INFO["decode_below_card_limit"].action
    # results.json: the new fields beside the old ones, which keep their names.
    written = as_written(e)
    fields = written["roofline"]
    for key in ("bytes_per_step", "limit_tok_s", "measured_tok_s", "efficiency",
                "active_weights_bytes", "kv_bytes_per_token", "accepted_tokens_per_step",
                "misfit"):  # fmt: skip
        assert key in fields, key
    assert engine_from_dict(written).roofline == roof


def test_the_bandwidth_source_does_not_change_the_bytes_per_step() -> None:
    steps = set()
    for source in ("exporter", "config", "--bandwidth-gbs"):
        e = replace(moe_engine(structure=True), bandwidth_source=source)
        steps.add(roofline(e).bytes_per_step)
    assert len(steps) == 1


def test_speculative_acceptance_raises_the_limit_and_a_missing_one_is_named() -> None:
    # Dense 8 GB model decoding 1.5x faster than one token per weight read allows.
    fast = 4.8e12 / 8e9 * 1.5
    e = engine("spec", single=[fast] * 3, weights=8e9, bandwidth=4.8e12)
    e = replace(e, always_read_bytes=8e9, routed_expert_bytes=0.0)
    e = replace(e, roofline=roofline(e))
    assert e.roofline.misfit == "speculative_decoding_not_detected"
    e = replace(e, spec_accept_length=2.5, draft_weights_bytes=0.5e9)
    e = replace(e, roofline=roofline(e))
    assert e.roofline.accepted_tokens_per_step == 2.5
    assert e.roofline.bytes_per_step == pytest.approx(8e9 + 2.5 * 0.5e9, rel=1e-3)
    # 900 tok/s against 4.8 TB/s x 2.5 tokens / 9.25 GB (draft included): 69 %.
    assert e.roofline.misfit is None
    assert e.roofline.efficiency == pytest.approx(fast / (4.8e12 * 2.5 / 9.25e9), rel=1e-3)


def test_beyond_physics_gives_no_estimate_in_compare() -> None:
    a = moe_engine(structure=False)
    b = engine("dense", weights=16e9, single=[50.0, 50.5, 51.0], quant="bf16", bandwidth=4.8e12)
    d = decide_compare(a, b)
    assert d.estimates == [] and "beyond physics" in d.steps[1].answer


def _offload(tok_s: float, **extra: Any) -> str:
    """diagnose's action for 20 layers' experts (12.8 GB) on a host of 40 GB/s, measured."""
    e = moe_engine(structure=True, tok_s=tok_s, experts_host_layers=20.0, experts_host_bytes=12.8e9)
    host = {"host_bandwidth_bytes_per_s": 40e9, "host_bandwidth_source": "measured"}
    e = replace(e, **{**host, **extra})
    signals = Signals(layers_ratio=1.0, experts_host_layers=20.0, host_has_gpu=True)
    verdict, action = engine_verdict(e, signals)
    assert verdict == "weights_not_resident"
    assert evaluate(signals).evidence == ("experts_host",)
    return action


def test_expert_offload_names_layers_bytes_and_the_measured_host_bound() -> None:
    action = _offload(20.0)
    assert "the routed experts of 20 layers live in host memory" in action
    assert "11.92 GiB" in action and "--n-cpu-moe" in action
    # 12.8 GB x 8/128 read per step from 40 GB/s of host memory: 50 tok/s at most.
    assert "bound near 50.0 tok/s per sequence by host memory (40.0 GB/s, measured" in action
    # 20 tok/s is 40 % of the bound: not near it, so no claim that host memory is the limit.
    assert "host memory is the limit" not in action and "-ngl" not in action


def test_expert_offload_without_a_host_bandwidth_gives_no_bound() -> None:
    action = _offload(20.0, host_bandwidth_bytes_per_s=None, host_bandwidth_source=None)
    assert "host memory bandwidth unknown (pass --host-bandwidth-gbs)" in action
    assert "bound near" not in action and "100 GB/s" not in action


def test_decode_near_the_host_bound_says_what_more_layers_on_the_gpu_buy() -> None:
    # 46 tok/s against a 50 tok/s bound: 92 %, within 20 %. 0.64 GB of experts per layer;
    # 5 GB free holds 7 more layers: 13 layers' experts stay, the bound rises to 50 x 20/13.
    action = _offload(46.0, gpu_free_bytes=5e9)
    assert "Measured decode 46.0 tok/s per sequence is 92 % of that bound" in action
    assert "host memory is the limit" in action
    assert "Moving 7 more layers' experts to the GPU (a `--n-cpu-moe` lower by 7" in action
    assert "7 x 0.60 GiB = 4.17 GiB of VRAM; 4.66 GiB free" in action
    assert "raises the bound to 76.9 tok/s per sequence" in action


def test_near_the_host_bound_without_room_or_free_vram_known() -> None:
    full = _offload(46.0, gpu_free_bytes=0.5e9)
    assert "needs 0.60 GiB of VRAM, more than the 0.47 GiB free: make room first" in full
    # Free VRAM unknown: half the host layers, the VRAM they need, said to be unknown.
    unknown = _offload(46.0)
    assert "Moving 10 more layers' experts" in unknown and "free VRAM unknown" in unknown
    assert "raises the bound to 100.0 tok/s" in unknown
    roomy = _offload(46.0, gpu_free_bytes=20e9)
    assert "Moving all 20 layers' experts to the GPU" in roomy
    assert "removes the host bound" in roomy


def test_decode_far_above_the_host_bound_says_the_figure_is_low() -> None:
    # 80 tok/s against a 50 tok/s bound: the engine draws more than 40 GB/s from the host.
    action = _offload(80.0)
    assert "Measured decode 80.0 tok/s per sequence is 160 % of that bound" in action
    assert "so that figure is low for its access pattern" in action
    assert "--host-bandwidth-gbs" in action and "host memory is the limit" not in action
    # 59 tok/s is 118 %: within 20 %, host memory is the limit.
    assert "host memory is the limit" in _offload(59.0)
