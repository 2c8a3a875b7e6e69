"""The live rules under realistic traffic (issue 34 item 6): a mixed Mooncake trace (long
and short prompts, shared prefixes) replayed by `diagnose --traffic` against the real CPU
llama-server (Gemma 3 270M), with the real exporter reading it and a real Prometheus
scraping the exporter and evaluating the shipped rules every second.

The recording rules' verdict (`llmb:engine_bottleneck:verdict`) at the end of the replay
must be diagnose's on the same run (diagnose reads the same exporter: `--exporter-url`), and
no alert may be pending or firing but the one the verdict justifies. Prometheus starts just
before diagnose, so its windows hold this run alone (what diagnose's step window takes)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from cli.loadgen import main as loadgen_main
from tests.plugins.exporter import ExporterProcess
from tests.plugins.llama import LlamaServer
from tests.plugins.prom import PrometheusServer

pytestmark = [pytest.mark.llamaserver, pytest.mark.prometheus, pytest.mark.timeout(400)]

# Six requests 200 ms apart on one slot: each prefill takes longer than the gap, so the
# later ones wait (a queue the rules and diagnose both see). Long prompts open with one
# shared 512-token block; the short ones share nothing.
ROWS = [
    {"timestamp": 200 * i, "input_length": n, "output_length": out, "hash_ids": ids}
    for i, (n, out, ids) in enumerate(
        [(600, 4, [0, 100]), (60, 3, [300]), (620, 4, [0, 101]), (70, 3, [301]),
         (640, 4, [0, 102]), (80, 3, [302])]
    )
]  # fmt: skip
# The alert each verdict justifies (alerts.yml), pending or firing while it holds.
JUSTIFIED = {"scheduling_bound": {"LLMRequestsQueueing"}, "kv_saturated": {"LLMKVCacheSaturated"}}


def query_at(prom: PrometheusServer, expr: str, at: float) -> list[dict[str, Any]]:
    resp = httpx.get(f"{prom.url}/api/v1/query", params={"query": expr, "time": at}, timeout=10)
    body = resp.json()
    assert body["status"] == "success", body
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def scraped_stack(
    engine: dict[str, Any],
    exporter_process: Callable[[dict[str, Any]], ExporterProcess],
    prometheus_server: Callable[[dict[str, list[str]]], PrometheusServer],
) -> tuple[ExporterProcess, PrometheusServer]:
    """The real exporter reading `engine` and a Prometheus that has scraped it once."""
    exporter = exporter_process({"engines": [engine], "gpu": {"enabled": False}})
    prom = prometheus_server({"llmb-exporter": [exporter.url.removeprefix("http://")]})
    prom.wait_until(
        lambda: bool(prom.query(f'llmb_engine_up{{engine="{engine["name"]}"}} == 1')),
        60,
        "the exporter's first scrape",
        every=0.5,
    )
    return exporter, prom


def write_trace(tmp_path: Path) -> Path:
    """ROWS as a Mooncake JSONL file."""
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return trace


def replayed(out: Path, name: str) -> tuple[dict[str, Any], str, dict[str, Any], list[Any]]:
    """diagnose's engine, verdict and traffic row from `out`, and its requests, each of which
    must have the trace's usage (±1 prompt token: a template's merged token)."""
    doc = json.loads((out / "results.json").read_text())
    (result,) = doc["engines"]
    (row,) = [r for r in result["rows"] if r["step"] == "concurrency"]
    assert row["requests"] == 6 and row["tokens_ok"] is True, row
    records = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    assert sorted(r["index"] for r in records) == list(range(6))
    for rec in records:
        asked = ROWS[rec["index"]]
        assert abs(rec["prompt_tokens"] - asked["input_length"]) <= 1, rec
        assert rec["completion_tokens"] == asked["output_length"], rec
    return result, doc["verdict"][name], row, records


def rules_agree(prom: PrometheusServer, result: dict[str, Any], name: str, verdict: str) -> None:
    """The rules' verdict at the end of the replay (the step's last sample), as Prometheus
    evaluated it from its own scrapes of the exporter, is diagnose's; no alert but the
    verdict's own (pending: the run is shorter than its `for`)."""
    (phase,) = [p for p in result["phases"] if p["name"] == "concurrency"]
    prom.wait_until(
        lambda: bool(query_at(prom, "llmb:engine_bottleneck:verdict", phase["end"] + 2)),
        30,
        "the rules' evaluation after the step",
        every=0.5,
    )
    found = query_at(prom, f'llmb:engine_bottleneck:verdict{{engine="{name}"}} == 1', phase["end"])
    assert [s["metric"]["verdict"] for s in found] == [verdict], (found, result["signals"])
    alerts = query_at(prom, f'ALERTS{{engine="{name}"}}', phase["end"])
    assert {a["metric"]["alertname"] for a in alerts} <= JUSTIFIED.get(verdict, set()), alerts


def test_the_rules_give_diagnose_s_verdict_under_a_mixed_trace(
    tmp_path: Path,
    llama_server: Callable[..., LlamaServer],
    exporter_process: Callable[[dict[str, Any]], ExporterProcess],
    prometheus_server: Callable[[dict[str, list[str]]], PrometheusServer],
) -> None:
    server = llama_server("--swa-full", ctx=4096, parallel=1)
    engine = {"name": "llama", "kind": "llamacpp", "url": server.url, "log_file": str(server.log)}
    exporter, prom = scraped_stack(engine, exporter_process, prometheus_server)
    trace = write_trace(tmp_path)
    out = tmp_path / "out"
    code = loadgen_main(["diagnose", "--url", server.url, "--name", "llama",
                         "--exporter-url", exporter.url, "--out", str(out),
                         "--concurrency", "8", "--traffic", str(trace)])  # fmt: skip
    assert code == 0
    result, verdict, row, records = replayed(out, "llama")
    # One slot, six requests in a second: the queue is the bottleneck, by the run itself.
    assert verdict == "scheduling_bound", (verdict, result["signals"])
    assert row["prompt_cache_hit_ratio"] is not None and row["prompt_cache_hit_ratio"] > 0.2
    # The counters' cached share is the engine's per-request cache_n over the step.
    cached = sum(r["cached_tokens"] for r in records) / sum(r["prompt_tokens"] for r in records)
    assert row["prompt_cache_hit_ratio"] == pytest.approx(cached, abs=0.02)
    rules_agree(prom, result, "llama", verdict)
