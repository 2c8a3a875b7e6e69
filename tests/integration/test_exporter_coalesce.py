"""Coalesced collection: many scrapers, one set of engine requests per collection.

Unit tests drive the Runner directly; the integration tests run the real exporter
process against real HTTP engine stubs (llama.cpp and SGLang answering with captured
bodies) that count every request they receive.
"""

from __future__ import annotations

import asyncio
import gzip
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest
from aiohttp.test_utils import TestClient, TestServer

from exporter.runner import CollectionTimeout, Runner
from exporter.server import make_app
from tests.plugins.collectors import Fixed
from tests.plugins.engine_stubs import CountingStub, counting_engines
from tests.plugins.exporter import ExporterProcess, parse_samples, pick

# --- unit: the Runner ----------------------------------------------------------------------


async def test_concurrent_scrapes_share_one_collection() -> None:
    collectors = [Fixed("a", 0.2), Fixed("b", 0.2)]
    runner = Runner(collectors)
    results = await asyncio.gather(*(runner.collect() for _ in range(20)))
    assert [c.calls for c in collectors] == [1, 1]
    assert runner.collections == 1
    assert all(r is results[0] for r in results)
    # Once it finished, the next request collects again (min_interval is 0 by default).
    await runner.collect()
    assert [c.calls for c in collectors] == [2, 2]


async def test_min_interval_serves_the_last_collection() -> None:
    now = [100.0]
    collector = Fixed("a", 0.0)
    runner = Runner([collector], min_interval=5.0, clock=lambda: now[0])
    first = await runner.collect()
    now[0] += 4.9
    assert await runner.collect() is first
    assert collector.calls == 1
    now[0] += 0.2
    assert await runner.collect() is not first
    assert collector.calls == 2


async def test_a_scraper_that_gives_up_does_not_cancel_the_others() -> None:
    collector = Fixed("a", 0.3)
    runner = Runner([collector])
    quitter = asyncio.ensure_future(runner.collect())
    stayer = asyncio.ensure_future(runner.collect())
    await asyncio.sleep(0.05)
    quitter.cancel()
    collection = await stayer
    assert collector.calls == 1
    assert collection.families


async def test_one_rendering_per_format_and_gzip_only_when_asked() -> None:
    runner = Runner([Fixed("a", 0.0)])
    async with TestClient(TestServer(make_app(runner))) as client:
        plain = await client.get("/metrics", headers={"Accept-Encoding": "identity"})
        assert "Content-Encoding" not in plain.headers
        text = await plain.text()
        zipped = await client.get(
            "/metrics", headers={"Accept-Encoding": "gzip"}, auto_decompress=False
        )
        assert zipped.headers["Content-Encoding"] == "gzip"
        raw = await zipped.read()
    assert (
        gzip.decompress(raw).decode().split("llmb_source_duration")[0]
        == (text.split("llmb_source_duration")[0])
    )
    collection = await runner.collect()
    first = collection.encode("", gzipped=True)
    assert collection.encode("", gzipped=True)[0] is first[0]  # cached, not re-rendered
    openmetrics = collection.encode("application/openmetrics-text;version=1.0.0")
    assert openmetrics[1].startswith("application/openmetrics-text")
    assert openmetrics[0].rstrip().endswith(b"# EOF")


# --- integration: the real exporter against counting engine stubs --------------------------


@pytest.fixture
async def engines() -> AsyncIterator[tuple[CountingStub, CountingStub, list[float]]]:
    """A llama.cpp and an SGLang stub; set `delay[0]` to slow every answer down."""
    async with counting_engines() as stubs:
        yield stubs


def _config(llama: CountingStub, sgl: CountingStub, **extra: Any) -> dict[str, Any]:
    return {
        "engines": [
            {"name": "llama", "kind": "llamacpp", "url": llama.url},
            {"name": "sgl", "kind": "sglang", "url": sgl.url},
        ],
        "gpu": {"enabled": False},
        **extra,
    }


Started = tuple[ExporterProcess, CountingStub, CountingStub, list[float]]
StartExporter = Callable[..., Awaitable[Started]]


