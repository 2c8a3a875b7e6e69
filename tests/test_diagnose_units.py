"""diagnose's parsers and summaries on real captured fixtures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadgen.client import StreamResult
from loadgen.decision import EngineResult, Row, decide_single, roofline_fraction
from loadgen.diagnose import (
    Metrics,
    kv_bytes_from_log,
    layers_from_log,
    request_params,
    row_from_results,
    sglang_facts,
)

H200 = "llamacpp-h200-gemma3-27b-shape-q4_0"
MIB = 2**20


def test_layers_and_kv_from_real_logs(fixtures_dir: Path) -> None:
    full = fixtures_dir / H200 / "server_c8k_np1.log"
    assert layers_from_log(full) == (63.0, 63.0)
    # Gemma 3: 640 MiB full-attention KV + 624 MiB sliding-window KV at -c 8192.
    assert kv_bytes_from_log(full) == (640 + 624) * MIB
    assert layers_from_log(fixtures_dir / H200 / "run2" / "server_ngl30.log") == (30.0, 63.0)
    cpu = fixtures_dir / "llamacpp-cpu-gemma3-270m" / "server.log"
    assert layers_from_log(cpu) == (None, None)  # default verbosity prints no load lines
    assert layers_from_log(fixtures_dir / "missing.log") == (None, None)


def _stream(send: float, first: float, step: float, n: int, timings_ms: float) -> StreamResult:
    r = StreamResult(t_send=send, done=True)
    r.chunk_times = [first + i * step for i in range(n)]
    r.usage = {"completion_tokens": n, "prompt_tokens": 15}
    r.timings = {"predicted_per_token_ms": timings_ms}
    return r


def test_row_from_results_per_token_convention(fixtures_dir: Path) -> None:
    # Timestamps shaped like comp_1.json: 200 tokens, 28.148 ms per token after the first.
    comp = json.loads((fixtures_dir / "llamacpp-cpu-gemma3-270m" / "comp_1.json").read_text())
    per_tok = comp["timings"]["predicted_per_token_ms"] / 1000
    n = comp["tokens_predicted"]
    results = [_stream(0.0, 0.061, per_tok, n, comp["timings"]["predicted_per_token_ms"])]
    row = row_from_results(
        results, engine="e", step="single", concurrency=1, max_tokens=n, wall=0.061 + per_tok * n
    )
    assert row.tokens_ok and row.completion_tokens == n
    assert row.per_token_ms == pytest.approx(comp["timings"]["predicted_per_token_ms"])
    assert row.server_per_token_ms == pytest.approx(row.per_token_ms)
    assert row.ttft_s == pytest.approx(0.061)
    assert row.per_seq_tok_s == pytest.approx(1 / per_tok)


def test_row_counts_short_and_failed_requests() -> None:
    ok = _stream(0, 0.1, 0.01, 16, 10.0)
    short = _stream(0, 0.1, 0.01, 12, 10.0)
    failed = StreamResult(error="http_error", error_detail="HTTP 503: loading")
    row = row_from_results([ok, short, failed], engine="e", step="concurrency", concurrency=3,
                           max_tokens=16, wall=1.0)  # fmt: skip
    assert not row.tokens_ok
    assert row.completion_tokens == 28
    assert row.error == "1/3 requests failed: HTTP 503: loading"


def test_request_params() -> None:
    p = request_params("llamacpp", 64)
    assert p["temperature"] == 0 and p["ignore_eos"] is True and p["max_tokens"] == 64
    assert p["stream_options"] == {"include_usage": True} and p["cache_prompt"] is False
    assert "cache_prompt" not in request_params("sglang", 64)


def test_sglang_facts() -> None:
    info = {
        "dtype": "bfloat16",
        "kv_cache_dtype": "fp8_e4m3",
        "max_running_requests": 48,
        "internal_states": [
            {"memory_usage": {"weight": 51.12}, "effective_max_running_requests_per_dp": 40}
        ],
    }
    facts = sglang_facts(info)
    assert facts == {
        "quantization": "bfloat16 kv fp8_e4m3",
        "slots": 40,
        "weights_bytes": pytest.approx(51.12 * 2**30),
    }
    assert "quantization" not in sglang_facts({"dtype": "auto", "kv_cache_dtype": "auto"})


def test_metrics_parser_sums_and_labels() -> None:
    text = (
        "# TYPE llmb_gpu_memory_used_bytes gauge\n"
        'llmb_gpu_memory_used_bytes{gpu="0"} 1e9\n'
        'llmb_gpu_memory_used_bytes{gpu="1"} 2e9\n'
        "# TYPE llmb_engine_info gauge\n"
        'llmb_engine_info{engine="a",kind="llamacpp",model="m",quantization="Q4_0",'
        'simulated="false",version="b1"} 1\n'
    )
    m = Metrics(text)
    assert m.total("llmb_gpu_memory_used_bytes") == 3e9
    assert m.total("llmb_gpu_memory_used_bytes", gpu="1") == 2e9
    assert m.total("llmb_model_weights_bytes") is None
    assert (m.labels("llmb_engine_info", engine="a") or {})["quantization"] == "Q4_0"


def test_h200_capture_single_engine_roofline(fixtures_dir: Path) -> None:
    """The H200 capture: 27B Q4_0 weights at 4.8 TB/s; decode from its own timings."""
    req = json.loads((fixtures_dir / H200 / "req_c1.json").read_text())
    timings = req[0]["timings"]
    per_tok_ms = timings["predicted_per_token_ms"]
    e = EngineResult(
        name="h200", kind="llamacpp", weights_bytes=15203778848, bandwidth_bytes_per_s=4.8e12,
        layers_offloaded=63, layers_total=63, memory_source="gpu",
        process_gpu_bytes=17e9,
    )  # fmt: skip
    e.rows.append(
        Row("h200", "single", 1, per_seq_tok_s=1000 / per_tok_ms, per_token_ms=per_tok_ms)
    )
    frac = roofline_fraction(e)
    assert frac is not None
    assert frac == pytest.approx((1000 / per_tok_ms) * 15203778848 / 4.8e12)
    assert frac == pytest.approx(0.30, abs=0.01)  # 94.8 tok/s of a 316 tok/s limit
    assert "the card is at 30 % of its decode limit" in decide_single(e).recommendation
