"""The live rules under realistic traffic on SGLang (issue 34 item 6): the mixed Mooncake trace
of tests/system/test_traffic_rules_llama.py (long prompts opening with one shared 512-token
block, short ones sharing nothing) replayed by `diagnose --traffic` against the real CPU SGLang
(the session's `sglang_server`: tiny Qwen2, `--max-running-requests 8`), with the real exporter
reading it as a `kind: sglang` engine and a real Prometheus scraping the exporter and
evaluating the shipped rules every second.

The rules' verdict (`llmb:engine_bottleneck:verdict`) at the end of the replay must be
diagnose's on the same run (diagnose reads the same exporter: `--exporter-url`), and no alert
may be pending or firing but the one the verdict justifies.

The trace is replayed one request at a time (`--no-schedule --concurrency 1`): SGLang puts a
prompt into its radix cache only once its prefill batch is done, and on two busy cores the
first 600-token prefill took 10 s, so on the trace's schedule the later long prompts were
batched with nothing cached (1 % hits). One at a time, each long prompt finds block 0. That
run induces no queue, and the mean prompt (~345 tokens) is below `prefill_prompt_tokens_min`
(no prefill verdict): it gives the fallback, `decode_below_card_limit` (no GPU, no roofline),
and the test asserts the two verdicts' equality on whatever the run gives (that one, here).
A server of its own with `--max-running-requests 1` (`sglang_launcher`) could queue as the
llama test's one slot does, but would cost another SGLang start (~80 s on CI's two cores):
the session's server is reused instead.

The cached share is read from SGLang's counters (`sglang:cached_tokens_total` through the
exporter's `llmb_engine_prompt_tokens_cached_total`), never the per-batch `cache_hit_rate`
gauge: diagnose's row is the step's cached share as SGLang's log counts it batch by batch (one
request per batch), and it holds the shared block, while the gauge, which each prefill batch
overwrites, ends on the last short prompt's share."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cli.loadgen import main as loadgen_main
from tests.plugins.exporter import ExporterProcess
from tests.plugins.prom import PrometheusServer
from tests.plugins.sglang import SglangServer
from tests.system.test_traffic_rules_llama import (
    ROWS,
    replayed,
    rules_agree,
    scraped_stack,
    write_trace,
)

pytestmark = [pytest.mark.sglang, pytest.mark.prometheus, pytest.mark.timeout(600)]

# Prompt tokens of the trace, and those of its second and third long prompts that open with
# block 0, which the first long prompt put in the radix cache.
TRACE_PROMPT = sum(cast(int, r["input_length"]) for r in ROWS)
SHARED = 512 * (sum(1 for r in ROWS if cast(list[int], r["hash_ids"])[0] == 0) - 1)
PREFILL_BATCH = re.compile(
    r"Prefill batch, #new-seq: (\d+), #new-token: (\d+), #cached-token: (\d+)"
)


def engine_sample(url: str, name: str) -> float | None:
    """One sample of the engine's own /metrics (its first series of that name)."""
    text = httpx.get(url + "/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return float(sample.value)
    return None


def test_the_rules_give_diagnose_s_verdict_on_sglang_under_a_mixed_trace(
    tmp_path: Path,
    sglang_server: SglangServer,
    exporter_process: Callable[[dict[str, Any]], ExporterProcess],
    prometheus_server: Callable[[dict[str, list[str]]], PrometheusServer],
) -> None:
    engine = {"name": "sgl", "kind": "sglang", "url": sglang_server.url}
    exporter, prom = scraped_stack(engine, exporter_process, prometheus_server)
    trace = write_trace(tmp_path)
    out = tmp_path / "out"
    code = loadgen_main(["diagnose", "--url", sglang_server.url, "--name", "sgl",
                         "--kind", "sglang", "--exporter-url", exporter.url, "--out", str(out),
                         "--concurrency", "1", "--no-schedule",
                         "--traffic", str(trace)])  # fmt: skip
    assert code == 0
    result, verdict, row, records = replayed(out, "sgl")
    # The cached share from SGLang's counters (cached / prompt tokens over the step) is the
    # engine's own count: one request at a time, each of the step's requests is one prefill
    # batch in SGLang's log (`#new-token`, `#cached-token`), the last six of the run.
    batches = PREFILL_BATCH.findall(sglang_server.log_text())[-6:]
    assert [int(seqs) for seqs, _, _ in batches] == [1] * 6, batches
    hits = sum(int(c) for _, _, c in batches)
    assert sum(int(n) + int(c) for _, n, c in batches) == sum(r["prompt_tokens"] for r in records)
    ratio = row["prompt_cache_hit_ratio"]
    assert ratio is not None and ratio >= 0.9 * SHARED / TRACE_PROMPT, (ratio, SHARED)
    assert ratio == pytest.approx(hits / TRACE_PROMPT, abs=0.02), (ratio, batches)
    # Not the `cache_hit_rate` gauge: SGLang sets it per prefill batch (0 at each logged
    # decode batch), so after the step it holds the last short prompt's share, not the step's.
    gauge = engine_sample(sglang_server.url, "sglang:cache_hit_rate")
    assert gauge is not None and abs(gauge - ratio) > 0.3, (gauge, ratio)
    assert verdict != "idle", result["signals"]  # the step's tokens are in the rate window
    rules_agree(prom, result, "sgl", verdict)