@pytest.fixture
def start_exporter(
    engines: tuple[CountingStub, CountingStub, list[float]],
    exporter_process: Callable[[dict[str, Any]], ExporterProcess],
) -> StartExporter:
    """`await start_exporter(**extra)`: the exporter over both stubs (`extra`: more config),
    with the stubs and their delay."""
    llama, sgl, delay = engines

    async def start(**extra: Any) -> Started:
        # The fixture polls /healthz synchronously; run it off the loop that serves the stubs.
        exporter = await asyncio.to_thread(exporter_process, _config(llama, sgl, **extra))
        return exporter, llama, sgl, delay

    return start


def _total(*stubs: CountingStub) -> Counter[str]:
    out: Counter[str] = Counter()
    for i, stub in enumerate(stubs):
        for path, n in stub.hits.items():
            out[f"{i}{path}"] += n
    return out


async def test_twenty_scrapers_cause_one_engine_request_set(
    start_exporter: StartExporter,
) -> None:
    exporter, llama, sgl, delay = await start_exporter()
    async with httpx.AsyncClient(timeout=30) as client:
        url = exporter.url + "/metrics"
        # Warm-up: SGLang's static endpoints are read once and cached by the collector.
        assert (await client.get(url)).status_code == 200
        before = _total(llama, sgl)
        assert (await client.get(url)).status_code == 200
        one_scrape = _total(llama, sgl) - before
        assert one_scrape["0/metrics"] == 1 and one_scrape["1/metrics"] == 1

        delay[0] = 0.5  # every engine answer takes 0.5 s: the 20 requests overlap
        before = _total(llama, sgl)
        answers = await asyncio.gather(*(client.get(url) for _ in range(20)))
        twenty_scrapes = _total(llama, sgl) - before
    assert [r.status_code for r in answers] == [200] * 20
    assert twenty_scrapes == one_scrape
    # All twenty got the same collection: same engine series, same duration sample.
    bodies = {r.text for r in answers}
    assert len(bodies) == 1
    samples = parse_samples(bodies.pop())
    assert pick(samples, "llmb_engine_up", engine="llama") == [1.0]
    assert pick(samples, "llmb_engine_up", engine="sgl") == [1.0]


async def test_min_interval_from_the_config_file(
    start_exporter: StartExporter,
) -> None:
    exporter, llama, sgl, _ = await start_exporter(min_interval=30)
    async with httpx.AsyncClient(timeout=30) as client:
        answers = [await client.get(exporter.url + "/metrics") for _ in range(5)]
    assert {r.status_code for r in answers} == {200}
    assert llama.hits["/metrics"] == 1 and sgl.hits["/metrics"] == 1
    assert len({r.text for r in answers}) == 1


async def test_healthz_does_not_wait_for_a_collection(
    start_exporter: StartExporter,
) -> None:
    exporter, _, _, delay = await start_exporter()
    delay[0] = 3.0
    async with httpx.AsyncClient(timeout=30) as client:
        scrape = asyncio.ensure_future(client.get(exporter.url + "/metrics"))
        await asyncio.sleep(0.3)  # the collection is now waiting on the engines
        assert not scrape.done()
        start = time.perf_counter()
        health = await client.get(exporter.url + "/healthz")
        took = time.perf_counter() - start
        assert not scrape.done()
        assert (await scrape).status_code == 200
    assert health.status_code == 200
    assert took < 1.0, took


async def test_a_shorter_deadline_does_not_wait_for_a_longer_collection() -> None:
    collector = Fixed("a", 1.0)
    runner = Runner([collector], default_deadline=5.0)
    first = asyncio.ensure_future(runner.collect(5.0))
    await asyncio.sleep(0.05)
    start = time.perf_counter()
    with pytest.raises(CollectionTimeout):  # nothing finished yet to fall back to
        await runner.collect(0.3)
    assert time.perf_counter() - start < 0.6
    done = await first
    second = asyncio.ensure_future(runner.collect(5.0))
    await asyncio.sleep(0.05)
    start = time.perf_counter()
    assert await runner.collect(0.3) is done  # the last finished collection, in time
    assert time.perf_counter() - start < 0.6
    assert await second is not done
    assert collector.calls == 2
    # A joiner whose deadline is later than the collection's end just waits for it.
    third = asyncio.ensure_future(runner.collect(0.5))
    await asyncio.sleep(0.05)
    assert await runner.collect(5.0) is await third
