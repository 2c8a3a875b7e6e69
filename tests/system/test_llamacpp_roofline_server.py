"""The roofline facts against a real llama-server (CPU, Gemma 3 270M): q8_0 KV, a draft model."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from config.settings import EngineConfig
from exporter.attribution import Attribution
from exporter.collectors.llamacpp.collector import LlamaCppCollector
from tests.unit.test_llamacpp_collector import v, values

pytestmark = pytest.mark.llamaserver

MIB = 1024 * 1024


def exporter_for(url: str, log: Path, model: Path) -> LlamaCppCollector:
    engine = EngineConfig.model_validate(
        {
            "name": "llama",
            "kind": "llamacpp",
            "url": url,
            "log_file": str(log),
            "model_path": str(model),
        }
    )
    return LlamaCppCollector(engine, httpx.AsyncClient(), 10.0, Attribution([engine]))


def wait_for(log: Path, text: str, count: int = 1, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while log.read_text(errors="replace").count(text) < count:
        assert time.monotonic() < deadline, f"no {text!r} in the -lv 4 log"
        time.sleep(0.2)


async def test_q8_0_kv_cache_estimate_equals_the_servers_buffer(
    llama_server: Callable[..., object], gemma_model: Path
) -> None:
    server = llama_server("-ctk", "q8_0", "-ctv", "q8_0", ctx=4096, parallel=2)
    log: Path = server.log  # type: ignore[attr-defined]
    wait_for(log, "K (q8_0)", count=2)  # the non-SWA and the SWA cache
    c = exporter_for(server.url, log, gemma_model)  # type: ignore[attr-defined]
    scrape = await c.collect()
    m = scrape.metrics
    assert scrape.up, scrape.errors
    assert v(m, "llmb_model_kv_cache_type_info", type_k="q8_0", type_v="q8_0") == 1
    logged = v(m, "llmb_engine_kv_cache_bytes", device="CPU")
    # 2 x 2048 cells x 3 layers + 2 x 1024 x 15 SWA layers, x 256 x 34/32 for K and V.
    exact = (2 * 2048 * 3 + 2 * 1024 * 15) * 256 * 34 // 32 * 2
    assert v(m, "llmb_model_kv_cache_bytes_estimated") == exact
    # Two caches, each printed as %.2f MiB.
    assert logged == pytest.approx(exact, abs=2 * 0.005 * MIB)
    assert v(m, "llmb_model_kv_bytes_per_token_estimated") == 3 * 256 * 34 / 32 * 2


async def test_draft_model_accept_length_matches_the_response(
    llama_server: Callable[..., object], gemma_model: Path
) -> None:
    server = llama_server(
        "-md", str(gemma_model), "--spec-type", "draft-simple", ctx=2048, parallel=1
    )
    log: Path = server.log  # type: ignore[attr-defined]
    url: str = server.url  # type: ignore[attr-defined]
    body = {"prompt": "One, two, three,", "n_predict": 12, "temperature": 0, "ignore_eos": True}
    async with httpx.AsyncClient(timeout=300) as client:
        timings = (await client.post(url + "/completion", json=body)).json()["timings"]
    wait_for(log, "draft acceptance")
    c = exporter_for(url, log, gemma_model)
    m = (await c.collect()).metrics
    intervals = timings["predicted_n"] - 1
    accepted = timings["draft_n_accepted"]
    assert accepted > 0  # the draft is the target itself: greedy drafts are accepted
    assert v(m, "llmb_engine_spec_accept_length") == pytest.approx(
        intervals / (intervals - accepted)
    )
    # The draft's weights are a second copy of the same file's buffers, not the target's.
    target = sum(
        val for (name, _), val in values(m).items() if name == "llmb_engine_model_buffer_bytes"
    )
    assert v(m, "llmb_model_draft_weights_bytes") == pytest.approx(target)
