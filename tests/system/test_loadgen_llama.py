"""The load generator against the real llama-server (CPU build, Gemma 3 270M): the issue's
"Done when" run, token counts against the server's own accounting, and a server killed mid-run."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cli.loadgen import main
from tests.plugins.loadgen import loadgen_process, request_lines, run_cli, wait_for_records

pytestmark = pytest.mark.llamaserver


def _config(tmp_path: Path, url: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(f"engines:\n  - {{name: llama, kind: llamacpp, url: '{url}'}}\n")
    return path


def _counter(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return float(sample.value)
    raise KeyError(name)


def test_done_when_run_matches_the_server(llama_server: Any, tmp_path: Path) -> None:
    server = llama_server(ctx=4096, parallel=2)
    out = tmp_path / "out"
    code = main(
        [
            "run", "--config", str(_config(tmp_path, server.url)), "--engine", "llama",
            "--prompt-tokens", "256", "--max-tokens", "64", "--concurrency", "2",
            "--requests", "8", "--out", str(out), "--metrics-port", "0", "--no-progress",
        ]
    )  # fmt: skip
    assert code == 0
    records = request_lines(out)
    assert len(records) == 8
    for rec in records:
        assert rec["error"] is None, (rec["error"], rec.get("error_detail"), rec["start_time"])
        # usage (what we record) against the server's independent timings counters.
        assert rec["prompt_tokens"] == 256
        assert rec["completion_tokens"] == 64 == rec["server_predicted_n"]
        assert rec["server_prompt_n"] + rec["server_cache_n"] == rec["prompt_tokens"]
        assert rec["cached_tokens"] == rec["server_cache_n"]
        # Unique prefixes: at most the chat template's first tokens come from the cache.
        assert rec["cached_tokens"] < 16
        assert rec["chunks"] <= 64
    summary = json.loads((out / "summary.json").read_text())
    assert summary["valid"] is True
    step = summary["steps"][0]
    assert step["prompt_tokens"] == 256 and step["completion_tokens"] == 64
    assert step["requests_ok"] == 8
    ours, theirs = step["decode_tok_s_mean"], step["server_decode_tok_s_mean"]
    assert abs(ours - theirs) / theirs < 0.05, (ours, theirs)


def test_completions_counts_match_server_metrics(llama_server: Any, tmp_path: Path) -> None:
    # /tokenize calibration sends no probe requests, so the server's counters move by
    # exactly what the measured requests cost.
    server = llama_server(ctx=2048, parallel=2)
    before = _counter(server.url, "llamacpp:tokens_predicted_total")
    out = tmp_path / "out"
    code = main(
        [
            "run", "--url", server.url, "--kind", "llamacpp", "--endpoint", "completions",
            "--prompt-tokens", "128", "--max-tokens", "16", "--concurrency", "2",
            "--requests", "4", "--out", str(out), "--metrics-port", "0", "--no-progress",
        ]
    )  # fmt: skip
    assert code == 0
    records = request_lines(out)
    assert [r["prompt_tokens"] for r in records] == [128] * 4
    after = _counter(server.url, "llamacpp:tokens_predicted_total")
    assert after - before == sum(r["completion_tokens"] for r in records) == 64


def test_server_killed_mid_run_still_writes_the_summary(llama_server: Any, tmp_path: Path) -> None:
    server = llama_server(ctx=2048, parallel=2)
    out = tmp_path / "out"
    proc = loadgen_process(
        "run", "--url", server.url, "--kind", "llamacpp",
        "--prompt-tokens", "32", "--max-tokens", "48", "--concurrency", "2",
        "--requests", "40", "--out", str(out), "--metrics-port", "0",
    )  # fmt: skip
    wait_for_records(out, 2, timeout=240)
    server.proc.kill()  # two requests are in flight now (closed loop)
    t_kill = time.monotonic()
    out_text, err = proc.communicate(timeout=90)
    # Bounded: the step gives up on a dead engine within seconds, whatever --timeout says.
    assert time.monotonic() - t_kill < 30
    records = request_lines(out)
    errors = [r["error"] for r in records]
    assert errors.count(None) >= 2
    # A stream cut mid-answer is `disconnected`; one still in prefill (no answer yet) is
    # re-sent once and then refused like every later one: `connect_error`. The request the
    # other worker has in flight when the step gives up is `cancelled`, with the reason.
    assert "connect_error" in errors, errors
    assert set(errors) <= {None, "disconnected", "connect_error", "cancelled"}, errors
    summary = json.loads((out / "summary.json").read_text())
    gave_up = summary["abort_reason"].removeprefix("step 0: ")
    cancelled = [r["error_detail"] for r in records if r["error"] == "cancelled"]
    assert cancelled == [f"cancelled in flight: {gave_up}"] * len(cancelled) and len(cancelled) <= 1
    step = summary["steps"][0]
    assert step["requests_failed"] == len(records) - errors.count(None) > 0
    assert step["requests_ok"] == errors.count(None)
    # The reproduction: an engine that died mid-run is an aborted, invalid run.
    assert summary["aborted"] is True and summary["valid"] is False
    assert summary["abort_reason"].startswith("step 0: "), summary["abort_reason"]
    assert any("requests failed" in r for r in summary["invalid_reasons"])
    assert "ABORTED: step 0:" in out_text
    assert proc.returncode == 1, err


def _long_prompt(tmp_path: Path, words: int) -> Path:
    path = tmp_path / "prompt.txt"
    path.write_text(" ".join(["memory"] * words))
    return path


def _failing_run(
    server: Any, tmp_path: Path, words: int, *args: str
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A run of `words`-word prompts that stops at the first error (exit code 3):
    its records and its summary."""
    out = tmp_path / "out"
    code = run_cli(
        out, "--url", server.url, "--kind", "llamacpp", "--max-errors", "1",
        "--prompt-file", str(_long_prompt(tmp_path, words)), *args,
    )  # fmt: skip
    assert code == 3
    return request_lines(out), json.loads((out / "summary.json").read_text())


