"""Fidelity of the SGLang simulator against SGLang 0.5.23's own metric rendering."""

from __future__ import annotations

import asyncio

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.paths import FIXTURES

FIX = FIXTURES / "sglang-0.5.23"
PROM2_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
    "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


def shape(text: str) -> dict[str, tuple[str, str, frozenset[str]]]:
    """family -> (type, help, label names of its samples)."""
    out = {}
    for fam in text_string_to_metric_families(text):
        labels = frozenset(k for s in fam.samples for k in s.labels)
        out[fam.name] = (fam.type, fam.documentation, labels)
    return out


async def test_idle_metrics_equal_capture(sim_server) -> None:
    h = await sim_server("sglang")
    async with httpx.AsyncClient(base_url=h.url, timeout=30) as c:
        r = await c.get("/metrics", headers={"Accept": "text/plain;version=0.0.4"})
    assert r.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert shape(r.text) == shape((FIX / "metrics-idle.txt").read_text())


async def drive_busy(c: httpx.AsyncClient) -> None:
    """Streaming and non-streaming traffic, one abort, enough load to retract and evict."""
    body = {
        "messages": [{"role": "user", "content": " x" * 1400}],
        "max_tokens": 400,
        "ignore_eos": True,
    }
    reqs = [
        c.post(
            "/v1/chat/completions",
            json={**body, "messages": [{"role": "user", "content": f"{i}" + " x" * 1400}]},
        )
        for i in range(8)
    ]
    reqs.append(c.post("/v1/chat/completions", json={**body, "stream": True}))
    long = {
        "text": "abort me",
        "stream": True,
        "sampling_params": {"max_new_tokens": 5000, "ignore_eos": True},
    }
    async with c.stream("POST", "/generate", json=long) as resp:
        async for _ in resp.aiter_lines():
            break  # the client goes away mid-stream
    await asyncio.gather(*reqs)
    await c.get("/v1/models")
    await c.get("/health")


async def test_busy_metrics_equal_capture(sim_server) -> None:
    h = await sim_server("sglang", "kv_saturated")
    async with httpx.AsyncClient(base_url=h.url, timeout=60) as c:
        await drive_busy(c)
        await asyncio.sleep(0.1)
        r = await c.get("/metrics")
        om = await c.get("/metrics", headers={"Accept": PROM2_ACCEPT})
    ours, real = shape(r.text), shape((FIX / "metrics-busy.txt").read_text())
    assert ours.keys() == real.keys()
    for name in real:
        assert ours[name][:2] == real[name][:2], name
        # the capture saw a 400 response (status label) in http_responses; we saw only 200s
        assert ours[name][2] == real[name][2], name
    idle = shape((FIX / "metrics-idle.txt").read_text())
    lazy = sorted(real.keys() - idle.keys())
    assert "sglang:num_aborted_requests" in lazy and "sglang:evicted_tokens" in lazy
    # OpenMetrics for Prometheus 2.x: escaped sample names, colon HELP, # EOF
    assert (
        om.headers["content-type"]
        == "application/openmetrics-text; version=1.0.0; charset=utf-8; escaping=underscores"
    )
    assert om.text.endswith("# EOF\n")
    assert "\nsglang_num_queue_reqs{" in om.text and "# HELP sglang:num_queue_reqs " in om.text


async def test_underscore_spelling(sim_server) -> None:
    h = await sim_server("sglang", metric_spelling="underscore")
    async with httpx.AsyncClient(base_url=h.url, timeout=30) as c:
        text = (await c.get("/metrics")).text
    names = [f.name for f in text_string_to_metric_families(text)]
    assert names and all(n.startswith("sglang_") for n in names)


async def test_endpoints_and_prefix_cache(sim_server) -> None:
    h = await sim_server("sglang", enable_cache_report=True)
    async with httpx.AsyncClient(base_url=h.url, timeout=30) as c:
        info = (await c.get("/server_info")).json()
        assert info["simulated"] is True and info["version"] == "0.5.23"
        assert (await c.get("/get_server_info")).json()["max_total_num_tokens"] == info[
            "max_total_num_tokens"
        ]
        assert (await c.get("/model_info")).json()["served_model_name"]
        models = (await c.get("/v1/models")).json()
        assert models["data"][0]["owned_by"] == "sglang"
        body = {
            "text": "Tell me about GPUs" * 20,
            "sampling_params": {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True},
        }
        first = (await c.post("/generate", json=body)).json()
        second = (await c.post("/generate", json=body)).json()
        assert first["meta_info"]["cached_tokens"] == 0
        assert second["meta_info"]["cached_tokens"] > 0
        assert first["text"] == second["text"]  # greedy is deterministic
        assert second["meta_info"]["completion_tokens"] == 8
        chat = {
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4,
            "ignore_eos": True,
        }
        r = (await c.post("/v1/chat/completions", json=chat)).json()
        assert (
            r["usage"]["completion_tokens"] == 4
            and "cached_tokens" in r["usage"]["prompt_tokens_details"]
        )
        s = await c.post(
            "/v1/chat/completions",
            json={**chat, "stream": True, "stream_options": {"include_usage": True}},
        )
        lines = [ln for ln in s.text.splitlines() if ln.startswith("data: ")]
        assert lines[-1] == "data: [DONE]" and '"usage":{"prompt_tokens"' in lines[-2]
        comp = (
            await c.post(
                "/v1/completions", json={"prompt": "hello", "max_tokens": 3, "ignore_eos": True}
            )
        ).json()
        assert comp["usage"]["completion_tokens"] == 3


async def test_prometheus3_accept_and_loading(sim_server) -> None:
    accept = (
        "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,"
        "application/openmetrics-text;version=0.0.1;q=0.5,text/plain;version=1.0.0;"
        "escaping=allow-utf-8;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2"
    )
    h = await sim_server("sglang")
    loading = await sim_server("sglang", load_seconds=100, time_scale=1.0)
    async with httpx.AsyncClient(timeout=30) as c:
        r = await c.get(h.url + "/metrics", headers={"Accept": accept})
        assert r.headers["content-type"] == (
            "application/openmetrics-text; version=1.0.0; charset=utf-8; escaping=allow-utf-8"
        )
        assert "\nsglang:num_queue_reqs{" in r.text
        assert (await c.get(loading.url + "/health")).status_code == 503
        assert (await c.get(loading.url + "/metrics")).status_code == 503
