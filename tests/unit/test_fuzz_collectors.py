"""Property-based tests (hypothesis) of every collector's parsers, seeded from real answers.

Unit level: answers are served through httpx.MockTransport (no sockets) so each example
costs milliseconds; tools/fuzz_collectors.py runs the same mutators (tools/fuzz_mutators.py)
over real HTTP at scale.

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
from prometheus_client.parser import text_string_to_metric_families

from config.settings import EngineConfig
from exporter.attribution import Attribution
from exporter.collectors import Collector, Scrape
from exporter.collectors.llamacpp.collector import LlamaCppCollector
from exporter.collectors.llamacpp.log import LogFollower, LogState
from exporter.collectors.llamacpp.memory import host_experts
from exporter.collectors.sglang.collector import SGLangCollector
from exporter.runner import Families
from model.geometry import geometry_from_gguf
from tests.paths import FIXTURES
from tools.fuzz_collectors import BODIES, LLAMA_LOG
from tools.fuzz_mutators import (
    mutate_body,
    mutate_bytes,
    mutate_exposition,
    mutate_json,
    mutate_log,
)

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
    text = generate_latest(Families(scrape.metrics)).decode("utf-8")
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


# --- The roofline's llama.cpp facts: KV types, expert overrides, draft acceptance -------------

FIX = FIXTURES
ROOFLINE_LOGS = [
    FIX / "llamacpp-cpu-gemma3-270m-kv-q8_0" / "server.log",
    FIX / "llamacpp-cpu-gemma3-270m-spec-draft" / "server.log",
    FIX / "llamacpp-cpu-gemma3-270m-spec-q8_0" / "server.log",
    FIX / "llamacpp-cpu-qwen3moe-synth-expert-offload" / "server-ncmoe1-lv5.log",
    FIX / "llamacpp-cpu-qwen3moe-synth-expert-offload" / "server-ot-lv4.log",
]


def _check_roofline_state(state: LogState) -> None:
    accept = state.spec_accept_length
    assert accept is None or (math.isfinite(accept) and accept >= 1.0)
    assert len(state.spec_requests) <= 64 and len(state.expert_overrides) <= 4096
    for value in (*state.draft_model_buffer_bytes.values(), *state.draft_kv_buffer_bytes.values()):
        assert math.isfinite(value)
    experts = host_experts(state, None)
    assert experts is None or (experts[0] >= 0 and math.isfinite(experts[1]))


@pytest.mark.parametrize("log_path", ROOFLINE_LOGS, ids=lambda p: f"{p.parent.name}/{p.name}")
@FUZZ
@given(rng=st.randoms(use_true_random=False))
def test_mutated_roofline_logs_never_break_the_scrape(
    tmp_path_factory: Any, log_path: Path, rng: random.Random
) -> None:
    text = mutate_log(log_path.read_text(), rng)
    state = LogState()
    for line in text.split("\n"):
        state.feed(line)
    _check_roofline_state(state)
    log = tmp_path_factory.mktemp("log") / "server.log"
    log.write_text(text, errors="surrogateescape")
    _check(_scrape("llamacpp", dict(REAL["llamacpp"]), log))


_count = st.integers(min_value=-5, max_value=10**15)
_name = st.text(alphabet=st.characters(codec="ascii"), min_size=0, max_size=20)


@FUZZ
@given(
    numbers=st.tuples(*[_count] * 6),
    kv_type=_name,
    buffer=st.sampled_from(["CPU", "CUDA_Host", "CUDA0", "CPU_Mapped", "Vulkan_Host", ""]),
)
def test_roofline_lines_with_any_numbers(
    numbers: tuple[int, ...], kv_type: str, buffer: str
) -> None:
    """The exact formats (real lines of the fixtures) with any numbers and names in them."""
    task, n_tokens, accepted, drafted, layer, mib = numbers
    state = LogState()
    prefix = f"1.15.304.682 I slot print_timing: id  0 | task {task} |"
    for line in (
        "0.05.587.350 I llama_kv_cache: size =    3.19 MiB (  2048 cells,   3 layers,  1/1 seqs), "
        f"K ({kv_type}):    1.59 MiB, V ({kv_type}):    1.59 MiB",
        f"0.00.726.811 D tensor blk.{layer}.ffn_gate_exps.weight ({mib} MiB q4_0) buffer type "
        f"overridden to {buffer}",
        f"{prefix}        eval time =   49002.57 ms / {n_tokens:5d} tokens (1.0 ms per token)",
        f"{prefix} draft acceptance = 0.94444 ({accepted:5d} accepted / {drafted:5d} generated), "
        "mean len =  3.83",
        "0.07.199.174 I common_speculative_init_result: loading draft model '/models/x.gguf'",
        "0.09.362.334 I load_tensors:   CPU_Mapped model buffer size =   235.16 MiB",
    ):
        state.feed(line)
    _check_roofline_state(state)
    assert state.model_buffer_bytes == {}  # the last buffer line belongs to the draft
    if state.expert_overrides:
        assert buffer.startswith("CPU") or buffer.endswith("_Host")


@pytest.fixture(scope="module")
def moe_header(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """A real-layout qwen3moe GGUF header (3 layers, 8 experts) with tensor infos, no data."""
    from tests.unit.test_weights import qwen3moe_tensors, write_header

    kv = {"block_count": 3, "embedding_length": 64, "attention.head_count": 2}
    kv |= {"attention.head_count_kv": 1, "expert_count": 8, "expert_used_count": 2}
    path = tmp_path_factory.mktemp("moe") / "moe.gguf"
    write_header(path, "qwen3moe", kv, qwen3moe_tensors(3, 64, 2, 1, 32, 32, 8))
    assert geometry_from_gguf(path).routed_expert_bytes > 0
    return path.read_bytes()


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(rng=st.randoms(use_true_random=False))
def test_damaged_moe_header_gives_a_consistent_structure_or_an_error(
    moe_header: bytes, tmp_path_factory: Any, rng: random.Random
) -> None:
    data = bytearray(moe_header)
    for _ in range(rng.randrange(1, 6)):
        pos = rng.randrange(4, len(data))
        data[pos : pos + 8] = rng.randbytes(rng.randrange(1, 9))
    path = tmp_path_factory.mktemp("badmoe") / "bad.gguf"
    path.write_bytes(bytes(data))
    try:
        geom = geometry_from_gguf(path)
    except Exception:  # noqa: BLE001 - the collector turns any of these into one warning
        return
    assert geom.always_read_bytes is None or geom.always_read_bytes >= 0
    assert geom.routed_expert_bytes >= 0 and geom.token_embedding_row_bytes >= 0
    assert sum(geom.routed_expert_bytes_by_layer) <= geom.routed_expert_bytes
    if geom.expert_count is not None:
        assert 0 < geom.expert_count <= 1 << 16
    if geom.expert_used_count is not None:
        assert geom.expert_count is not None and geom.expert_used_count <= geom.expert_count


def _moe_configs() -> list[dict[str, Any]]:
    from tests.unit.test_weights import DEEPSEEK_V3, GPT_OSS_20B, QWEN3_30B_A3B

    return [QWEN3_30B_A3B, DEEPSEEK_V3, GPT_OSS_20B]


@pytest.mark.parametrize("index", [0, 1, 2], ids=["qwen3-30b-a3b", "deepseek-v3", "gpt-oss-20b"])
@FUZZ
@given(data=st.data(), value=json_values)
def test_any_json_value_in_a_real_moe_config(index: int, data: st.DataObject, value: Any) -> None:
    """The SGLang collector's model config.json (public configs) with one value replaced."""
    from model.geometry import geometry_from_hf_config

    config = json.loads(json.dumps(_moe_configs()[index]))
    key = data.draw(st.sampled_from(sorted(config)))
    config[key] = value
    try:
        geom = geometry_from_hf_config(config)
    except (ValueError, TypeError, KeyError, ArithmeticError):
        return  # a broken layer/head count: no geometry at all, as before issue 17
    if geom.always_read_bytes is None:
        assert geom.routed_expert_bytes == 0 and geom.expert_count is None
        return
    assert min(geom.always_read_bytes, geom.routed_expert_bytes) >= 0
    assert geom.token_embedding_row_bytes >= 0
    assert sum(geom.routed_expert_bytes_by_layer) == geom.routed_expert_bytes
    if geom.expert_used_count is not None:
        assert geom.expert_count is not None and geom.expert_used_count <= geom.expert_count


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
