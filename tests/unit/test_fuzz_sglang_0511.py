"""Property-based tests of the SGLang 0.5.11 parsing, seeded from the real H200 capture.

The mutators of tests/unit/test_fuzz_collectors.py (tools/fuzz_mutators.py) on every answer of
the real 0.5.11 server, on the `/server_info` keys added for 0.5.11 (memory_usage, dtype,
speculative decoding, version), and on its server log's memory lines. Properties: the scrape
never breaks, only `parse` errors, every exported value finite and every label encodable
(`_check`); the log reader's figures are finite or unknown.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter.collectors.sglang.log import SGLangLog, SGLangLogState
from tests.paths import FIXTURES
from tests.unit.test_fuzz_collectors import FUZZ, _check, _scrape, json_values
from tools.fuzz_mutators import mutate_body, mutate_log

V0511 = FIXTURES / "sglang-0.5.11-h200"
REAL_0511 = {
    "/metrics": (V0511 / "metrics-busy-c64.txt").read_bytes(),
    "/server_info": (V0511 / "server_info.json").read_bytes(),
    "/model_info": (V0511 / "get_model_info.json").read_bytes(),
    "/v1/models": (V0511 / "v1_models.json").read_bytes(),
}
LOG = (V0511 / "server.log").read_text()
# The lines the collector reads from the log, and their neighbours.
MEMORY_LINES = [ln for ln in LOG.split("\n") if "mem usage" in ln or "KV Cache" in ln]


@pytest.mark.parametrize("path", sorted(REAL_0511))
@FUZZ
@given(rng=st.randoms(use_true_random=False))
def test_mutated_0511_answer_never_breaks_the_scrape(path: str, rng: random.Random) -> None:
    bodies = dict(REAL_0511)
    bodies[path] = mutate_body(path, bodies[path], rng)
    _check(_scrape("sglang", bodies))


@FUZZ
@given(
    key=st.sampled_from(
        ["weight", "kvcache", "token_capacity", "graph", None]  # None: memory_usage itself
    ),
    top=st.sampled_from(["dtype", "kv_cache_dtype", "speculative_algorithm", "version"]),
    value=json_values,
    other=json_values,
)
def test_any_value_in_the_0511_memory_and_type_fields(
    key: str | None, top: str, value: Any, other: Any
) -> None:
    doc = json.loads(REAL_0511["/server_info"])
    state = doc["internal_states"][0]
    if key is None:
        state["memory_usage"] = value
    else:
        state["memory_usage"][key] = value
    doc[top] = other
    bodies = {**REAL_0511, "/server_info": json.dumps(doc).encode("utf-8", "surrogatepass")}
    _check(_scrape("sglang", bodies))


@FUZZ
@given(rng=st.randoms(use_true_random=False))
def test_mutated_0511_log_never_breaks_the_scrape(
    tmp_path_factory: pytest.TempPathFactory, rng: random.Random
) -> None:
    doc = json.loads(REAL_0511["/server_info"])
    del doc["internal_states"][0]["memory_usage"]  # so the log is what the collector reads
    bodies = {**REAL_0511, "/server_info": json.dumps(doc).encode()}
    log = tmp_path_factory.mktemp("log") / "server.log"
    log.write_text(mutate_log(LOG, rng), errors="surrogateescape")
    _check(_scrape("sglang", bodies, log))


def _finite_or_unknown(state: SGLangLogState) -> None:
    for value in (state.weights_bytes, state.kv_bytes):
        assert value is None or (math.isfinite(value) and value >= 0)
    assert state.kv_tokens is None or 0 <= state.kv_tokens < 10**16


@FUZZ
@given(
    lines=st.lists(st.text(max_size=200), max_size=10),
    digits=st.text(alphabet="0123456789.", min_size=1, max_size=400),
    rng=st.randoms(use_true_random=False),
)
def test_log_reader_takes_any_line(lines: list[str], digits: str, rng: random.Random) -> None:
    reader = SGLangLog(Path("unused"))
    hostile = [
        ln.replace("0.78", digits).replace("20.46", digits).replace("3574979", digits)
        for ln in MEMORY_LINES
    ]
    for line in lines + hostile + [mutate_log(rng.choice(MEMORY_LINES), rng) for _ in range(5)]:
        reader.feed(line)
        _finite_or_unknown(reader.state)


@FUZZ
@given(rng=st.randoms(use_true_random=False), cut=st.integers(min_value=0, max_value=len(LOG)))
def test_log_reader_survives_rewrites_and_partial_lines(
    tmp_path_factory: pytest.TempPathFactory, rng: random.Random, cut: int
) -> None:
    log = tmp_path_factory.mktemp("follow") / "server.log"
    raw = LOG.encode()
    log.write_bytes(raw[:cut])  # a line may be cut in the middle
    reader = SGLangLog(log)
    reader.poll()
    log.write_bytes(raw)
    state = reader.poll()
    # However the file was cut, the complete lines are read once and exactly.
    assert state.weights_bytes == 0.78 * (1 << 30)
    assert state.kv_bytes == 40.92 * (1 << 30)
    log.write_bytes(mutate_log(LOG, rng).encode("utf-8", "surrogateescape"))
    _finite_or_unknown(reader.poll())


def test_the_seeds_are_the_real_memory_lines() -> None:
    assert len(MEMORY_LINES) >= 2
    reader = SGLangLog(Path("unused"))
    for line in MEMORY_LINES:
        reader.feed(line)
    assert reader.state.kv_tokens == 3574979
