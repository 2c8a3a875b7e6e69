"""`llmb-loadgen run --traffic` against the real llama-server (CPU build, Gemma 3 270M): a
Mooncake trace written here (timestamps, lengths, shared `hash_ids`, two sessions) replays
token-exact on its schedule, and the shared blocks are the server's own cached tokens."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from core.stats import percentile
from loadgen.summary import LATE_SEND_S
from loadgen.traffic.spec import load_traffic
from tests.plugins.loadgen import request_lines, run_cli

pytestmark = [pytest.mark.llamaserver, pytest.mark.timeout(900)]
SCHEDULE_SLACK_S = 0.5
# Tokens a chat template puts around the text (Gemma 3's: 9 before, 15 after; the traffic's
# prompts count them, calibrated), a bound of what prefix caching cannot share.
TEMPLATE_TOKENS = 32


def mooncake_rows() -> list[dict[str, Any]]:
    """Six requests, small for two shared cores: two that share a 512-token block (id 0), and
    two sessions of two turns whose second turn repeats and extends the first's block."""
    rows: list[dict[str, Any]] = [
        {"timestamp": 0, "input_length": 536, "output_length": 4, "hash_ids": [0, 100]},
        {"timestamp": 300, "input_length": 540, "output_length": 6, "hash_ids": [0, 101]},
    ]
    for name, start, block, first in (("a", 150, 500, 64), ("b", 400, 600, 48)):
        rows.append(
            {"timestamp": start, "input_length": first, "output_length": 4, "hash_ids": [block],
             "session_id": name}
        )  # fmt: skip
        rows.append(
            {"timestamp": start + 100, "input_length": first + 32, "output_length": 5,
             "hash_ids": [block], "session_id": name, "delay": 200}
        )  # fmt: skip
    return sorted(rows, key=lambda r: r["timestamp"])


def replay(tmp_path: Path, url: str, kind: str, *extra: str) -> tuple[list[dict], dict]:
    """Write the trace, replay it against `url`; the records by index and summary.json."""
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in mooncake_rows()))
    out = tmp_path / "out"
    code = run_cli(out, "--url", url, "--kind", kind, "--traffic", str(trace), *extra)
    records = sorted(request_lines(out), key=lambda r: r["index"])
    summary = json.loads((out / "summary.json").read_text())
    assert code == 0, summary["invalid_reasons"]
    traffic = load_traffic(str(trace))
    assert len(records) == len(traffic.requests) == 6
    for rec, req in zip(records, traffic.requests, strict=True):
        assert rec["error"] is None, rec["error_detail"]
        # Token-exact: the engine's own usage against the trace (a chat template may merge
        # one token: reported in prompt_tokens_off, never more).
        assert abs(rec["prompt_tokens"] - req.prompt_tokens) <= 1
        assert rec["prompt_tokens_target"] == req.prompt_tokens
        assert rec["completion_tokens"] == req.output_tokens
    step = summary["steps"][0]
    assert step["prompt_tokens_off"] == sum(
        1 for r in records if r["prompt_tokens"] != r["prompt_tokens_target"]
    )
    # The schedule kept: every send's error is recorded, the p99 in summary.json.
    errors = sorted(r["send_error_s"] for r in records)
    assert step["send_error_p99_s"] == pytest.approx(percentile(errors, 99), abs=1e-6)
    assert step["late_sends"] == sum(1 for e in errors if e > LATE_SEND_S)
    assert errors[0] >= 0
    return records, summary


def test_a_mooncake_trace_replays_on_llama_server(llama_server: Any, tmp_path: Path) -> None:
    # --swa-full: Gemma 3 attends through a sliding window, and llama-server reuses a cached
    # prefix followed by other text only with the full-size window cache (without it a
    # shared block is evaluated again: cache_n 1).
    server = llama_server("--swa-full", ctx=8192, parallel=2)
    records, summary = replay(tmp_path, server.url, "llamacpp")
    step = summary["steps"][0]
    # Open loop: the sends keep the schedule. Here within half a second: two cores shared with
    # the engine's prefill, which takes seconds a request (a replay that waited for answers
    # would be seconds late); the 5 ms bound is bench/traffic_timing.py's, docs/benchmarks.md.
    assert step["send_error_p99_s"] < SCHEDULE_SLACK_S, step
    answered = shared_tokens(tmp_path, records, "end_time")
    sent = shared_tokens(tmp_path, records, "start_time")
    assert sum(answered) >= 48  # a session's first turn is always answered before its next
    for rec, ready, maybe in zip(records, answered, sent, strict=True):
        # The server's own timings: output as asked, cached + evaluated = the prompt.
        assert rec["server_predicted_n"] == rec["completion_tokens"]
        assert rec["server_cache_n"] + rec["server_prompt_n"] == rec["prompt_tokens"]
        # The shared blocks an answered request sent come from the cache (the engine's own
        # timings.cache_n): all their tokens but where the chat template's tail sat in the
        # earlier prompt (Gemma's: 15 tokens after the text).
        assert rec["server_cache_n"] >= ready - TEMPLATE_TOKENS, (rec, ready)
        if not maybe:  # no block of it sent before: at most the template's first tokens
            assert rec["server_cache_n"] < TEMPLATE_TOKENS, rec


def shared_tokens(tmp_path: Path, records: list[dict], by: str) -> list[int]:
    """Per request, its prompt's leading tokens that requests sent it before it was sent:
    those answered by then (`by="end_time"`) or only sent (`by="start_time"`)."""
    traffic = load_traffic(str(tmp_path / "trace.jsonl"))
    out = []
    for rec, req in zip(records, traffic.requests, strict=True):
        sent: dict[int, int] = {}
        for other, before in zip(records, traffic.requests, strict=True):
            if other is not rec and other[by] <= rec["start_time"]:
                for block, tokens in before.blocks:
                    sent[block] = max(tokens, sent.get(block, 0))
        shared = 0
        for block, tokens in req.blocks:
            shared += min(tokens, sent.get(block, 0))
            if sent.get(block, 0) < tokens:
                break
        out.append(shared)
    return out
