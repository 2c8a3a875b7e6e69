"""Model geometry and KV estimates against what real llama-server runs allocated."""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass
from pathlib import Path

import gguf
import pytest

from model.geometry import ModelGeometry, geometry_from_gguf, geometry_from_hf_config
from model.kv_cache import LLAMACPP_KV_TYPE_BYTES, estimate_llamacpp_kv, estimate_sglang_kv
from tests.paths import FIXTURES

H200 = FIXTURES / "llamacpp-h200-gemma3-27b-shape-q4_0"
MIB = 1024 * 1024

# The Gemma 3 27B shape of the H200 fixture, as its logs print it (print_info: ...).
GEMMA3_27B = {
    "block_count": 62,
    "embedding_length": 5376,
    "feed_forward_length": 21504,
    "attention.head_count": 32,
    "attention.head_count_kv": 16,
    "attention.key_length": 128,
    "attention.value_length": 128,
    "attention.sliding_window": 1024,
    "context_length": 131072,
}


@dataclass
class LoggedRun:
    """What one `-lv 4` llama-server log says about its context and KV caches."""

    n_ctx: int
    n_seq: int
    n_ubatch: int
    unified: bool
    ngl: int | None
    caches: list[tuple[float, int, int]]  # (MiB, cells, layers): non-SWA first, then SWA
    devices: dict[str, float]  # KV MiB per device, summed over both caches


def parse_log(path: Path) -> LoggedRun:
    """Read the llama_context and llama_kv_cache lines of a real log."""
    text = path.read_text(encoding="utf-8", errors="replace")

    def ctx(name: str) -> str:
        match = re.search(rf"llama_context: {name}\s+= (\S+)", text)
        assert match, name
        return match.group(1)

    caches = [
        (float(m[0]), int(m[1]), int(m[2]))
        for m in re.findall(
            r"llama_kv_cache: size = +([\d.]+) MiB \( *(\d+) cells, +(\d+) layers", text
        )
    ]
    devices: dict[str, float] = {}
    for dev, mib in re.findall(r"llama_kv_cache: +(\S+) KV buffer size = +([\d.]+) MiB", text):
        devices[dev] = devices.get(dev, 0.0) + float(mib)
    offload = re.search(r"offloaded (\d+)/(\d+) layers to GPU", text)
    ngl = int(offload.group(1)) if offload and offload.group(1) != offload.group(2) else None
    return LoggedRun(
        n_ctx=int(ctx("n_ctx")),
        n_seq=int(ctx("n_seq_max")),
        n_ubatch=int(ctx("n_ubatch")),
        unified=ctx("kv_unified") == "true",
        ngl=ngl,
        caches=caches,
        devices=devices,
    )


