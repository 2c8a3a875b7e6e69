"""Fidelity of the llama-server simulator against real captures."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import httpx
import pytest

from simulator.llamacpp import fmt
from tests.paths import FIXTURES
from tests.plugins.sim import shape_diff

FIX = FIXTURES
CPU = FIX / "llamacpp-cpu-gemma3-270m"
H200 = FIX / "llamacpp-h200-gemma3-27b-shape-q4_0"
METRIC_FILES = sorted(
    [
        *CPU.glob("llamacpp_metrics_*.txt"),
        *H200.glob("metrics_*.txt"),
        *H200.glob("run2/metrics_*.txt"),
    ]
)


def families(text: str) -> list[tuple[str, str, str]]:
    """(name, type, help) in output order, from the HELP/TYPE comment lines."""
    helps = dict(re.findall(r"^# HELP (\S+) (.*)$", text, re.M))
    return [(n, t, helps[n]) for n, t in re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M)]


def samples(text: str) -> list[tuple[str, str]]:
    return [tuple(line.split(" ", 1)) for line in text.splitlines() if line and line[0] != "#"]  # type: ignore[misc]


def words(n: int, tag: str = "") -> str:
    return tag + "".join(f" w{i % 97}" for i in range(n))


async def test_format_matches_cpp_stream() -> None:
    assert [fmt(v) for v in (1234567, 0, 7.912345, 0.243577, 97, 1.39683)] == [
        "1.23457e+06",
        "0",
        "7.91235",
        "0.243577",
        "97",
        "1.39683",
    ]


@pytest.mark.parametrize("capture", METRIC_FILES, ids=lambda p: p.name)
async def test_metrics_families_equal_capture(sim_server, capture: Path) -> None:
    h = await sim_server("llamacpp")
    async with httpx.AsyncClient(base_url=h.url, timeout=30) as c:
        await c.post("/completion", json={"prompt": words(20), "n_predict": 5})
        r = await c.get("/metrics")
    assert r.headers["content-type"] == "text/plain; version=0.0.4"
    assert "Process-Start-Time-Unix" in r.headers
    real = capture.read_text()  # noqa: ASYNC240 - a small fixture
    assert families(r.text) == families(real)
    # same series (no labels), one per family, value formatted like the server does
    assert [n for n, _ in samples(r.text)] == [n for n, _ in samples(real)]
    for _, value in samples(r.text):
        assert re.fullmatch(r"-?\d+(\.\d+)?(e[+-]\d\d)?", value), value
        assert fmt(float(value)) == value


async def test_throughput_gauges_reset_on_scrape(sim_server) -> None:
    h = await sim_server("llamacpp")
    async with httpx.AsyncClient(base_url=h.url, timeout=30) as c:
        await c.post("/completion", json={"prompt": words(30), "n_predict": 20})
        first = dict(samples((await c.get("/metrics")).text))
        second = dict(samples((await c.get("/metrics")).text))
    assert float(first["llamacpp:predicted_tokens_seconds"]) > 0
    assert float(first["llamacpp:prompt_tokens_seconds"]) > 0
    assert second["llamacpp:predicted_tokens_seconds"] == "0"
    assert second["llamacpp:prompt_tokens_seconds"] == "0"
    assert float(second["llamacpp:tokens_predicted_total"]) == 20


def load(name: str, base: Path = CPU):
    return json.loads((base / name).read_text())


async def test_json_shapes_equal_capture(sim_server) -> None:
    h = await sim_server("llamacpp", parallel=2, ctx_size=4096)
    async with httpx.AsyncClient(base_url=h.url, timeout=30) as c:
        assert shape_diff((await c.get("/slots")).json(), load("slots_idle.json")) == []
        props = (await c.get("/props")).json()
        assert shape_diff(props, load("props.json")) == []
        assert props["build_info"] == "b0-llmb-sim"
        assert shape_diff((await c.get("/v1/models")).json(), load("v1_models.json")) == []
        comp = (
            await c.post(
                "/completion", json={"prompt": words(14), "n_predict": 16, "ignore_eos": True}
            )
        ).json()
        assert shape_diff(comp, load("comp_1.json")) == []
        # a busy slot (has a task) while a long request runs
        task = asyncio.create_task(
            c.post("/completion", json={"prompt": words(14), "n_predict": 4000, "ignore_eos": True})
        )
        for _ in range(200):
            slots = (await c.get("/slots")).json()
            if any(s["is_processing"] for s in slots):
                break
            await asyncio.sleep(0.01)
        busy = [s for s in slots if s["is_processing"]]
        assert busy and shape_diff(busy[0], load("slots_busy.json")[0]) == []
        task.cancel()
        chat_body = {
            "messages": [{"role": "user", "content": "Write a long story about a GPU."}],
            "max_tokens": 8,
            "ignore_eos": True,
        }
        chat = (await c.post("/v1/chat/completions", json=chat_body)).json()
        assert shape_diff(chat, load("chat_nonstream.json")) == []
        assert list(chat) == list(load("chat_nonstream.json"))
        stream = await c.post(
            "/v1/chat/completions",
            json={**chat_body, "stream": True, "stream_options": {"include_usage": True}},
        )
    real = [
        ln[6:]
        for ln in (CPU / "chat_stream.txt").read_text().splitlines()
        if ln.startswith("data: ")
    ]
    ours = [ln[6:] for ln in stream.text.splitlines() if ln.startswith("data: ")]
    assert ours[-1] == real[-1] == "[DONE]"
    assert len(ours) == len(real)  # role chunk + 8 tokens + finish + usage + [DONE]
    for mine, theirs in zip(ours[:-1], real[:-1], strict=True):
        assert shape_diff(json.loads(mine), json.loads(theirs)) == []
    # the repeated prompt is served from the slot's cache
    assert json.loads(ours[-2])["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


async def test_disabled_endpoints_and_api_key(sim_server) -> None:
    h = await sim_server("llamacpp", no_metrics=True, no_slots=True, api_key="s3cret")
    auth = {"Authorization": "Bearer s3cret"}
    async with httpx.AsyncClient(base_url=h.url, timeout=30) as c:
        r = await c.get("/metrics", headers=auth)
        assert (
            r.status_code == 501
            and r.text == (CPU / "metrics_disabled_501.json").read_text().strip()
        )
        r = await c.get("/slots", headers=auth)
        assert (
            r.status_code == 501 and r.text == (CPU / "slots_disabled_501.json").read_text().strip()
        )
        assert (await c.get("/health")).status_code == 200  # public
        r = await c.post("/completion", json={"prompt": "hi", "n_predict": 1})
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        r = await c.post("/completion", json={"prompt": "hi", "n_predict": 1}, headers=auth)
        assert r.status_code == 200


async def test_loading_phase_answers_503(sim_server) -> None:
    h = await sim_server("llamacpp", load_seconds=0.5, time_scale=1.0)
    async with httpx.AsyncClient(base_url=h.url, timeout=30) as c:
        for path in ("/health", "/metrics", "/slots", "/props"):
            r = await c.get(path)
            assert r.status_code == 503
            assert r.text == (CPU / "health_503_loading.json").read_text().strip()
        for _ in range(100):
            await asyncio.sleep(0.05)
            if (await c.get("/health")).status_code == 200:
                break
        assert (await c.get("/health")).json() == {"status": "ok"}


async def test_slot_context_exhaustion_truncates_like_run2(sim_server) -> None:
    # run2 kvslot: -c 4096 -np 4, 570-token prompts asking 512 tokens -> 454, truncated
    h = await sim_server("llamacpp", "h200-gemma3-27b", ctx_size=4096, parallel=4)
    body = {"prompt": words(569), "n_predict": 512, "ignore_eos": True}
    async with httpx.AsyncClient(base_url=h.url, timeout=60) as c:
        results = await asyncio.gather(*(c.post("/completion", json=body) for _ in range(4)))
    for r in results:
        out = r.json()
        assert out["tokens_evaluated"] == 570
        assert out["tokens_predicted"] == 454
        assert out["truncated"] is True
    log = h.log_file.read_text()
    assert log.count("stop processing: n_tokens = 1023, truncated = 1") == 4
    assert "load_tensors: offloaded 63/63 layers to GPU" in log
    assert re.search(
        r"^\d+\.\d\d\.\d{3}\.\d{3} I slot print_timing: id  \d \| task \d+ \| prompt eval time = ",
        log,
        re.M,
    )
    assert re.search(r"       eval time = +\d+\.\d\d ms / +454 tokens \(", log)


async def test_tokenizers_differ(sim_server) -> None:
    a = await sim_server("llamacpp")
    b = await sim_server("llamacpp", tokenizer="char4")
    text = {"content": "The quick brown fox jumps over the lazy dog."}
    async with httpx.AsyncClient(timeout=30) as c:
        na = len((await c.post(a.url + "/tokenize", json=text)).json()["tokens"])
        nb = len((await c.post(b.url + "/tokenize", json=text)).json()["tokens"])
    assert na != nb and na > 0 and nb > 0


@pytest.mark.parametrize(
    ("ours", "capture"),
    [
        ("/props", "props.json"),
        ("/v1/models", "models.json"),
    ],
)
async def test_h200_json_shapes(sim_server, ours: str, capture: str) -> None:
    h = await sim_server("llamacpp", "h200-gemma3-27b")
    async with httpx.AsyncClient(base_url=h.url, timeout=30) as c:
        got = (await c.get(ours)).json()
    assert shape_diff(got, load(capture, H200)) == []


@pytest.mark.parametrize(
    "capture",
    [
        "slots_busy1.json",
        "slots_np4_c8.json",
        "run2/slots_kvslot_busy.json",
        "run2/slots_kvunified_busy.json",
    ],
)
async def test_h200_busy_slots_shape(sim_server, capture: str) -> None:
    h = await sim_server("llamacpp", "h200-gemma3-27b", parallel=4, ctx_size=8192)
    body = {"prompt": words(100), "n_predict": 2000, "ignore_eos": True, "stream": True}
    async with httpx.AsyncClient(base_url=h.url, timeout=30) as c:
        async with c.stream("POST", "/completion", json=body) as resp:
            async for _ in resp.aiter_lines():
                break
            slots = (await c.get("/slots")).json()
    real = load(capture, H200)
    busy = [s for s in slots if s["is_processing"]]
    assert len(slots) == 4 and busy
    assert shape_diff(busy[0], next(s for s in real if s["is_processing"])) == []


async def test_faults(sim_server) -> None:
    h = await sim_server(
        "llamacpp",
        fault=["error_rate=1", "metrics_garbage_rate=1"],
        fault_seed=1,
    )
    async with httpx.AsyncClient(base_url=h.url, timeout=30) as c:
        r = await c.post("/completion", json={"prompt": "hi", "n_predict": 2})
        assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
        assert "llamacpp:" not in (await c.get("/metrics")).text
    cut = await sim_server("llamacpp", fault=["stream_cut_rate=1"], fault_seed=2)
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 50,
        "stream": True,
        "ignore_eos": True,
    }
    async with httpx.AsyncClient(base_url=cut.url, timeout=30) as c:
        text = (await c.post("/v1/chat/completions", json=body)).text
    assert "[DONE]" not in text and 1 < text.count("data: ") < 12


async def test_kv_pressure_warning_in_log(sim_server) -> None:
    h = await sim_server("llamacpp", "kv_saturated")
    async with httpx.AsyncClient(base_url=h.url, timeout=60) as c:
        bodies = [
            {"prompt": words(900, f"k{i}"), "n_predict": 400, "ignore_eos": True} for i in range(4)
        ]
        results = await asyncio.gather(*(c.post("/completion", json=b) for b in bodies))
    assert any(r.json()["truncated"] for r in results)
    log = h.log_file.read_text()
    warning = " W srv        decode: failed to find free space in the KV cache, retrying with "
    assert warning + "smaller batch size" in log
    assert "kv_unified = 'true'" in log
