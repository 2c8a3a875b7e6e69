"""The served mix from a real Prometheus that scraped a run, checked against the run's own
requests (issue 34 item 2: `--traffic-from`'s mix; `llmb-loadgen served-mix`).

A real engine (the CPU SGLang 0.5.11 with tiny Qwen2, or the CPU llama-server with Gemma 3
270M) serves two short `llmb-loadgen run`s with `--prompt-file` (no calibration probes, so the
engine serves exactly the run's requests): short prompts with 8 output tokens, then longer
prompts with longer answers. The real exporter reads the engine, a real Prometheus scrapes it every
second, and `served_mix` over the last hour (all Prometheus holds) must give:

- SGLang: the run's prompt and output lengths as histograms: each bucket's share of requests
  equal to the share of the run's `usage` lengths in that bucket, and the exact means;
- llama.cpp: the mean prompt and output lengths of the run (`fixed` at the mean, flagged);
- the number of requests the run finished, the rate over the window, running p50 <= p90 <= 2.

The mix counts each counter from its samples, not with `increase()`'s extrapolation
(`counted_increase`, tests/system/test_served_mix_promql.py): counts, means and shares are the
run's exactly.

With `LLMB_CAPTURE_SERVED_MIX=DIR` set, each test writes the queries it asked with
Prometheus' answers and the run's lengths into DIR/<engine> (tests/fixtures/served-mix-*).
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cli.loadgen import main
from loadgen.prompts import filler
from loadgen.served_mix import ServedMix, served_mix
from tests.conftest import get_free_port
from tests.plugins.exporter import ExporterProcess
from tests.plugins.llama import LlamaServer
from tests.plugins.loadgen import request_lines, run_cli
from tests.plugins.prom import QueryRecorder, start_prometheus, stop_process
from tests.plugins.sglang import SglangServer

pytestmark = [pytest.mark.prometheus, pytest.mark.timeout(900)]

# (filler words, --max-tokens, --requests): short prompts with short answers, then longer ones.
# SGLang's outputs reach its second bucket (100-300 tokens); llama.cpp gives only means, and
# Gemma 3 270M decodes slowly on two shared cores, so its answers stay short.
Runs = tuple[tuple[int, int, int], ...]
SGLANG_RUNS: Runs = ((40, 8, 4), (170, 110, 3))
LLAMA_RUNS: Runs = ((40, 8, 3), (170, 24, 3))
WINDOW = "1h"


def run_load(url: str, kind: str, runs: Runs, tmp_path: Path) -> list[dict[str, Any]]:
    """The runs against the engine; every request's record (all must have succeeded)."""
    records: list[dict[str, Any]] = []
    for i, (words, max_tokens, requests) in enumerate(runs):
        prompt = tmp_path / f"prompt-{i}.txt"
        prompt.write_text(filler(words), encoding="utf-8")
        out = tmp_path / f"run-{i}"
        args = ["--url", url, "--kind", kind, "--prompt-file", str(prompt)]
        args += ["--max-tokens", str(max_tokens), "--requests", str(requests)]
        assert run_cli(out, *args, "--concurrency", "2") == 0
        lines = request_lines(out)
        assert len(lines) == requests and not any(r["error"] for r in lines), lines
        records += lines
    return records


