"""End to end: simulators under load -> the real exporter (subprocess) -> normalized series."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import yaml

from tests.conftest import get_free_port
from tests.integration.test_sim_scenarios import llama_load, poll, sglang_load
from tests.paths import ROOT


def series(text: str, name: str, engine: str) -> float | None:
    m = re.search(rf'^{name}{{[^}}]*engine="{engine}"[^}}]*}} (\S+)$', text, re.M)
    return float(m.group(1)) if m else None


@pytest.fixture
async def exporter(tmp_path: Path) -> AsyncIterator:
    """Factory: start the exporter for a list of simulator handles; returns its /metrics URL."""
    procs: list[asyncio.subprocess.Process] = []

    async def start(handles: dict[str, object]) -> str:
        port = get_free_port()
        engines = []
        for name, h in handles.items():
            engine = {"name": name, "kind": h.sim.kind, "url": h.url}
            if h.log_file is not None:  # the log tells the exporter about --kv-unified
                engine["log_file"] = str(h.log_file)
            engines.append(engine)
        config = {
            "listen": f"127.0.0.1:{port}",
            "engines": engines,
            "gpu": {"fake_file": [str(h.gpu_state_file) for h in handles.values()]},
        }
        path = tmp_path / f"exporter-{port}.yaml"
        path.write_text(yaml.safe_dump(config))
        log = (tmp_path / f"exporter-{port}.log").open("wb")
        procs.append(
            await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "exporter",
                "--config",
                str(path),
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
        url = f"http://127.0.0.1:{port}/metrics"
        async with httpx.AsyncClient(timeout=5) as c:
            for _ in range(100):
                try:
                    if (await c.get(url)).status_code == 200:
                        return url
                except httpx.TransportError:
                    pass
                await asyncio.sleep(0.1)
        raise AssertionError("exporter did not start")

    yield start
    for proc in procs:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), timeout=10)


async def test_kv_saturated_and_scheduling_bound_via_exporter(sim_server, exporter) -> None:
    # kv-llama, kv-sg, sched-llama, sched-sg: both scenarios on both engines.
    handles = {
        f"{prefix}-{short}": await sim_server(kind, scenario, time_scale=0.1)
        for prefix, scenario in (("kv", "kv_saturated"), ("sched", "scheduling_bound"))
        for kind, short in (("llamacpp", "llama"), ("sglang", "sg"))
    }
    url = await exporter(handles)
    clients = {n: httpx.AsyncClient(base_url=h.url, timeout=60) for n, h in handles.items()}
    async with httpx.AsyncClient(timeout=60) as c:
        tasks = []
        for name, c2 in clients.items():
            if name == "kv-llama":
                tasks += llama_load(c2, 8, 900, 400)
            elif name == "kv-sg":
                tasks += sglang_load(c2, 12, 1500, 600)
            elif name == "sched-llama":
                tasks += llama_load(c2, 8, 200, 300)
            else:
                tasks += sglang_load(c2, 8, 200, 300)
        seen: set[str] = set()

        async def signatures() -> bool:
            text = (await c.get(url)).text
            usage = {n: series(text, "llmb_engine_kv_cache_usage_ratio", n) for n in handles}
            waiting = {n: series(text, "llmb_engine_requests_waiting", n) for n in handles}
            for n in ("kv-llama", "kv-sg"):
                if (usage[n] or 0) >= 0.9 and (waiting[n] or 0) > 0:
                    seen.add(n)
            for n in ("sched-llama", "sched-sg"):
                if (waiting[n] or 0) > 0 and usage[n] is not None and usage[n] < 0.5:
                    seen.add(n)
            return len(seen) == 4

        try:
            assert await poll(signatures, tries=300), seen
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for client in clients.values():
                await client.aclose()


async def test_weights_not_resident_via_exporter(sim_server, exporter) -> None:
    handles = {"off-llama": await sim_server("llamacpp", "weights_not_resident")}
    url = await exporter(handles)
    async with httpx.AsyncClient(timeout=30) as c:
        for _ in range(50):
            text = (await c.get(url)).text
            proc = series(text, "llmb_engine_process_gpu_memory_bytes", "off-llama")
            weights = series(text, "llmb_model_weights_bytes", "off-llama")
            if proc is not None and weights is not None:
                break
            await asyncio.sleep(0.1)
    assert proc is not None and weights is not None
    assert proc < weights
    assert 'simulated="true"' in text


def labelled(text: str, name: str, engine: str) -> list[tuple[str, float]]:
    """(label text, value) of every sample of `name` for `engine`."""
    pattern = rf'^{name}{{([^}}]*engine="{engine}"[^}}]*)}} (\S+)$'
    return [(labels, float(v)) for labels, v in re.findall(pattern, text, re.M)]


async def test_moe_kv_and_spec_presets_via_exporter(sim_server, exporter) -> None:
    """The exporter reads the model structure from the GGUF the simulator serves, the KV type
    from its log, and the accept length of its draft; the numbers are the presets'."""
    from simulator import scenarios

    presets = (
        ("moe", "moe_below_limit"),
        ("kvq", "kv_quantized"),
        ("spec", "spec_decode"),
        ("host", "moe_experts_on_host"),
    )
    handles = {name: await sim_server("llamacpp", p, time_scale=0.2) for name, p in presets}
    url = await exporter(handles)
    async with httpx.AsyncClient(base_url=handles["spec"].url, timeout=60) as c:
        [reply] = await asyncio.gather(*llama_load(c, 1, 64, 96))
    timings = reply.json()["timings"]
    accept = 1 + timings["draft_n_accepted"] / handles["spec"].sim.engine.stats.spec_drafts

    async with httpx.AsyncClient(timeout=30) as c:

        async def ready() -> bool:
            text = (await c.get(url)).text
            return series(text, "llmb_engine_spec_accept_length", "spec") is not None and (
                series(text, "llmb_model_weights_routed_experts_bytes", "moe") is not None
            )

        assert await poll(ready, tries=500)
        text = (await c.get(url)).text
    m = scenarios.QWEN3_30B_A3B_Q8
    assert series(text, "llmb_model_weights_routed_experts_bytes", "moe") == m.routed_bytes
    always = m.weights_bytes - m.routed_bytes
    assert series(text, "llmb_model_weights_always_read_bytes", "moe") == always
    assert series(text, "llmb_model_experts", "moe") == 128
    assert series(text, "llmb_model_experts_used", "moe") == 8
    assert series(text, "llmb_model_token_embedding_row_bytes", "moe") == m.token_row_bytes
    # The 8-bit KV cache: the exporter's estimate from the logged types is the buffer.
    [(labels, _)] = labelled(text, "llmb_model_kv_cache_type_info", "kvq")
    assert 'type_k="q8_0"' in labels and 'type_v="q8_0"' in labels
    kvq = handles["kvq"].sim.engine
    estimated = series(text, "llmb_model_kv_cache_bytes_estimated", "kvq")
    assert estimated == pytest.approx(kvq.kv_pool_bytes, abs=1)
    per_token = series(text, "llmb_model_kv_bytes_per_token_estimated", "kvq")
    assert per_token == pytest.approx(kvq.kv_bytes_per_token)
    # Speculative decoding: tokens per target step, and the draft's weights apart.
    assert series(text, "llmb_engine_spec_accept_length", "spec") == pytest.approx(accept)
    draft = series(text, "llmb_model_draft_weights_bytes", "spec")
    assert draft == pytest.approx(scenarios.QWEN3_06B_Q8_BYTES, rel=1e-4)
    # --n-cpu-moe 20: the experts of 20 layers in host memory, found from the host buffers.
    assert series(text, "llmb_engine_experts_host_layers", "host") == 20
    assert series(text, "llmb_engine_experts_host_bytes", "host") == 20 * m.routed_layer_bytes
    assert series(text, "llmb_engine_experts_host_layers", "moe") in (None, 0)
    # The host's memory bandwidth, measured once at exporter start (the bound's numerator).
    found = re.findall(
        r'^llmb_host_memory_bandwidth_bytes_per_second\{[^}]*source="measured"[^}]*\} (\S+)$',
        text,
        re.M,
    )
    assert len(found) == 1 and 1e8 < float(found[0]) < 1e13
