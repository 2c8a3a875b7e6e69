"""Decision rules as tables: each case is measured numbers -> expected verdict."""

from __future__ import annotations

import json

import pytest

from loadgen.decision import (
    FIX_MEMORY,
    STAY,
    EngineResult,
    Row,
    decide_compare,
    decide_single,
    engine_from_dict,
    quantization_caveat,
    results_to_dict,
    roofline_fraction,
    tuning_flags,
)

GB = 1e9


def engine(
    name: str,
    kind: str = "llamacpp",
    single: float = 20.0,
    agg: dict[int, float] | None = None,
    *,
    quant: str = "Q4_0",
    weights: float = 15 * GB,
    proc: float | None = 16 * GB,
    layers: tuple[float, float] | None = (63, 63),
    bandwidth: float | None = 1.344e12,
    contexts: dict[int, str | None] | None = None,
    tokens_ok: bool = True,
) -> EngineResult:
    """An EngineResult with a single row, a concurrency sweep and a context sweep."""
    e = EngineResult(
        name=name,
        kind=kind,
        quantization=quant,
        weights_bytes=weights,
        process_gpu_bytes=proc,
        layers_offloaded=layers[0] if layers else None,
        layers_total=layers[1] if layers else None,
        gpu_total_bytes=72 * GB,
        bandwidth_bytes_per_s=bandwidth,
        memory_source="gpu",
    )
    e.rows.append(
        Row(
            name,
            "single",
            1,
            per_seq_tok_s=single,
            per_token_ms=1000 / single,
            aggregate_tok_s=single * 0.95,
            tokens_ok=tokens_ok,
        )
    )
    for c, total in (agg or {}).items():
        e.rows.append(
            Row(
                name,
                "concurrency",
                c,
                per_seq_tok_s=total / c,
                aggregate_tok_s=total,
                tokens_ok=tokens_ok,
            )
        )
    for ctx, err in (contexts or {}).items():
        e.rows.append(Row(name, "context", 1, context=ctx, error=err, loaded_memory_bytes=20 * GB))
    return e


# (A, B, expected verdict, decisive step)
COMPARE_CASES = [
    pytest.param(
        engine("llama", single=20.0, agg={4: 24.0}),
        engine("sglang", "sglang", single=20.5, agg={4: 70.0}),
        "switch: batching",
        3,
        id="same-single-more-aggregate-on-B",
    ),
    pytest.param(
        engine("llama", single=20.0, agg={4: 60.0}),
        engine("sglang", "sglang", single=19.0, agg={4: 62.0}),
        STAY,
        None,
        id="equal-everything",
    ),
    pytest.param(
        engine("llama", single=20.0, agg={4: 75.0}),
        engine("sglang", "sglang", single=20.0, agg={4: 40.0}),
        STAY,
        3,
        id="A-batches-better",
    ),
    pytest.param(
        engine("llama", single=10.0, agg={4: 30.0}, layers=(30, 63)),
        engine("sglang", "sglang", single=20.0, agg={4: 70.0}),
        FIX_MEMORY,
        1,
        id="partial-offload",
    ),
    pytest.param(
        engine("llama", single=20.0, proc=4 * GB, layers=None),
        engine("sglang", "sglang", single=20.0),
        FIX_MEMORY,
        1,
        id="process-memory-below-weights",
    ),
    pytest.param(
        engine("llama", single=20.0, agg={4: 60.0}),
        engine("sglang", "sglang", single=26.0, agg={4: 80.0}),
        "switch: decode",
        2,
        id="B-decodes-faster",
    ),
    pytest.param(
        engine("llama", agg={4: 60.0}, contexts={8192: None, 131072: "exited: out of memory"}),
        engine("sglang", "sglang", agg={4: 61.0}, contexts={8192: None, 131072: None}),
        "switch: long context",
        4,
        id="A-memory-gives-out-first",
    ),
]


