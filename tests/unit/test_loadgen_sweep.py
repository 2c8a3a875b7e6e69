"""`llmb-loadgen sweep`: step plan, pauses, server-side figures from the exporter or Prometheus."""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web

from cli.loadgen import main
from loadgen.report import step_block
from loadgen.scheduler.spec import RunSpec
from loadgen.sweep import plan_steps
from loadgen.target import Target
from simulator.stub import StubOptions, ThreadedStub
from tests.conftest import get_free_port


class FakeSources:
    """An exporter /metrics whose values rise per scrape, and a Prometheus query API."""

    def __init__(self) -> None:
        self.scrapes = 0
        self.queries: list[str] = []
        self.server = ThreadedStub(StubOptions(), extend=self._routes)

    def _routes(self, app: web.Application) -> None:
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/api/v1/query", self.query)

    async def metrics(self, request: web.Request) -> web.Response:
        self.scrapes += 1
        n = self.scrapes
        return web.Response(
            text=(
                "# TYPE llmb_gpu_memory_used_peak_bytes gauge\n"
                f'llmb_gpu_memory_used_peak_bytes{{gpu="0"}} {1e9 * n}\n'
                "# TYPE llmb_engine_kv_cache_usage_ratio gauge\n"
                f'llmb_engine_kv_cache_usage_ratio{{engine="target",kind="llamacpp"}} {n / 100}\n'
                'llmb_engine_kv_cache_usage_ratio{engine="other",kind="sglang"} 0.99\n'
                "# TYPE llmb_engine_requests_waiting gauge\n"
                f'llmb_engine_requests_waiting{{engine="target",kind="llamacpp"}} {n % 3}\n'
                # The load generator names a --url engine after its model ("stub-model");
                # the exporter calls it "target": the info series links the two.
                "# TYPE llmb_engine_info gauge\n"
                'llmb_engine_info{engine="target",model="/models/stub-model.gguf"} 1\n'
                'llmb_engine_info{engine="other",model="other-model"} 1\n'
            )
        )

    async def query(self, request: web.Request) -> web.Response:
        q = request.query["query"]
        self.queries.append(q)
        value = "0.5" if "kv_cache" in q else "7" if "waiting" in q else "2.5e10"
        result = [{"metric": {}, "value": [time.time(), value]}]
        return web.json_response(
            {"status": "success", "data": {"resultType": "vector", "result": result}}
        )

    def start(self) -> FakeSources:
        self.server.start()
        return self


@pytest.fixture
def sources() -> Iterator[FakeSources]:
    fake = FakeSources().start()
    yield fake
    fake.server.stop()


def test_plan_changes_one_variable_per_step() -> None:
    base = RunSpec(targets=[Target("t", "http://127.0.0.1:1")])
    steps = [(s.concurrency, s.prompt_tokens) for s in plan_steps(base, [1, 2, 4], [512, 2048])]
    assert steps == [(1, 512), (2, 512), (4, 512), (1, 2048)]
    grid = [(s.concurrency, s.prompt_tokens) for s in plan_steps(base, [1, 2], [8, 16, 32], True)]
    assert grid == [(1, 8), (2, 8), (2, 16), (1, 16), (1, 32), (2, 32)]
    for a, b in itertools.pairwise(grid):
        assert (a[0] != b[0]) + (a[1] != b[1]) == 1


def _sweep(out: Path, url: str, *extra: str) -> int:
    return main(
        [
            "sweep", "--url", url, "--kind", "llamacpp", "--out", str(out), "--metrics-port", "0",
            "--no-progress", "--max-tokens", "8", "--requests", "4", *extra,
        ]
    )  # fmt: skip


def test_sweep_with_exporter_probe(sources: FakeSources, tmp_path: Path) -> None:
    t0 = time.perf_counter()
    code = _sweep(
        tmp_path,
        sources.server.url,
        *("--concurrency", "1,2", "--prompt-tokens", "16,32", "--pause", "0.3"),
        *("--exporter-url", sources.server.url),
    )
    assert code == 0
    assert time.perf_counter() - t0 >= 0.6  # two pauses between three steps
    summary = json.loads((tmp_path / "summary.json").read_text())
    steps = summary["steps"]
    assert [(s["step"], s["concurrency"], s["prompt_tokens"]) for s in steps] == [
        (0, 1, 16),
        (1, 2, 16),
        (2, 1, 32),
    ]
    records = [json.loads(x) for x in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert sorted({r["step"] for r in records}) == [0, 1, 2] and len(records) == 12
    for s in steps:
        server = s["server"]
        assert server["source"] == "exporter" and server["scrapes"] >= 1
        assert server["gpu_memory_peak_bytes_max"] >= 1e9
        # Only this engine's series count: the other engine's KV usage (0.99) is ignored.
        assert 0 < server["kv_usage_max"] < 0.5
        assert "waiting_max" in server and "waiting_mean" in server
    assert "Server side during each step" in (tmp_path / "summary.md").read_text()


def test_sweep_with_prometheus_probe(sources: FakeSources, tmp_path: Path) -> None:
    code = _sweep(
        tmp_path,
        sources.server.url,
        *("--concurrency", "1,2", "--prompt-tokens", "16", "--pause", "0"),
        *("--prometheus-url", sources.server.url, "--name", "target"),
    )
    assert code == 0
    steps = json.loads((tmp_path / "summary.json").read_text())["steps"]
    assert len(steps) == 2
    server = steps[0]["server"]
    assert server["source"] == "prometheus"
    assert server["gpu_memory_peak_bytes_max"] == 2.5e10
    assert server["kv_usage_max"] == 0.5 and server["waiting_max"] == 7
    assert any('llmb_engine_kv_cache_usage_ratio{engine="target"}' in q for q in sources.queries)
    assert all("_over_time(" in q for q in sources.queries)


def test_sweep_rejects_bad_lists(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _sweep(tmp_path, "http://127.0.0.1:1", "--concurrency", "1,x") == 2
    assert "comma-separated integers" in capsys.readouterr().err


def test_threaded_stub_is_isolated() -> None:
    # Sanity for the fixtures above: two stubs do not share state.
    with ThreadedStub() as a, ThreadedStub() as b:
        assert a.port != b.port and a.state is not b.state
        assert threading.active_count() >= 3


def test_a_prometheus_that_fails_is_said_on_the_terminal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--prometheus-url at a dead port printed an empty server block and `VALID`: its error
    was only in summary.json."""
    with ThreadedStub() as stub:
        dead = f"http://127.0.0.1:{get_free_port()}"
        args = ("--concurrency", "1", "--prompt-tokens", "16", "--prometheus-url", dead)
        assert _sweep(tmp_path, stub.url, *args) == 0
    out = capsys.readouterr().out
    assert "error: gpu_memory_peak_bytes_max: ClientConnectorError" in out, out
    server = json.loads((tmp_path / "summary.json").read_text())["steps"][0]["server"]
    assert server["errors"] and all("ClientConnectorError" in e for e in server["errors"])
    quiet = step_block({"engine": "e", "server": {"source": "prometheus", "window_s": 4}})
    assert quiet[-2] == "no figures: no samples in the step's window (shorter than a scrape?)"