def write_gguf(path: Path, arch: str, kv: dict[str, int], tensors: int = 0) -> Path:
    """A tiny GGUF with `arch` metadata and `tensors` small f32 tensors."""
    import numpy as np

    writer = gguf.GGUFWriter(str(path), arch)
    for key, value in kv.items():
        writer.add_uint32(f"{arch}.{key}", value)
    writer.add_file_type(int(gguf.LlamaFileType.MOSTLY_Q4_0))
    for i in range(tensors):
        writer.add_tensor(f"blk.{i}.w", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture
def gemma3_27b(tmp_path: Path) -> ModelGeometry:
    return geometry_from_gguf(write_gguf(tmp_path / "g27.gguf", "gemma3", GEMMA3_27B, tensors=2))


def test_gguf_header_geometry(gemma3_27b: ModelGeometry) -> None:
    g = gemma3_27b
    assert (g.architecture, g.n_layer, g.n_head_kv, g.head_dim_k, g.head_dim_v) == (
        "gemma3",
        62,
        16,
        128,
        128,
    )
    assert g.sliding_window == 1024
    # Gemma 3: every 6th layer is global -> 10 full, 52 SWA (the logs' "10 layers"/"52 layers").
    assert (g.full_layers, g.swa_layers) == (10, 52)
    assert [i for i in range(62) if not g.is_swa(i)] == [5, 11, 17, 23, 29, 35, 41, 47, 53, 59]
    assert g.n_ctx_train == 131072 and g.n_embd == 5376 and g.n_head == 32
    assert g.file_type == "Q4_0"
    assert g.n_params == 2 * 32 and g.weight_bytes == 2 * 32 * 4
    # 10 layers x 16 heads x (128 + 128) x 2 bytes
    assert g.kv_bytes_per_token() == 10 * 16 * 256 * 2 == 81920


LOGS = sorted(H200.glob("server_*.log")) + sorted((H200 / "run2").glob("server_*.log"))


def test_all_captured_logs_are_covered() -> None:
    names = {p.name for p in LOGS}
    runs = ("c128k_np1", "c32k_np4", "c8k_np1", "kvslot", "kvunified", "ngl30")
    assert names == {f"server_{run}.log" for run in runs}


@pytest.mark.parametrize("log", LOGS, ids=lambda p: p.name)
def test_llamacpp_estimate_matches_every_captured_run(log: Path, gemma3_27b: ModelGeometry) -> None:
    run = parse_log(log)
    assert len(run.caches) == 2, "expected a non-SWA and a SWA cache"
    est = estimate_llamacpp_kv(
        gemma3_27b,
        n_ctx=run.n_ctx,
        n_seq=run.n_seq,
        kv_unified=run.unified,
        n_ubatch=run.n_ubatch,
        n_gpu_layers=run.ngl,
    )
    (full_mib, full_cells, full_layers), (swa_mib, swa_cells, swa_layers) = run.caches
    assert (est.cells_full, est.cells_swa) == (full_cells, swa_cells)
    assert (gemma3_27b.full_layers, gemma3_27b.swa_layers) == (full_layers, swa_layers)
    assert est.full_bytes / MIB == pytest.approx(full_mib, rel=0.01)
    assert est.swa_bytes / MIB == pytest.approx(swa_mib, rel=0.01)
    assert est.total / MIB == pytest.approx(sum(run.devices.values()), rel=0.01)
    assert est.cpu_bytes / MIB == pytest.approx(run.devices.get("CPU", 0.0), abs=0.5)
    assert est.gpu_bytes / MIB == pytest.approx(run.devices["CUDA0"], rel=0.01)


def test_llamacpp_named_examples(gemma3_27b: ModelGeometry) -> None:
    est = estimate_llamacpp_kv(gemma3_27b, 8192)
    assert (est.full_bytes, est.swa_bytes) == (640 * MIB, 624 * MIB)
    # The naive all-layers figure the estimate must not produce.
    naive = 62 * 8192 * gemma3_27b.kv_bytes_per_layer_token()
    assert naive == 3968 * MIB
    assert estimate_llamacpp_kv(gemma3_27b, 131072).full_bytes == 10240 * MIB
    unified = estimate_llamacpp_kv(gemma3_27b, 8192, n_seq=4, kv_unified=True)
    assert (unified.cells_swa, unified.swa_bytes) == (4608, 1872 * MIB)
    # --swa-full: SWA layers hold the whole context too.
    full = estimate_llamacpp_kv(gemma3_27b, 8192, swa_full=True)
    assert full.total == 3968 * MIB
    # -c 0 = training context; odd sizes are padded to 256 like llama.cpp.
    assert estimate_llamacpp_kv(gemma3_27b, 0).cells_full == 131072
    assert estimate_llamacpp_kv(gemma3_27b, 8000).cells_full == 8192
    assert estimate_llamacpp_kv(gemma3_27b, 10000, n_seq=3).cells_full == 3584


def test_llamacpp_quantized_kv_types(gemma3_27b: ModelGeometry) -> None:
    q8 = LLAMACPP_KV_TYPE_BYTES["q8_0"]
    est = estimate_llamacpp_kv(gemma3_27b, 8192, type_k_bytes=q8, type_v_bytes=q8)
    # ggml q8_0 rows: 34 bytes per 32 values.
    assert est.full_bytes == 10 * 8192 * 16 * 256 * 34 // 32


LLAMA3_8B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_hidden_layers": 32,
    "max_position_embeddings": 131072,
    "torch_dtype": "bfloat16",
}

