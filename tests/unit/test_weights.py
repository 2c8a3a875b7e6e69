"""What a decode step reads of a model: real MoE/dense shapes from GGUF headers and HF configs.

The shapes are the public configs of Qwen3-30B-A3B, Qwen3-235B-A22B, gpt-oss-20b, DeepSeek-V3,
Qwen3-32B and Gemma 3 27B; the GGUF tensor names and layouts are llama.cpp's (gguf-py
constants: blk.N.ffn_{gate,up,down}_exps are [n_embd, n_ff_exp, n_expert] in ne order). The
expected numbers are the ones measured or published, not recomputed here: issue 17's
Qwen3-30B-A3B Q8_0 file is 30.5 B parameters and 32.45 GB and reads about 3.24 GB per token.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import gguf
import numpy as np
import pytest

from model.geometry import ModelGeometry, geometry_from_gguf, geometry_from_hf_config
from model.kv_cache import estimate_llamacpp_kv, estimate_sglang_kv, kv_type_bytes

Q8, F32, MXFP4 = int(gguf.GGMLQuantizationType.Q8_0), int(gguf.GGMLQuantizationType.F32), 39

QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_hidden_layers": 48,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "vocab_size": 151936,
    "tie_word_embeddings": False,
    "max_position_embeddings": 40960,
    "torch_dtype": "bfloat16",
}
QWEN3_235B_A22B = {
    **QWEN3_30B_A3B,
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "moe_intermediate_size": 1536,
    "num_hidden_layers": 94,
    "num_attention_heads": 64,
}
GPT_OSS_20B = {
    "architectures": ["GptOssForCausalLM"],
    "model_type": "gpt_oss",
    "hidden_size": 2880,
    "intermediate_size": 2880,
    "num_hidden_layers": 24,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "num_local_experts": 32,
    "num_experts_per_tok": 4,
    "experts_per_token": 4,
    "attention_bias": True,
    "sliding_window": 128,
    "layer_types": ["sliding_attention", "full_attention"] * 12,
    "vocab_size": 201088,
    "tie_word_embeddings": False,
    "max_position_embeddings": 131072,
    "torch_dtype": "bfloat16",
    "quantization_config": {
        "quant_method": "mxfp4",
        "modules_to_not_convert": [
            "model.layers.*.self_attn",
            "model.layers.*.mlp.router",
            "model.embed_tokens",
            "lm_head",
        ],
    },
}
DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 61,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "first_k_dense_replace": 3,
    "moe_layer_freq": 1,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "vocab_size": 129280,
    "tie_word_embeddings": False,
    "max_position_embeddings": 163840,
    "torch_dtype": "bfloat16",
    "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]},
}
QWEN3_32B = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 5120,
    "intermediate_size": 25600,
    "num_hidden_layers": 64,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "tie_word_embeddings": False,
    "max_position_embeddings": 40960,
    "torch_dtype": "bfloat16",
}
GEMMA3_27B = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "model_type": "gemma3",
    "text_config": {
        "model_type": "gemma3_text",
        "hidden_size": 5376,
        "intermediate_size": 21504,
        "num_hidden_layers": 62,
        "num_attention_heads": 32,
        "num_key_value_heads": 16,
        "head_dim": 128,
        "sliding_window": 1024,
        "vocab_size": 262208,
        "max_position_embeddings": 131072,
    },
    "torch_dtype": "bfloat16",
}


def read_per_token(g: ModelGeometry, batch: int = 1) -> float:
    """The contract's weights_step(B) (CONTRACT-roofline.md), written out for the check."""
    assert g.always_read_bytes is not None
    share = 1.0
    if g.expert_count and g.expert_used_count:
        share = 1 - (1 - g.expert_used_count / g.expert_count) ** batch
    return g.always_read_bytes + g.routed_expert_bytes * share + batch * g.token_embedding_row_bytes


def write_header(
    path: Path, arch: str, kv: dict[str, int], tensors: list[tuple[str, tuple[int, ...], int]]
) -> Path:
    """A GGUF header with tensor infos (shape in ne order) and no tensor data."""
    writer = gguf.GGUFWriter(str(path), arch)
    for key, value in kv.items():
        writer.add_uint32(f"{arch}.{key}", value)
    for name, ne, qtype in tensors:
        block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(qtype)]
        n = int(np.prod(ne))
        writer.add_tensor_info(
            name,
            tuple(reversed(ne)),
            np.dtype(np.float32),
            n // block * size,
            raw_dtype=gguf.GGMLQuantizationType(qtype),
        )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    return path


