"""`llmb-loadgen diagnose` against the real CPU llama-server, launched by the tool.

Two context sizes and two concurrencies; the report must have every phase and row,
and the client-side per-token figures must agree with the server's own `timings`
within 5 %.
"""

from __future__ import annotations

import json
import shlex
import urllib.request
from pathlib import Path

import pytest
import yaml

from loadgen.__main__ import main as loadgen_main
from tests.conftest import get_free_port
from tests.test_htmlreport import assert_report_renders

pytestmark = pytest.mark.llamaserver

PHASES = ("baseline", "start", "settle", "first_generation", "after", "weights", "single",
          "concurrency", "context")  # fmt: skip


def test_diagnose_real_llama_server(tmp_path: Path, llama_binary: Path, gemma_model: Path) -> None:
    port = get_free_port()
    metrics_port = get_free_port()
    command = (
        f"{shlex.quote(str(llama_binary))} -m {{model}} -c {{ctx}} -np {{parallel}} "
        "--host 127.0.0.1 --port {port} -t 2 --metrics -lv 4 --log-file {log}"
    )
    config = {
        "engines": [
            {
                "name": "llama",
                "kind": "llamacpp",
                "url": f"http://127.0.0.1:{port}",
                "model_path": str(gemma_model),
                "launch": {"command": command, "ready_timeout_seconds": 120},
            }
        ]
    }
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump(config))
    out = tmp_path / "report"
    code = loadgen_main(
        [
            "diagnose", "--config", str(cfg), "--engine", "llama", "--out", str(out),
            "--contexts", "1024,2048", "--concurrency", "1,2", "--prompt-tokens", "32",
            "--max-tokens", "24", "--settle", "1",
            "--metrics-listen", f"127.0.0.1:{metrics_port}",
        ]
    )  # fmt: skip
    assert code == 0
    doc = json.loads((out / "results.json").read_text())
    engine = doc["engines"][0]
    assert engine["missing"] == ["roofline (no GPU bandwidth: pass --bandwidth-gbs)"]

    # Every phase ran and has a start, an end and a memory reading (host RSS on CPU).
    phases = {p["name"]: p for p in engine["phases"]}
    for name in PHASES:
        assert name in phases, name
        assert phases[name]["end"] >= phases[name]["start"]
    for name in ("start", "settle", "first_generation", "after", "weights"):
        assert phases[name]["memory_bytes"] > 100e6, name  # the 246 MB model is mapped
    assert engine["memory_source"] == "host rss"
    assert engine["load_seconds"] > 0
    # /v1/models meta.size counts the tensors: the file minus its header and vocabulary.
    assert 0.9 * gemma_model.stat().st_size < engine["weights_bytes"] <= gemma_model.stat().st_size
    assert engine["quantization"] == "Q4_K - Medium"

    rows = engine["rows"]
    steps = [(r["step"], r["concurrency"], r["context"]) for r in rows]
    assert steps == [
        ("first", 1, 1024), ("single", 1, 1024), ("concurrency", 2, 1024),
        ("context", 1, 1024), ("context", 1, 2048),
    ]  # fmt: skip
    for r in rows:
        assert r["error"] is None
        assert r["tokens_ok"] and r["completion_tokens"] == 24 * r["requests"]
        assert r["prompt_tokens"] == 32
        assert r["parallel"] == 2
        for key in ("ttft_s", "per_token_ms", "server_per_token_ms", "per_seq_tok_s",
                    "aggregate_tok_s", "memory_bytes"):  # fmt: skip
            assert r[key] is not None and r[key] > 0, (r["step"], key)
        # The client's (last - first token) / (n - 1) agrees with llama.cpp's own timings.
        assert r["per_token_ms"] == pytest.approx(r["server_per_token_ms"], rel=0.05), r
    for r in rows[3:]:
        assert r["loaded_memory_bytes"] > 100e6 and r["load_seconds"] > 0
    # KV cache sizes from the -lv 4 log: a longer context allocates more.
    assert 0 < rows[3]["kv_bytes"] < rows[4]["kv_bytes"]
    # A CPU-only build offloads no layer: that is not a residency problem to fix.
    assert engine["layers_offloaded"] in (None, 0)
    assert doc["verdict"] == "stay and tune"
    assert doc["decision"]["steps"][0]["answer"].startswith("CPU-only run")
    assert "-t <physical cores>" in doc["recommendation"]

    md = (out / "report.md").read_text()
    assert "| llama | context | 2048 |" in md
    assert_report_renders(out)
    # Two launches, each with its own llama.cpp log and stdout file.
    assert sorted(p.name for p in out.glob("llama-c*.log") if ".stdout" not in p.name) == [
        "llama-c1024-np2.log", "llama-c2048-np2.log",
    ]  # fmt: skip
    # The engine is gone: nothing answers on its port any more.
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
