"""The exporter against a REAL llama-server (CPU build, real Gemma 3 270M model).

Issue 2's "done when": the exporter serves every schema series llama.cpp can provide and they
match the engine's own numbers; stopping the engine flips llmb_engine_up to 0 within one scrape
while other series keep coming; --metrics off and --no-slots are reported, not fatal.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

import httpx
import pytest
from aiohttp import web

from tests.plugins.engine_stubs import ThreadedApp
from tests.plugins.exporter import parse_samples, pick

pytestmark = pytest.mark.llamaserver


def _chat(url: str, content: str, max_tokens: int, stream: bool = False) -> dict:
    body = {
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "seed": 42,
        "ignore_eos": True,
    }
    resp = httpx.post(url + "/v1/chat/completions", json=body, timeout=600)
    resp.raise_for_status()
    return resp.json()


def _engine_counters(url: str) -> dict:
    # Reading the engine's /metrics ourselves resets its windowed gauges; we compare counters only.
    text = httpx.get(url + "/metrics", timeout=10).text
    return {name: v for (name, _), v in parse_samples(text).items()}


def one(samples: dict, name: str, **labels: str) -> float:
    values = pick(samples, name, **labels)
    assert len(values) == 1, (name, labels, values)
    return values[0]


def test_exporter_matches_real_llama_server(llama_server, exporter_process) -> None:
    server = llama_server(ctx=4096, parallel=2)
    exp = exporter_process(
        {
            "engines": [
                {
                    "name": "llama",
                    "kind": "llamacpp",
                    "url": server.url,
                    "log_file": str(server.log),
                }
            ],
            "gpu": {"enabled": True},  # no driver here: the NVML source must report down, not crash
        }
    )
    idle = exp.scrape()
    assert one(idle, "llmb_engine_up", engine="llama") == 1
    assert one(idle, "llmb_source_up", source="llama") == 1
    assert one(idle, "llmb_source_up", source="nvml") == 0
    assert one(idle, "llmb_source_errors_total", source="nvml", reason="connect") >= 1
    assert one(idle, "llmb_engine_slots", engine="llama") == 2
    assert one(idle, "llmb_engine_context_tokens", engine="llama") == 2048
    assert one(idle, "llmb_engine_kv_cache_capacity_tokens", engine="llama") == 4096
    assert one(idle, "llmb_engine_kv_cache_used_tokens", engine="llama") == 0
    models = httpx.get(server.url + "/v1/models").json()["data"][0]["meta"]
    assert one(idle, "llmb_model_weights_bytes", engine="llama") == models["size"]
    assert one(idle, "llmb_model_parameters", engine="llama") == models["n_params"]
    # A CPU-only build prints no "offloaded N/M layers" line: the series is absent, not 0.
    assert not pick(idle, "llmb_engine_gpu_layers_total", engine="llama")
    assert one(idle, "llmb_model_layers", engine="llama") == 18  # Gemma 3 270M, from the GGUF
    assert one(idle, "llmb_engine_load_seconds", engine="llama") > 0
    kv_logged = pick(idle, "llmb_engine_kv_cache_bytes", engine="llama")
    assert kv_logged and sum(kv_logged) > 0
    estimated = one(idle, "llmb_model_kv_cache_bytes_estimated", engine="llama")
    assert abs(estimated - sum(kv_logged)) / sum(kv_logged) < 0.05

    usages = [_chat(server.url, f"Request {i}: say something.", 24)["usage"] for i in range(2)]
    # A long streaming request keeps a slot busy while we scrape.
    busy_result: dict = {}

    def long_request() -> None:
        busy_result["r"] = _chat(server.url, "Write a long story about GPUs.", 160)

    thread = threading.Thread(target=long_request)
    thread.start()
    busy = None
    for _ in range(200):
        # /slots read just before and just after the scrape: a slot that finishes its request
        # in between (one of the short requests above, on a loaded machine) is in one of them.
        before = httpx.get(server.url + "/slots").json()
        sample = exp.scrape()
        if (
            one(sample, "llmb_engine_requests_running", engine="llama") >= 1
            and one(sample, "llmb_engine_kv_cache_used_tokens", engine="llama") > 30
        ):
            busy = sample
            slots = httpx.get(server.url + "/slots").json()
            break
        time.sleep(0.05)
    assert busy is not None, "never saw the busy slot"
    held = max(
        sum(s["n_prompt_tokens"] for s in read if s["is_processing"]) for read in (before, slots)
    )
    seen = one(busy, "llmb_engine_kv_cache_used_tokens", engine="llama")
    assert 0 < seen <= held and held - seen < 40  # tokens generated between the two reads
    assert one(busy, "llmb_engine_kv_cache_usage_ratio", engine="llama") == pytest.approx(
        seen / 4096
    )
    thread.join(timeout=600)
    assert "r" in busy_result

    after = exp.scrape()
    engine = _engine_counters(server.url)
    total_completion = (
        sum(u["completion_tokens"] for u in usages) + busy_result["r"]["usage"]["completion_tokens"]
    )
    assert (
        one(after, "llmb_engine_generation_tokens_total", engine="llama")
        == engine["llamacpp:tokens_predicted_total"]
    )
    assert engine["llamacpp:tokens_predicted_total"] == total_completion
    # With the log, decode counts the intervals after each request's first token, as the
    # engine's timings.predicted_per_second does; the time is the engine's own decode time.
    assert one(after, "llmb_engine_decode_tokens_total", engine="llama") == total_completion - 3
    assert one(after, "llmb_engine_decode_seconds_total", engine="llama") == pytest.approx(
        engine["llamacpp:tokens_predicted_seconds_total"], rel=1e-3
    )
    assert (
        one(after, "llmb_engine_prompt_tokens_total", engine="llama")
        == engine["llamacpp:prompt_tokens_total"] + engine["llamacpp:prompt_tokens_cached_total"]
    )
    assert one(after, "llmb_engine_requests_running", engine="llama") == 0
    assert one(after, "llmb_engine_requests_finished_total", engine="llama") == 3

    # Stop the engine: the next scrape says so, and the rest keeps coming.
    server.stop()
    down = exp.scrape()
    assert one(down, "llmb_engine_up", engine="llama") == 0
    assert one(down, "llmb_source_up", source="llama") == 0
    assert one(down, "llmb_source_errors_total", source="llama", reason="connect") >= 1
    assert pick(down, "llmb_exporter_build_info")
    assert pick(down, "llmb_source_up", source="nvml")


def test_metrics_off_and_no_slots(llama_server, exporter_process) -> None:
    plain = llama_server(ctx=2048, parallel=1, metrics=False)
    noslots = llama_server("--no-slots", ctx=2048, parallel=1)
    exp = exporter_process(
        {
            "engines": [
                {"name": "plain", "kind": "llamacpp", "url": plain.url, "log_file": str(plain.log)},
                {"name": "noslots", "kind": "llamacpp", "url": noslots.url},
            ],
            "gpu": {"enabled": False},
        }
    )
    _chat(plain.url, "hello", 8)
    s = exp.scrape()
    assert one(s, "llmb_engine_up", engine="plain") == 1
    assert one(s, "llmb_engine_endpoint_enabled", engine="plain", endpoint="metrics") == 0
    assert one(s, "llmb_engine_endpoint_enabled", engine="plain", endpoint="slots") == 1
    # Without /metrics the log's per-request lines give the token counter.
    assert one(s, "llmb_engine_generation_tokens_total", engine="plain") == 8
    assert one(s, "llmb_engine_decode_tokens_total", engine="plain") == 7
    assert one(s, "llmb_engine_endpoint_enabled", engine="noslots", endpoint="slots") == 0
    assert one(s, "llmb_engine_endpoint_enabled", engine="noslots", endpoint="metrics") == 1
    assert not pick(s, "llmb_engine_kv_cache_usage_ratio", engine="noslots")
    assert one(s, "llmb_source_up", source="noslots") == 1
    log = exp.log.read_text()
    assert "start llama-server with --metrics" in log
    assert "--no-slots" in log


class _Stub(ThreadedApp):
    """A misbehaving 'engine' on a real socket: garbage /metrics, or a slow one."""

    def __init__(self, delay: float = 0.0, garbage: bool = False):
        super().__init__()
        self.delay = delay
        self.garbage = garbage

    async def handle(self, request: web.Request) -> web.Response:
        await asyncio.sleep(self.delay)
        if request.path == "/metrics" and self.garbage:
            return web.Response(text="<html>\x00garbage</html>")
        if request.path == "/health":
            return web.Response(text='{"status":"ok"}')
        # Well-formed but empty answers, so the garbage /metrics is the only parse error.
        return web.Response(text=json.dumps([] if request.path == "/slots" else {}))


def test_garbage_and_slow_engines_never_break_the_scrape(exporter_process, tmp_path: Path) -> None:
    with _Stub(garbage=True) as bad, _Stub(delay=20) as slow:
        exp = exporter_process(
            {
                "engines": [
                    {"name": "bad", "kind": "llamacpp", "url": f"http://127.0.0.1:{bad.port}"},
                    {"name": "slow", "kind": "sglang", "url": f"http://127.0.0.1:{slow.port}"},
                ],
                "gpu": {"enabled": False},
            }
        )
        start = time.perf_counter()
        s = exp.scrape(timeout_header=2)
        elapsed = time.perf_counter() - start
        s2 = exp.scrape(timeout_header=2)
    assert elapsed < 3.0
    assert one(s, "llmb_source_errors_total", source="bad", reason="parse") == 1
    assert one(s2, "llmb_source_errors_total", source="bad", reason="parse") == 2
    assert one(s, "llmb_engine_up", engine="bad") == 1
    assert one(s, "llmb_source_errors_total", source="slow", reason="timeout") == 1
    assert one(s, "llmb_engine_up", engine="slow") == 0


def _instance(samples: dict, slots: int, capacity: int, restarts: int) -> tuple[float, float]:
    """Check the series of one llama-server instance (1024 tokens per slot); return its KV
    estimate and the KV bytes its log reported."""
    assert one(samples, "llmb_engine_slots", engine="llama") == slots
    assert one(samples, "llmb_engine_context_tokens", engine="llama") == 1024
    assert one(samples, "llmb_engine_kv_cache_capacity_tokens", engine="llama") == capacity
    assert one(samples, "llmb_engine_restarts_total", engine="llama") == restarts
    estimate = one(samples, "llmb_model_kv_cache_bytes_estimated", engine="llama")
    return estimate, sum(pick(samples, "llmb_engine_kv_cache_bytes", engine="llama"))


def test_engine_restart_shows_the_new_instance_on_the_first_scrape(
    llama_server, exporter_process
) -> None:
    """Issue 11 item 8: -np 4 → -np 2 --no-slots on the same port under one exporter.

    No scrape happens while the engine is away, so nothing but the new instance's own
    answers can tell the exporter (the hardest case).
    """
    old = llama_server(ctx=4096, parallel=4)
    exp = exporter_process(
        {
            "engines": [
                {"name": "llama", "kind": "llamacpp", "url": old.url, "log_file": str(old.log)}
            ],
            "gpu": {"enabled": False},
        }
    )
    est_before, kv_before = _instance(exp.scrape(), slots=4, capacity=4096, restarts=0)

    old.stop()
    new = llama_server("--no-slots", ctx=2048, parallel=2, port=old.port)
    after = exp.scrape()
    assert one(after, "llmb_engine_endpoint_enabled", engine="llama", endpoint="slots") == 0
    est_after, kv_after = _instance(after, slots=2, capacity=2048, restarts=1)
    # The estimate follows the new context and still matches what the new instance logged.
    assert est_after < est_before
    assert kv_after < kv_before
    assert abs(est_after - kv_after) / kv_after < 0.05
    assert new.log == old.log  # one log file, rewritten by the new process

    # Down in between (a crash seen by a scrape), then back with the old flags.
    new.stop()
    down = exp.scrape()
    assert one(down, "llmb_engine_up", engine="llama") == 0
    llama_server(ctx=4096, parallel=4, port=old.port)
    back = exp.scrape()
    assert one(back, "llmb_engine_slots", engine="llama") == 4
    assert one(back, "llmb_engine_kv_cache_capacity_tokens", engine="llama") == 4096
    assert one(back, "llmb_model_kv_cache_bytes_estimated", engine="llama") == est_before
    assert one(back, "llmb_engine_restarts_total", engine="llama") == 2
