"""MoE, quantized-KV and speculative-decoding presets of the simulators.

The simulated engines behave as the real ones physically do: a decode step reads the
always-read weights, the routed experts the batch's tokens pick (drawn per step), the KV in
use in the cache's element type; speculative decoding runs a draft, verifies it in one target
forward and keeps the accepted tokens (drawn per step). Their files, logs and endpoints carry
what the exporter reads on a real engine (GGUF / HF config at `model_path`, KV type lines,
draft acceptance lines and counters), checked here against the real formats (fixtures).
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import httpx
import pytest

from model.geometry import geometry_from_gguf, geometry_from_hf_config
from model.kv_cache import estimate_llamacpp_kv, estimate_sglang_kv
from simulator import scenarios
from simulator.common import simulator_class
from simulator.engine import Engine
from simulator.model import Clock, ModelSpec, Request
from simulator.tokenizer import Tokenizer
from tests.integration.test_sim_scenarios import llama_load, llama_metrics, words
from tests.paths import FIXTURES
from tests.plugins.sim import SimServer
from tools.synth_model.plan import build_model, weight_split

FIXTURES = FIXTURES
SPEC_FIXTURE = FIXTURES / "llamacpp-cpu-gemma3-270m-spec-draft"
KVQ_FIXTURE = FIXTURES / "llamacpp-cpu-gemma3-270m-kv-q8_0"


def engine(scenario: str, kind: str = "llamacpp") -> Engine:
    sc = scenarios.get(scenario)
    tok = Tokenizer("word", sc.model.n_vocab)
    style = simulator_class(kind).style
    return Engine(style, sc.model, sc.gpu, sc.params(kind), tok, Clock(1.0))


def is_file(path: Path) -> bool:
    return path.is_file()


def fake_batch(n: int, tokens: int = 512) -> list[Request]:
    import random

    return [Request(-1, [0] * tokens, 0, True, random.Random(0), 0) for _ in range(n)]


@pytest.mark.parametrize(
    "spec", [scenarios.QWEN3_30B_A3B_Q8, scenarios.QWEN3_8B_Q4, scenarios.QWEN3_32B_Q8]
)
def test_preset_models_are_the_synthetic_gguf_shapes(spec: ModelSpec) -> None:
    assert spec.gguf_like is not None
    model = build_model(*spec.gguf_like, None)
    shape = model.spec
    block0 = [t for t in model.tensors if t.name.startswith("blk.0.")]
    assert spec.layer_bytes == sum(t.nbytes for t in block0)
    assert spec.routed_layer_bytes == sum(t.nbytes for t in block0 if "_exps." in t.name)
    assert spec.output_bytes == sum(t.nbytes for t in model.tensors if t.name.startswith("output"))
    assert (spec.n_params, spec.file_bytes) == (model.n_params, model.data_bytes)
    split = weight_split(model)
    assert spec.weights_bytes == split.always_read_bytes + split.routed_expert_bytes
    assert spec.token_row_bytes == split.token_embedding_row_bytes
    assert spec.token_embd_bytes + spec.weights_bytes == model.data_bytes
    assert (spec.expert_count, spec.expert_used) == (shape.n_expert, shape.n_expert_used)
    assert spec.kv_bytes_per_token == shape.n_layer * shape.n_head_kv * shape.head_dim * 2 * 2
    # The SGLang side serves the same shape's HF config.
    assert spec.hf_config is not None
    geo = geometry_from_hf_config(spec.hf_config)
    assert (geo.n_layer, geo.n_head_kv, geo.head_dim_k) == (
        shape.n_layer,
        shape.n_head_kv,
        shape.head_dim,
    )
    assert spec.hf_config["vocab_size"] == shape.n_vocab
    assert spec.hf_config["hidden_size"] == shape.n_embd


def test_the_draft_is_the_synthetic_qwen3_0_6b() -> None:
    draft = build_model("qwen3-0.6b", "q8_0", None)
    assert scenarios.QWEN3_06B_Q8_BYTES == draft.data_bytes
    assert weight_split(draft).always_read_bytes == draft.data_bytes  # tied: all read
    shape = draft.spec
    per_token = shape.n_layer * shape.n_head_kv * shape.head_dim * 2 * 2
    assert scenarios.QWEN3_06B_KV_BYTES_PER_TOKEN == per_token


def test_routing_reads_k_of_e_at_batch_1_and_the_union_at_larger_batches() -> None:
    e = engine("moe_at_limit")
    # One token picks k distinct experts in every layer: exactly k/E of the routed bytes.
    assert all(e.routed_share(1) == 8 / 128 for _ in range(50))
    # B tokens pick independently: on average the expected union 1 - (1 - k/E)^B.
    for batch in (4, 16, 64):
        mean = sum(e.routed_share(batch) for _ in range(400)) / 400
        assert mean == pytest.approx(1 - (1 - 8 / 128) ** batch, rel=0.02), batch
    # A dense model reads no routed experts.
    assert engine("healthy").routed_share(16) == 0.0


def test_moe_decode_time_is_bytes_actually_read_over_bandwidth() -> None:
    m = scenarios.QWEN3_30B_A3B_Q8
    for preset in ("moe_below_limit", "moe_at_limit"):
        e, p = engine(preset), scenarios.get(preset).params("llamacpp")
        bandwidth = scenarios.get(preset).gpu.bandwidth
        batch = fake_batch(1)
        step = e.decode_seconds(batch)
        always = m.weights_bytes - m.routed_bytes
        read = always + m.routed_bytes * 8 / 128 + 512 * e.kv_bytes_per_token
        overheads = p.step_overhead_s + p.per_seq_overhead_s + 48 * p.moe_layer_overhead_s
        host = m.token_row_bytes / p.cpu_bandwidth  # the token_embd row, in host memory
        assert step == pytest.approx(read / bandwidth + overheads + host, rel=1e-9)
    # The capture the below-limit preset follows: 238.6 tok/s at batch 1 (llama.cpp, H200).
    below = engine("moe_below_limit").per_seq_tok_s(1)
    assert below == pytest.approx(238.6, rel=0.01)
    at = engine("moe_at_limit").per_seq_tok_s(1)
    active = m.weights_bytes - m.routed_bytes + m.routed_bytes / 16
    assert below / (4.8e12 / active) < 0.2  # H200
    assert 0.6 < at / (1.344e12 / active) < 1.0  # RTX PRO 5000


def test_sglang_moe_reads_bf16_experts_and_the_same_share() -> None:
    e = engine("moe_at_limit", "sglang")
    step = e.decode_seconds(fake_batch(1, tokens=1))
    # SGLang serves bf16: two bytes for every parameter but the rows-only embedding table.
    assert e.weights_total == 2 * (30532122624 - 151936 * 2048)
    scale = e.weights_total / scenarios.QWEN3_30B_A3B_Q8.weights_bytes
    routed = scenarios.QWEN3_30B_A3B_Q8.routed_bytes * scale
    assert e.last_routed_share == 8 / 128
    memory = (e.weights_total - routed * (1 - 8 / 128) + e.kv_bytes_per_token) / e.gpu.bandwidth
    assert step > memory and e.utilization == pytest.approx(memory / step, rel=1e-6)


def test_quantized_kv_halves_the_cache_in_both_engines() -> None:
    llama, sglang = engine("kv_quantized"), engine("kv_quantized", "sglang")
    f16 = scenarios.QWEN3_8B_Q4.kv_bytes_per_token
    assert llama.kv_bytes_per_token == f16 * (34 / 32) / 2  # q8_0 blocks: 34 bytes per 32
    assert sglang.kv_bytes_per_token == f16 / 2  # fp8: one byte per element
    assert llama.kv_pool_bytes == round(32768 * f16 * 34 / 64)


def test_speculative_steps_keep_one_plus_accepted_tokens() -> None:
    e = engine("spec_decode")
    assert e.tokens_per_step() == pytest.approx(1 + 0.75 + 0.75**2 + 0.75**3 + 0.75**4)
    req = fake_batch(1)[0]
    req.max_tokens = 100_000
    steps = 2000
    produced = sum(e._emit_step(req, 0.0) for _ in range(steps))
    assert produced / steps == pytest.approx(e.tokens_per_step(), rel=0.03)
    st = e.stats
    assert st.spec_drafts == steps and st.spec_draft_tokens == 4 * steps
    assert st.spec_accepted == produced - steps == req.draft_accepted
    # Position i is accepted only after positions < i were.
    assert st.spec_accepted_per_pos == sorted(st.spec_accepted_per_pos, reverse=True)
    assert st.spec_accepted_per_pos[0] / steps == pytest.approx(0.75, abs=0.03)
    # A request never gets more tokens than it asked for.
    short = fake_batch(1)[0]
    short.max_tokens = 3
    while len(short.generated) < 3:
        e._emit_step(short, 0.0)
    assert len(short.generated) == 3


async def test_llamacpp_moe_serves_a_gguf_with_the_real_geometry(sim_server: SimServer) -> None:
    h = await sim_server("llamacpp", "moe_below_limit")
    async with httpx.AsyncClient(base_url=h.url) as c:
        props = (await c.get("/props")).json()
        meta = (await c.get("/v1/models")).json()["data"][0]["meta"]
    path = Path(props["model_path"])
    assert is_file(path) and path.suffix == ".gguf"
    geo = geometry_from_gguf(path)
    shape = ("qwen3moe", 48, 4, 128)
    assert (geo.architecture, geo.n_layer, geo.n_head_kv, geo.head_dim_k) == shape
    # The header-only file lists every tensor: sizes add up to what llama-server reports.
    assert geo.weight_bytes == meta["size"] == scenarios.QWEN3_30B_A3B_Q8.file_bytes
    assert geo.n_params == meta["n_params"]
    log = h.log_file.read_text()
    assert "print_info: n_expert              = 128" in log
    assert "print_info: n_expert_used         = 8" in log
    assert f"-m {path} " in h.sim.cmdline()


async def test_sglang_moe_serves_the_hf_config(sim_server: SimServer) -> None:
    h = await sim_server("sglang", "moe_at_limit")
    async with httpx.AsyncClient(base_url=h.url) as c:
        info = (await c.get("/server_info")).json()
    folder = Path(info["model_path"])
    config = json.loads((folder / "config.json").read_text())
    assert config == scenarios.QWEN3_30B_A3B_HF
    assert (config["num_experts"], config["num_experts_per_tok"]) == (128, 8)
    assert geometry_from_hf_config(folder).n_layer == 48
    assert info["kv_cache_dtype"] == "auto" and info["speculative_algorithm"] is None


def kv_lines(log: str) -> list[tuple[str, str, float]]:
    """(type_k, type_v, total MiB) of every `llama_kv_cache: size = ...` line."""
    pattern = r"llama_kv_cache: size = +([\d.]+) MiB \(.*\), K \((\w+)\): +[\d.]+ MiB, V \((\w+)\)"
    return [(k, v, float(mib)) for mib, k, v in re.findall(pattern, log)]


def test_kv_lines_follow_the_real_q8_0_capture() -> None:
    real = (KVQ_FIXTURE / "server.log").read_text()
    assert [(k, v) for k, v, _ in kv_lines(real)] == [("q8_0", "q8_0"), ("q8_0", "q8_0")]
    assert "enabling flash_attn since it is required for quantized V cache" in real


async def test_llamacpp_quantized_kv_buffer_equals_the_exporter_estimate(
    sim_server: SimServer,
) -> None:
    h = await sim_server("llamacpp", "kv_quantized")
    async with httpx.AsyncClient(base_url=h.url) as c:
        props = (await c.get("/props")).json()
    log = h.log_file.read_text()
    assert "enabling flash_attn since it is required for quantized V cache" in log
    [(type_k, type_v, size_mib)] = kv_lines(log)
    assert (type_k, type_v) == ("q8_0", "q8_0")
    buffer = re.search(r"llama_kv_cache: +CUDA0 KV buffer size = +([\d.]+) MiB", log)
    assert buffer and float(buffer.group(1)) == pytest.approx(size_mib, abs=0.01)
    # The exporter's estimate from the served GGUF and the logged types: the same bytes.
    geo = geometry_from_gguf(props["model_path"])
    estimate = estimate_llamacpp_kv(geo, 32768, n_seq=4, type_k_bytes=34 / 32, type_v_bytes=34 / 32)
    assert estimate.total == pytest.approx(size_mib * 2**20, abs=0.01 * 2**20)
    assert "-ctk q8_0 -ctv q8_0" in h.sim.cmdline()


async def test_sglang_fp8_kv_cache_in_server_info(sim_server: SimServer) -> None:
    h = await sim_server("sglang", "kv_quantized")
    async with httpx.AsyncClient(base_url=h.url) as c:
        info = (await c.get("/server_info")).json()
    assert info["kv_cache_dtype"] == "fp8_e5m2"
    assert "--kv-cache-dtype fp8_e5m2" in info["launch_command"]
    memory = info["internal_states"][0]["memory_usage"]
    per_token = scenarios.QWEN3_8B_Q4.kv_bytes_per_token / 2
    assert memory["kvcache"] == round(200000 * per_token / 2**30, 2)
    # The exporter's estimate from the served config.json and the dtype is the pool.
    geo = geometry_from_hf_config(Path(info["model_path"]))
    estimate = estimate_sglang_kv(geo, info["max_total_num_tokens"], kv_cache_dtype="fp8_e5m2")
    assert estimate.total == h.sim.engine.kv_pool_bytes


def real_spec_release_lines() -> list[str]:
    log = (SPEC_FIXTURE / "server.log").read_text()
    return re.findall(r"\| (draft acceptance = .*)$", log, re.MULTILINE)


DRAFT_LINE = re.compile(
    r"draft acceptance = (\d\.\d{5}) \( *(\d+) accepted / +(\d+) generated\), mean len = +([\d.]+)$"
)


async def test_llamacpp_spec_decode_reports_as_the_real_server(sim_server: SimServer) -> None:
    real = real_spec_release_lines()
    assert len(real) == 2 and all(DRAFT_LINE.fullmatch(line) for line in real)
    h = await sim_server("llamacpp", "spec_decode")
    async with httpx.AsyncClient(base_url=h.url, timeout=60) as c:
        [reply] = await asyncio.gather(*llama_load(c, 1, 64, 96))
        metrics = llama_metrics((await c.get("/metrics")).text)
        metrics_text = (await c.get("/metrics")).text
        slots = (await c.get("/slots")).json()
    timings = reply.json()["timings"]
    assert timings["predicted_n"] == 96 and timings["draft_n"] > 0
    assert timings["draft_n_accepted"] == metrics["llamacpp:spec_decode_num_accepted_tokens_total"]
    assert timings["draft_n"] == metrics["llamacpp:spec_decode_num_draft_tokens_total"]
    drafts = metrics["llamacpp:spec_decode_num_drafts_total"]
    # Every verification step keeps its accepted drafts plus one token of its own.
    assert drafts + timings["draft_n_accepted"] == 96 - 1
    assert slots[0]["speculative"] is True
    real_slots = json.loads((SPEC_FIXTURE / "slots.json").read_text())
    assert slots[0]["params"]["speculative.types"] == real_slots[0]["params"]["speculative.types"]
    per_pos = re.findall(
        r'^llamacpp:spec_decode_num_accepted_tokens_per_pos_total\{position="(\d)"\} (\S+)$',
        metrics_text,
        re.MULTILINE,
    )
    assert [p for p, _ in per_pos] == ["0", "1", "2", "3"]
    assert sum(float(v) for _, v in per_pos) == timings["draft_n_accepted"]
    [line] = re.findall(r"\| (draft acceptance = .*)$", h.log_file.read_text(), re.M)
    match = DRAFT_LINE.fullmatch(line)
    assert match, line
    rate, accepted, generated, mean_len = match.groups()
    assert float(rate) == pytest.approx(int(accepted) / int(generated), abs=1e-5)
    assert (int(accepted), int(generated)) == (timings["draft_n_accepted"], timings["draft_n"])
    assert float(mean_len) == pytest.approx(1 + int(accepted) / drafts, abs=0.005)
    assert "--spec-type draft-simple" in h.sim.cmdline()


async def test_sglang_spec_decode_accept_length(sim_server: SimServer) -> None:
    h = await sim_server("sglang", "spec_decode")
    body = {"text": words(64), "sampling_params": {"max_new_tokens": 96, "ignore_eos": True}}
    async with httpx.AsyncClient(base_url=h.url, timeout=60) as c:
        reply = await c.post("/generate", json=body)
        metrics = (await c.get("/metrics", headers={"Accept": "text/plain"})).text
        info = (await c.get("/server_info")).json()
    assert reply.status_code == 200
    match = re.search(r"^sglang:spec_accept_length\{[^}]*\} (\S+)$", metrics, re.MULTILINE)
    assert match
    accept_length = float(match.group(1))
    st = h.sim.engine.stats
    assert accept_length == pytest.approx((st.spec_accepted + st.spec_drafts) / st.spec_drafts)
    assert 2.0 < accept_length < 4.5  # expectation 3.05 for 4 drafts at p = 0.75
    assert info["speculative_algorithm"] == "EAGLE"
    assert info["speculative_num_draft_tokens"] == 5
    assert info["internal_states"][0]["avg_spec_accept_length"] == pytest.approx(accept_length)


async def test_llamacpp_experts_on_host_memory(sim_server: SimServer) -> None:
    m = scenarios.QWEN3_30B_A3B_Q8
    h = await sim_server("llamacpp", "moe_experts_on_host")
    e = h.sim.engine
    assert (e.host_expert_layers, e.host_expert_bytes) == (20, 20 * m.routed_layer_bytes)
    log = h.log_file.read_text()
    # As llama.cpp at -lv 4: every layer offloaded, the experts of 20 stay in host buffers.
    assert "load_tensors: offloaded 49/49 layers to GPU" in log
    assert "tensor overrides to CPU are used with mmap enabled" in log
    buffers = dict(re.findall(r"load_tensors: +(\S+) model buffer size = +([\d.]+) MiB", log))
    # With mmap llama.cpp maps the file span from the token embedding to the last host expert
    # tensor (those layers' attention weights inside it): more than the experts alone.
    span = geometry_from_gguf(Path(h.sim.model_path)).host_mapped_bytes_by_layers[20] / 2**20
    assert float(buffers["CPU_Mapped"]) == pytest.approx(span, abs=0.01)
    assert span > (20 * m.routed_layer_bytes + m.token_embd_bytes) / 2**20
    gpu = (m.weights_bytes - 20 * m.routed_bytes / 48) / 2**20
    assert float(buffers["CUDA0"]) == pytest.approx(gpu, abs=0.01)
    assert "--n-cpu-moe 20" in h.sim.cmdline()
    # A step reads the host experts' routed share from host memory.
    p = scenarios.get("moe_experts_on_host").params("llamacpp")
    step = e.decode_seconds(fake_batch(1, tokens=1))
    always = m.weights_bytes - m.routed_bytes
    gpu_read = always + 28 * m.routed_layer_bytes / 16 + e.kv_bytes_per_token
    host_read = 20 * m.routed_layer_bytes / 16 + m.token_row_bytes
    overheads = p.step_overhead_s + p.per_seq_overhead_s + 48 * p.moe_layer_overhead_s
    expected = gpu_read / 864e9 + host_read / p.cpu_bandwidth + overheads
    assert step == pytest.approx(expected, rel=1e-9)
