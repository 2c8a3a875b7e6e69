"""SGLangCollector on SGLang 0.5.11 (real H200 capture) beside 0.5.23, and while it warms up."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web

from exporter.collectors import Scrape
from exporter.collectors.sglang.collector import SGLangCollector
from exporter.collectors.sglang.log import SGLangLog
from tests.conftest import get_free_port
from tests.integration import test_sglang_collector as base
from tests.integration.test_sglang_collector import (
    ENDPOINTS,
    METRICS,
    FakeSGLang,
    assert_values,
    clean_scrape,
    make,
    names,
    scrape_of,
    val,
)
from tests.paths import FIXTURES

FIX = FIXTURES
V0511 = FIX / "sglang-0.5.11-h200"
MODEL = V0511 / "model"
GIB = 1 << 30
# The fixtures of the 0.5.23 collector tests: a fixture-file SGLang and an HTTP client.
fake = base.fake
client = base.client


async def collect_fast(collector: SGLangCollector) -> Scrape:
    """One collection that does not wait for the blocked endpoint (the timeout is 5 s)."""
    started = time.perf_counter()
    scrape = await collector.collect()
    assert time.perf_counter() - started < 1.0
    return scrape


def routes_0511(fake: FakeSGLang, metrics: str = "metrics-busy-c64.txt") -> None:
    fake.routes.clear()
    fake.set("/health", 200, "")
    fake.set("/metrics", 200, (V0511 / metrics).read_text())
    fake.set("/server_info", 200, (V0511 / "server_info.json").read_text())
    fake.set("/model_info", 200, (V0511 / "get_model_info.json").read_text())
    fake.set("/v1/models", 200, (V0511 / "v1_models.json").read_text())


def info_0511(**change: Any) -> dict[str, Any]:
    info: dict[str, Any] = json.loads((V0511 / "server_info.json").read_text())
    info.update(change)
    return info


async def test_0511_capture_maps_every_known_series(
    fake: FakeSGLang, client: httpx.AsyncClient
) -> None:
    routes_0511(fake)
    collector, _ = make(fake.url, client, model_path=MODEL)
    scrape = await clean_scrape(collector)
    assert_values(
        scrape,
        {
            "llmb_engine_requests_running": 64,
            "llmb_engine_requests_waiting": 0,
            "llmb_engine_slots": 4096,
            "llmb_engine_context_tokens": 8192,
            "llmb_engine_kv_cache_capacity_tokens": 3574979,
            "llmb_engine_kv_cache_used_tokens": 13536,
            # token_usage reads 0.0 (rounded to two decimals); full_token_usage is the real ratio.
            "llmb_engine_kv_cache_usage_ratio": pytest.approx(13536 / 3574979),
        },
    )
    # No weight/KV memory series in 0.5.11: /server_info internal_states memory_usage.
    assert val(scrape, "llmb_engine_model_buffer_bytes", device="gpu") == 0.78 * GIB
    assert val(scrape, "llmb_model_weights_bytes") == 0.78 * GIB
    assert val(scrape, "llmb_engine_kv_cache_bytes", device="gpu") == 40.91 * GIB
    # The engine's K + V (2 x 20.46 GiB) and the architecture's estimate agree.
    estimated = val(scrape, "llmb_model_kv_cache_bytes_estimated")
    assert estimated == 12288 * (3574979 + 1)
    assert estimated == pytest.approx(40.91 * GIB, rel=0.002)
    # kv_cache_dtype auto, dtype auto: the checkpoint's torch_dtype.
    key = ("llmb_model_kv_cache_type_info", "bfloat16", "bfloat16")
    assert key in {
        (n, dict(lab)["type_k"], dict(lab)["type_v"])
        for n, lab in _flat_keys(scrape)
        if n == "llmb_model_kv_cache_type_info"
    }
    got = names(scrape)
    # Only a gauge of retractions in 0.5.11: the count is not known, so no series at all.
    assert "llmb_engine_kv_pressure_events_total" not in got
    # No startup_time_seconds; no speculative decoding (spec_accept_length reads 0).
    assert "llmb_engine_load_seconds" not in got
    assert "llmb_engine_spec_accept_length" not in got
    assert val(scrape, "llmb_engine_generation_tokens_total") == 73784
    assert val(scrape, "llmb_engine_decode_tokens_total") == 44943


def _flat_keys(scrape: Any) -> list[tuple[str, tuple[tuple[str, str], ...]]]:
    return [(s.name, tuple(sorted(s.labels.items()))) for m in scrape.metrics for s in m.samples]


async def test_0511_underscore_spelling_gives_the_same_series(
    fake: FakeSGLang, client: httpx.AsyncClient
) -> None:
    routes_0511(fake)
    collector, _ = make(fake.url, client, model_path=MODEL)
    colon = sorted(_flat_values(await collector.collect()))
    text = (V0511 / "metrics-busy-c64.txt").read_text()
    fake.set("/metrics", 200, re.sub(r"^sglang:", "sglang_", text, flags=re.MULTILINE))
    collector, _ = make(fake.url, client, model_path=MODEL)
    assert sorted(_flat_values(await collector.collect())) == colon


def _flat_values(scrape: Any) -> list[tuple[str, tuple[tuple[str, str], ...], float]]:
    return [
        (s.name, tuple(sorted(s.labels.items())), s.value)
        for m in scrape.metrics
        for s in m.samples
    ]


async def test_0511_memory_from_the_server_log(
    fake: FakeSGLang, client: httpx.AsyncClient, tmp_path: Path
) -> None:
    # A /server_info without memory_usage: the log's load and KV lines say it.
    info = info_0511()
    del info["internal_states"][0]["memory_usage"]
    routes_0511(fake)
    fake.set("/server_info", 200, json.dumps(info))
    log_file = tmp_path / "sglang.log"
    log_file.write_text("")
    collector, _ = make(fake.url, client, log_file=log_file)
    scrape = await collector.collect()
    assert "llmb_engine_model_buffer_bytes" not in names(scrape)
    # The server writes its log as it starts; the collector follows it.
    log_file.write_text((V0511 / "server.log").read_text())
    scrape = await collector.collect()
    assert val(scrape, "llmb_engine_model_buffer_bytes", device="gpu") == 0.78 * GIB
    assert val(scrape, "llmb_engine_kv_cache_bytes", device="gpu") == (20.46 + 20.46) * GIB


def test_log_reader_takes_the_last_instance_and_mla_lines(tmp_path: Path) -> None:
    log_file = tmp_path / "s.log"
    real = (V0511 / "server.log").read_text()
    restarted = real.replace("mem usage=0.78 GB", "mem usage=1.50 GB").replace(
        "K size: 20.46 GB, V size: 20.46 GB", "KV size: 3.25 GB"
    )
    log_file.write_text(real + restarted)
    state = SGLangLog(log_file).poll()
    assert state.weights_bytes == 1.5 * GIB
    assert state.kv_bytes == 3.25 * GIB
    assert state.kv_tokens == 3574979
    # A new, shorter log (rotated or truncated) is read from its start.
    reader = SGLangLog(log_file)
    reader.poll()
    log_file.write_text("[x] Load weight end. elapsed=1 s, mem usage=2.00 GB.\n")
    assert reader.poll().weights_bytes == 2 * GIB
    assert reader.state.kv_bytes is None


async def test_0523_retraction_counter_zero_only_where_the_release_has_it(
    fake: FakeSGLang, client: httpx.AsyncClient
) -> None:
    # 0.5.23 idle: gauge present, counter not yet created: a true zero.
    scrape = await scrape_of(fake, client, (METRICS / "metrics-idle.txt").read_text())
    assert val(scrape, "llmb_engine_kv_pressure_events_total", event="retracted") == 0
    # The same exposition from a server that says 0.5.11: unknown, so absent.
    info = json.loads((ENDPOINTS / "server_info.json").read_text())
    info["version"] = "0.5.11"
    fake.set("/server_info", 200, json.dumps(info))
    collector, _ = make(fake.url, client)
    scrape = await collector.collect()
    assert "llmb_engine_kv_pressure_events_total" not in names(scrape)


async def test_spec_accept_length_only_with_speculative_decoding(
    fake: FakeSGLang, client: httpx.AsyncClient
) -> None:
    routes_0511(fake)
    text = (V0511 / "metrics-busy-c64.txt").read_text()
    fake.set("/metrics", 200, re.sub(r"(sglang:spec_accept_length\{.*\}) 0\.0", r"\1 2.75", text))
    collector, _ = make(fake.url, client)
    assert "llmb_engine_spec_accept_length" not in names(await collector.collect())
    fake.set("/server_info", 200, json.dumps(info_0511(speculative_algorithm="EAGLE")))
    collector, _ = make(fake.url, client)
    assert val(await collector.collect(), "llmb_engine_spec_accept_length") == 2.75
    # On, but no step verified yet (0): not known.
    routes_0511(fake)
    fake.set("/server_info", 200, json.dumps(info_0511(speculative_algorithm="EAGLE")))
    collector, _ = make(fake.url, client)
    assert "llmb_engine_spec_accept_length" not in names(await collector.collect())


async def test_kv_cache_type_from_kv_cache_dtype(
    fake: FakeSGLang, client: httpx.AsyncClient
) -> None:
    routes_0511(fake)
    fake.set("/server_info", 200, json.dumps(info_0511(kv_cache_dtype="fp8_e5m2")))
    collector, _ = make(fake.url, client)
    scrape = await collector.collect()
    types = [dict(lab) for n, lab in _flat_keys(scrape) if n == "llmb_model_kv_cache_type_info"]
    assert [(t["type_k"], t["type_v"]) for t in types] == [("fp8_e5m2", "fp8_e5m2")]
    # auto without a model dir or dtype: the type is not known, so no series.
    routes_0511(fake)
    collector, _ = make(fake.url, client)
    scrape = await collector.collect()
    assert "llmb_model_kv_cache_type_info" not in names(scrape)


# --- warm-up ---------------------------------------------------------------------------


class WarmingSGLang:
    """A real HTTP server that behaves like SGLang between Uvicorn start and "fired up":
    /metrics and /v1/models answer, /health is 503, /server_info blocks until ready."""

    def __init__(self) -> None:
        self.port = get_free_port()
        self.ready = asyncio.Event()
        self.blocked = 0
        self.health_blocks = False
        self.info_blocks = True  # the H200 run; on a CPU /server_info answers while warming
        self.health_hits = 0
        self.health_seconds = 0.0  # a ready server's /health generates one token

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def handle(self, request: web.Request) -> web.Response:
        path = request.path
        if path == "/metrics":
            return web.Response(text=(V0511 / "metrics-after-load.txt").read_text())
        if path == "/v1/models":
            return web.Response(text=(V0511 / "v1_models.json").read_text())
        if path == "/health":
            self.health_hits += 1
            if self.health_blocks:
                await self.ready.wait()
            if self.ready.is_set():
                await asyncio.sleep(self.health_seconds)
            return web.Response(status=200 if self.ready.is_set() else 503)
        if path in ("/server_info", "/get_server_info"):
            self.blocked += 1
            if self.info_blocks:
                await self.ready.wait()
            return web.Response(text=(V0511 / "server_info.json").read_text())
        if path in ("/model_info", "/get_model_info"):
            return web.Response(text=(V0511 / "get_model_info.json").read_text())
        return web.Response(status=404)


@pytest.fixture
async def warming() -> AsyncIterator[WarmingSGLang]:
    server = WarmingSGLang()
    app = web.Application()
    app.router.add_route("GET", "/{tail:.*}", server.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", server.port).start()
    yield server
    server.ready.set()
    await runner.cleanup()


async def test_warming_up_answers_fast_with_loading(
    warming: WarmingSGLang, client: httpx.AsyncClient
) -> None:
    # The source timeout is 5 s, as the exporter's default; the scrape must not wait it.
    collector, _ = make(warming.url, client, timeout=5.0)
    for _ in range(3):
        scrape = await collect_fast(collector)
        assert val(scrape, "llmb_engine_up") == 0.0
        assert val(scrape, "llmb_engine_loading") == 1.0
        assert scrape.errors == []
        # Nothing the verdict reads while loading.
        assert "llmb_engine_requests_running" not in names(scrape)
    # One /server_info in flight at a time, not one per scrape.
    assert warming.blocked == 1
    warming.ready.set()
    await asyncio.sleep(0.05)
    scrape = await collector.collect()
    assert val(scrape, "llmb_engine_up") == 1.0
    assert val(scrape, "llmb_engine_loading") == 0.0
    assert val(scrape, "llmb_engine_slots") == 4096
    assert collector.restarts == 0
    await collector.close()


async def test_slow_server_info_of_a_serving_engine_keeps_it_up(
    warming: WarmingSGLang, client: httpx.AsyncClient
) -> None:
    # Once /server_info answered for this instance, a slow refresh only means stale facts.
    warming.ready.set()
    clock = [0.0]
    collector, _ = make(warming.url, client, clock=lambda: clock[0], timeout=5.0)
    assert val(await collector.collect(), "llmb_engine_slots") == 4096
    warming.ready.clear()
    clock[0] = 120.0  # past the static TTL: a refresh starts, and blocks
    scrape = await collect_fast(collector)
    assert val(scrape, "llmb_engine_up") == 1.0
    assert val(scrape, "llmb_engine_loading") == 0.0
    assert val(scrape, "llmb_engine_slots") == 4096
    warming.ready.set()
    await collector.close()


async def test_health_without_answer_while_pending_is_loading(
    warming: WarmingSGLang, client: httpx.AsyncClient
) -> None:
    # A server so busy starting that /health does not answer either: loading, not down.
    warming.health_blocks = True
    collector, _ = make(warming.url, client, timeout=5.0)
    scrape = await collect_fast(collector)
    assert val(scrape, "llmb_engine_loading") == 1.0
    assert val(scrape, "llmb_engine_up") == 0.0
    assert scrape.errors == []
    await collector.close()


async def test_warm_up_seen_through_health_when_server_info_answers(
    warming: WarmingSGLang, client: httpx.AsyncClient
) -> None:
    # The real CPU server: /server_info answers during the warm-up, /health says 503; once
    # ready, /health generates a token (slower than the scrape waits): loading until it says 200.
    warming.info_blocks = False
    warming.health_seconds = 1.5
    collector, _ = make(warming.url, client, timeout=5.0)
    for _ in range(2):
        scrape = await collector.collect()
        assert val(scrape, "llmb_engine_loading") == 1.0 and val(scrape, "llmb_engine_up") == 0.0
    warming.ready.set()
    started = time.perf_counter()
    scrape = await collector.collect()  # /health now takes 1.5 s: still loading, fast answer
    assert time.perf_counter() - started < 1.0
    assert val(scrape, "llmb_engine_loading") == 1.0
    await asyncio.sleep(1.6)
    scrape = await collector.collect()
    assert val(scrape, "llmb_engine_up") == 1.0 and val(scrape, "llmb_engine_loading") == 0.0
    hits = warming.health_hits
    for _ in range(3):
        await collector.collect()
    assert warming.health_hits == hits  # ready: the generating /health is not asked again
    await collector.close()


async def test_0511_cpu_capture_weights_from_config_when_the_engine_says_zero(
    fake: FakeSGLang, client: httpx.AsyncClient
) -> None:
    # The real CPU server (tests/fixtures/sglang-0.5.11-cpu): memory_usage.weight -0.0 and
    # `mem usage=-0.00 GB` in its log (a host-memory delta), KV 0.03 GiB.
    cpu = FIX / "sglang-0.5.11-cpu"
    fake.routes.clear()
    fake.set("/health", 200, "")
    fake.set("/metrics", 200, (cpu / "metrics-after-load.txt").read_text())
    fake.set("/server_info", 200, (cpu / "server_info.json").read_text())
    fake.set("/model_info", 200, (cpu / "get_model_info.json").read_text())
    fake.set("/v1/models", 200, (cpu / "v1_models.json").read_text())
    model = FIX / "sglang-tiny-qwen2"
    collector, _ = make(fake.url, client, model_path=model, log_file=cpu / "server.log")
    scrape = await clean_scrape(collector)
    assert "llmb_engine_model_buffer_bytes" not in names(scrape)
    # No safetensors (random weights): the config's shapes x bf16.
    assert val(scrape, "llmb_model_weights_bytes") == 24261120
    assert val(scrape, "llmb_engine_kv_cache_bytes", device="gpu") == 0.03 * GIB
    # 4 layers x 2 KV heads x (64 + 64) x 2 B, for 16384 + 1 slots.
    assert val(scrape, "llmb_model_kv_bytes_per_token_estimated") == 2048
    assert val(scrape, "llmb_model_kv_cache_bytes_estimated") == 2048 * 16385
    assert val(scrape, "llmb_engine_slots") == 8


async def test_model_structure_only_where_it_describes_the_placed_weights(
    fake: FakeSGLang, client: httpx.AsyncClient, tmp_path: Path
) -> None:
    # The H200 model's config gives 0.72 GiB against the 0.78 GiB SGLang placed: exported.
    routes_0511(fake)
    collector, _ = make(fake.url, client, model_path=MODEL)
    scrape = await collector.collect()
    assert val(scrape, "llmb_model_weights_always_read_bytes") == 773226240
    # A config without FFN or vocabulary sizes says far less than what was placed: the
    # split would undercount every step, so it is not exported (the weights still are).
    (tmp_path / "config.json").write_text(
        json.dumps({"num_hidden_layers": 24, "hidden_size": 896, "num_attention_heads": 14})
    )
    collector, _ = make(fake.url, client, model_path=tmp_path)
    scrape = await collector.collect()
    assert "llmb_model_weights_always_read_bytes" not in names(scrape)
    assert val(scrape, "llmb_model_weights_bytes") == 0.78 * GIB
