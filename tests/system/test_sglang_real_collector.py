"""The SGLang collector against the real SGLang 0.5.11 CPU server (tests/plugins/sglang.py):
its warm-up, and residency decided by diagnose with an NVML-shaped GPU file sized from the
server's own numbers (this machine has no GPU).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from config.settings import EngineConfig, parse_config
from diagnose.options import Options
from diagnose.phase_marks import PhasePublisher
from diagnose.procedure import Diagnoser
from exporter.attribution import Attribution
from exporter.collectors.sglang.collector import SGLangCollector
from exporter.collectors.sglang.memory import checkpoint_weight_bytes
from model.geometry import geometry_from_hf_config
from tests.plugins.sglang import MODEL_DIR, SGLANG_SERVER, SglangServer
from tests.unit.test_sglang_residency import h200_gpu_file

pytestmark = [pytest.mark.sglang, pytest.mark.timeout(900)]
GIB = 1 << 30


def _value(scrape: Any, name: str) -> float | None:
    for fam in scrape.metrics:
        for s in fam.samples:
            if s.name == name:
                return float(s.value)
    return None


async def test_warm_up_of_the_real_server_answers_fast_with_loading(
    sglang_launcher: Callable[..., SglangServer],
) -> None:
    server = sglang_launcher(SGLANG_SERVER, wait=False)
    engine = EngineConfig(name="sg", kind="sglang", url=server.url)
    seen: list[tuple[float, float | None, float | None, list[str]]] = []
    async with httpx.AsyncClient() as client:
        collector = SGLangCollector(engine, client, 5.0, Attribution([engine]))
        deadline = time.monotonic() + 420
        while time.monotonic() < deadline:
            assert server.proc.poll() is None, server.log_text()[-3000:]
            started = time.perf_counter()
            scrape = await collector.collect()
            took = time.perf_counter() - started
            reasons: list[str] = [e.reason for e in scrape.errors]
            seen.append(
                (
                    took,
                    _value(scrape, "llmb_engine_up"),
                    _value(scrape, "llmb_engine_loading"),
                    reasons,
                )
            )
            if seen[-1][1] == 1.0:
                break
            await asyncio.sleep(0.3)
        await collector.close()
    answering = [s for s in seen if "connect" not in s[3]]
    # Every scrape of a server that answers HTTP took under a second.
    assert answering and max(s[0] for s in answering) < 1.0, answering
    # While it warmed up: loading, not up (so no verdict, no LLMEngineDown), and no error.
    loading = [s for s in answering if s[2] == 1.0]
    assert loading, answering
    assert all(s[1] == 0.0 and s[3] == [] for s in loading)
    # Then up, after the server itself said so (its log: "fired up").
    assert seen[-1][1] == 1.0 and seen[-1][2] == 0.0
    assert "The server is fired up and ready to roll!" in server.log_text()


async def _scheduler_pid(url: str) -> int:
    async with httpx.AsyncClient() as client:
        text = (await client.get(url + "/metrics", timeout=10)).text
    match = re.search(r'sglang:num_retracted_reqs\{[^}]*pid="(\d+)"', text)
    assert match, text[:500]
    return int(match.group(1))


async def _residency(server: SglangServer, tmp_path: Path, process_bytes: float) -> Any:
    gpu_file = h200_gpu_file(
        tmp_path / "gpu.json", process_bytes, pid=await _scheduler_pid(server.url)
    )
    cfg = parse_config(
        {
            "engines": [{"name": "sg", "kind": "sglang", "url": server.url}],
            "gpu": {"fake_file": str(gpu_file), "sample_interval_seconds": 0.1},
        },
        environ={},
    )
    engine = cfg.engines[0]
    d = Diagnoser(
        engine, Options(concurrency=[1], contexts=[], gpu=cfg.gpu), tmp_path / "o", PhasePublisher()
    )
    await d.monitor.attach(engine, None, None)
    d.monitor.start()
    try:
        await asyncio.sleep(1.5)
        await d.read_facts()
        await d.measure_step("residency")
    finally:
        await d.monitor.stop()
    return d.steps["residency"]


async def test_residency_on_the_real_server_with_a_gpu_sized_from_it(
    sglang_server: SglangServer, tmp_path_factory: pytest.TempPathFactory
) -> None:
    async with httpx.AsyncClient() as client:
        info = (await client.get(sglang_server.url + "/server_info", timeout=30)).json()
    usage = info["internal_states"][0]["memory_usage"]
    kv = usage["kvcache"] * GIB
    # The weight figure is a memory delta, 0.00-0.01 GiB on a CPU: 0 is "not known", and the
    # weights then come from the model's config.json (random weights: no safetensors).
    weights = usage["weight"] * GIB or checkpoint_weight_bytes(geometry_from_hf_config(MODEL_DIR))
    assert weights and kv > 0, usage
    # All weights on the "GPU": its process holds the pool, the weights and a CUDA context.
    ok = await _residency(sglang_server, tmp_path_factory.mktemp("ok"), kv + weights + 0.3 * GIB)
    assert ok.answer.startswith("yes, from "), ok.answer
    assert ok.numbers["weights_buffers_ratio"] in (None, 1.0)
    assert ok.numbers["weights_memory_beyond_kv_ratio"] == pytest.approx(
        (weights + 0.3 * GIB) / weights
    )
    assert "minus the KV pool" in ok.answer
    # Half of the weights missing beyond the pool: not resident, and that is decisive.
    bad = await _residency(sglang_server, tmp_path_factory.mktemp("bad"), kv + 0.5 * weights)
    assert bad.answer.startswith("no: memory_beyond_kv"), bad.answer
    assert bad.decisive