def test_prompt_beyond_the_slot_context_is_kv_exhausted(llama_server: Any, tmp_path: Path) -> None:
    """-c 512 over 4 slots gives 128 tokens per slot; a ~300-token prompt cannot fit."""
    server = llama_server(ctx=512, parallel=4)
    records, summary = _failing_run(
        server, tmp_path, 300, "--concurrency", "2", "--requests", "4", "--max-tokens", "8"
    )
    assert [r["error"] for r in records] == ["kv_exhausted"] * 4
    # The real server's own words (HTTP 400, type exceed_context_size_error).
    detail = records[0]["error_detail"]
    assert detail.startswith("HTTP 400") and "exceed" in detail and "context size" in detail
    assert summary["steps"][0]["kv_exhausted"] == 4
    assert "4 of 4 requests failed (kv_exhausted 4)" in summary["invalid_reasons"][0]


def test_unified_kv_full_is_kv_exhausted(llama_server: Any, tmp_path: Path) -> None:
    """--kv-unified -c 1024 -np 4: each prompt fits, four together with their outputs do
    not, and llama.cpp fails the active slots with "Context size has been exceeded"."""
    server = llama_server("--kv-unified", ctx=1024, parallel=4)
    records, summary = _failing_run(
        server, tmp_path, 150, "--concurrency", "4", "--requests", "8", "--max-tokens", "200"
    )
    kv = [r for r in records if r["error"] == "kv_exhausted"]
    assert kv, [(r["error"], r["error_detail"]) for r in records]
    assert all("Context size has been exceeded" in r["error_detail"] for r in kv)
    assert "Context size has been exceeded" in server.log.read_text()
    assert summary["steps"][0]["kv_exhausted"] == len(kv)
