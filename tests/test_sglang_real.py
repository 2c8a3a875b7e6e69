"""The product against a real SGLang 0.5.11 server on the CPU (tests/plugins/sglang.py).

What is real: SGLang's HTTP server, tokenizer manager, scheduler (radix cache, admission by its
token pool, retraction) and metrics collector, serving the tiny Qwen2 folder with random
weights; every request and number here. What is not: this machine has no GPU, so the residency
tests give the exporter an NVML-shaped GPU file sized from the server's own numbers.

Servers: `sglang_server` (running cap 8, 16384-token pool) and `sglang_pool_server` (1024-token
pool, cap 16), each started once per session. Requests send `ignore_eos` (random weights).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.plugins.exporter import ExporterProcess, parse_samples, pick
from tests.plugins.sglang import (
    KV_BYTES_PER_TOKEN,
    POOL_SERVER,
    SERVED_MODEL_NAME,
    SGLANG_SERVER,
    SGLANG_VERSION,
    SglangServer,
)

pytestmark = [pytest.mark.sglang, pytest.mark.timeout(900)]

FIXTURES = Path(__file__).parent / "fixtures"
H200 = FIXTURES / "sglang-0.5.11-h200"
GIB = 1 << 30


# -- requests --------------------------------------------------------------------------------------
def prompt_ids(n: int, seed: int) -> list[int]:
    """`n` token ids, different per seed (no radix-cache hits between requests), no specials."""
    return [3 + (seed * 7919 + k * 104729) % 31990 for k in range(n)]


def complete(url: str, ids: list[int], max_tokens: int, stream: bool = False) -> dict[str, Any]:
    """One /v1/completions request by token ids; returns its `usage` (and the text)."""
    body = {
        "model": SERVED_MODEL_NAME,
        "prompt": ids,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": stream,
        **({"stream_options": {"include_usage": True}} if stream else {}),
    }
    with httpx.Client(timeout=300) as client:
        if not stream:
            resp = client.post(url + "/v1/completions", json=body)
            resp.raise_for_status()
            doc: dict[str, Any] = resp.json()
            return {**doc["usage"], "finish_reason": doc["choices"][0]["finish_reason"]}
        usage: dict[str, Any] = {}
        with client.stream("POST", url + "/v1/completions", json=body) as resp:
            resp.raise_for_status()
            for line in resp.iter_lines():
                if line.startswith("data: {"):
                    chunk = json.loads(line[6:])
                    usage = chunk.get("usage") or usage
        return usage


def burst(url: str, prompts: list[list[int]], max_tokens: int) -> list[dict[str, Any]]:
    """All `prompts` at once (one thread each); their usages in order."""
    with ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(lambda ids: complete(url, ids, max_tokens), prompts))


# -- /metrics ---------------------------------------------------------------------------------------
def scrape(url: str) -> str:
    resp = httpx.get(url + "/metrics", timeout=30)
    resp.raise_for_status()
    return resp.text


def gauge(text: str, name: str) -> float:
    """The value of one unlabelled-by-us SGLang series (rank 0 of the one scheduler)."""
    values = pick(parse_samples(text), name)
    assert len(values) == 1, (name, values)
    return values[0]


@dataclass
class Watch:
    """The largest value each series reached while the watcher ran."""

    peaks: dict[str, float] = field(default_factory=dict)
    samples: int = 0

    def see(self, name: str, value: float) -> None:
        self.peaks[name] = max(value, self.peaks.get(name, value))


@contextmanager
def watching(read: Callable[[], dict[str, float]], every: float = 0.1) -> Iterator[Watch]:
    """Poll `read` in a thread while the block runs."""
    watch = Watch()
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            for name, value in read().items():
                watch.see(name, value)
            watch.samples += 1
            stop.wait(every)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield watch
    finally:
        stop.set()
        thread.join(timeout=30)


def engine_gauges(url: str) -> Callable[[], dict[str, float]]:
    names = ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage")

    def read() -> dict[str, float]:
        text = scrape(url)
        return {n: gauge(text, n) for n in names}

    return read


def exporter_config(server: SglangServer, **extra: Any) -> dict[str, Any]:
    engine = {"name": "sgl", "kind": "sglang", "url": server.url, "log_file": str(server.log)}
    return {"engines": [engine], "gpu": {"enabled": False}, **extra}


# -- the server's own answers --------------------------------------------------------------------
def test_server_answers_what_it_was_started_with(sglang_server: SglangServer) -> None:
    """/server_info, /get_model_info and /v1/models of the real 0.5.11 server."""
    info = httpx.get(sglang_server.url + "/server_info", timeout=30).json()
    assert info["version"] == SGLANG_VERSION and info["status"] == "ready"
    assert info["max_total_num_tokens"] == SGLANG_SERVER.max_total_tokens
    assert info["max_running_requests"] == SGLANG_SERVER.max_running_requests
    assert info["context_length"] == SGLANG_SERVER.context_length
    assert (info["device"], info["load_format"]) == ("cpu", "dummy")
    state = info["internal_states"][0]
    assert state["effective_max_running_requests_per_dp"] == SGLANG_SERVER.max_running_requests
    memory = state["memory_usage"]
    assert set(memory) == {"weight", "kvcache", "token_capacity", "graph"}
    assert memory["token_capacity"] == SGLANG_SERVER.max_total_tokens
    # K + V of the pool in GiB, rounded to 2 places as SGLang writes it.
    pool = SGLANG_SERVER.max_total_tokens * KV_BYTES_PER_TOKEN / GIB
    assert memory["kvcache"] == round(pool, 2)
    model = httpx.get(sglang_server.url + "/get_model_info", timeout=30).json()
    assert model["architectures"] == ["Qwen2ForCausalLM"] and model["model_type"] == "qwen2"
    # The same keys as on the H200 (0.5.11 answers these endpoints the same on both).
    assert set(model) == set(json.loads((H200 / "get_model_info.json").read_text()))
    assert set(info) == set(json.loads((H200 / "server_info.json").read_text()))
    models = httpx.get(sglang_server.url + "/v1/models", timeout=30).json()["data"]
    assert [(m["id"], m["max_model_len"]) for m in models] == [
        (SERVED_MODEL_NAME, SGLANG_SERVER.context_length)
    ]


def test_bounded_load_fills_the_running_cap_and_queues_the_rest(
    sglang_server: SglangServer,
    exporter_process: Callable[[dict[str, Any]], ExporterProcess],
) -> None:
    """12 requests against a cap of 8: 8 run, the rest wait; SGLang's gauges and counters and
    the exporter's series say so, and every answer has the asked-for token counts."""
    exporter = exporter_process(exporter_config(sglang_server))
    before = parse_samples(scrape(sglang_server.url))
    prompts = [prompt_ids(24 + i, seed=100 + i) for i in range(12)]

    def read_both() -> dict[str, float]:
        out = engine_gauges(sglang_server.url)()
        samples = exporter.scrape()
        for name in ("llmb_engine_requests_running", "llmb_engine_requests_waiting"):
            out.update({name: v for v in pick(samples, name, engine="sgl")})
        return out

    with watching(read_both) as watch:
        usages = burst(sglang_server.url, prompts, max_tokens=96)
        time.sleep(1.0)
    assert [u["completion_tokens"] for u in usages] == [96] * 12
    assert [u["prompt_tokens"] for u in usages] == [len(p) for p in prompts]
    peaks = watch.peaks
    assert peaks["sglang:num_running_reqs"] == SGLANG_SERVER.max_running_requests, peaks
    assert 1 <= peaks["sglang:num_queue_reqs"] <= 12 - SGLANG_SERVER.max_running_requests
    # The exporter saw the same (it scrapes at its own moments: at most what SGLang showed).
    assert 1 <= peaks["llmb_engine_requests_running"] <= SGLANG_SERVER.max_running_requests
    after = parse_samples(scrape(sglang_server.url))

    def grew(name: str) -> float:
        return sum(pick(after, name)) - sum(pick(before, name))

    assert grew("sglang:num_requests_total") == 12
    assert grew("sglang:generation_tokens_total") == 12 * 96
    assert grew("sglang:prompt_tokens_total") == sum(len(p) for p in prompts)
    samples = exporter.scrape()
    assert pick(samples, "llmb_engine_up", engine="sgl") == [1.0]
    assert pick(samples, "llmb_engine_kv_cache_capacity_tokens", engine="sgl") == [16384.0]
    assert pick(samples, "llmb_engine_slots", engine="sgl") == [8.0]
    assert pick(samples, "llmb_model_layers", engine="sgl") == [4.0]
    kv_per_token = pick(samples, "llmb_model_kv_bytes_per_token_estimated", engine="sgl")
    assert kv_per_token == [float(KV_BYTES_PER_TOKEN)]
    assert pick(samples, "llmb_engine_requests_finished_total", engine="sgl") == [
        sum(pick(after, "sglang:num_requests_total"))
    ]
