"""SGLangCollector against SGLang 0.5.23's real /metrics output served over local HTTP."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web
from prometheus_client.metrics_core import Metric

from config.settings import EngineConfig
from exporter.attribution import Attribution
from exporter.collectors import Scrape, SourceError
from exporter.collectors.sglang.collector import SGLangCollector
from exporter.schema import SCHEMA
from tests.conftest import get_free_port
from tests.paths import FIXTURES
from tests.unit.test_geometry import GEMMA3_27B_HF

FIX = FIXTURES
METRICS = FIX / "sglang-0.5.23"
ENDPOINTS = FIX / "sglang-0.5.23-endpoints"
GIB = 1 << 30
E = {"engine": "sg", "kind": "sglang"}


@dataclass
class FakeSGLang:
    """A local HTTP server answering SGLang's endpoints from fixture files."""

    port: int
    routes: dict[str, tuple[int, str]] = field(default_factory=dict)
    hits: dict[str, int] = field(default_factory=dict)
    auth: list[str | None] = field(default_factory=list)
    accept: list[str | None] = field(default_factory=list)
    delay: dict[str, float] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def set(self, path: str, status: int, body: str) -> None:
        self.routes[path] = (status, body)

    async def handle(self, request: web.Request) -> web.Response:
        path = request.path
        self.hits[path] = self.hits.get(path, 0) + 1
        self.auth.append(request.headers.get("Authorization"))
        if path == "/metrics":
            self.accept.append(request.headers.get("Accept"))
        if path in self.delay:
            await asyncio.sleep(self.delay[path])
        status, body = self.routes.get(path, (404, '{"detail":"Not Found"}'))
        return web.Response(status=status, text=body)


def standard_routes(fake: FakeSGLang, metrics_file: str = "metrics-busy.txt") -> None:
    fake.set("/health", 200, "")
    fake.set("/metrics", 200, (METRICS / metrics_file).read_text())
    fake.set("/server_info", 200, (ENDPOINTS / "server_info.json").read_text())
    fake.set("/model_info", 200, (ENDPOINTS / "model_info.json").read_text())
    fake.set("/v1/models", 200, (ENDPOINTS / "v1_models.json").read_text())