@pytest.mark.parametrize(("a", "b", "verdict", "decisive"), COMPARE_CASES)
def test_compare_decision_table(
    a: EngineResult, b: EngineResult, verdict: str, decisive: int | None
) -> None:
    d = decide_compare(a, b)
    assert d.verdict == verdict, d.recommendation
    decided = [s.number for s in d.steps if s.decisive]
    assert decided == ([decisive] if decisive else [])
    assert [s.number for s in d.steps] == [1, 2, 3, 4]
    # The recommendation carries the roofline sentence for both engines.
    assert "the card is at" in d.recommendation


def test_batching_numbers_in_recommendation() -> None:
    d = decide_compare(engine("a", single=20, agg={8: 25}), engine("b", single=21, agg={8: 100}))
    assert d.verdict == "switch: batching"
    assert "4.00x the aggregate throughput at concurrency 8" in d.recommendation
    assert d.steps[1].numbers["ratio"] == pytest.approx(21 / 20)


def test_roofline_fraction() -> None:
    # 15 GB of weights at 1.344 TB/s: limit 89.6 tok/s; 20 tok/s is 22 %.
    e = engine("a", single=20.0)
    assert roofline_fraction(e) == pytest.approx(20.0 / (1.344e12 / 15e9))
    assert "the card is at 22 % of its decode limit" in decide_single(e).recommendation
    assert roofline_fraction(engine("a", bandwidth=None)) is None


@pytest.mark.parametrize(
    ("qa", "qb", "expect"),
    [
        ("Q4_0", "Q4_0", None),
        ("F16", "float16", None),
        ("Q4_0", "bfloat16", "different precision"),
        ("Q4_K - Medium", "", "quantization unknown for b"),
    ],
)
def test_quantization_caveat(qa: str, qb: str, expect: str | None) -> None:
    got = quantization_caveat(engine("a", quant=qa), engine("b", quant=qb))
    assert (got is None) if expect is None else (got is not None and expect in got)


def test_decode_switch_mentions_precision_discount() -> None:
    d = decide_compare(engine("a", single=20), engine("b", "sglang", single=30, quant="bfloat16"))
    assert d.verdict == "switch: decode"
    assert "different precision" in d.recommendation
    assert any("different precision" in c for c in d.caveats)


@pytest.mark.parametrize(
    ("e", "action", "flag"),
    [
        (engine("a", single=20, agg={4: 22}), STAY, "-np 4"),
        (engine("a", single=20, agg={4: 70}, layers=(16, 33)), FIX_MEMORY, "-ngl 999"),
        (engine("a", single=20, contexts={4096: None, 65536: "exit 1"}), STAY, "-c 4096"),
        (engine("s", "sglang", single=20, agg={8: 21}), STAY, "--max-running-requests >= 8"),
    ],
)
def test_single_engine_flags(e: EngineResult, action: str, flag: str) -> None:
    d = decide_single(e)
    assert d.action == action
    assert any(flag in f for f in tuning_flags(e))
    assert flag in d.recommendation


def test_cpu_only_build_is_not_a_residency_problem() -> None:
    e = engine("cpu", single=35, agg={2: 60}, layers=(0, 19), bandwidth=None)
    e.memory_source = "host rss"
    d = decide_single(e)
    assert d.action == STAY
    assert d.steps[0].answer.startswith("CPU-only run")
    assert "-t <physical cores>" in d.recommendation
    # The same layer count with a GPU present is a residency problem.
    e.memory_source = "gpu"
    assert decide_single(e).action == FIX_MEMORY


def test_token_mismatch_is_a_caveat() -> None:
    d = decide_compare(engine("a"), engine("b", tokens_ok=False))
    assert any("token counts differ" in c for c in d.caveats)


def test_results_json_round_trip() -> None:
    a, b = engine("a", agg={2: 30}), engine("b", agg={2: 80})
    d = decide_compare(a, b)
    doc = json.loads(json.dumps(results_to_dict([a, b], d)))
    assert doc["verdict"] == d.verdict and doc["recommendation"] == d.recommendation
    back = engine_from_dict(doc["engines"][1])
    row = back.at_concurrency(2)
    assert row is not None and row.aggregate_tok_s == 80
