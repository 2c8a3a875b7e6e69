"""`llmb-loadgen run --traffic` against the real CPU SGLang: the same Mooncake trace as the
llama-server test replays token-exact on its schedule, and the shared blocks show as radix
cache hits in SGLang's own counter (`sglang:cached_tokens_total`, not the per-batch
`cache_hit_rate` gauge, which each batch overwrites)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.system.test_traffic_llama import SCHEDULE_SLACK_S, replay, shared_tokens

pytestmark = [pytest.mark.sglang, pytest.mark.timeout(900)]

CACHED = "sglang:cached_tokens_total"


def cached_tokens(url: str) -> float:
    """SGLang's radix-cache hits so far (every cache source), from its /metrics."""
    text = httpx.get(url + "/metrics", timeout=10).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == CACHED
    )


def test_a_mooncake_trace_replays_on_sglang(sglang_launcher: Any, tmp_path: Path) -> None:
    server = sglang_launcher()
    before = cached_tokens(server.url)
    records, summary = replay(tmp_path, server.url, "sglang")
    hits = cached_tokens(server.url) - before
    expected = sum(shared_tokens(tmp_path, records, "end_time"))
    assert expected >= 48  # a session's first turn is always answered before its second
    # The shared blocks were served from the radix cache (at least them: the calibration
    # probes and the chat template's first tokens add a few more hits of their own).
    assert hits >= 0.9 * expected, (hits, expected)
    assert summary["steps"][0]["send_error_p99_s"] < SCHEDULE_SLACK_S
