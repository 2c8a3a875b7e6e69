"""SGLang streaming empty text: per-sequence decode and TTFT from the engine's own figures.

The real SGLang 0.5.11 on the CPU (tests/plugins/sglang.py) serves the tiny Qwen2 with random
weights and a tokenizer whose every token is special (`silent_model_dir`): every generated id
decodes to "", so the stream carries a chunk per token with `"text": ""` and the client stamps
none, as on the H200 runs. `diagnose` then reports decode and TTFT from SGLang's own
histograms over each step (through the exporter's series), says so, and the figures equal
SGLang's /metrics over the same requests.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

import diagnose.load
from cli.loadgen import main as loadgen_main
from diagnose.decision.sources import ENGINE, ENGINE_NOTE
from tests.plugins.sglang import (
    SERVED_MODEL_NAME,
    SGLANG_SERVER,
    SglangServer,
    silent_model_dir,
    start_sglang_server,
)

pytestmark = [pytest.mark.sglang, pytest.mark.timeout(900)]

MAX_TOKENS = 16
# SGLang's histograms behind the exporter's TTFT and decode series.
TTFT = "sglang:time_to_first_token_seconds"
ITL = "sglang:inter_token_latency_seconds"


@pytest.fixture(scope="module")
def silent_server(
    sglang_python: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SglangServer]:
    work = tmp_path_factory.mktemp("sglang-silent")
    spec = replace(SGLANG_SERVER, model=silent_model_dir(work / "model"))
    server = start_sglang_server(sglang_python, work, spec)
    try:
        yield server
    finally:
        server.stop()


def histograms(url: str) -> dict[str, float]:
    """The `_sum` and `_count` of SGLang's TTFT and inter-token histograms, over their labels."""
    out: dict[str, float] = {}
    text = httpx.get(url + "/metrics", timeout=30).text
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.endswith(("_sum", "_count")) and s.name.startswith((TTFT, ITL)):
                out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def rise(before: dict[str, float], after: dict[str, float], name: str) -> float:
    return after.get(name, 0.0) - before.get(name, 0.0)


def stream(url: str, prompt: str) -> list[dict[str, Any]]:
    """One streamed completion's events (the load generator's request, by hand)."""
    body = {"model": SERVED_MODEL_NAME, "prompt": prompt, "max_tokens": MAX_TOKENS,
            "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    events = []
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if line.startswith("data: {"):
                events.append(json.loads(line[6:]))
    return events


def test_the_silent_model_streams_every_token_as_empty_text(silent_server: SglangServer) -> None:
    """The setup is what the H200 runs saw: all the tokens asked for, none with text."""
    events = stream(silent_server.url, "Request apple river stone. the quick brown fox")
    usage = events[-1]["usage"]
    assert usage["completion_tokens"] == MAX_TOKENS
    assert usage["prompt_tokens"] == 9  # one token per word, "stone." two
    texts = [e["choices"][0]["text"] for e in events if e.get("choices")]
    assert texts and all(t == "" for t in texts), texts


def test_diagnose_reports_decode_and_ttft_from_sglang_s_own_histograms(
    silent_server: SglangServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Each step's per-sequence decode is SGLang's inter-token count / sum and its TTFT the
    TTFT histogram's sum / count over that step's requests, read here from SGLang's /metrics
    when each step begins (after the prompt calibration) and at the end."""
    snaps: list[dict[str, float]] = []
    calibrate: Callable[..., Any] = diagnose.load.calibrate_first

    async def calibrate_then_scrape(*args: Any) -> Any:
        prompts = await calibrate(*args)  # the real calibration, then SGLang's own figures
        snaps.append(histograms(silent_server.url))
        return prompts

    monkeypatch.setattr(diagnose.load, "calibrate_first", calibrate_then_scrape)
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump({"gpu": {"enabled": False}}))
    out = tmp_path / "out"
    code = loadgen_main(
        ["diagnose", "--url", silent_server.url, "--kind", "sglang", "--config", str(cfg),
         "--out", str(out), "--concurrency", "1,2", "--prompt-tokens", "32",
         "--max-tokens", str(MAX_TOKENS), "--requests-per-slot", "3",
         "--kv-prompt-tokens", "0", "--settle", "0"]
    )  # fmt: skip
    snaps.append(histograms(silent_server.url))
    assert code == 0
    doc = json.loads((out / "results.json").read_text())
    records = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    # The client saw no text: no chunk, no TTFT, no decode rate of its own.
    assert records and all(r["chunks"] == 0 and r["ttft_s"] is None for r in records)
    assert all(r["completion_tokens"] == MAX_TOKENS and r["error"] is None for r in records)
    rows = [r for r in doc["engines"][0]["rows"] if r["step"] in ("single", "concurrency")]
    assert [r["concurrency"] for r in rows] == [1, 2] and len(snaps) == 3
    for row, before, after in zip(rows, snaps[:-1], snaps[1:], strict=True):
        assert row["per_seq_source"] == ENGINE and row["ttft_source"] == ENGINE, row
        assert rise(before, after, TTFT + "_count") == row["requests"]
        ttft = rise(before, after, TTFT + "_sum") / rise(before, after, TTFT + "_count")
        decode = rise(before, after, ITL + "_count") / rise(before, after, ITL + "_sum")
        assert row["ttft_s"] == pytest.approx(ttft, rel=1e-6), row
        assert row["per_seq_tok_s"] == pytest.approx(decode, rel=1e-6), row
        # Each request's TTFT is within its own e2e, so the mean is within the mean e2e (not
        # within the fastest request's: on a loaded CPU a step's requests vary by 10x).
        e2e = [r["e2e_s"] for r in records if r["step"] in row["record_steps"]]
        assert 0 < row["ttft_s"] < sum(e2e) / len(e2e), (row, e2e)
    # Every surface says where the figures came from; no TTFT reads 0.000 s.
    steps = {s["key"]: s["answer"] for s in doc["decision"]["steps"]}
    assert steps["single"].startswith(f"{rows[0]['per_seq_tok_s']:.1f} tok/s per sequence")
    assert f"({ENGINE_NOTE})" in steps["single"]
    assert f"TTFT mean {rows[1]['ttft_s']:.3f} s ({ENGINE_NOTE})" in steps["concurrency"]
    printed = capsys.readouterr().out
    assert f"({ENGINE_NOTE})" in printed
    # A wait of 0.000 s is a reading (SGLang's queue-time histogram at c=1); a TTFT or a prompt
    # time of 0.000 s would be a missing one.
    assert not re.search(r"(TTFT[a-z0-9 ]*|prompt) 0\.000 s", printed), printed
    report = (out / "report.md").read_text()
    assert f"{rows[0]['per_seq_tok_s']:.1f} (engine)" in report
    assert f"{rows[1]['ttft_s'] * 1000:.1f} (engine)" in report
