"""`llmb-loadgen diagnose` against the real CPU llama-server (Gemma 3 270M), launched by the tool.

What is real: llama-server, its `-lv 4` log, its /metrics, /slots and /props, the model, the
requests and every number measured from them. What is not: this machine has no GPU, so the
residency test gives the exporter's NVML collector an NVML-shaped GPU file (the exporter's
`gpu.fake_file`, as the simulators use) and lets the real log say how many layers llama.cpp
put on a GPU.
"""

from __future__ import annotations

import json
import shlex
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from cli.loadgen import main as loadgen_main
from core.conditions import VERDICT_INFO, evaluate
from core.signals import Signals
from tests.conftest import get_free_port

pytestmark = pytest.mark.llamaserver


def write_config(tmp_path: Path, binary: Path, model: Path, flags: str, **extra: Any) -> Path:
    port = get_free_port()
    command = (
        f"{shlex.quote(str(binary))} -m {{model}} -c {{ctx}} -np {{parallel}} "
        f"--host 127.0.0.1 --port {{port}} -t 2 --metrics -lv 4 --log-file {{log}} {flags}"
    )
    config: dict[str, Any] = {
        "engines": [
            {
                "name": "llama",
                "kind": "llamacpp",
                "url": f"http://127.0.0.1:{port}",
                "model_path": str(model),
                "launch": {
                    "command": command,
                    "ready_timeout_seconds": 120,
                    # The CPU build repacks weights for AMX otherwise (SIGILL on some hosts).
                    "env": {"LLAMA_ARG_REPACK": "0"},
                },
            }
        ],
        **extra,
    }
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump(config))
    return cfg


def run(cfg: Path, out: Path, *extra: str) -> dict[str, Any]:
    code = loadgen_main(
        ["diagnose", "--config", str(cfg), "--engine", "llama", "--out", str(out),
         "--prompt-tokens", "32", "--max-tokens", "24", "--settle", "0.5", *extra]
    )  # fmt: skip
    assert code == 0
    doc: dict[str, Any] = json.loads((out / "results.json").read_text())
    return doc