Tensor = tuple[str, tuple[int, ...], int]


def outer_tensors(n_embd: int, vocab: int) -> list[Tensor]:
    """The tensors outside the blocks as llama.cpp names them: token embedding and untied
    output at Q8_0, the final norm F32."""
    return [
        ("token_embd.weight", (n_embd, vocab), Q8),
        ("output_norm.weight", (n_embd,), F32),
        ("output.weight", (n_embd, vocab), Q8),
    ]


def qwen3moe_tensors(
    n_layer: int, n_embd: int, n_head: int, n_kv: int, head: int, n_ff_exp: int, n_expert: int
) -> list[Tensor]:
    """llama.cpp's qwen3moe tensors at Q8_0 (norms and the router stay F32)."""
    out = outer_tensors(n_embd, 151936)
    for i in range(n_layer):
        b = f"blk.{i}."
        out += [
            (b + "attn_norm.weight", (n_embd,), F32),
            (b + "attn_q.weight", (n_embd, n_head * head), Q8),
            (b + "attn_k.weight", (n_embd, n_kv * head), Q8),
            (b + "attn_v.weight", (n_embd, n_kv * head), Q8),
            (b + "attn_output.weight", (n_head * head, n_embd), Q8),
            (b + "attn_q_norm.weight", (head,), F32),
            (b + "attn_k_norm.weight", (head,), F32),
            (b + "ffn_norm.weight", (n_embd,), F32),
            (b + "ffn_gate_inp.weight", (n_embd, n_expert), F32),
            (b + "ffn_gate_exps.weight", (n_embd, n_ff_exp, n_expert), Q8),
            (b + "ffn_up_exps.weight", (n_embd, n_ff_exp, n_expert), Q8),
            (b + "ffn_down_exps.weight", (n_ff_exp, n_embd, n_expert), Q8),
        ]
    return out


@pytest.fixture(scope="module")
def qwen3_30b(tmp_path_factory: pytest.TempPathFactory) -> ModelGeometry:
    kv = {
        "block_count": 48,
        "embedding_length": 2048,
        "attention.head_count": 32,
        "attention.head_count_kv": 4,
        "attention.key_length": 128,
        "attention.value_length": 128,
        "expert_count": 128,
        "expert_used_count": 8,
        "expert_feed_forward_length": 768,
        "context_length": 40960,
    }
    path = tmp_path_factory.mktemp("moe") / "qwen3-30b-a3b-q8_0.gguf"
    tensors = qwen3moe_tensors(48, 2048, 32, 4, 128, 768, 128)
    return geometry_from_gguf(write_header(path, "qwen3moe", kv, tensors))


def test_qwen3_30b_a3b_q8_0_gguf(qwen3_30b: ModelGeometry) -> None:
    g = qwen3_30b
    assert g.n_params is not None and g.weight_bytes is not None
    assert round(g.n_params / 1e9, 1) == 30.5
    assert g.weight_bytes == pytest.approx(32.45e9, rel=0.002)
    assert (g.expert_count, g.expert_used_count, g.expert_shared_count) == (128, 8, 0)
    assert g.leading_dense_block_count == 0 and g.is_moe and g.tied_embeddings is False
    # One Q8_0 row of the untied 151936 x 2048 embedding: 2048 / 32 blocks x 34 bytes.
    assert g.token_embedding_row_bytes == 2176
    assert g.token_embedding_bytes == 151936 * 2176
    assert g.always_read_bytes is not None
    parts = g.always_read_bytes + g.routed_expert_bytes + g.token_embedding_bytes
    assert parts == g.weight_bytes  # every byte is in exactly one part
    assert len(g.routed_expert_bytes_by_layer) == 48
    assert sum(g.routed_expert_bytes_by_layer) == g.routed_expert_bytes
    # The issue's ~3.24 GB read per token at batch 1.
    assert read_per_token(g) == pytest.approx(3.24e9, rel=0.01)
    # The untied embedding is ~10 % of the active bytes: counted as one row, not the table.
    assert g.token_embedding_bytes / read_per_token(g) == pytest.approx(0.10, abs=0.01)
    # At batch 16 the distinct-expert share is 1 - (120/128)^16 = 64 %.
    assert read_per_token(g, 16) == pytest.approx(
        g.always_read_bytes + 0.644 * g.routed_expert_bytes + 16 * 2176, rel=0.002
    )