def scraped(prom_url: str, engine: str, records: list[dict[str, Any]], timeout: float = 60) -> None:
    """Wait until Prometheus has scraped every finished request, and one scrape more."""
    import httpx

    expr = (
        f'max_over_time(llmb_engine_requests_finished_total{{engine="{engine}"}}[{WINDOW}]) - '
        f'min_over_time(llmb_engine_requests_finished_total{{engine="{engine}"}}[{WINDOW}])'
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        body = httpx.get(f"{prom_url}/api/v1/query", params={"query": expr}, timeout=10).json()
        found = body["data"]["result"]
        if found and float(found[0]["value"][1]) >= len(records):
            time.sleep(2.5)
            return
        time.sleep(0.5)
    raise AssertionError(f"Prometheus did not see {len(records)} finished requests")


def mix_of_run(
    exporter: ExporterProcess, engine: str, kind: str, url: str, runs: Runs, tmp_path: Path
) -> tuple[ServedMix, list[dict[str, Any]], QueryRecorder]:
    """Prometheus scraping the exporter, the run, then the served mix (through a recorder)."""
    host = exporter.url.removeprefix("http://")
    workdir = tmp_path / "prometheus"
    workdir.mkdir()
    prom = start_prometheus(workdir, get_free_port(), {"llmb-exporter": [host]})
    try:
        prom.wait_until(
            lambda: bool(prom.query(f'llmb_engine_up{{engine="{engine}"}} == 1')),
            60,
            "the exporter's first scrape",
            every=0.5,
        )
        time.sleep(2)  # samples before the load: the window starts idle
        records = run_load(url, kind, runs, tmp_path)
        scraped(prom.url, engine, records)
        with QueryRecorder(prom.url) as recorder:
            mix = served_mix(recorder.url, WINDOW, engine)
            out = tmp_path / "mix.json"
            code = main(["served-mix", "--prometheus", recorder.url, "--window", WINDOW,
                         "--engine", engine, "--out", str(out), "--at", str(mix.at)])  # fmt: skip
            assert code == 0
            same_mix(
                json.loads(out.read_text(encoding="utf-8")), json.loads(mix.length_mix().to_json())
            )
    finally:
        stop_process(prom.process)
    capture(engine, recorder, runs, records)
    return mix, records, recorder


def same_mix(cli: dict[str, Any], lib: dict[str, Any]) -> None:
    """The command's file and served_mix()'s, read a moment apart at one `--at`: counted from
    the samples and every query evaluated at that instant, they are the same (the scrapes in
    between moved the running quantiles when each read ended at its own now)."""
    assert cli == lib


def capture(
    engine: str, recorder: QueryRecorder, runs: Runs, records: list[dict[str, Any]]
) -> None:
    """With LLMB_CAPTURE_SERVED_MIX=DIR: the answers and the run's lengths, for unit tests."""
    root = os.environ.get("LLMB_CAPTURE_SERVED_MIX")
    if not root:
        return
    folder = Path(root) / engine
    folder.mkdir(parents=True, exist_ok=True)
    # Each query once, as served_mix() got it (the CLI asked the same ones a moment later).
    first: dict[str, dict[str, Any]] = {}
    for answer in recorder.answers:
        first.setdefault(answer["query"], answer)
    answers = list(first.values())
    (folder / "queries.json").write_text(json.dumps(answers, indent=1) + "\n", encoding="utf-8")
    lengths = [[r["prompt_tokens"], r["completion_tokens"]] for r in records]
    run = {"window": WINDOW, "engine": engine, "runs": runs, "lengths": lengths}
    (folder / "run.json").write_text(json.dumps(run) + "\n", encoding="utf-8")


def shares(values: list[int], bounds: list[float]) -> list[float]:
    """The share of `values` in each bucket (upper bounds, each from the bound before it)."""
    counts = [0] * len(bounds)
    for v in values:
        counts[next(i for i, ub in enumerate(bounds) if v <= ub)] += 1
    return [c / len(values) for c in counts]


def check_counts(mix: ServedMix, records: list[dict[str, Any]]) -> None:
    n = len(records)
    assert mix.requests == n
    assert mix.rate_per_second == pytest.approx(n / 3600)
    assert mix.running_p50 is not None and mix.running_p90 is not None
    assert 0 <= mix.running_p50 <= mix.running_p90 <= 2
    assert mix.concurrency == max(1, -int(-mix.running_p90 // 1))
    doc = json.loads(mix.length_mix().to_json())
    assert (doc["kind"], doc["version"], doc["requests"]) == ("llmb-length-mix", 1, None)
    assert doc["rate_per_second"] == mix.rate_per_second
    assert doc["concurrency"] == float(mix.concurrency or 0)


@pytest.mark.sglang
def test_sglang_served_mix_is_the_runs_lengths(
    sglang_server: SglangServer,
    exporter_process: Callable[[dict[str, Any]], ExporterProcess],
    tmp_path: Path,
) -> None:
    engine = {"name": "sgl", "kind": "sglang", "url": sglang_server.url}
    exporter = exporter_process({"engines": [engine], "gpu": {"enabled": False}})
    mix, records, _ = mix_of_run(
        exporter, "sgl", "sglang", sglang_server.url, SGLANG_RUNS, tmp_path
    )
    assert (mix.engine, mix.kind) == ("sgl", "sglang")
    check_counts(mix, records)
    for lengths, key in ((mix.prompt, "prompt_tokens"), (mix.output, "completion_tokens")):
        values = [r[key] for r in records]
        assert lengths.mean == pytest.approx(statistics.fmean(values), rel=1e-9), key
        assert lengths.buckets, key
        bounds = [ub for ub, _ in lengths.buckets]
        total = sum(w for _, w in lengths.buckets)
        assert total == len(values), key
        got = [w / total for _, w in lengths.buckets]
        want = shares(values, bounds)
        assert got == pytest.approx(want, abs=1e-9), (key, got, want)
    # Two prompt buckets (<=100 and 100-300 tokens) and two output buckets (<=100, 100-300).
    assert len(mix.prompt.buckets) == len(mix.output.buckets) == 2
    doc = json.loads(mix.length_mix().to_json())
    assert doc["prompt_tokens"]["empirical"] == [[ub, round(w, 3)] for ub, w in mix.prompt.buckets]
    assert not any("mean length" in item for item in mix.lacks)


@pytest.mark.llamaserver
def test_llamacpp_served_mix_is_the_runs_mean_lengths(
    llama_server: Callable[..., LlamaServer],
    exporter_process: Callable[[dict[str, Any]], ExporterProcess],
    tmp_path: Path,
) -> None:
    server = llama_server(parallel=2)
    engine = {"name": "llama", "kind": "llamacpp", "url": server.url, "log_file": str(server.log)}
    exporter = exporter_process({"engines": [engine], "gpu": {"enabled": False}})
    mix, records, _ = mix_of_run(exporter, "llama", "llamacpp", server.url, LLAMA_RUNS, tmp_path)
    assert (mix.engine, mix.kind) == ("llama", "llamacpp")
    check_counts(mix, records)
    for lengths, key in ((mix.prompt, "prompt_tokens"), (mix.output, "completion_tokens")):
        mean = statistics.fmean(r[key] for r in records)
        assert lengths.mean == pytest.approx(mean, rel=1e-9), key
        assert lengths.buckets == () and lengths.dist().to_obj() == {"fixed": round(lengths.mean)}
    assert mix.lacks[0] == (
        "llama.cpp exports only token totals, no per-request length histograms "
        "(llmb_engine_request_prompt_tokens, llmb_engine_request_generation_tokens): the mix "
        "is the mean length"
    )
    assert "llama.cpp exports only token totals" in json.loads(mix.length_mix().to_json())["source"]
