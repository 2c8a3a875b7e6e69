"""`decide --load-from`: the user's load read from a real Prometheus (issue 26, item 2).

A real `prometheus` scrapes, every second, a small exporter page served here whose
`llmb_engine_requests_running` changes scrape by scrape for three engines; then
`llmb-loadgen decide` re-decides the saved H200 same-weights run (no difference beyond the
noise at c=1 and c=4 with its two rounds, SGLang ahead from c=16 on) for the load each
engine served, as Prometheus computes its p90:

- llama, busy (64 running in 3 scrapes of 4, else 40): c=64 → switch to SGLang;
- prod-llama, nearly idle (0, one scrape in 5 at 1): c=1 → stay on llama;
- light (0, 1, 2, 0, 1): a p90 above 1 and at most 2 (1.4 or 1.5 after 6 or 7 scrapes, 2
  later), rounded up to c=2, between c=1 and c=4, which agree → stay, "at c=2".
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from cli.loadgen import main
from tests.conftest import get_free_port
from tests.paths import ROOT
from tests.plugins.engine_stubs import ThreadedApp
from tests.plugins.prom import PrometheusServer, start_prometheus, stop_process

pytestmark = pytest.mark.prometheus

SAME = ROOT / "docs" / "results" / "h200-sglang-vs-llamacpp-2026-12-01" / "same-weights"
RUNNING = {
    "llama": [40, 64, 64, 64],
    "prod-llama": [0, 1, 0, 0, 0],
    "light": [0, 1, 2, 0, 1],
}
SAMPLES = 6  # scrapes of each engine before deciding (1 s apart)


class RunningRequests(ThreadedApp):
    """An exporter's /metrics with only the running-requests gauge, the next value each scrape."""

    def __init__(self) -> None:
        super().__init__()
        self.cycles = {name: itertools.cycle(values) for name, values in RUNNING.items()}

    async def handle(self, request: web.Request) -> web.StreamResponse:
        lines = ["# TYPE llmb_engine_requests_running gauge"]
        for name, values in self.cycles.items():
            lines.append(f'llmb_engine_requests_running{{engine="{name}"}} {next(values)}')
        return web.Response(text="\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusServer]:
    """One Prometheus for the module, with SAMPLES scrapes of every engine in it."""
    with RunningRequests() as page:
        workdir = tmp_path_factory.mktemp("prometheus")
        server = start_prometheus(
            workdir, get_free_port(), {"llmb-exporter": [f"127.0.0.1:{page.port}"]}
        )
        try:
            expr = 'count_over_time(llmb_engine_requests_running{engine="light"}[1h])'

            def enough() -> bool:
                found = server.query(expr)
                return bool(found) and float(found[0]["value"][1]) >= SAMPLES

            server.wait_until(enough, 30, f"{SAMPLES} scrapes of the page", every=0.5)
            yield server
        finally:
            stop_process(server.process)


def decide(tmp_path: Path, name: str, *flags: str) -> tuple[int, dict[str, Any]]:
    out = tmp_path / name
    code = main(["decide", str(SAME), "--in-use", "llama", *flags, "--out", str(out)])
    path = out / "results.json"
    return code, json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def test_decide_answers_for_the_load_prometheus_saw(
    prom: PrometheusServer, tmp_path: Path, capsys: Any
) -> None:
    code, busy = decide(tmp_path, "busy", "--load-from", prom.url)
    assert code == 0
    assert busy["recommendation"] == "switch_to:sglang"
    assert busy["decision"]["load"] == 64
    source = busy["decision"]["load_source"]
    assert source.startswith("the p90 of running requests over the last 1h on llama (64 over ")
    assert source.endswith(f"samples; Prometheus at {prom.url})")
    assert f"your load       c=64, {source}" in capsys.readouterr().out

    code, idle = decide(tmp_path, "idle", "--load-from", prom.url, "--load-engine", "prod-llama")
    assert code == 0 and idle["decision"]["load"] == 1
    assert idle["recommendation"] == "stay"
    assert "on prod-llama (" in idle["decision"]["load_source"]

    # Prometheus' own p90 of the light engine, above 1: rounded up to 2.
    (light_p90,) = prom.query(
        'quantile_over_time(0.9, llmb_engine_requests_running{engine="light"}[1h])'
    )
    assert 1 < float(light_p90["value"][1]) <= 2
    code, light = decide(
        tmp_path, "light", "--load-from", prom.url, "--load-engine", "light", "--load-window", "5m"
    )
    assert code == 0 and light["decision"]["load"] == 2
    assert light["recommendation"] == "stay"
    assert "at c=2 (between c=1: no difference, ratio [" in light["action"]
    assert "and c=4: no difference, ratio [1.06–1.20], which agree)" in light["action"]
    assert "over the last 5m on light" in light["decision"]["load_source"]


def test_load_wins_and_an_unknown_engine_is_one_message(
    prom: PrometheusServer, tmp_path: Path, capsys: Any
) -> None:
    code, doc = decide(tmp_path, "given", "--load", "1", "--load-from", prom.url)
    assert code == 0 and doc["recommendation"] == "stay"
    assert doc["decision"]["load_source"] == "--load"
    capsys.readouterr()
    code, doc = decide(tmp_path, "nope", "--load-from", prom.url, "--load-engine", "sglang")
    err = capsys.readouterr().err
    assert code == 2 and doc == {}
    assert "no llmb_engine_requests_running samples of engine 'sglang' in the last 1h" in err
    assert "it has samples of light, llama, prod-llama: pass --load-engine NAME" in err