def test_qwen3_30b_a3b_hf_config_matches_the_gguf(qwen3_30b: ModelGeometry) -> None:
    hf = geometry_from_hf_config(QWEN3_30B_A3B)
    assert hf.weights_source == "config"
    assert (hf.expert_count, hf.expert_used_count, hf.leading_dense_block_count) == (128, 8, 0)
    assert hf.tied_embeddings is False and hf.token_embedding_row_bytes == 2048 * 2
    # BF16 vs Q8_0: the same parameters at 2 bytes instead of 34/32.
    assert qwen3_30b.always_read_bytes is not None and hf.always_read_bytes is not None
    assert hf.routed_expert_bytes == pytest.approx(
        qwen3_30b.routed_expert_bytes * 32 / 34 * 2, rel=1e-6
    )
    # The F32 router of the GGUF is 4 bytes a parameter, BF16 here: within 3 %.
    assert hf.always_read_bytes == pytest.approx(
        qwen3_30b.always_read_bytes * 32 / 34 * 2, rel=0.03
    )


def test_qwen3_235b_a22b_hf_config() -> None:
    g = geometry_from_hf_config(QWEN3_235B_A22B)
    assert g.always_read_bytes is not None
    total = (g.always_read_bytes + g.routed_expert_bytes + g.token_embedding_bytes) / 2
    assert total / 1e9 == pytest.approx(235, rel=0.01)  # 235 B parameters (BF16)
    assert read_per_token(g) / 2 / 1e9 == pytest.approx(22, rel=0.03)  # 22 B active


def test_deepseek_v3_hf_config_mla_and_shared_experts() -> None:
    g = geometry_from_hf_config(DEEPSEEK_V3)
    assert (g.expert_count, g.expert_used_count, g.expert_shared_count) == (256, 8, 1)
    assert g.leading_dense_block_count == 3
    assert g.routed_expert_bytes_by_layer[:3] == (0, 0, 0)
    assert len(set(g.routed_expert_bytes_by_layer[3:])) == 1
    # FP8 linear weights: 1 byte per parameter, embeddings BF16. 671 B total, 37 B active.
    assert g.always_read_bytes is not None
    params = g.routed_expert_bytes + g.always_read_bytes + g.token_embedding_bytes / 2
    assert params / 1e9 == pytest.approx(671, rel=0.01)
    assert read_per_token(g) / 1e9 == pytest.approx(37, rel=0.08)
    # MLA: one 512 latent + 64 rope key per token and layer, no V (llama.cpp and SGLang).
    assert g.kv_lora_rank == 512 and (g.head_dim_k, g.head_dim_v, g.n_head_kv) == (576, 0, 1)
    assert g.kv_bytes_per_token() == 61 * 576 * 2
    assert estimate_sglang_kv(g, 1000, kv_cache_dtype="fp8_e4m3").total == 61 * 1001 * 576


def test_gpt_oss_20b_hf_config_mxfp4_experts() -> None:
    g = geometry_from_hf_config(GPT_OSS_20B)
    assert (g.expert_count, g.expert_used_count) == (32, 4)
    expert_params = 24 * 32 * (3 * 2880 * 2880 + 2 * 2880 + 2880)
    assert g.routed_expert_bytes == round(expert_params * 17 / 32)
    assert g.swa_layers == 12 and g.sliding_window == 128
    total = g.routed_expert_bytes / (17 / 32)
    assert g.always_read_bytes is not None
    total += (g.always_read_bytes + g.token_embedding_bytes) / 2
    assert total / 1e9 == pytest.approx(20.9, rel=0.02)  # 20.9 B parameters


def test_dense_qwen3_32b_untied_embedding_share() -> None:
    g = geometry_from_hf_config(QWEN3_32B)
    assert not g.is_moe and g.routed_expert_bytes == 0 and g.expert_count is None
    assert g.always_read_bytes is not None
    share = g.token_embedding_bytes / (g.always_read_bytes + g.token_embedding_bytes)
    assert 0.02 < share < 0.03  # the "2-3 % of a dense 32B"
    assert (g.always_read_bytes + g.token_embedding_bytes) / 2 / 1e9 == pytest.approx(32.8, 0.01)


