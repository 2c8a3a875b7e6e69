"""Golden /metrics of the whole exporter: fake NVML (H200 capture) + llama.cpp (H200 capture)
+ SGLang 0.5.23 (busy), rendered by client_python and checked with `promtool check metrics`.

Regenerate after an intended change with `pytest tests/system/test_golden.py --update-golden`.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest
from prometheus_client.exposition import generate_latest

from config.settings import parse_config
from exporter.app import build_runner
from exporter.runner import Families
from tests.paths import FIXTURES, ROOT
from tests.plugins.engine_stubs import LLAMA_BODIES, SGLANG_BODIES

FIX = FIXTURES
H200 = FIX / "llamacpp-h200-gemma3-27b-shape-q4_0"
GOLDEN = ROOT / "tests" / "golden" / "exporter.txt"

ROUTES = {
    host: {path: (200, body) for path, body in bodies.items()}
    for host, bodies in (("127.0.0.1:8080", LLAMA_BODIES), ("127.0.0.1:30000", SGLANG_BODIES))
}

# Values that change from run to run.
MASK = re.compile(r"^(llmb_source_duration_seconds\{[^}]*\}) .*$", re.M)


def handler(request: httpx.Request) -> httpx.Response:
    host = f"{request.url.host}:{request.url.port}"
    status, body = ROUTES.get(host, {}).get(request.url.path, (404, ""))
    return httpx.Response(status, text=body)


async def render() -> str:
    config = parse_config(
        {
            # Pinned so the golden file does not depend on the machine that runs the test.
            "host": "gpu-box-1",
            "engines": [
                {
                    "name": "llama",
                    "kind": "llamacpp",
                    "url": "http://127.0.0.1:8080",
                    "log_file": str(H200 / "server_c32k_np4.log"),
                },
                {"name": "sgl", "kind": "sglang", "url": "http://127.0.0.1:30000"},
            ],
            "gpu": {"fake_file": [str(H200 / "nvml_6_np4_c4.json")]},
        },
        environ={},
    )
    runner = build_runner(config, httpx.AsyncClient(transport=httpx.MockTransport(handler)))
    # No background sampler: every value comes from the scrape itself.
    families = await runner.scrape(5.0)
    await runner.close()
    text = generate_latest(Families(families)).decode()  # type: ignore[arg-type]
    return MASK.sub(r"\1 <masked>", text)


async def test_golden_metrics(request: pytest.FixtureRequest) -> None:
    text = await render()
    if request.config.getoption("--update-golden"):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text(), (
        "exporter output changed: rerun with --update-golden if intended"
    )


def test_golden_passes_promtool(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool missing: run scripts/install.sh (Debian package prometheus)"
    text = GOLDEN.read_text().replace("<masked>", "0.001")
    proc = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    problems = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    # The issue fixes this gauge's name (a layer count, not a counter): the one accepted lint.
    accepted = {'llmb_engine_gpu_layers_total non-counter metrics should not have "_total" suffix'}
    assert set(problems) <= accepted, problems


def test_golden_covers_both_engines_and_gpu() -> None:
    text = GOLDEN.read_text()
    for needle in (
        'llmb_engine_up{engine="llama",host="gpu-box-1",kind="llamacpp"} 1.0',
        'llmb_engine_up{engine="sgl",host="gpu-box-1",kind="sglang"} 1.0',
        'llmb_gpu_memory_used_bytes{gpu="0",host="gpu-box-1"}',
        'llmb_engine_process_gpu_memory_bytes{engine="llama",host="gpu-box-1",kind="llamacpp"}',
        "llmb_engine_kv_cache_usage_ratio{",
        'llmb_source_up{host="gpu-box-1",source="nvml"} 1.0',
        'llmb_exporter_build_info{host="gpu-box-1",version=',
    ):
        assert needle in text, needle
    # Every series names its host (issue 8: many hosts on one Prometheus).
    series = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    assert series and all('host="gpu-box-1"' in ln for ln in series)
    assert "llamacpp:" not in text and "sglang:" not in text  # raw names are not re-exposed