QWEN25_7B = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 3584,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "num_hidden_layers": 28,
    "max_position_embeddings": 32768,
    "sliding_window": 131072,
    "use_sliding_window": False,
    "max_window_layers": 28,
    "torch_dtype": "bfloat16",
}

GEMMA3_27B_HF = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "model_type": "gemma3",
    "text_config": {
        "model_type": "gemma3_text",
        "hidden_size": 5376,
        "num_attention_heads": 32,
        "num_key_value_heads": 16,
        "head_dim": 128,
        "num_hidden_layers": 62,
        "sliding_window": 1024,
        "sliding_window_pattern": 6,
        "max_position_embeddings": 131072,
    },
    "torch_dtype": "bfloat16",
}


def test_hf_llama_no_swa() -> None:
    g = geometry_from_hf_config(LLAMA3_8B)
    assert (g.n_layer, g.n_head_kv, g.head_dim_k, g.swa_layers) == (32, 8, 128, 0)
    # 32 layers x 8 heads x 256 x 2 bytes = 128 KiB per token
    assert g.kv_bytes_per_token() == 131072
    est = estimate_sglang_kv(g, 100000)
    assert est.total == (100000 + 1) * 131072 and est.swa_bytes == 0
    est = estimate_llamacpp_kv(geometry_from_hf_config(LLAMA3_8B), 8192, n_seq=4)
    assert (est.cells_full, est.n_stream, est.total) == (2048, 4, 8192 * 131072)


def test_hf_qwen_window_switched_off() -> None:
    g = geometry_from_hf_config(QWEN25_7B)
    assert (g.n_layer, g.n_head_kv, g.head_dim_k, g.swa_layers) == (28, 4, 128, 0)
    assert g.kv_bytes_per_token() == 28 * 4 * 256 * 2


def test_hf_gemma3_text_config_and_layer_types() -> None:
    g = geometry_from_hf_config(GEMMA3_27B_HF)
    assert g.architecture == "Gemma3ForConditionalGeneration"
    assert (g.n_layer, g.n_head_kv, g.head_dim_k, g.full_layers, g.swa_layers) == (
        62,
        16,
        128,
        10,
        52,
    )
    newer = json.loads(json.dumps(GEMMA3_27B_HF))
    del newer["text_config"]["sliding_window_pattern"]
    newer["text_config"]["layer_types"] = [
        "full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(62)
    ]
    assert geometry_from_hf_config(newer).swa_mask == g.swa_mask
    # SGLang 0.5.23 serves Gemma 3 without hybrid SWA: all 62 layers get the whole pool.
    assert estimate_sglang_kv(g, 127000).total == 62 * 16 * 256 * 2 * 127001
    hybrid = estimate_sglang_kv(g, 127000, hybrid_swa=True, max_total_num_tokens_swa=20000)
    assert hybrid.full_bytes == 10 * 16 * 256 * 2 * 127001
    assert hybrid.swa_bytes == 52 * 16 * 256 * 2 * 20001
    assert estimate_sglang_kv(g, 1000, kv_dtype_bytes=1.0, tp_size=2).total == 62 * 8 * 256 * 1001


def test_hf_model_dir_with_safetensors(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA3_8B))
    files: dict[str, list[tuple[int, ...]]] = {
        "a.safetensors": [(4, 8)],
        "b.safetensors": [(16,), (2, 3)],
    }
    for name, shapes in files.items():
        header: dict[str, object] = {"__metadata__": {"format": "pt"}}
        offset = 0
        for i, shape in enumerate(shapes):
            size = 2
            for dim in shape:
                size *= dim
            header[f"t{i}"] = {
                "dtype": "BF16",
                "shape": list(shape),
                "data_offsets": [offset, offset + size],
            }
            offset += size
        raw = json.dumps(header).encode()
        (tmp_path / name).write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * offset)
    g = geometry_from_hf_config(tmp_path)
    assert g.n_params == 32 + 16 + 6
    assert g.weight_bytes == 2 * (32 + 16 + 6)
    assert g.file_type == "bfloat16"
    assert geometry_from_hf_config(tmp_path / "config.json").n_params == 54