def test_tied_gemma3_27b_reads_the_whole_table() -> None:
    g = geometry_from_hf_config(GEMMA3_27B)
    assert g.tied_embeddings is True
    assert g.token_embedding_row_bytes == 0 and g.token_embedding_bytes == 0
    assert g.always_read_bytes is not None
    assert g.always_read_bytes / 2 / 1e9 == pytest.approx(27.0, rel=0.01)  # 27 B (text)


def test_gguf_gpt_oss_mxfp4_and_tied_detection(tmp_path: Path) -> None:
    n_embd, n_ff, n_exp, vocab = 2880, 2880, 32, 201088
    tensors: list[tuple[str, tuple[int, ...], int]] = [
        ("token_embd.weight", (n_embd, vocab), Q8),
        ("output.weight", (n_embd, vocab), Q8),
    ]
    for i in range(2):
        b = f"blk.{i}."
        tensors += [
            (b + "attn_q.weight", (n_embd, 64 * 64), Q8),
            # Ends in "output.weight" too: tied-ness goes by the exact name output.weight.
            (b + "attn_output.weight", (64 * 64, n_embd), Q8),
            (b + "ffn_gate_inp.weight", (n_embd, n_exp), F32),
            (b + "ffn_gate_inp.bias", (n_exp,), F32),
            (b + "ffn_gate_exps.weight", (n_embd, n_ff, n_exp), MXFP4),
            (b + "ffn_gate_exps.bias", (n_ff, n_exp), F32),
            (b + "ffn_down_exps.weight", (n_ff, n_embd, n_exp), MXFP4),
        ]
    kv = {"block_count": 2, "embedding_length": n_embd, "attention.head_count": 64}
    kv |= {"expert_count": n_exp, "expert_used_count": 4}
    g = geometry_from_gguf(write_header(tmp_path / "oss.gguf", "gpt-oss", kv, tensors))
    mx = n_embd * n_ff * n_exp * 17 // 32
    assert g.routed_expert_bytes == 2 * (2 * mx + n_ff * n_exp * 4)
    assert g.routed_expert_bytes_by_layer == (g.routed_expert_bytes // 2,) * 2
    assert g.tied_embeddings is False and g.token_embedding_row_bytes == n_embd * 34 // 32
    # Without output.weight the token embedding is the output projection: read in full.
    tied = [t for t in tensors if t[0] != "output.weight"]
    g2 = geometry_from_gguf(write_header(tmp_path / "tied.gguf", "gpt-oss", kv, tied))
    assert g2.tied_embeddings is True and g2.token_embedding_row_bytes == 0
    assert g2.always_read_bytes is not None and g.always_read_bytes is not None
    assert g2.always_read_bytes == g.always_read_bytes  # output swapped for token_embd


def test_gguf_mla_deepseek2_kv(tmp_path: Path) -> None:
    kv = {
        "block_count": 61,
        "embedding_length": 7168,
        "attention.head_count": 128,
        "attention.head_count_kv": 1,
        "attention.key_length": 576,
        "attention.value_length": 512,
        "attention.kv_lora_rank": 512,
        "rope.dimension_count": 64,
        "expert_count": 256,
        "expert_used_count": 8,
        "expert_shared_count": 1,
        "leading_dense_block_count": 3,
    }
    g = geometry_from_gguf(write_header(tmp_path / "ds.gguf", "deepseek2", kv, []))
    assert (g.n_head_kv, g.head_dim_k, g.head_dim_v, g.kv_lora_rank) == (1, 576, 0, 512)
    # -ctk q8_0: 576 / 32 blocks x 34 bytes per layer and cell; no V cache.
    est = estimate_llamacpp_kv(g, 4096, type_k="q8_0", type_v="q8_0")
    assert est.total == 61 * 4096 * 576 * 34 // 32


def test_gguf_multi_token_prediction_layers_are_not_read(tmp_path: Path) -> None:
    tensors = qwen3moe_tensors(3, 64, 2, 1, 32, 32, 8)
    kv = {"block_count": 3, "embedding_length": 64, "attention.head_count": 2}
    kv |= {"expert_count": 8, "expert_used_count": 2, "nextn_predict_layers": 1}
    g = geometry_from_gguf(write_header(tmp_path / "mtp.gguf", "qwen3moe", kv, tensors))
    assert g.routed_expert_bytes_by_layer[2] == 0
    assert g.routed_expert_bytes == g.routed_expert_bytes_by_layer[0] * 2


def test_kv_type_names() -> None:
    assert kv_type_bytes("q8_0") == 34 / 32 and kv_type_bytes("Q4_0") == 18 / 32
    assert kv_type_bytes("f16") == kv_type_bytes("bf16") == kv_type_bytes("auto") == 2.0
    assert kv_type_bytes("fp8_e5m2") == 1.0 and kv_type_bytes("iq4_nl") == 18 / 32
    with pytest.raises(ValueError, match="unknown KV cache type"):
        kv_type_bytes("q3_k")


def test_hf_safetensors_names_decide_the_split(tmp_path: Path) -> None:
    """A checkpoint's real tensor names: experts.N vs shared_experts, lm_head vs tied."""
    tensors = {
        "model.embed_tokens.weight": [100, 8],
        "lm_head.weight": [100, 8],
        "model.layers.0.self_attn.q_proj.weight": [8, 8],
        "model.layers.0.mlp.gate.weight": [4, 8],
        "model.layers.0.mlp.shared_experts.up_proj.weight": [16, 8],
        "model.layers.0.mlp.experts.0.up_proj.weight": [16, 8],
        "model.layers.0.mlp.experts.1.up_proj.weight": [16, 8],
        "vision_tower.encoder.weight": [64, 64],
        # A multi-token-prediction layer past num_hidden_layers (DeepSeek-V3 ships one).
        "model.layers.1.mlp.experts.0.up_proj.weight": [16, 8],
    }
    header: dict[str, object] = {}
    offset = 0
    for name, shape in tensors.items():
        size = 2 * shape[0] * shape[1]
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw)
    config = {
        "model_type": "deepseek_v3",
        "num_hidden_layers": 1,
        "hidden_size": 8,
        "num_attention_heads": 1,
        "n_routed_experts": 2,
        "num_experts_per_tok": 1,
        "n_shared_experts": 1,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    g = geometry_from_hf_config(tmp_path)
    assert g.weights_source == "safetensors"
    assert g.routed_expert_bytes == 2 * 2 * 16 * 8
    assert g.routed_expert_bytes_by_layer == (2 * 2 * 16 * 8,)
    assert g.token_embedding_bytes == 2 * 100 * 8 and g.token_embedding_row_bytes == 16
    # q_proj, router, shared expert, lm_head; the vision tower is not read by decode.
    assert g.always_read_bytes == 2 * (64 + 32 + 128 + 800)


def test_gguf_shared_experts_router_and_leading_dense_blocks(tmp_path: Path) -> None:
    """deepseek2 layout: block 0 dense, then MoE blocks with a shared expert and a router."""
    n_embd, n_ff, n_ff_exp, n_exp = 64, 256, 32, 16
    tensors: list[tuple[str, tuple[int, ...], int]] = [
        ("token_embd.weight", (n_embd, 1000), Q8),
        ("output.weight", (n_embd, 1000), Q8),
        ("blk.0.ffn_up.weight", (n_embd, n_ff), Q8),  # the leading dense block's FFN
    ]
    for i in (1, 2):
        b = f"blk.{i}."
        tensors += [
            (b + "ffn_gate_inp.weight", (n_embd, n_exp), F32),
            (b + "exp_probs_b.bias", (n_exp,), F32),
            (b + "ffn_up_shexp.weight", (n_embd, n_ff_exp), Q8),
            (b + "ffn_up_exps.weight", (n_embd, n_ff_exp, n_exp), Q8),
        ]
    kv = {"block_count": 3, "embedding_length": n_embd, "attention.head_count": 4}
    kv |= {"expert_count": n_exp, "expert_used_count": 4, "expert_shared_count": 1}
    kv |= {"leading_dense_block_count": 1}
    g = geometry_from_gguf(write_header(tmp_path / "ds.gguf", "deepseek2", kv, tensors))
    assert (g.expert_shared_count, g.leading_dense_block_count) == (1, 1)
    exps = n_embd * n_ff_exp * n_exp * 34 // 32
    assert g.routed_expert_bytes_by_layer == (0, exps, exps)
    dense = n_embd * n_ff * 34 // 32
    shared = n_embd * n_ff_exp * 34 // 32
    router = n_embd * n_exp * 4 + n_exp * 4
    output = n_embd * 1000 * 34 // 32
    # The dense FFN, the shared experts and the routers are read every step; the output too.
    assert g.always_read_bytes == dense + 2 * (shared + router) + output
