"""`diagnose --url` decides residency on SGLang 0.5.11, which has no weight-memory series.

The engine is the real H200 capture (tests/fixtures/sglang-0.5.11-h200) served over local
HTTP; the GPU is an NVML-shaped file sized from the same run (the exporter's own readings
of it in `exporter-busy.txt`: card total, used, reserved and the scheduler process, pid 750,
which the collector attributes to the engine from the `pid` label of its metrics).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from config.settings import parse_config
from diagnose.options import Options
from diagnose.phase_marks import PhasePublisher
from diagnose.procedure import Diagnoser
from tests.integration import test_sglang_collector as base
from tests.integration.test_sglang_collector import FakeSGLang
from tests.unit.test_sglang_versions import V0511, routes_0511

fake = base.fake
GIB = 1 << 30


def capture_value(name: str) -> float:
    """One series of the exporter's reading of the H200 run."""
    for line in (V0511 / "exporter-busy.txt").read_text().splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(name)


def h200_gpu_file(path: Path, process_bytes: float, pid: int = 750) -> Path:
    total = capture_value("llmb_gpu_memory_total_bytes")
    reserved = capture_value("llmb_gpu_memory_reserved_bytes")
    used = (
        capture_value("llmb_gpu_memory_used_bytes")
        - capture_value("llmb_gpu_process_memory_used_bytes")
        + process_bytes
    )
    doc = {
        "t": 0.0,
        "driver": "580.159.04",
        "nvml": "13.580.159.04",
        "devices": [
            {
                "index": 0,
                "name": "NVIDIA H200",
                "uuid": "GPU-38425928-5f32-65f2-7226-cfb98a838032",
                "mem": {"total": total, "used": used + reserved, "free": total - used - reserved},
                "mem_v2": {
                    "total": total,
                    "used": used,
                    "free": total - used - reserved,
                    "reserved": reserved,
                },
                "util": {"gpu": 11, "memory": 5},
                "bus_width": 6016,
                "power_mw": 200000,
                "temp": 45,
                "max_mem_clock_mhz": 3201,
                "mem_clock_mhz": 3201,
                "sm_clock_mhz": 1980,
                "procs": [{"pid": pid, "used": int(process_bytes), "cmdline": "sglang::scheduler"}],
                "memoryinfo_call_us": 6.0,
                "procs_call_us": 30.0,
            }
        ],
    }
    path.write_text(json.dumps(doc))
    return path


async def run_diagnose(fake: FakeSGLang, tmp_path: Path, process_bytes: float, **extra: Any) -> Any:
    gpu_file = h200_gpu_file(tmp_path / "gpu.json", process_bytes)
    cfg = parse_config(
        {
            "engines": [{"name": "sgl", "kind": "sglang", "url": fake.url, **extra}],
            "gpu": {"fake_file": str(gpu_file), "sample_interval_seconds": 0.1},
        },
        environ={},
    )
    opts = Options(concurrency=[1], contexts=[], kv_prompt_tokens=0, gpu=cfg.gpu)
    # Only the facts and the residency step: the capture cannot generate.
    engine = cfg.engines[0]
    d = Diagnoser(engine, opts, tmp_path / "out", PhasePublisher())
    await d.monitor.attach(engine, engine.log_file, None)
    d.monitor.start()
    try:
        await asyncio.sleep(1.0)  # a few samples of the embedded exporter
        await d.read_facts()
        await d.measure_step("residency")
    finally:
        await d.monitor.stop()
    return d.view(), d.steps


async def test_residency_on_the_h200_capture_names_its_sources(
    fake: FakeSGLang, tmp_path: Path
) -> None:
    routes_0511(fake)
    result, steps = await run_diagnose(
        fake, tmp_path, capture_value("llmb_gpu_process_memory_used_bytes")
    )
    residency = steps["residency"]
    assert residency.answer.startswith("yes, from "), residency.answer
    # The engine's own weight figure (/server_info memory_usage: 0.78 GiB) is all on the GPU,
    # and what the process holds beyond its KV pool covers the weights.
    assert residency.numbers["weights_buffers_ratio"] == 1.0
    beyond = (46059749376 - 40.91 * GIB) / (0.78 * GIB)
    assert residency.numbers["weights_memory_beyond_kv_ratio"] == pytest.approx(beyond)
    assert "/server_info` memory_usage" in residency.answer
    assert "minus the KV pool" in residency.answer
    assert not residency.decisive
    assert result.weights_bytes == 0.78 * GIB


async def test_offloaded_weights_beyond_the_pool_are_not_resident(
    fake: FakeSGLang, tmp_path: Path
) -> None:
    # No weight figure from the engine (no memory_usage, no log): the weights come from the
    # model folder's safetensors headers, the KV pool from the engine's K + V, and the
    # process holds only 0.2 GiB beyond its pool for 0.72 GiB of weights.
    routes_0511(fake)
    info = json.loads((V0511 / "server_info.json").read_text())
    del info["internal_states"][0]["memory_usage"]
    fake.set("/server_info", 200, json.dumps(info))
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text((V0511 / "model" / "config.json").read_text())
    write_safetensors_header(model / "model.safetensors", params=386_568_064)
    log_file = tmp_path / "sglang.log"
    kv_lines = [ln for ln in (V0511 / "server.log").read_text().splitlines() if "KV Cache" in ln]
    log_file.write_text("\n".join(kv_lines) + "\n")
    result, steps = await run_diagnose(
        fake,
        tmp_path,
        40.92 * GIB + 0.2 * GIB,
        model_path=str(model),
        log_file=str(log_file),
    )
    residency = steps["residency"]
    assert residency.answer.startswith("no: memory_beyond_kv"), residency.answer
    assert residency.decisive
    assert result.weights_bytes == 386_568_064 * 2


def write_safetensors_header(path: Path, params: int) -> None:
    """A safetensors file's header only (one bf16 tensor of `params` values): the exporter
    reads sizes from headers and never the data."""
    header = {
        "model.embed_tokens.weight": {
            "dtype": "BF16",
            "shape": [params],
            "data_offsets": [0, params * 2],
        }
    }
    raw = json.dumps(header).encode()
    path.write_bytes(len(raw).to_bytes(8, "little") + raw)