def test_hf_mla_latent() -> None:
    g = geometry_from_hf_config(
        {
            "model_type": "deepseek_v3",
            "num_hidden_layers": 61,
            "num_attention_heads": 128,
            "hidden_size": 7168,
            "kv_lora_rank": 512,
            "qk_rope_head_dim": 64,
        }
    )
    assert g.kv_bytes_per_token() == 61 * (512 + 64) * 2


def test_gguf_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="block_count"):
        geometry_from_gguf(write_gguf(tmp_path / "x.gguf", "llama", {"context_length": 4}))


def test_implausible_shapes_are_refused(tmp_path: Path) -> None:
    # A corrupt header must not size per-layer tables by a billion layers.
    huge = write_gguf(tmp_path / "h.gguf", "gemma3", {"block_count": 2**31, "context_length": 4})
    with pytest.raises(ValueError, match="layer count"):
        geometry_from_gguf(huge)
    with pytest.raises(ValueError, match="head_dim_k"):
        geometry_from_hf_config(
            {"num_hidden_layers": 4, "num_attention_heads": 1, "head_dim": 2**40}
        )


def test_gguf_header_with_full_vocabulary_is_fast(tmp_path: Path) -> None:
    """A 262k-token vocabulary (Gemma 3) must not make the header read slow."""
    import time

    import numpy as np

    path = tmp_path / "vocab.gguf"
    writer = gguf.GGUFWriter(str(path), "gemma3")
    for key, value in GEMMA3_27B.items():
        writer.add_uint32(f"gemma3.{key}", value)
    writer.add_token_list([f"t{i}" for i in range(262144)])
    writer.add_token_scores([0.0] * 262144)
    writer.add_sliding_window_pattern([(i + 1) % 6 != 0 for i in range(62)])
    quant = gguf.GGMLQuantizationType.Q4_0
    raw = np.zeros((2, 18 * 4), dtype=np.uint8)  # 2 rows of 4 Q4_0 blocks = 2 x 128 values
    writer.add_tensor("blk.0.attn_q.weight", raw, raw_dtype=quant)
    writer.add_tensor("blk.0.attn_norm.weight", np.zeros(7, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    start = time.perf_counter()
    g = geometry_from_gguf(path)
    assert time.perf_counter() - start < 3.0  # gguf.GGUFReader: ~100 s
    assert (g.full_layers, g.swa_layers) == (10, 52)  # explicit per-layer pattern
    assert g.n_params == 2 * 128 + 7
    assert g.weight_bytes == 2 * 4 * 18 + 7 * 4


def test_real_gemma3_270m_gguf(gemma_model: Path) -> None:
    """The real Gemma 3 270M GGUF against what llama-server reported for it (/v1/models)."""
    cpu = FIXTURES / "llamacpp-cpu-gemma3-270m"
    meta = json.loads((cpu / "v1_models.json").read_text())["data"][0]["meta"]
    g = geometry_from_gguf(gemma_model)
    assert g.architecture == "gemma3"
    assert g.n_params == meta["n_params"] == 268098176
    assert g.weight_bytes == meta["size"]
    assert g.n_embd == meta["n_embd"] == 640
    assert g.n_ctx_train == meta["n_ctx_train"]
    assert (g.n_layer, g.n_head_kv, g.head_dim_k, g.sliding_window) == (18, 1, 256, 512)
    assert (g.full_layers, g.swa_layers) == (3, 15)
    assert g.file_type == "Q4_K_M"
    # No output.weight: the Q8_0 token embedding is the output projection, read in full.
    assert g.tied_embeddings is True and g.token_embedding_row_bytes == 0
    assert g.always_read_bytes == g.weight_bytes and g.routed_expert_bytes == 0
    assert g.input_embedding_bytes == 262144 * 640 * 34 // 32
