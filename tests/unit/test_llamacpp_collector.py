"""llama.cpp collector on real captured llama-server outputs (CPU and H200 builds)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.metrics_core import Metric

from config.settings import EngineConfig
from exporter.attribution import Attribution
from exporter.collectors import Scrape
from exporter.collectors.llamacpp.collector import LlamaCppCollector
from exporter.collectors.llamacpp.log import LogFollower, LogState
from tests.paths import FIXTURES

CPU = FIXTURES / "llamacpp-cpu-gemma3-270m"
H200 = FIXTURES / "llamacpp-h200-gemma3-27b-shape-q4_0"
MIB = 1024 * 1024

# An exposition of a llama.cpp build from before PR #13660 (May 2025), when the server
# still reported KV usage itself and called n_tokens_max n_past_max. Values are made up;
# names, types and HELP texts follow that era's server (engine-metrics.md 1.4).
LEGACY_METRICS = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 1200
# HELP llamacpp:prompt_seconds_total Prompt process time
# TYPE llamacpp:prompt_seconds_total counter
llamacpp:prompt_seconds_total 2.5
# HELP llamacpp:tokens_predicted_total Number of generation tokens processed.
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 640
# HELP llamacpp:tokens_predicted_seconds_total Predict process time
# TYPE llamacpp:tokens_predicted_seconds_total counter
llamacpp:tokens_predicted_seconds_total 12.8
# HELP llamacpp:n_past_max Largest observed n_past.
# TYPE llamacpp:n_past_max counter
llamacpp:n_past_max 900
# HELP llamacpp:kv_cache_usage_ratio KV-cache usage. 1 means 100 percent usage.
# TYPE llamacpp:kv_cache_usage_ratio gauge
llamacpp:kv_cache_usage_ratio 0.25
# HELP llamacpp:kv_cache_tokens KV-cache tokens.
# TYPE llamacpp:kv_cache_tokens gauge
llamacpp:kv_cache_tokens 1024
# HELP llamacpp:requests_processing Number of request processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 1
# HELP llamacpp:requests_deferred Number of request deferred.
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 0
"""


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def make_transport(
    metrics: str | None,
    slots: str | None,
    props: str,
    models: str,
    health: tuple[int, str] = (200, '{"status":"ok"}'),
    metrics_status: int = 200,
) -> httpx.MockTransport:
    """A transport answering like llama-server, from captured bodies."""

    def handler(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/health":
            return httpx.Response(health[0], text=health[1])
        if health[0] != 200:
            return httpx.Response(503, text=health[1])
        if path == "/metrics":
            if metrics is None:
                return httpx.Response(501, text=_read(CPU / "metrics_disabled_501.json"))
            return httpx.Response(metrics_status, text=metrics)
        if path == "/slots":
            if slots is None:
                return httpx.Response(501, text=_read(CPU / "slots_disabled_501.json"))
            return httpx.Response(200, text=slots)
        if path == "/props":
            return httpx.Response(200, text=props)
        if path == "/v1/models":
            return httpx.Response(200, text=models)
        return httpx.Response(404)

    return httpx.MockTransport(handler)


def cpu_busy_transport(metrics: str | None, metrics_status: int = 200) -> httpx.MockTransport:
    """`make_transport` with the CPU capture's busy /slots, /props and /v1/models."""
    slots, props, models = (
        _read(CPU / f) for f in ("slots_busy.json", "props.json", "v1_models.json")
    )
    return make_transport(metrics, slots, props, models, metrics_status=metrics_status)


def collector(transport: httpx.MockTransport, **engine_kw: object) -> LlamaCppCollector:
    engine = EngineConfig.model_validate(
        {"name": "llama", "kind": "llamacpp", "url": "http://127.0.0.1:8080", **engine_kw}
    )
    client = httpx.AsyncClient(transport=transport)
    return LlamaCppCollector(engine, client, 2.0, Attribution([engine]))


async def scrape_once(transport: httpx.MockTransport, **engine_kw: object) -> Scrape:
    """One scrape by a fresh collector behind `transport`."""
    return await collector(transport, **engine_kw).collect()


def values(metrics: list[Metric]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in metrics:
        for s in fam.samples:
            labels = tuple(
                sorted((k, v) for k, v in s.labels.items() if k not in ("engine", "kind"))
            )
            out[(s.name, labels)] = s.value
    return out


def v(metrics: list[Metric], name: str, **labels: str) -> float:
    return values(metrics)[(name, tuple(sorted(labels.items())))]


async def test_cpu_busy_capture_maps_to_schema() -> None:
    scrape = await scrape_once(cpu_busy_transport(_read(CPU / "llamacpp_metrics_busy.txt")))
    assert scrape.up and not scrape.errors
    m = scrape.metrics
    raw = {
        line.split()[0]: float(line.split()[1])
        for line in _read(CPU / "llamacpp_metrics_busy.txt").splitlines()
        if line and not line.startswith("#")
    }
    slots = json.loads(_read(CPU / "slots_busy.json"))
    assert v(m, "llmb_engine_up") == 1
    assert v(m, "llmb_engine_requests_running") == raw["llamacpp:requests_processing"]
    assert v(m, "llmb_engine_requests_waiting") == raw["llamacpp:requests_deferred"] == 2
    assert v(m, "llmb_engine_slots") == 2
    assert v(m, "llmb_engine_context_tokens") == 2048
    held = sum(s["n_prompt_tokens"] for s in slots if s["is_processing"])
    assert v(m, "llmb_engine_kv_cache_used_tokens") == held
    assert v(m, "llmb_engine_kv_cache_capacity_tokens") == 4096  # -c 4096 -np 2, not unified
    assert v(m, "llmb_engine_kv_cache_usage_ratio") == pytest.approx(held / 4096)
    assert v(m, "llmb_engine_prompt_tokens_total") == (
        raw["llamacpp:prompt_tokens_total"] + raw["llamacpp:prompt_tokens_cached_total"]
    )
    assert (
        v(m, "llmb_engine_prompt_tokens_cached_total") == raw["llamacpp:prompt_tokens_cached_total"]
    )
    assert v(m, "llmb_engine_decode_tokens_total") == raw["llamacpp:tokens_predicted_total"]
    assert (
        v(m, "llmb_engine_decode_seconds_total") == raw["llamacpp:tokens_predicted_seconds_total"]
    )
    assert v(m, "llmb_engine_generation_tokens_total") == raw["llamacpp:tokens_predicted_total"]
    # No log: llama.cpp's own prompt time is timed per prompt batch, a wall time: the busy
    # series, not each request's prompt time summed (that would read prompts computed
    # together as waiting in the rules' TTFT split: issue 32 review), which is absent.
    seconds = raw["llamacpp:prompt_seconds_total"]
    assert v(m, "llmb_engine_prefill_busy_seconds_total") == seconds
    assert ("llmb_engine_prompt_seconds_total", ()) not in values(m)
    assert v(m, "llmb_model_weights_bytes") == 246587904
    assert v(m, "llmb_model_parameters") == 268098176
    info = values(m)
    info_keys = [k for k in info if k[0] == "llmb_engine_info"]
    assert len(info_keys) == 1
    info_labels = dict(info_keys[0][1])
    assert info_labels["quantization"] == "Q4_K - Medium"
    assert info_labels["simulated"] == "false"
    # Series llama.cpp cannot provide are absent, not zero.
    names = {k[0] for k in info}
    assert "llmb_engine_time_to_first_token_seconds_count" not in names
    assert "llmb_engine_kv_cache_bytes" not in names  # only from a -lv 4 log


async def test_h200_np4_c4_capture_slots_and_log() -> None:
    scrape = await scrape_once(
        make_transport(
            _read(H200 / "metrics_np4_c4.txt"),
            _read(H200 / "slots_np4_c4.json"),
            _read(H200 / "props.json"),
            _read(H200 / "models.json"),
        ),
        log_file=str(H200 / "server_c32k_np4.log"),
    )
    m = scrape.metrics
    assert v(m, "llmb_engine_requests_running") == 4
    assert v(m, "llmb_engine_requests_waiting") == 0
    assert v(m, "llmb_engine_slots") == 4
    # The log says kv_unified = 'false' with n_ctx_slot 8192 and 4 slots.
    assert v(m, "llmb_engine_kv_cache_capacity_tokens") == 4 * 8192
    assert v(m, "llmb_engine_gpu_layers_offloaded") == 63
    assert v(m, "llmb_engine_gpu_layers_total") == 63
    assert v(m, "llmb_engine_kv_cache_bytes", device="CUDA0") == 5056 * MIB
    assert v(m, "llmb_engine_model_buffer_bytes", device="CUDA0") == pytest.approx(14493.27 * MIB)
    # With the log: each request's own prompt time summed, and the union of the prompt spans.
    state = LogState()
    for line in _read(H200 / "server_c32k_np4.log").splitlines():
        state.feed(line)
    assert v(m, "llmb_engine_prompt_seconds_total") == pytest.approx(state.prompt_seconds)
    assert v(m, "llmb_engine_prefill_busy_seconds_total") == pytest.approx(
        state.prefill_busy_seconds
    )
    # Four slots computed prompts together: the union is well below the sum.
    assert 0 < state.prefill_busy_seconds < 0.5 * state.prompt_seconds


async def test_metrics_disabled_and_no_slots_keep_other_series() -> None:
    scrape = await scrape_once(
        make_transport(None, None, _read(CPU / "props.json"), _read(CPU / "v1_models.json")),
        log_file=str(CPU / "server.log"),
    )
    m = scrape.metrics
    assert scrape.up and not scrape.errors  # 501 is a setting, not a failure
    assert v(m, "llmb_engine_up") == 1
    assert v(m, "llmb_engine_endpoint_enabled", endpoint="metrics") == 0
    assert v(m, "llmb_engine_endpoint_enabled", endpoint="slots") == 0
    assert v(m, "llmb_engine_slots") == 2
    # Token counters fall back to the per-request timing lines of the log; decode counts the
    # intervals after each request's first token (6 requests).
    state = LogFollower(CPU / "server.log").poll()
    assert v(m, "llmb_engine_generation_tokens_total") == state.eval_tokens == 872
    assert v(m, "llmb_engine_decode_tokens_total") == state.eval_intervals == 872 - 6
    assert v(m, "llmb_engine_decode_seconds_total") == pytest.approx(state.eval_seconds)
    names = {k[0] for k in values(m)}
    assert "llmb_engine_requests_waiting" not in names
    assert "llmb_engine_kv_cache_usage_ratio" not in names


async def test_loading_engine_reports_loading_not_error() -> None:
    body = _read(CPU / "health_503_loading.json")
    scrape = await scrape_once(make_transport(None, None, "{}", "{}", health=(503, body)))
    assert scrape.up and not scrape.errors
    assert v(scrape.metrics, "llmb_engine_up") == 0
    assert v(scrape.metrics, "llmb_engine_loading") == 1


async def test_garbage_metrics_is_a_parse_error_and_other_series_stay() -> None:
    scrape = await scrape_once(cpu_busy_transport("this is {not an exposition\n"))
    assert not scrape.up
    assert [e.reason for e in scrape.errors] == ["parse"]
    assert v(scrape.metrics, "llmb_engine_up") == 1
    assert v(scrape.metrics, "llmb_engine_slots") == 2


async def test_http_error_reason() -> None:
    scrape = await scrape_once(cpu_busy_transport("x 1\n", metrics_status=500))
    assert [e.reason for e in scrape.errors] == ["http"]


async def test_connection_refused_is_engine_down() -> None:
    engine = EngineConfig(name="llama", kind="llamacpp", url="http://127.0.0.1:9")
    c = LlamaCppCollector(engine, httpx.AsyncClient(), 1.0, Attribution([engine]))
    scrape = await c.collect()
    assert not scrape.up
    assert [e.reason for e in scrape.errors] == ["connect"]
    assert v(scrape.metrics, "llmb_engine_up") == 0


async def test_legacy_build_with_kv_metrics() -> None:
    m = (await scrape_once(cpu_busy_transport(LEGACY_METRICS))).metrics
    assert v(m, "llmb_engine_kv_cache_usage_ratio") == 0.25
    assert v(m, "llmb_engine_kv_cache_used_tokens") == 1024
    assert v(m, "llmb_engine_decode_tokens_total") == 640
    assert v(m, "llmb_engine_decode_seconds_total") == 12.8
    # No prompt_tokens_cached_total in that era: the total is the processed count.
    assert v(m, "llmb_engine_prompt_tokens_total") == 1200


def test_log_follower_on_every_captured_log() -> None:
    ngl30 = LogFollower(H200 / "run2" / "server_ngl30.log").poll()
    assert (ngl30.layers_offloaded, ngl30.layers_total) == (30, 63)
    assert ngl30.model_buffer_bytes["CPU_Mapped"] == pytest.approx(8067.74 * MIB)
    assert ngl30.kv_buffer_bytes == {"CPU": 656 * MIB, "CUDA0": 608 * MIB}
    kvslot = LogFollower(H200 / "run2" / "server_kvslot.log").poll()
    assert kvslot.events["slot_truncated"] == 4
    assert kvslot.n_ctx_slot == 1024
    unified = LogFollower(H200 / "run2" / "server_kvunified.log").poll()
    assert unified.kv_unified is True
    assert unified.kv_buffer_bytes["CUDA0"] == (640 + 1872) * MIB
    c8k = LogFollower(H200 / "server_c8k_np1.log").poll()
    assert c8k.kv_buffer_bytes["CUDA0"] == (640 + 624) * MIB
    assert c8k.load_seconds is not None and 0 < c8k.load_seconds < 10


def test_log_follower_incremental_restart_and_jsonl(tmp_path: Path) -> None:
    path = tmp_path / "server.log"
    lines = _read(CPU / "server.log").splitlines(keepends=True)
    path.write_text("".join(lines[:12]))
    follower = LogFollower(path)
    first = follower.poll()
    assert first.prompt_tokens == 34 and first.eval_tokens == 0
    with path.open("a") as fh:
        fh.write(lines[12][:20])  # half a line: must wait for its end
    assert follower.poll().eval_tokens == 0
    with path.open("a") as fh:
        fh.write(lines[12][20:])
        fh.write('{"type":"log","time":1,"level":"W","msg":"slot context shift, n_keep = 0"}\n')
    state = follower.poll()
    assert state.eval_tokens == 64
    assert state.events["context_shift"] == 1
    # A new server process truncates the file: state starts over.
    path.write_text(lines[0])
    assert follower.poll().eval_tokens == 0


# --- Hostile or broken answers (issue 12): one bad field costs only its own series ----------


def _real(**replace: str) -> httpx.MockTransport:
    """The busy CPU capture, with some bodies replaced."""
    bodies = {
        "metrics": _read(CPU / "llamacpp_metrics_busy.txt"),
        "slots": _read(CPU / "slots_busy.json"),
        "props": _read(CPU / "props.json"),
        "models": _read(CPU / "v1_models.json"),
    }
    bodies.update(replace)
    return make_transport(bodies["metrics"], bodies["slots"], bodies["props"], bodies["models"])


def _edit(path: Path, edit: Any) -> str:
    doc = json.loads(_read(path))
    edit(doc)
    return json.dumps(doc)


def _reasons(scrape: Any) -> list[str]:
    return [e.reason for e in scrape.errors]


async def test_lone_surrogate_in_model_id_and_build_is_sanitized() -> None:
    from prometheus_client.exposition import generate_latest

    from exporter.runner import Runner

    models = _read(CPU / "v1_models.json").replace(
        '"id":"/models/gemma-3-270m-q4_k_m.gguf"', '"id":"gemma\\ud800\\u0007x"'
    )
    props = _read(CPU / "props.json").replace('"b0-unknown"', '"b1\\udfff\\n"')
    c = collector(_real(models=models, props=props))
    families = await Runner([c]).scrape()

    class Snapshot:
        def collect(self) -> list[Metric]:
            return families

    text = generate_latest(Snapshot()).decode("utf-8")  # raised UnicodeEncodeError before
    info = [line for line in text.splitlines() if line.startswith("llmb_engine_info{")]
    assert len(info) == 1
    assert 'model="gemma?\ufffdx"' in info[0] and 'version="b1?\ufffd"' in info[0]
    assert 'llmb_engine_up{engine="llama",kind="llamacpp"} 1.0' in text


@pytest.mark.parametrize(
    ("what", "replace", "lost"),
    [
        ("slots [1,2]", {"slots": "[1,2]"}, "llmb_engine_slot_context_usage_max_ratio"),
        (
            "n_ctx 1e400",
            {"slots": _read(CPU / "slots_busy.json").replace('"n_ctx":2048', '"n_ctx":1e400')},
            "llmb_engine_context_tokens",
        ),
        (
            "meta.size big",
            {"models": _read(CPU / "v1_models.json").replace('"size":246587904', '"size":"big"')},
            "llmb_model_weights_bytes",
        ),
        (
            "model_path list",
            {
                "props": _read(CPU / "props.json").replace(
                    '"model_path":"/models/gemma-3-270m-q4_k_m.gguf"', '"model_path":["a"]'
                )
            },
            None,
        ),
        ("props deep", {"props": "[" * 100_000 + "]" * 100_000}, None),
        ("slots not JSON", {"slots": "{"}, "llmb_engine_slot_context_usage_max_ratio"),
        (
            "metrics Inf",
            {
                "metrics": _read(CPU / "llamacpp_metrics_busy.txt").replace(
                    "llamacpp:tokens_predicted_total 72", "llamacpp:tokens_predicted_total +Inf"
                )
            },
            None,
        ),
    ],
)
async def test_wrong_types_cost_only_their_series(
    what: str, replace: dict[str, str], lost: str | None
) -> None:
    good = await collector(_real()).collect()
    bad = await collector(_real(**replace)).collect()
    assert "parse" in _reasons(bad), what
    assert set(_reasons(bad)) == {"parse"}, what
    assert v(bad.metrics, "llmb_engine_up") == 1, what
    good_names = {n for n, _ in values(good.metrics)}
    bad_names = {n for n, _ in values(bad.metrics)}
    if lost is not None:
        assert lost in good_names and lost not in bad_names, what
    # Everything not read from the broken field is still there.
    assert "llmb_engine_requests_running" in bad_names
    assert "llmb_engine_generation_tokens_total" in bad_names or "metrics" in replace


async def test_histogram_and_nan_values_are_dropped_not_fatal() -> None:
    from exporter.schema import MetricSet

    ms = MetricSet()
    labels = {"engine": "e", "kind": "sglang"}
    ms.histogram("llmb_engine_queue_time_seconds", [("1,5", 1.0), ("+Inf", 2.0)], 1.0, **labels)
    ms.histogram(
        "llmb_engine_e2e_request_latency_seconds", [("1", 3.0), ("+Inf", 2.0)], 1.0, **labels
    )
    ms.add("llmb_engine_slots", float("nan"), **labels)
    ms.add("llmb_engine_requests_running", float("inf"), **labels)
    ms.add("llmb_engine_requests_waiting", "3", **labels)
    ms.add("llmb_engine_context_tokens", 10**400, **labels)
    ms.add("llmb_engine_kv_cache_used_tokens", 5, **labels)
    assert [f.name for f in ms.metrics()] == ["llmb_engine_kv_cache_used_tokens"]
    assert len(ms.problems) == 6


async def test_too_large_body_is_not_read() -> None:
    padding = ("# " + "x" * 1000 + "\n") * 5000  # 5 MB of comments
    huge = padding + _read(CPU / "llamacpp_metrics_busy.txt")
    scrape = await scrape_once(_real(metrics=huge))
    assert _reasons(scrape) == ["too_large"]
    assert v(scrape.metrics, "llmb_engine_up") == 1
    assert v(scrape.metrics, "llmb_engine_slots") == 2
    small = collector(_real(metrics=huge), max_response_bytes=16 * MIB)
    assert _reasons(await small.collect()) == []


def test_log_lines_that_break_numbers_are_skipped() -> None:
    from exporter.collectors.llamacpp.log import LogState

    state = LogState()
    for line in (
        "load_tensors:   CPU_Mapped model buffer size =   1.2.3 MiB",
        "llama_kv_cache:        CPU KV buffer size =    " + "9" * 5000 + " MiB",
        "prompt eval time =  1e400 ms /    12 tokens",
        "{" * 5000,
        '{"msg": ["not", "text"]}',
        "\udcff\x00       eval time =       5.00 ms /     3 tokens",
    ):
        state.feed(line)
    assert state.model_buffer_bytes == {} and state.kv_buffer_bytes == {}
    assert state.prompt_tokens == 0
    assert state.eval_tokens == 3


async def test_restart_with_new_flags_refreshes_every_fact() -> None:
    """A new instance (other -np, --no-slots) between two scrapes: the next scrape shows it."""
    bodies = {
        "metrics": _read(CPU / "llamacpp_metrics_idle.txt"),
        "slots": _read(CPU / "slots_idle.json"),
        "props": _read(CPU / "props.json"),
        "models": _read(CPU / "v1_models.json"),
    }

    def handler(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/health":
            return httpx.Response(200, text='{"status":"ok"}')
        body = bodies[{"/v1/models": "models"}.get(path, path.strip("/"))]
        if body is None:
            return httpx.Response(501, text=_read(CPU / "slots_disabled_501.json"))
        return httpx.Response(200, text=body)

    c = collector(httpx.MockTransport(handler))
    before = (await c.collect()).metrics
    assert v(before, "llmb_engine_slots") == 2
    assert v(before, "llmb_engine_kv_cache_capacity_tokens") == 4096
    assert v(before, "llmb_engine_restarts_total") == 0
    # Restarted as -np 4 -c 2048 --no-slots with another model card.
    props = json.loads(bodies["props"])
    props["total_slots"] = 4
    props["default_generation_settings"]["n_ctx"] = 512
    bodies["props"] = json.dumps(props)
    bodies["slots"] = None  # type: ignore[assignment]
    bodies["models"] = bodies["models"].replace('"size":246587904', '"size":1000')
    after = (await c.collect()).metrics
    assert v(after, "llmb_engine_slots") == 4
    assert v(after, "llmb_engine_context_tokens") == 512
    assert v(after, "llmb_engine_kv_cache_capacity_tokens") == 2048
    assert v(after, "llmb_model_weights_bytes") == 1000
    assert v(after, "llmb_engine_restarts_total") == 1
    # The same instance again: no further restart.
    assert v((await c.collect()).metrics, "llmb_engine_restarts_total") == 1


def test_bucket_bounds_prometheus_cannot_read_drop_the_histogram() -> None:
    from exporter.schema import MetricSet

    labels = {"engine": "e", "kind": "sglang"}
    for le in ("0.8 ", "1_0", "0x1", "NaN", "", "inf"):
        ms = MetricSet()
        ms.histogram("llmb_engine_queue_time_seconds", [(le, 1.0), ("+Inf", 2.0)], 1.0, **labels)
        assert ms.metrics() == [] and len(ms.problems) == 1, le
    ms = MetricSet()
    ms.histogram("llmb_engine_queue_time_seconds", [("1e-3", 1.0), ("+Inf", 2.0)], 1.0, **labels)
    assert ms.metrics() and not ms.problems


def test_labels_that_sanitize_alike_do_not_duplicate_a_series() -> None:
    from exporter.schema import MetricSet

    ms = MetricSet()
    labels = {"engine": "e", "kind": "llamacpp"}
    # Two log device names that differ only in control characters.
    ms.add("llmb_engine_kv_cache_bytes", 1.0, device="CPU\x00", **labels)
    ms.add("llmb_engine_kv_cache_bytes", 2.0, device="CPU\x01", **labels)
    (fam,) = ms.metrics()
    assert [(s.labels["device"], s.value) for s in fam.samples] == [("CPU\ufffd", 1.0)]
    assert len(ms.problems) == 1


async def test_a_model_or_log_path_not_there_is_a_connect_error_with_a_mount_hint(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A path the container does not have: the source is not up, the reason is `connect`."""
    missing_model, missing_log = tmp_path / "model.gguf", tmp_path / "server.log"
    c = collector(
        cpu_busy_transport(_read(CPU / "llamacpp_metrics_busy.txt")),
        model_path=str(missing_model),
        log_file=str(missing_log),
    )
    for _ in range(2):  # looked for again every scrape, announced once
        scrape = await c.collect()
        assert not scrape.up
        reasons = sorted((e.reason, str(e).split(":")[0]) for e in scrape.errors)
        assert reasons == [("connect", "log file"), ("connect", "model_path " + str(missing_model))]
    assert "llmb_model_layers" not in {k[0] for k in values(scrape.metrics)}
    hints = [r.message for r in caplog.records if "is the host's file mounted" in r.message]
    assert len(hints) == 2, hints
    # Once the file is there (the mount fixed, the engine started), the error goes.
    from tests.unit.test_geometry import GEMMA3_27B, write_gguf

    write_gguf(missing_model, "gemma3", GEMMA3_27B)
    missing_log.write_text("")
    scrape = await c.collect()
    assert scrape.up and not scrape.errors
    assert v(scrape.metrics, "llmb_model_layers") == GEMMA3_27B["block_count"]
