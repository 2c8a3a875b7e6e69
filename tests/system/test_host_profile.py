"""System test: `docker compose --profile host up -d` on a llama-server already running (issue 25).

A real CPU llama-server with the real Gemma 3 270M runs on this host, outside compose, on
127.0.0.1 with `--metrics -lv 4 --log-file`; `.env` gets only LLAMACPP_URL,
LLAMACPP_LOG_FILE and LLAMACPP_MODEL_FILE (no SGLANG_URL, no LLMB_CONFIG_FILE). The stack
runs on the real Docker daemon as tests/system/test_docker_stack.py runs it (tests/
docker_stack.py: images built locally, the same tags, so after that test every build is a
cache hit; the stack's network `internal: true`), and everything is read through the
Prometheus and Alertmanager APIs from inside. The tests run in file order on one stack.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests import docker_stack as ds
from tests.plugins.exporter import parse_samples
from tests.plugins.llama import LlamaServer, find_gemma_model, find_llama_server, start_llama_server

SERVICES = ["exporter", "prometheus", "alertmanager", "host-link", "engine-link"]
TIMINGS: dict[str, float] = {}


@dataclass
class Host:
    stack: ds.Stack
    server: LlamaServer


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    start = time.monotonic()
    base = ds.install_docker()
    work = Path(os.path.realpath(tmp_path_factory.mktemp("host-profile")))
    model = work / "gemma.gguf"
    try:
        os.link(find_gemma_model(), model)
    except OSError:
        model.write_bytes(find_gemma_model().read_bytes())
    model.chmod(0o644)  # the exporter runs as uid 10001
    (work / "models").mkdir()  # MODELS_DIR: unused here, but mounted
    # -c 512 -np 2: 256 tokens a slot, so the load below is cut short (KV pressure).
    server = start_llama_server(find_llama_server(), model, work, "--no-repack", ctx=512)
    server.log.chmod(0o644)
    env = ds.compose_env(work / "models", work / "out", base)
    env.update(
        LLAMACPP_URL=server.url,
        LLAMACPP_LOG_FILE=str(server.log),
        LLAMACPP_MODEL_FILE=str(model),
    )
    TIMINGS["build"] = sum(ds.build_images(base, env).values())
    stack = ds.Stack(f"llmbhost{os.getpid()}", work, env, base)
    try:
        yield Host(stack, server)
    finally:
        try:
            stack.down()
        finally:
            server.stop()
            TIMINGS["total"] = time.monotonic() - start
            print(f"\nhost profile timings (s): { {k: round(v) for k, v in TIMINGS.items()} }")


@pytest.mark.timeout(2400)  # the first test waits for the fixture: install and builds
def test_host_profile_lists_the_engine_of_the_url_with_its_log_and_model(host: Host) -> None:
    start = time.monotonic()
    stack = host.stack
    stack.compose(["host"], "up", "-d", "--no-build")
    stack.wait_healthy(SERVICES)
    # Nothing is published beyond 127.0.0.1, and the links publish nothing at all.
    for service in SERVICES:
        ports = stack.inspect(service)["HostConfig"]["PortBindings"] or {}
        hosts = {b["HostIp"] for bindings in ports.values() for b in bindings or []}
        assert hosts <= {"127.0.0.1"}, (service, ports)
        if service.endswith("-link"):
            assert not ports, service
    assert stack.inspect("host-link")["HostConfig"]["NetworkMode"] == "host"
    assert stack.inspect("exporter")["HostConfig"]["PidMode"] == "host"

    ds.wait_for(
        lambda: stack.query('llmb_engine_up{engine="llama"} == 1'), 90, "llama up in Prometheus"
    )
    metrics = parse_samples(stack.fetch("http://exporter:9490/metrics"))
    engines = {dict(labels).get("engine") for _, labels in metrics} - {None}
    assert engines == {"llama"}, engines  # no SGLANG_URL: no sgl engine at all
    # From the -lv 4 log, read through the mount: where the layers and their weights went,
    # as llama-server logged it (a GPU build logs `offloaded N/M layers to GPU`; this CPU
    # build logs its model buffers only), and the KV buffers.
    log = host.server.log.read_text(errors="replace")
    offloaded = re.search(r"offloaded (\d+)/(\d+) layers to GPU", log)
    if offloaded:
        for name, value in (("offloaded", offloaded[1]), ("total", offloaded[2])):
            rows = stack.query(f'llmb_engine_gpu_layers_{name}{{engine="llama"}}')
            assert [float(r["value"][1]) for r in rows] == [float(value)], name
    for series, pattern in (
        (
            "llmb_engine_model_buffer_bytes",
            r"load_tensors:\s+(\S+) model buffer size =\s+([\d.]+) MiB",
        ),
        ("llmb_engine_kv_cache_bytes", r"llama_kv_cache:\s+(\S+) KV buffer size =\s+([\d.]+) MiB"),
    ):
        logged: dict[str, float] = {}
        for device, mib in re.findall(pattern, log):
            logged[device] = logged.get(device, 0.0) + float(mib) * 2**20
        assert logged, f"llama-server logged no {series} line"
        rows = stack.query(f'{series}{{engine="llama"}}')
        got = {r["metric"]["device"]: float(r["value"][1]) for r in rows}
        assert got == pytest.approx(logged), series
    # From the GGUF (read through the mount): the geometry and the KV estimate.
    assert [float(r["value"][1]) for r in stack.query('llmb_model_layers{engine="llama"}')] == [
        18.0
    ]
    for name in ("llmb_model_kv_bytes_per_token_estimated", "llmb_model_kv_cache_bytes_estimated"):
        rows = stack.query(f'{name}{{engine="llama"}}')
        assert rows and float(rows[0]["value"][1]) > 0, name
    assert stack.query('llmb_source_errors_total{source="llama"} > 0') == []
    TIMINGS["up"] = time.monotonic() - start


@pytest.mark.timeout(600)
def test_verdict_is_set_and_nothing_alerts_at_rest(host: Host) -> None:
    start = time.monotonic()
    stack = host.stack
    verdicts = ds.wait_for(
        lambda: stack.query("llmb:engine_bottleneck:verdict == 1"), 120, "a verdict for llama"
    )
    assert [r["metric"]["engine"] for r in verdicts] == ["llama"]
    time.sleep(20)  # four evaluations of every rule at rest
    assert stack.query("ALERTS") == []
    assert stack.alertmanager_alerts() == []
    # No SGLang engine was named: no SGLang series, so no SGLang alert can exist.
    assert stack.query('{kind="sglang"}') == [] and stack.query('{engine="sgl"}') == []
    targets = stack.api("http://127.0.0.1:9090/api/v1/targets")["data"]["activeTargets"]
    assert {t["labels"]["job"] for t in targets if t["health"] == "up"} == {"llmb-exporter"}
    TIMINGS["rest"] = time.monotonic() - start


def complete(url: str, prompt_words: int, tokens: int) -> dict[str, Any]:
    """One completion sent from this host straight to the host's llama-server."""
    body = json.dumps(
        {"prompt": " ".join(["word"] * prompt_words), "n_predict": tokens, "cache_prompt": False}
    ).encode()
    request = urllib.request.Request(
        f"{url}/completion", body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as resp:
        doc: dict[str, Any] = json.loads(resp.read())
    return doc


@pytest.mark.timeout(600)
def test_kv_saturation_fires_the_kv_alert_in_alertmanager(host: Host) -> None:
    """Prompts of ~200 tokens asking 100 more in 256-token slots: llama.cpp logs them cut."""
    start = time.monotonic()
    stack = host.stack
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda _: complete(host.server.url, 200, 100), range(4)))

    alert = stack.wait_for_alert("LLMKVCacheSaturated", "llama", 240)
    assert alert["labels"]["severity"] == "warning"
    firing = {r["metric"]["alertname"] for r in stack.query('ALERTS{alertstate="firing"}')}
    assert "LLMKVCacheSaturated" in firing
    assert not [a for a in stack.alertmanager_alerts() if a["labels"].get("engine") == "sgl"]
    TIMINGS["kv_alert"] = time.monotonic() - start