@pytest.fixture
async def fake() -> AsyncIterator[FakeSGLang]:
    server = FakeSGLang(port=get_free_port())
    app = web.Application()
    app.router.add_route("GET", "/{tail:.*}", server.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", server.port)
    await site.start()
    standard_routes(server)
    yield server
    await runner.cleanup()


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as c:
        yield c


def make(
    url: str,
    client: httpx.AsyncClient,
    model_path: Path | None = None,
    clock: Callable[[], float] | None = None,
    timeout: float = 2.0,
    **extra: Any,
) -> tuple[SGLangCollector, Attribution]:
    engine = EngineConfig(name="sg", kind="sglang", url=url, model_path=model_path, **extra)
    attribution = Attribution([engine])
    kwargs = {"clock": clock} if clock else {}
    return SGLangCollector(engine, client, timeout, attribution, **kwargs), attribution


def flat(metrics: list[Metric]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample as {(name, sorted labels): value}; checks names against the schema."""
    out = {}
    for fam in metrics:
        # client_python strips `_total` / `_info` from family names.
        suffix = {"info": "_info", "counter": "_total"}.get(fam.type, "")
        assert fam.name + suffix in SCHEMA, fam.name
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def val(scrape: Scrape, name: str, **labels: str) -> float | None:
    key = (name, tuple(sorted({**E, **labels}.items())))
    return flat(scrape.metrics).get(key)


def names(scrape: Scrape) -> set[str]:
    return {n for n, _ in flat(scrape.metrics)}


async def scrape_of(fake: FakeSGLang, client: httpx.AsyncClient, metrics: str) -> Scrape:
    """One scrape by a fresh collector, the engine's /metrics answering `metrics`."""
    fake.set("/metrics", 200, metrics)
    collector, _ = make(fake.url, client)
    return await collector.collect()


async def clean_scrape(collector: SGLangCollector) -> Scrape:
    """One scrape that must succeed: the engine up, no source error."""
    scrape = await collector.collect()
    assert scrape.up and scrape.errors == [], [str(e) for e in scrape.errors]
    return scrape


def assert_values(scrape: Scrape, expected: dict[str, object]) -> None:
    """Each series (engine label only) has its expected value (a number or pytest.approx)."""
    for name, want in expected.items():
        got = val(scrape, name)
        assert got == want, (name, got, want)


async def test_busy_fixture_maps_to_schema(fake: FakeSGLang, client: httpx.AsyncClient) -> None:
    collector, attribution = make(fake.url, client)
    scrape = await clean_scrape(collector)
    assert_values(
        scrape,
        {
            "llmb_engine_up": 1.0,
            "llmb_engine_loading": 0.0,
            "llmb_engine_requests_running": 24,
            "llmb_engine_requests_waiting": 7,
            "llmb_engine_slots": 48,
            "llmb_engine_context_tokens": 8192,
            "llmb_engine_kv_cache_capacity_tokens": 463552,
            "llmb_engine_kv_cache_used_tokens": 431112,
            # full_token_usage, unrounded (token_usage reads 0.93).
            "llmb_engine_kv_cache_usage_ratio": pytest.approx(431112 / 463552),
            "llmb_engine_prompt_tokens_total": 4005498 + 772166,
            "llmb_engine_prompt_tokens_cached_total": 1905996,
            "llmb_engine_requests_finished_total": 2928 + 555,
            "llmb_engine_decode_tokens_total": 2137107,
            "llmb_engine_decode_seconds_total": pytest.approx(29993.2266),
        },
    )
    retracted = val(scrape, "llmb_engine_kv_pressure_events_total", event="retracted")
    assert retracted == 9  # 6 retraction events, 9 requests retracted (PROVENANCE)
    assert val(scrape, "llmb_engine_kv_cache_bytes", device="gpu") == pytest.approx(60.38 * GIB)
    assert val(scrape, "llmb_model_weights_bytes") == pytest.approx(51.12 * GIB)
    assert val(scrape, "llmb_engine_model_buffer_bytes", device="gpu") == pytest.approx(51.12 * GIB)
    assert val(scrape, "llmb_engine_load_seconds") == 36.84
    info = val(
        scrape,
        "llmb_engine_info",
        model="google/gemma-3-27b-it",
        version="0.5.23",
        quantization="",
        simulated="false",
    )
    assert info == 1.0
    # Generation tokens: the sum of both is_streaming series in the fixture.
    text = (METRICS / "metrics-busy.txt").read_text()
    gen = sum(
        float(v) for v in re.findall(r"^sglang:generation_tokens_total\{.*\} (\S+)$", text, re.M)
    )
    assert val(scrape, "llmb_engine_generation_tokens_total") == gen
    # The scheduler pid from the pid label of sglang:num_retracted_reqs.
    pid = int(re.search(r'sglang:num_retracted_reqs\{.*pid="(\d+)"', text).group(1))  # type: ignore[union-attr]
    assert attribution.engine_for(pid, "python3") is not None
    # No geometry without a readable model directory: absent, not zero.
    assert "llmb_model_layers" not in names(scrape)
    assert fake.accept == ["text/plain;version=0.0.4"]


async def test_histograms_sum_label_sets_and_keep_buckets(
    fake: FakeSGLang, client: httpx.AsyncClient
) -> None:
    collector, _ = make(fake.url, client)
    scrape = await collector.collect()
    text = (METRICS / "metrics-busy.txt").read_text()
    for schema, raw in [
        ("llmb_engine_time_to_first_token_seconds", "time_to_first_token_seconds"),
        ("llmb_engine_e2e_request_latency_seconds", "e2e_request_latency_seconds"),
        ("llmb_engine_queue_time_seconds", "queue_time_seconds"),
        ("llmb_engine_inter_token_latency_seconds", "inter_token_latency_seconds"),
    ]:
        expected: dict[str, float] = {}
        for le, v in re.findall(rf'^sglang:{raw}_bucket\{{.*le="([^"]+)".*\}} (\S+)$', text, re.M):
            expected[le] = expected.get(le, 0.0) + float(v)
        got = {
            dict(labels)["le"]: v
            for (n, labels), v in flat(scrape.metrics).items()
            if n == schema + "_bucket"
        }
        assert got == expected, schema
        sums = re.findall(rf"^sglang:{raw}_sum\{{.*\}} (\S+)$", text, re.M)
        assert val(scrape, schema + "_sum") == pytest.approx(sum(float(s) for s in sums))
        assert val(scrape, schema + "_count") == expected["+Inf"]


@pytest.mark.parametrize(
    "variant", ["metrics-busy.openmetrics.txt", "metrics-busy.openmetrics-utf8.txt"]
)
async def test_openmetrics_spellings_give_same_series(
    fake: FakeSGLang, client: httpx.AsyncClient, variant: str
) -> None:
    collector, _ = make(fake.url, client)
    text_scrape = flat((await collector.collect()).metrics)
    fake.set("/metrics", 200, (METRICS / variant).read_text())
    other = flat((await collector.collect()).metrics)
    assert other == text_scrape


async def test_idle_fixture_leaves_unobserved_series_absent(
    fake: FakeSGLang, client: httpx.AsyncClient
) -> None:
    scrape = await scrape_of(fake, client, (METRICS / "metrics-idle.txt").read_text())
    got = names(scrape)
    assert val(scrape, "llmb_engine_requests_running") == 0
    assert val(scrape, "llmb_engine_kv_cache_capacity_tokens") == 463552
    for absent in (
        "llmb_engine_prompt_tokens_total",
        "llmb_engine_generation_tokens_total",
        "llmb_engine_decode_tokens_total",
        "llmb_engine_time_to_first_token_seconds_bucket",
    ):
        assert absent not in got
    # The retraction gauge is there, the counter not yet: a true zero.
    assert val(scrape, "llmb_engine_kv_pressure_events_total", event="retracted") == 0


def two_ranks(text: str, label: str) -> str:
    """Copy every sample that carries tp_rank="0" to a second rank `label`="1"."""
    out = []
    for line in text.splitlines():
        out.append(line)
        if line.startswith("sglang:") and 'tp_rank="0"' in line:
            if label == "tp_rank":
                out.append(line.replace('tp_rank="0"', 'tp_rank="1"'))
            elif "dp_rank" not in line:
                out[-1] = line.replace('tp_rank="0"', 'dp_rank="0",tp_rank="0"')
                out.append(line.replace('tp_rank="0"', 'dp_rank="1",tp_rank="0"'))
    return "\n".join(out) + "\n"


async def test_two_tp_ranks_are_not_double_counted(
    fake: FakeSGLang, client: httpx.AsyncClient
) -> None:
    collector, _ = make(fake.url, client)
    one = flat((await collector.collect()).metrics)
    fake.set("/metrics", 200, two_ranks((METRICS / "metrics-busy.txt").read_text(), "tp_rank"))
    two = flat((await collector.collect()).metrics)
    assert two == one


async def test_two_dp_ranks_are_summed(fake: FakeSGLang, client: httpx.AsyncClient) -> None:
    scrape = await scrape_of(
        fake, client, two_ranks((METRICS / "metrics-busy.txt").read_text(), "dp_rank")
    )
    assert val(scrape, "llmb_engine_requests_running") == 48
    assert val(scrape, "llmb_engine_requests_waiting") == 14
    assert val(scrape, "llmb_engine_kv_cache_capacity_tokens") == 2 * 463552
    assert val(scrape, "llmb_engine_kv_cache_used_tokens") == 2 * 431112
    # full_token_usage, unrounded (token_usage reads 0.93).
    assert val(scrape, "llmb_engine_kv_cache_usage_ratio") == pytest.approx(431112 / 463552)
    assert val(scrape, "llmb_engine_context_tokens") == 8192
    assert val(scrape, "llmb_engine_kv_pressure_events_total", event="retracted") == 18
    # Tokenizer-side counters carry no rank: unchanged.
    assert val(scrape, "llmb_engine_prompt_tokens_total") == 4005498 + 772166


OLD_SGLANG = """\
# HELP sglang:num_running_reqs The number of running requests
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{name="meta-llama/Llama-3.1-8B"} 3.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{name="meta-llama/Llama-3.1-8B"} 0.0
# HELP sglang:max_total_num_tokens Maximum total number of tokens in the KV cache pool
# TYPE sglang:max_total_num_tokens gauge
sglang:max_total_num_tokens{name="meta-llama/Llama-3.1-8B"} 120000.0
# HELP sglang:token_usage The token usage
# TYPE sglang:token_usage gauge
sglang:token_usage{name="meta-llama/Llama-3.1-8B"} 0.05
# HELP sglang:num_used_tokens The number of used tokens
# TYPE sglang:num_used_tokens gauge
sglang:num_used_tokens{name="meta-llama/Llama-3.1-8B"} 6000.0
# HELP sglang:cached_tokens_total Number of cached prompt tokens
# TYPE sglang:cached_tokens_total counter
sglang:cached_tokens_total{name="meta-llama/Llama-3.1-8B"} 500.0
# HELP sglang:time_per_output_token_seconds Histogram of time per output token in seconds.
# TYPE sglang:time_per_output_token_seconds histogram
sglang:time_per_output_token_seconds_bucket{le="0.01",name="meta-llama/Llama-3.1-8B"} 10.0
sglang:time_per_output_token_seconds_bucket{le="0.1",name="meta-llama/Llama-3.1-8B"} 90.0
sglang:time_per_output_token_seconds_bucket{le="+Inf",name="meta-llama/Llama-3.1-8B"} 100.0
sglang:time_per_output_token_seconds_count{name="meta-llama/Llama-3.1-8B"} 100.0
sglang:time_per_output_token_seconds_sum{name="meta-llama/Llama-3.1-8B"} 2.5
"""


async def test_older_sglang_exposition_is_tolerated(
    fake: FakeSGLang, client: httpx.AsyncClient
) -> None:
    fake.set("/metrics", 200, OLD_SGLANG)
    for path in ("/server_info", "/model_info", "/v1/models"):
        del fake.routes[path]
    collector, _ = make(fake.url, client)
    scrape = await clean_scrape(collector)
    assert_values(
        scrape,
        {
            "llmb_engine_requests_running": 3,
            "llmb_engine_kv_cache_used_tokens": 6000,
            "llmb_engine_prompt_tokens_cached_total": 500,
            "llmb_engine_decode_tokens_total": 100,
            "llmb_engine_decode_seconds_total": 2.5,
            "llmb_engine_inter_token_latency_seconds_count": 100,
        },
    )
    assert (
        val(
            scrape,
            "llmb_engine_info",
            model="meta-llama/Llama-3.1-8B",
            version="",
            quantization="",
            simulated="false",
        )
        == 1
    )
    got = names(scrape)
    assert "llmb_engine_slots" not in got and "llmb_engine_kv_pressure_events_total" not in got


async def test_get_server_info_fallback_and_static_cache(
    fake: FakeSGLang, client: httpx.AsyncClient
) -> None:
    info = json.loads((ENDPOINTS / "server_info.json").read_text())
    info["version"] = "0.4.6"
    info["simulated"] = True
    info["quantization"] = "fp8"
    del fake.routes["/server_info"]
    fake.set("/get_server_info", 200, json.dumps(info))
    now = [1000.0]
    collector, _ = make(fake.url, client, clock=lambda: now[0])
    scrape = await collector.collect()
    labels = {
        "model": "google/gemma-3-27b-it",
        "version": "0.4.6",
        "quantization": "fp8",
        "simulated": "true",
    }
    assert val(scrape, "llmb_engine_info", **labels) == 1
    for _ in range(3):
        now[0] += 20.0
        await collector.collect()
    # Static endpoints at most every 60 s; /metrics every scrape; the generating /health once
    # per instance (is it past its warm-up?), never again while /metrics answers.
    assert fake.hits["/get_server_info"] == 2 and fake.hits["/server_info"] == 2
    assert fake.hits["/model_info"] == 2 and fake.hits["/v1/models"] == 2
    assert fake.hits["/metrics"] == 4 and fake.hits["/health"] == 1


async def test_garbage_metrics_is_a_parse_error(
    fake: FakeSGLang, client: httpx.AsyncClient
) -> None:
    scrape = await scrape_of(fake, client, "<html>\x00\x01 not metrics {{{")
    assert not scrape.up
    assert [e.reason for e in scrape.errors] == ["parse"]
    assert val(scrape, "llmb_engine_up") == 1.0  # the engine itself answers /health


async def test_a_llama_server_given_kind_sglang_is_not_read_as_sglang(
    fake: FakeSGLang, client: httpx.AsyncClient
) -> None:
    """Its /metrics parses, but holds no sglang: sample: the source fails (parse) instead of
    exporting an SGLang engine with no figures, which the rules then gave a decode verdict."""
    llama = (FIXTURES / "llamacpp-cpu-gemma3-270m" / "llamacpp_metrics_busy.txt").read_text()
    scrape = await scrape_of(fake, client, llama)
    assert not scrape.up
    assert [(e.reason, str(e)) for e in scrape.errors] == [
        ("parse", "GET /metrics: no sglang: samples: not SGLang's")
    ]
    assert val(scrape, "llmb_engine_up") == 1.0  # it answers; it is not what the config says


async def test_metrics_disabled_is_an_http_error(
    fake: FakeSGLang, client: httpx.AsyncClient
) -> None:
    del fake.routes["/metrics"]
    collector, _ = make(fake.url, client)
    scrape = await collector.collect()
    assert not scrape.up and [e.reason for e in scrape.errors] == ["http"]
    # What the JSON endpoints tell is still exported.
    assert val(scrape, "llmb_engine_slots") == 48
    assert val(scrape, "llmb_engine_context_tokens") == 8192


async def test_connection_refused(client: httpx.AsyncClient) -> None:
    collector, _ = make(f"http://127.0.0.1:{get_free_port()}", client)
    scrape = await collector.collect()
    assert not scrape.up
    assert [e.reason for e in scrape.errors] == ["connect"]
    assert val(scrape, "llmb_engine_up") == 0.0
    assert flat(collector.fallback()) == {("llmb_engine_up", tuple(sorted(E.items()))): 0.0}


async def test_health_503_while_starting(fake: FakeSGLang, client: httpx.AsyncClient) -> None:
    # While SGLang starts every endpoint answers 503; only then is /health asked.
    for path in ("/health", "/metrics", "/server_info", "/model_info", "/v1/models"):
        fake.set(path, 503, "")
    collector, _ = make(fake.url, client)
    scrape = await collector.collect()
    assert val(scrape, "llmb_engine_up") == 0.0
    assert val(scrape, "llmb_engine_loading") == 1.0
    assert scrape.errors == []
    assert fake.hits["/health"] == 1


async def test_liveness_never_asks_the_generating_health_check(
    fake: FakeSGLang, client: httpx.AsyncClient
) -> None:
    # /health 500 (it would generate); /metrics answering proves the server serves. /health
    # is asked once per instance, to tell SGLang's warm-up (503) from ready, never again.
    fake.set("/health", 500, "")
    collector, _ = make(fake.url, client)
    scrape = await collector.collect()
    assert val(scrape, "llmb_engine_up") == 1.0 and scrape.errors == []
    assert fake.hits["/health"] == 1
    # Without /metrics, /v1/models (no generation) proves it before /health is asked.
    del fake.routes["/metrics"]
    for _ in range(2):
        scrape = await collector.collect()
        assert val(scrape, "llmb_engine_up") == 1.0
    assert fake.hits["/health"] == 1


async def test_api_key_sent_and_never_exported(
    fake: FakeSGLang, client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SG_TEST_KEY", "s3cret-key")
    collector, _ = make(fake.url, client, api_key_env="SG_TEST_KEY")
    scrape = await collector.collect()
    assert fake.auth and set(fake.auth) == {"Bearer s3cret-key"}
    assert "s3cret-key" not in repr(scrape.metrics)


async def test_geometry_from_model_dir(
    fake: FakeSGLang, client: httpx.AsyncClient, tmp_path: Path
) -> None:
    (tmp_path / "config.json").write_text(json.dumps(GEMMA3_27B_HF))
    collector, _ = make(fake.url, client, model_path=tmp_path)
    scrape = await collector.collect()
    assert val(scrape, "llmb_model_layers") == 62
    assert val(scrape, "llmb_model_kv_bytes_per_token_estimated") == 10 * 16 * 256 * 2
    # SGLang 0.5.23 gives Gemma 3 one pool for all 62 layers (+1 dummy slot).
    expected = 62 * 16 * 256 * 2 * (463552 + 1)
    assert val(scrape, "llmb_model_kv_cache_bytes_estimated") == expected
    # No safetensors in the directory: parameter count unknown, so absent.
    assert "llmb_model_parameters" not in names(scrape)


async def test_a_model_dir_not_there_is_a_connect_error_until_it_is(
    fake: FakeSGLang, client: httpx.AsyncClient, tmp_path: Path
) -> None:
    """SGLANG_MODEL_DIR not mounted (an empty folder in its place): said, not silent."""
    collector, _ = make(fake.url, client, model_path=tmp_path)
    scrape = await collector.collect()
    assert not scrape.up
    assert [(e.reason, str(e)) for e in scrape.errors] == [
        ("connect", f"model_path {tmp_path}: no config.json there")
    ]
    assert "llmb_model_layers" not in names(scrape)
    (tmp_path / "config.json").write_text(json.dumps(GEMMA3_27B_HF))
    collector._geometry = None  # the geometry is cached for STATIC_TTL_SECONDS
    scrape = await collector.collect()
    assert scrape.up and not scrape.errors and val(scrape, "llmb_model_layers") == 62


async def test_geometry_from_server_info_model_path(
    fake: FakeSGLang, client: httpx.AsyncClient, tmp_path: Path
) -> None:
    (tmp_path / "config.json").write_text(json.dumps(GEMMA3_27B_HF))
    info = json.loads((ENDPOINTS / "server_info.json").read_text())
    info["model_path"] = str(tmp_path)
    info["kv_cache_dtype"] = "fp8_e4m3"
    fake.set("/server_info", 200, json.dumps(info))
    collector, _ = make(fake.url, client)
    scrape = await collector.collect()
    assert val(scrape, "llmb_model_kv_bytes_per_token_estimated") == 10 * 16 * 256


async def test_slow_health_does_not_cost_the_metrics(
    fake: FakeSGLang, client: httpx.AsyncClient
) -> None:
    # SGLang's /health queues a 1-token generation; it gets half the timeout.
    fake.delay["/health"] = 1.0
    collector, _ = make(fake.url, client, timeout=0.6)
    scrape = await clean_scrape(collector)
    assert val(scrape, "llmb_engine_up") == 1.0
    assert val(scrape, "llmb_engine_requests_running") == 24


async def test_slow_metrics_is_a_timeout(fake: FakeSGLang, client: httpx.AsyncClient) -> None:
    fake.delay["/metrics"] = 1.0
    collector, _ = make(fake.url, client, timeout=0.3)
    with pytest.raises(SourceError) as err:
        await collector.collect()
    assert err.value.reason == "timeout"


async def test_unhealthy_engine(fake: FakeSGLang, client: httpx.AsyncClient) -> None:
    for path in ("/health", "/metrics", "/v1/models"):
        fake.set(path, 500, "")
    collector, _ = make(fake.url, client)
    scrape = await collector.collect()
    assert val(scrape, "llmb_engine_up") == 0.0
    assert val(scrape, "llmb_engine_loading") == 0.0
    assert {e.reason for e in scrape.errors} == {"http"}


async def test_through_runner_and_exposition(fake: FakeSGLang, client: httpx.AsyncClient) -> None:
    from prometheus_client.exposition import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from exporter.runner import Runner

    class Snapshot:
        def __init__(self, families: list[Metric]):
            self.families = families

        def collect(self) -> list[Metric]:
            return self.families

    collector, _ = make(fake.url, client)
    runner = Runner([collector], default_deadline=5.0)
    text = generate_latest(Snapshot(await runner.scrape())).decode()
    assert "sglang:" not in text and "sglang_" not in text
    parsed = {
        (s.name, s.labels.get("le")): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.labels.get("engine") == "sg" or s.labels.get("source") == "sg"
    }
    assert parsed[("llmb_source_up", None)] == 1.0
    assert parsed[("llmb_engine_requests_waiting", None)] == 7
    assert (
        parsed[("llmb_engine_time_to_first_token_seconds_bucket", "+Inf")]
        == parsed[("llmb_engine_time_to_first_token_seconds_count", None)]
    )
    assert parsed[("llmb_engine_kv_pressure_events_total", None)] == 9


async def test_cpu_offload_counts_in_model_size_not_gpu_buffers(
    fake: FakeSGLang, client: httpx.AsyncClient
) -> None:
    info = json.loads((ENDPOINTS / "server_info.json").read_text())
    info["cpu_offload_gb"] = 20
    fake.set("/server_info", 200, json.dumps(info))
    collector, _ = make(fake.url, client)
    scrape = await collector.collect()
    gpu = val(scrape, "llmb_engine_model_buffer_bytes", device="gpu")
    assert gpu == pytest.approx(51.12 * GIB)
    assert val(scrape, "llmb_engine_model_buffer_bytes", device="cpu") == 20 * GIB
    assert val(scrape, "llmb_model_weights_bytes") == pytest.approx((51.12 + 20) * GIB)


async def test_family_prefilter_loses_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Parsing only sglang.FAMILIES gives the same normalized series as parsing everything."""
    import httpx

    from config.settings import EngineConfig
    from exporter.attribution import Attribution
    from exporter.collectors.sglang import collector as sglang_module
    from tests.plugins.engine_stubs import SGLANG_BODIES

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text=SGLANG_BODIES.get(request.url.path, ""))

    async def samples() -> list[tuple[str, tuple[tuple[str, str], ...], float]]:
        engine = EngineConfig(name="sgl", kind="sglang", url="http://127.0.0.1:30000")
        client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
        collector = sglang_module.SGLangCollector(engine, client, 2.0, Attribution([engine]))
        scrape = await collector.collect()
        return sorted(
            (s.name, tuple(sorted(s.labels.items())), s.value)
            for fam in scrape.metrics
            for s in fam.samples
        )

    filtered = await samples()
    monkeypatch.setattr(sglang_module, "FAMILIES", None)
    assert filtered == await samples()
    assert len(filtered) > 50


# --- Hostile or broken answers (issue 12): one bad field costs only its own series ----------


def _info(**change: Any) -> str:
    info = json.loads((ENDPOINTS / "server_info.json").read_text())
    info.update(change)
    return json.dumps(info)


async def test_surrogate_in_served_model_name_is_sanitized(
    fake: FakeSGLang, client: httpx.AsyncClient
) -> None:
    fake.set("/server_info", 200, _info(served_model_name="\ud800gemma\x1b"))
    collector, _ = make(fake.url, client)
    scrape = await collector.collect()
    infos = [k for k in flat(scrape.metrics) if k[0] == "llmb_engine_info"]
    assert [dict(k[1])["model"] for k in infos] == ["?gemma\ufffd"]
    assert scrape.up and scrape.errors == []


async def test_wrong_typed_server_info_fields_cost_only_their_series(
    fake: FakeSGLang, client: httpx.AsyncClient
) -> None:
    states = [{"effective_max_running_requests_per_dp": "lots"}]
    fake.set(
        "/server_info",
        200,
        _info(max_running_requests="lots", internal_states=states, cpu_offload_gb=[1]),
    )
    collector, _ = make(fake.url, client)
    scrape = await collector.collect()
    assert [e.reason for e in scrape.errors] == ["parse"]
    assert "llmb_engine_slots" not in names(scrape)
    assert val(scrape, "llmb_engine_up") == 1.0
    assert val(scrape, "llmb_engine_requests_running") == 24


async def test_deeply_nested_server_info_is_a_parse_error(
    fake: FakeSGLang, client: httpx.AsyncClient
) -> None:
    fake.set("/server_info", 200, '{"a":' * 50_000 + "1" + "}" * 50_000)
    collector, _ = make(fake.url, client)
    scrape = await collector.collect()
    assert [e.reason for e in scrape.errors] == ["parse"]
    assert val(scrape, "llmb_engine_up") == 1.0
    assert val(scrape, "llmb_engine_requests_running") == 24


async def test_bad_histogram_bound_drops_only_that_histogram(
    fake: FakeSGLang, client: httpx.AsyncClient
) -> None:
    text = (METRICS / "metrics-busy.txt").read_text()
    # Only the queue-time histogram has a bucket at 0.005 among the mapped ones.
    scrape = await scrape_of(fake, client, text.replace('le="0.005"', 'le="1,5"'))
    assert [e.reason for e in scrape.errors] == ["parse"]
    got = names(scrape)
    assert "llmb_engine_queue_time_seconds_count" not in got
    assert "llmb_engine_time_to_first_token_seconds_count" in got
    assert "llmb_engine_e2e_request_latency_seconds_count" in got
    assert val(scrape, "llmb_engine_requests_running") == 24
    assert val(scrape, "llmb_engine_up") == 1.0
    assert scrape.up  # /metrics itself was read


async def test_restart_refreshes_static_facts_and_counts(
    fake: FakeSGLang, client: httpx.AsyncClient
) -> None:
    now = [1000.0]
    collector, _ = make(fake.url, client, clock=lambda: now[0])
    first = await collector.collect()
    assert val(first, "llmb_engine_slots") == 48
    assert val(first, "llmb_engine_restarts_total") == 0
    # Same instance, 5 s later: no restart, static endpoints from the cache.
    now[0] += 5
    assert val(await collector.collect(), "llmb_engine_restarts_total") == 0
    assert fake.hits["/server_info"] == 1
    # The engine restarts with other arguments within one scrape interval: the KV pool and
    # startup times in /metrics change, so the cached /server_info is re-read at once.
    text = (METRICS / "metrics-busy.txt").read_text().replace("463552.0", "200000.0")
    fake.set("/metrics", 200, text)
    states = [{"effective_max_running_requests_per_dp": 8}]
    fake.set("/server_info", 200, _info(max_running_requests=8, internal_states=states))
    now[0] += 5
    after = await collector.collect()
    assert val(after, "llmb_engine_restarts_total") == 1
    assert val(after, "llmb_engine_slots") == 8
    assert val(after, "llmb_engine_kv_cache_capacity_tokens") == 200000
    # Unreachable in between counts as a new instance too.
    await fake_down_then_up(collector, fake)
    assert val(await collector.collect(), "llmb_engine_restarts_total") == 2


async def fake_down_then_up(collector: SGLangCollector, fake: FakeSGLang) -> None:
    url = collector.engine.url
    collector.engine = collector.engine.model_copy(
        update={"url": f"http://127.0.0.1:{get_free_port()}"}
    )
    down = await collector.collect()
    assert val(down, "llmb_engine_up") == 0.0
    collector.engine = collector.engine.model_copy(update={"url": url})


async def test_same_instance_is_never_a_restart(
    fake: FakeSGLang, client: httpx.AsyncClient
) -> None:
    now = [1000.0]
    collector, _ = make(fake.url, client, clock=lambda: now[0])
    for metrics in ("metrics-busy.txt", "metrics-idle.txt", "metrics-busy.txt"):
        # Load comes and goes, static endpoints are re-read after their 60 s: same instance.
        fake.set("/metrics", 200, (METRICS / metrics).read_text())
        scrape = await collector.collect()
        assert val(scrape, "llmb_engine_restarts_total") == 0
        now[0] += 70
    assert fake.hits["/server_info"] == 3
