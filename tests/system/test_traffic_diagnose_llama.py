"""`diagnose --traffic` on the real llama-server (CPU build, Gemma 3 270M): a small Mooncake
trace with shared `hash_ids`, replayed one request at a time, gives a verdict, the shared
blocks as cached tokens in the engine's own counters, and every request's usage as the trace
asked. The GPU is an NVML-shaped file, as in tests/system/test_diagnose_running_llama.py."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from cli.loadgen import main as loadgen_main
from core.conditions import VERDICTS
from loadgen.traffic.spec import load_traffic
from tests.plugins.llama import LlamaServer
from tests.system.test_diagnose_llama import FAKE_GPU

pytestmark = [pytest.mark.llamaserver, pytest.mark.timeout(300)]

# Four short requests, three of which open with block 0 (512 tokens): sent one after the
# other (--no-schedule, --concurrency 1), each finds the block in the cache.
ROWS = [
    {"timestamp": 0, "input_length": 520, "output_length": 4, "hash_ids": [0, 100]},
    {"timestamp": 100, "input_length": 530, "output_length": 6, "hash_ids": [0, 101]},
    {"timestamp": 200, "input_length": 80, "output_length": 3, "hash_ids": [200]},
    {"timestamp": 300, "input_length": 560, "output_length": 5, "hash_ids": [0, 102]},
]


def test_diagnose_answers_under_a_trace_with_shared_prefixes(
    tmp_path: Path, llama_server: Callable[..., LlamaServer]
) -> None:
    # --swa-full: Gemma 3's sliding window otherwise keeps llama-server from reusing a
    # cached prefix followed by other text (tests/system/test_traffic_llama.py).
    server = llama_server("--swa-full", ctx=4096, parallel=1)
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    gpu = tmp_path / "gpu.json"
    gpu.write_text(json.dumps(FAKE_GPU))
    config = tmp_path / "gpu.yaml"
    config.write_text(yaml.safe_dump({"gpu": {"fake_file": str(gpu)}}))
    out = tmp_path / "out"
    code = loadgen_main(["diagnose", "--url", server.url, "--config", str(config),
                         "--out", str(out), "--concurrency", "1", "--traffic", str(trace),
                         "--no-schedule"])  # fmt: skip
    assert code == 0
    doc = json.loads((out / "results.json").read_text())
    (engine,) = doc["engines"]
    assert doc["verdict"][engine["name"]] in VERDICTS
    (row,) = [r for r in engine["rows"] if r["step"] == "concurrency"]
    assert row["requests"] == 4 and row["requests_failed"] == 0
    # The engine's own counters: three of the four prompts open with the cached block.
    assert row["prompt_cache_hit_ratio"] is not None and row["prompt_cache_hit_ratio"] > 0.3
    assert row["tokens_ok"] is True and row["tokens_off"] == 0
    traffic = load_traffic(str(trace))
    records = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    assert sorted(r["index"] for r in records) == [0, 1, 2, 3]
    for rec in records:
        asked = traffic.requests[rec["index"]]
        # Token-exact (±1: a template may merge a token, reported as run does).
        assert abs(rec["prompt_tokens"] - asked.prompt_tokens) <= 1, rec
        assert rec["prompt_tokens_target"] == asked.prompt_tokens
        assert rec["completion_tokens"] == asked.output_tokens, rec
    # The counters agree with the engine's per-request timings (cache_n) over the step.
    cached = sum(r["cached_tokens"] for r in records) / sum(r["prompt_tokens"] for r in records)
    assert row["prompt_cache_hit_ratio"] == pytest.approx(cached, abs=0.02)
    mix = engine["traffic"]
    assert mix["requests"] == 4 and mix["scheduled"] is False
    assert mix["shared_prefix_share"] == pytest.approx(1024 / 1690)