def test_full_procedure_on_cpu(
    tmp_path: Path, llama_binary: Path, gemma_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every step, the context sweep up to --max-context; timings agree with the server's."""
    cfg = write_config(tmp_path, llama_binary, gemma_model, "")
    out = tmp_path / "out"
    doc = run(
        cfg, out, "--concurrency", "1,2", "--contexts", "1024,2048", "--rounds", "2",
        "--requests-per-slot", "3", "--slo", "ttft_p50=120s,tpot_p50=60s,e2e_p50=600s",
    )  # fmt: skip
    engine = doc["engines"][0]
    steps = {s["key"]: s for s in doc["decision"]["steps"]}
    # No GPU: residency cannot be measured, and the reason says so.
    assert steps["residency"]["answer"].startswith("not measured: no GPU seen")
    assert engine["memory_source"] == "host rss" and engine["load_seconds"] > 0
    assert 0.9 * gemma_model.stat().st_size < engine["weights_bytes"] <= gemma_model.stat().st_size
    rows = {(r["step"], r["concurrency"], r["context"]): r for r in engine["rows"]}
    single = rows[("single", 1, None)]
    assert len(single["per_seq_rounds"]) == 2 and single["tokens_ok"]
    assert single["completion_tokens"] == 24 * single["requests"]
    # The client's decode speed agrees with llama.cpp's own timings.
    assert single["per_token_ms"] == pytest.approx(single["server_per_token_ms"], rel=0.05)
    assert rows[("concurrency", 2, None)]["aggregate_tok_s"] > 0
    ctx_rows = [r for r in engine["rows"] if r["step"] == "context"]
    assert [r["context"] for r in ctx_rows] == [1024, 2048]
    assert all(r["error"] is None for r in ctx_rows)
    assert ctx_rows[1]["kv_bytes"] > ctx_rows[0]["kv_bytes"] > 0  # from the real -lv 4 log
    assert steps["context"]["answer"] == "every context loaded up to 2048"
    # --slo: goodput per step from the real requests, and the largest load within it (limits
    # wide enough for a 2-core host shared by many jobs: one gap of 7.7 s was seen there).
    # p50 terms: 6 requests bound a p50 (a p99 would need 368), 3 per slot x 2 rounds.
    slo = doc["decision"]["slo"]
    assert slo["max_within"] == {"llama": 2}
    for s in slo["steps"]["llama"]:
        assert s["requests"] >= 6 and s["needs"] == {}
        assert s["met"] is True and s["share"] == 1.0 and s["requests"] == s["within"]
        assert s["goodput_rps"] > 0 and s["goodput_tok_s"] == pytest.approx(24 * s["goodput_rps"])
        assert all(v is not None and v > 0 for v in s["observed"].values())
    assert steps["slo"]["answer"].startswith("at ttft_p50=120s,tpot_p50=60s,e2e_p50=600s: llama")
    # The verdict is the decision core's on the signals the run recorded.
    verdict = doc["verdict"]["llama"]
    assert verdict == evaluate(Signals(**engine["signals"])).name
    assert verdict in ("decode_below_card_limit", "scheduling_bound")
    printed = capsys.readouterr().out
    assert printed.startswith(f"verdict         llama: {verdict}\n")
    # The engine is gone: nothing answers on its port any more.
    url = yaml.safe_load(cfg.read_text())["engines"][0]["url"]
    with pytest.raises(OSError):
        urllib.request.urlopen(f"{url}/health", timeout=2)


def test_small_slot_contexts_under_long_prompts_are_kv_saturated(
    tmp_path: Path, llama_binary: Path, gemma_model: Path
) -> None:
    """-c 512 -np 2: 256 tokens a slot; 200-token prompts asking 100 tokens are cut short."""
    cfg = write_config(tmp_path, llama_binary, gemma_model, "")
    doc = run(
        cfg, tmp_path / "out", "--concurrency", "1,2", "--contexts", "512",
        "--kv-prompt-tokens", "200", "--max-tokens", "100",
    )  # fmt: skip
    assert doc["verdict"] == {"llama": "kv_saturated"}
    engine = doc["engines"][0]
    kv = next(r for r in engine["rows"] if r["step"] == "kv_pressure")
    assert kv["concurrency"] == 2 and kv["truncated"] == 2
    # llama.cpp logged the truncation; the exporter's log parser counted it.
    assert kv["kv_events"] >= 2
    assert engine["signals"]["kv_pressure_increase"] > 0
    step = next(s for s in doc["decision"]["steps"] if s["key"] == "kv_pressure")
    assert step["decisive"] and "2 cut short" in step["answer"]
    assert doc["action"] == VERDICT_INFO["kv_saturated"].action


def test_weights_in_host_memory_next_to_a_gpu_are_not_resident(
    tmp_path: Path, llama_binary: Path, gemma_model: Path
) -> None:
    """A GPU is present (an NVML-shaped file for the exporter's NVML collector), the engine
    holds none of its weights on it: the CPU build keeps every layer in host memory whatever
    `-ngl` asks, and its real log shows only CPU buffers. The exporter reports the engine's
    GPU memory as an explicit 0 against the weight bytes, and its log's host-only buffers are
    0 on the GPU (core.rules): both are the residency evidence."""
    gpu_file = tmp_path / "gpu.json"
    gpu_file.write_text(json.dumps(FAKE_GPU))
    cfg = write_config(
        tmp_path, llama_binary, gemma_model, "-ngl 4",
        gpu={"fake_file": str(gpu_file), "sample_interval_seconds": 0.1},
    )  # fmt: skip
    doc = run(cfg, tmp_path / "out", "--concurrency", "1", "--kv-prompt-tokens", "0",
              "--contexts", "1024")  # fmt: skip
    engine = doc["engines"][0]
    assert doc["verdict"] == {"llama": "weights_not_resident"}
    assert doc["recommendation"] == "fix_memory_first"
    assert engine["process_gpu_bytes"] == 0 and engine["gpu_buffer_bytes"] == 0
    assert engine["signals"]["weights_memory_ratio"] == 0
    assert engine["signals"]["weights_buffers_ratio"] == 0  # the log's CPU buffers alone
    assert engine["bandwidth_bytes_per_s"] == pytest.approx(4.8e12, rel=0.01)  # H200 table
    residency = doc["decision"]["steps"][0]
    assert residency["decisive"] and residency["answer"].startswith("no: buffers, memory")


# One idle H200 in the NVML shape the exporter's fake backend reads (simulator/gpu_state.py).
FAKE_GPU: dict[str, Any] = {
    "driver": "580.159.04",
    "nvml": "13.580.159.04",
    "devices": [
        {
            "index": 0,
            "name": "NVIDIA H200",
            "uuid": "GPU-00000000-0000-4000-8000-000000000200",
            "mem": {"total": 150754820096, "used": 9240576, "free": 150745579520},
            "mem_v2": {"total": 150754820096, "used": 9240576, "free": 150745579520,
                       "reserved": 0},
            "util": {"gpu": 0, "memory": 0},
            "bus_width": 6016,
            "power_mw": 75000,
            "temp": 36,
            "max_mem_clock_mhz": 3201,
            "mem_clock_mhz": 3201,
            "sm_clock_mhz": 1980,
            "procs": [],
        }
    ],
}  # fmt: skip
