"""Runner + HTTP server: concurrency, deadlines, per-source self-metrics, schema docs."""

from __future__ import annotations

import asyncio
import logging
import re
import time

import pytest
from aiohttp.test_utils import TestClient, TestServer

from exporter.collectors import Collector, Scrape, SourceError
from exporter.metrics_doc import markdown_table
from exporter.runner import Runner, deadline_from_header
from exporter.schema import SCHEMA, MetricSet
from exporter.server import make_app
from tests.paths import ROOT
from tests.plugins.collectors import Fixed
from tests.plugins.exporter import parse_samples


def test_deadline_header() -> None:
    assert deadline_from_header("10", 3.0) == 9.75
    assert deadline_from_header("0.2", 3.0) == 0.1
    assert deadline_from_header(None, 3.0) == 3.0
    assert deadline_from_header("junk", 3.0) == 3.0


async def test_slow_source_times_out_others_keep_coming() -> None:
    runner = Runner([Fixed("fast"), Fixed("slow", delay=5.0), Fixed("bad", fail="http")])
    app = make_app(runner)
    async with TestClient(TestServer(app)) as client:
        start = time.perf_counter()
        resp = await client.get("/metrics", headers={"X-Prometheus-Scrape-Timeout-Seconds": "0.75"})
        elapsed = time.perf_counter() - start
        text = await resp.text()
        # Second scrape: the error counter is cumulative.
        text2 = await (
            await client.get("/metrics", headers={"X-Prometheus-Scrape-Timeout-Seconds": "0.75"})
        ).text()
    assert resp.status == 200
    assert elapsed < 1.5, elapsed  # bounded by the header, not by the slow source
    s = parse_samples(text)
    up = lambda e: s[("llmb_engine_up", (("engine", e), ("kind", "llamacpp")))]  # noqa: E731
    assert up("fast") == 1 and up("slow") == 0 and up("bad") == 1
    assert s[("llmb_source_up", (("source", "fast"),))] == 1
    assert s[("llmb_source_up", (("source", "slow"),))] == 0
    assert s[("llmb_source_up", (("source", "bad"),))] == 0
    assert s[("llmb_source_errors_total", (("reason", "timeout"), ("source", "slow")))] == 1
    assert s[("llmb_source_errors_total", (("reason", "http"), ("source", "bad")))] == 1
    s2 = parse_samples(text2)
    assert s2[("llmb_source_errors_total", (("reason", "timeout"), ("source", "slow")))] == 2
    assert s[("llmb_source_duration_seconds", (("source", "slow"),))] >= 0.4


async def test_sources_run_concurrently_and_crash_is_contained() -> None:
    collectors = [Fixed(f"e{i}", delay=0.3) for i in range(5)] + [Fixed("crash", crash=True)]
    runner = Runner(collectors, default_deadline=5)
    start = time.perf_counter()
    families = await runner.scrape()
    assert time.perf_counter() - start < 1.0  # 5 × 0.3 s in parallel, not in series
    names = {s.name: s for f in families for s in f.samples}
    assert "llmb_source_errors_total" in names
    text_up = [
        s
        for f in families
        for s in f.samples
        if s.name == "llmb_source_up" and s.labels["source"] == "crash"
    ]
    assert text_up[0].value == 0


async def test_collect_new_begins_after_the_call_not_with_the_collection_in_flight() -> None:
    source = Fixed("e", delay=0.2)
    runner = Runner([source], default_deadline=5, min_interval=10.0)
    background = asyncio.ensure_future(runner.collect())  # a sampler's collection in flight
    await asyncio.sleep(0.05)
    asked = runner.clock()
    joined = await runner.collect()  # joins the one in flight
    new = await runner.collect_new()
    assert joined is await background and joined.started < asked
    assert new.started >= asked and source.calls == 2
    # A recent collection (within min_interval) is what collect() gives; collect_new never.
    assert await runner.collect() is new
    newer = await runner.collect_new()
    assert newer is not new and source.calls == 3


async def test_openmetrics_negotiation() -> None:
    runner = Runner([Fixed("a")])
    async with TestClient(TestServer(make_app(runner))) as client:
        resp = await client.get(
            "/metrics", headers={"Accept": "application/openmetrics-text;version=1.0.0"}
        )
        body = await resp.text()
    assert resp.headers["Content-Type"].startswith("application/openmetrics-text")
    assert body.rstrip().endswith("# EOF")


def test_metric_set_rejects_unknown_names_and_labels() -> None:
    ms = MetricSet()
    try:
        ms.add("llmb_not_a_metric", 1)
    except KeyError:
        pass
    else:
        raise AssertionError("unknown name accepted")
    try:
        ms.add("llmb_engine_up", 1, engine="a")
    except ValueError:
        pass
    else:
        raise AssertionError("missing label accepted")
    ms.add("llmb_engine_up", None, engine="a", kind="sglang")
    assert ms.metrics() == []


def test_schema_follows_naming_rules() -> None:
    for name, spec in SCHEMA.items():
        assert re.fullmatch(r"llmb_[a-z0-9_]+", name), name
        if spec.type == "counter":
            assert name.endswith("_total"), name
        if name.endswith("_ratio"):
            assert spec.type == "gauge"
        assert spec.help.endswith("."), name


def test_docs_table_matches_schema() -> None:
    doc = (ROOT / "docs" / "metrics.md").read_text()
    start = doc.index("<!-- BEGIN exporter schema -->\n") + len("<!-- BEGIN exporter schema -->\n")
    end = doc.index("<!-- END exporter schema -->")
    assert doc[start:end] == markdown_table(), (
        "run: python -m exporter.metrics_doc and paste into docs/metrics.md"
    )


class TwoErrors(Collector):
    """Answers with two different errors on every scrape, e.g. two failing endpoints."""

    source = "two"

    async def collect(self) -> Scrape:
        return Scrape(
            up=False,
            errors=[SourceError("http", "GET /slots: 501"), SourceError("parse", "bad /props")],
        )


async def test_two_errors_per_scrape_are_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    runner = Runner([TwoErrors()])
    with caplog.at_level(logging.INFO, logger="exporter.runner"):
        for _ in range(5):
            await runner.scrape()
    messages = [r.getMessage() for r in caplog.records]
    assert sorted(messages) == [
        "source=two reason=http error=GET /slots: 501",
        "source=two reason=parse error=bad /props",
    ]


async def test_a_crash_gives_one_traceback_until_it_changes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    crashing = Fixed("crash", crash=True)
    runner = Runner([crashing])
    with caplog.at_level(logging.INFO, logger="exporter.runner"):
        for _ in range(5):
            await runner.scrape()
        tracebacks = [r for r in caplog.records if r.exc_info]
        assert len(tracebacks) == 1
        crashing.crash = False
        await runner.scrape()
        crashing.crash = True
        await runner.scrape()  # crashing again after a recovery is news again
    assert len([r for r in caplog.records if r.exc_info]) == 2
    assert any(r.getMessage() == "source=crash recovered" for r in caplog.records)
