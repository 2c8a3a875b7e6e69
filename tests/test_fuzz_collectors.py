"""Property-based tests (hypothesis) of every collector's parsers, seeded from real answers.

Unit level: answers are served through httpx.MockTransport (no sockets) so each example
costs milliseconds; bench/fuzz_collectors.py runs the same mutators over real HTTP at scale.

Properties for any mutation of one real answer of a real engine:

* `collect()` returns (nothing escapes), the engine is `up` (it answered), and the only
  error reason is `parse`;
* the families render with client_python and read back with its parser: every label is
  encodable, every exported value finite.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
import unicodedata
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from bench.fuzz_collectors import (
    BODIES,
    LLAMA_LOG,
    mutate_body,
    mutate_bytes,
    mutate_exposition,
    mutate_json,
    mutate_log,
)
from exporter.attribution import Attribution
from exporter.collectors import Collector, Scrape
from exporter.collectors.llamacpp import LlamaCppCollector
from exporter.collectors.sglang import SGLangCollector
from exporter.config import EngineConfig
from exporter.geometry import geometry_from_gguf
from exporter.llamacpp_log import LogFollower, LogState

REAL = {kind: {p: f.read_bytes() for p, f in paths.items()} for kind, paths in BODIES.items()}
FUZZ = settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# Any JSON value, with the awkward ones (surrogates, NaN/Inf, huge ints, nesting) in reach.
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=40)
    | st.sampled_from(["\ud800", "a\udfffb", "\x00\n", "1,5", "big"]),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


class _Snapshot:
    def __init__(self, families: list[Metric]):
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


def _collector(kind: str, bodies: dict[str, bytes], log_file: Path | None = None) -> Collector:
    def handler(request: httpx.Request) -> httpx.Response:
        path = "/model_info" if request.url.path == "/get_model_info" else request.url.path
        if path == "/health":
            return httpx.Response(200, text='{"status":"ok"}')
        body = bodies.get(path)
        return httpx.Response(404) if body is None else httpx.Response(200, content=body)

    engine = EngineConfig.model_validate(
        {"name": "e", "kind": kind, "url": "http://127.0.0.1:1", "log_file": log_file}
    )
    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    cls = LlamaCppCollector if kind == "llamacpp" else SGLangCollector
    return cls(engine, client, 2.0, Attribution([engine]))


def _check(scrape: Scrape) -> None:
    assert {e.reason for e in scrape.errors} <= {"parse"}, [str(e) for e in scrape.errors]
    text = generate_latest(_Snapshot(scrape.metrics)).decode("utf-8")
    up = None
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            assert math.isfinite(s.value), (s.name, s.labels, s.value)
            # No control characters or surrogates (what the sanitizer promises).
            text = "".join(s.labels.values())
            assert not any(unicodedata.category(ch) in ("Cc", "Cs") for ch in text), s.labels
            if s.name == "llmb_engine_up":
                up = s.value
    assert up == 1.0


def _scrape(kind: str, bodies: dict[str, bytes], log_file: Path | None = None) -> Scrape:
    return asyncio.run(_collector(kind, bodies, log_file).collect())


@pytest.mark.parametrize(
    ("kind", "path"), [(kind, path) for kind, paths in BODIES.items() for path in paths]
)
@FUZZ
@given(rng=st.randoms(use_true_random=False))
def test_mutated_real_answer_never_breaks_the_scrape(
    kind: str, path: str, rng: random.Random
) -> None:
    bodies = dict(REAL[kind])
    bodies[path] = mutate_body(path, bodies[path], rng)
    _check(_scrape(kind, bodies))


@pytest.mark.parametrize(
    ("kind", "path"),
    [(kind, path) for kind, paths in BODIES.items() for path in paths if path != "/metrics"],
)
@FUZZ
@given(data=st.data(), value=json_values)
def test_any_json_value_anywhere_in_a_real_answer(
    kind: str, path: str, data: st.DataObject, value: Any
) -> None:
    doc = json.loads(REAL[kind][path])
    spots: list[tuple[Any, Any]] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            spots.extend((node, k) for k in node)
            for child in node.values():
                walk(child)
        elif isinstance(node, list):
            spots.extend((node, i) for i in range(len(node)))
            for child in node:
                walk(child)

    walk(doc)
    parent, key = data.draw(st.sampled_from(spots))
    parent[key] = value
    bodies = dict(REAL[kind])
    bodies[path] = json.dumps(doc).encode("utf-8", "surrogatepass")
    _check(_scrape(kind, bodies))


@FUZZ
@given(rng=st.randoms(use_true_random=False))
def test_mutated_real_log_never_breaks_the_scrape(
    tmp_path_factory: Any, rng: random.Random
) -> None:
    log = tmp_path_factory.mktemp("log") / "server.log"
    log.write_text(mutate_log(LLAMA_LOG.read_text(), rng), errors="surrogateescape")
    _check(_scrape("llamacpp", dict(REAL["llamacpp"]), log))


@FUZZ
@given(lines=st.lists(st.text(max_size=200), max_size=20), rng=st.randoms(use_true_random=False))
def test_log_state_takes_any_line(lines: list[str], rng: random.Random) -> None:
    state = LogState()
    real = LLAMA_LOG.read_text().split("\n")
    for line in lines + [mutate_log(rng.choice(real), rng) for _ in range(5)]:
        state.feed(line)
    for value in (state.prompt_seconds, state.eval_seconds, *state.kv_buffer_bytes.values()):
        assert math.isfinite(value)


@FUZZ
@given(rng=st.randoms(use_true_random=False))
def test_log_follower_survives_rewrites(tmp_path_factory: Any, rng: random.Random) -> None:
    log = tmp_path_factory.mktemp("follow") / "server.log"
    real = LLAMA_LOG.read_bytes()
    follower = LogFollower(log, max_bytes=4096)
    log.write_bytes(real[: len(real) // 2])
    follower.poll()
    log.write_bytes(mutate_bytes(real, rng))  # rewritten in place, maybe shorter or longer
    for _ in range(3):
        follower.poll()


# --- GGUF header reader: the model file named by the engine's /props --------------------------


@pytest.fixture(scope="module")
def gemma_header(gemma_model: Path, tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """The real Gemma 3 270M GGUF up to its tensor data (its header), read once."""
    prefix = gemma_model.open("rb").read(12 * 1024 * 1024)
    path = tmp_path_factory.mktemp("gguf") / "head.gguf"
    path.write_bytes(prefix)
    assert geometry_from_gguf(path).n_layer == 18  # the whole header is in the prefix
    return prefix


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(rng=st.randoms(use_true_random=False), where=st.sampled_from(["start", "any"]))
def test_damaged_gguf_header_fails_fast_and_cleanly(
    gemma_header: bytes, tmp_path_factory: Any, rng: random.Random, where: str
) -> None:
    data = bytearray(gemma_header)
    # Damage the counts and lengths at the front (where the walker trusts sizes) or anywhere.
    span = 4096 if where == "start" else len(data)
    for _ in range(rng.randrange(1, 6)):
        pos = rng.randrange(4, span)
        data[pos : pos + 8] = rng.randbytes(8)
    path = tmp_path_factory.mktemp("bad") / "bad.gguf"
    path.write_bytes(bytes(data))
    start = time.perf_counter()
    try:
        geom = geometry_from_gguf(path)
    except Exception:  # noqa: BLE001 - the collector turns any of these into one warning
        geom = None
    assert time.perf_counter() - start < 5.0
    if geom is not None:
        assert 0 < geom.n_layer <= 10_000
        assert 0 <= geom.kv_bytes_per_token() < 2**62


# --- The mutators really mutate (otherwise the properties above prove nothing) ---------------


def test_mutators_change_real_answers() -> None:
    rng = random.Random(3)
    metrics = REAL["sglang"]["/metrics"].decode()
    assert sum(mutate_exposition(metrics, rng) != metrics for _ in range(50)) >= 45
    info = REAL["sglang"]["/server_info"].decode()
    assert sum(mutate_json(info, rng) != info for _ in range(50)) >= 40
    changed = _scrape(
        "sglang", {**REAL["sglang"], "/server_info": b'{"max_running_requests": "lots"}'}
    )
    assert [e.reason for e in changed.errors] == ["parse"]
