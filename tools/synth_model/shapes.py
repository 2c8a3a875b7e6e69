"""The published architectures (`SPECS`) and the tensors llama.cpp expects of each."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import gguf
from gguf.constants import MODEL_ARCH_NAMES, MODEL_TENSOR, MODEL_TENSORS, TENSOR_NAMES

QType = gguf.GGMLQuantizationType

# The weight types a user can ask for, and the GGUF file type that announces each.
WEIGHT_TYPES: dict[str, tuple[QType, gguf.LlamaFileType]] = {
    "q4_0": (QType.Q4_0, gguf.LlamaFileType.MOSTLY_Q4_0),
    "q8_0": (QType.Q8_0, gguf.LlamaFileType.MOSTLY_Q8_0),
    "f16": (QType.F16, gguf.LlamaFileType.MOSTLY_F16),
}
# Routed experts may also be MXFP4 (gpt-oss ships them so; the file type then says MXFP4_MOE).
EXPERT_TYPES: dict[str, QType] = {
    **{name: qtype for name, (qtype, _) in WEIGHT_TYPES.items()},
    "mxfp4": QType.MXFP4,
}


@dataclass(frozen=True)
class ArchSpec:
    """Shape and hyper-parameters of one published model, as llama.cpp reads them from GGUF."""

    arch: str  # general.architecture, a key of gguf's MODEL_ARCH_NAMES values
    family: str  # tokenizer family: a tokenizer of the same family fits the vocabulary
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_vocab: int
    ctx_train: int
    rope_freq_base: float
    rms_eps: float
    sliding_window: int = 0  # 0: every layer attends to the whole context
    rope_scaling: tuple[str, float] | None = None
    qk_norm: bool = False  # per-head RMS norm of Q and K (Gemma 3, Qwen 3)
    qkv_bias: bool = False  # biases on Q, K and V (Qwen 2)
    post_norms: bool = False  # Gemma's extra norms after attention and after the FFN
    tied_output: bool = True  # output projection shares token_embd (no `output` tensor)
    # Mixture of experts (0: dense). Every block is an MoE block in the shapes below.
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0  # FFN width of one routed expert
    expert_type: str | None = None  # weight type of the routed experts (None: --type)
    rope_orig_ctx: int = 0  # YaRN: context the RoPE was trained at before scaling
    attn_bias: bool = False  # biases on Q, K, V and the attention output (gpt-oss)
    attn_sinks: bool = False  # one learned sink logit per head (gpt-oss)
    expert_bias: bool = False  # biases on the router and on every expert matrix (gpt-oss)
    # DeepSeek-V2 (deepseek2): the first n_dense_lead blocks keep a dense FFN of n_ff
    # (first_k_dense_replace), the others add n_expert_shared shared experts of n_ff_exp each.
    n_dense_lead: int = 0
    n_expert_shared: int = 0
    # Multi-head latent attention without a query LoRA (DeepSeek-V2-Lite), in llama.cpp's
    # unsplit `attn_kv_b` layout: keys of head_dim = no-RoPE part + rope_dim, values of
    # v_head_dim, compressed to kv_lora_rank (0: plain attention).
    kv_lora_rank: int = 0
    rope_dim: int = 0
    v_head_dim: int = 0

    @property
    def is_moe(self) -> bool:
        """Whether the FFN of the blocks (past `n_dense_lead`) is a set of routed experts."""
        return self.n_expert > 0

    @property
    def is_mla(self) -> bool:
        """Whether attention is DeepSeek's multi-head latent attention."""
        return self.kv_lora_rank > 0


# fmt: off
def _gemma3(
    n_layer: int, n_embd: int, n_head: int, n_head_kv: int, head_dim: int, n_ff: int,
    ctx: int, window: int, **extra: Any,
) -> ArchSpec:
    """A Gemma 3 shape: 262144-token vocabulary, QK norms, post-norms, sliding window."""
    return ArchSpec(
        "gemma3", "gemma", n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, 262144, ctx,
        1e6, 1e-6, sliding_window=window, qk_norm=True, post_norms=True, **extra,
    )


def _llama3(n_layer: int, n_embd: int, n_head: int, n_ff: int) -> ArchSpec:
    """A Llama 3 shape: 8 KV heads of 128, 128256-token vocabulary, untied output."""
    return ArchSpec(
        "llama", "llama3", n_layer, n_embd, n_head, 8, 128, n_ff, 128256, 8192, 500000.0, 1e-5,
        tied_output=False,
    )


def _qwen(
    arch: str, n_layer: int, n_embd: int, n_head: int, n_head_kv: int, n_ff: int, **extra: Any
) -> ArchSpec:
    """A Qwen 2.5 (qkv biases, 32768 context) or Qwen 3 (QK norms, 40960) shape."""
    qwen3 = arch.startswith("qwen3")
    vocab, ctx = (151936, 40960) if qwen3 else (152064, 32768)
    return ArchSpec(
        arch, "qwen", n_layer, n_embd, n_head, n_head_kv, 128, n_ff, vocab, ctx, 1e6, 1e-6,
        qk_norm=qwen3, qkv_bias=not qwen3, **extra,
    )


# Published configurations (config.json of each model). llama.cpp derives the Gemma 3
# sliding-window pattern (5 local layers, then 1 global) from the architecture itself.
LINEAR_X8 = ("linear", 8.0)
SPECS: dict[str, ArchSpec] = {
    "gemma3-27b": _gemma3(62, 5376, 32, 16, 128, 21504, 131072, 1024, rope_scaling=LINEAR_X8),
    "gemma3-12b": _gemma3(48, 3840, 16, 8, 256, 15360, 131072, 1024, rope_scaling=LINEAR_X8),
    "gemma3-4b": _gemma3(34, 2560, 8, 4, 256, 10240, 131072, 1024, rope_scaling=LINEAR_X8),
    "gemma3-1b": _gemma3(26, 1152, 4, 1, 256, 6912, 32768, 512),
    "gemma3-270m": _gemma3(18, 640, 4, 1, 256, 2048, 32768, 512),
    "llama3-8b": _llama3(32, 4096, 32, 14336),
    "llama3-70b": _llama3(80, 8192, 64, 28672),
    "qwen2.5-7b": _qwen("qwen2", 28, 3584, 28, 4, 18944, tied_output=False),
    "qwen2.5-72b": _qwen("qwen2", 80, 8192, 64, 8, 29568, tied_output=False),
    # The small Qwen 3 with the family's 151936-token vocabulary: a draft model for the others.
    "qwen3-0.6b": _qwen("qwen3", 28, 1024, 16, 8, 3072, tied_output=True),
    "qwen3-8b": _qwen("qwen3", 36, 4096, 32, 8, 12288, tied_output=False),
    "qwen3-32b": _qwen("qwen3", 64, 5120, 64, 8, 25600, tied_output=False),
    # Qwen3MoeForCausalLM: decoder_sparse_step 1 and no mlp_only_layers, so every block is MoE;
    # intermediate_size (the unused dense width) is still written as feed_forward_length.
    "qwen3-30b-a3b": _qwen(
        "qwen3moe", 48, 2048, 32, 4, 6144,
        tied_output=False, n_expert=128, n_expert_used=8, n_ff_exp=768,
    ),
    "qwen3-235b-a22b": _qwen(
        "qwen3moe", 94, 4096, 64, 4, 12288,
        tied_output=False, n_expert=128, n_expert_used=8, n_ff_exp=1536,
    ),
    # DeepseekV2ForCausalLM, DeepSeek-V2-Lite: 27 layers (llama.cpp's "lite": no query LoRA),
    # MLA with kv_lora_rank 512 and 16 heads of 128 + 64 RoPE dims (values 128), layer 0
    # dense (first_k_dense_replace 1, intermediate 10944), then 64 routed experts of 1408
    # (6 used) and 2 shared; YaRN x40 from 4096.
    "deepseek-v2-lite": ArchSpec(
        "deepseek2", "deepseek", 27, 2048, 16, 16, 192, 10944, 102400, 163840, 10000.0, 1e-6,
        rope_scaling=("yarn", 40.0), rope_orig_ctx=4096, tied_output=False,
        n_expert=64, n_expert_used=6, n_ff_exp=1408, n_dense_lead=1, n_expert_shared=2,
        kv_lora_rank=512, rope_dim=64, v_head_dim=128,
    ),
    # GptOssForCausalLM: sliding window 128 on every other layer (llama.cpp derives the
    # pattern), YaRN x32 from 4096, attention sinks, biases everywhere, MXFP4 experts.
    "gpt-oss-20b": ArchSpec(
        "gpt-oss", "gpt-oss", 24, 2880, 64, 8, 64, 2880, 201088, 131072, 150000.0, 1e-5,
        sliding_window=128, rope_scaling=("yarn", 32.0), rope_orig_ctx=4096,
        tied_output=False, n_expert=32, n_expert_used=4, n_ff_exp=2880, expert_type="mxfp4",
        attn_bias=True, attn_sinks=True, expert_bias=True,
    ),
}
# fmt: on


class SynthError(Exception):
    """A problem with the user's request (bad arguments, unusable tokenizer, no disk space)."""


@dataclass(frozen=True)
class TensorPlan:
    """One tensor to write: GGUF name, shape in ggml order (ne0 first), type and content."""

    name: str
    ne: tuple[int, ...]
    qtype: QType
    fill: str  # "random", "ones" (norm weights: identity) or "zeros" (biases)

    @property
    def n_elements(self) -> int:
        """Number of parameters in the tensor."""
        return math.prod(self.ne)

    @property
    def nbytes(self) -> int:
        """Size of the tensor data in the file, before alignment padding."""
        block, size = gguf.GGML_QUANT_SIZES[self.qtype]
        return self.n_elements // block * size


def _arch_enum(arch: str) -> gguf.MODEL_ARCH:
    for enum, name in MODEL_ARCH_NAMES.items():
        if name == arch:
            return enum
    raise SynthError(f"gguf does not know the architecture {arch!r}")


class _Namer:
    """GGUF tensor names from gguf's own tables: a typo cannot make a file llama.cpp rejects."""

    def __init__(self, arch: str) -> None:
        self.arch = arch
        self.allowed = MODEL_TENSORS[_arch_enum(arch)]

    def __call__(self, kind: MODEL_TENSOR, bid: int | None = None, suffix: str = "weight") -> str:
        if kind not in self.allowed:
            raise SynthError(f"{self.arch} has no tensor {kind.name}")
        base = TENSOR_NAMES[kind].format(bid=bid) if bid is not None else TENSOR_NAMES[kind]
        return f"{base}.{suffix}"


def _mla_tensors(spec: ArchSpec, bid: int, wtype: QType, name: _Namer) -> list[TensorPlan]:
    """DeepSeek-V2-Lite's latent attention as llama.cpp loads an unsplit (`attn_kv_b`) GGUF."""
    e, h, rank, f32, T = spec.n_embd, spec.n_head, spec.kv_lora_rank, QType.F32, MODEL_TENSOR
    nope = spec.head_dim - spec.rope_dim
    return [
        TensorPlan(name(T.ATTN_NORM, bid), (e,), f32, "ones"),
        TensorPlan(name(T.ATTN_KV_A_NORM, bid), (rank,), f32, "ones"),
        TensorPlan(name(T.ATTN_Q, bid), (e, h * spec.head_dim), wtype, "random"),
        TensorPlan(name(T.ATTN_KV_A_MQA, bid), (e, rank + spec.rope_dim), wtype, "random"),
        TensorPlan(name(T.ATTN_KV_B, bid), (rank, h * (nope + spec.v_head_dim)), wtype, "random"),
        TensorPlan(name(T.ATTN_OUT, bid), (h * spec.v_head_dim, e), wtype, "random"),
    ]


def _attention_tensors(spec: ArchSpec, bid: int, wtype: QType, name: _Namer) -> list[TensorPlan]:
    if spec.is_mla:
        return _mla_tensors(spec, bid, wtype, name)
    e, q_dim, kv_dim = spec.n_embd, spec.n_head * spec.head_dim, spec.n_head_kv * spec.head_dim
    f32, T = QType.F32, MODEL_TENSOR
    out = [
        TensorPlan(name(T.ATTN_NORM, bid), (e,), f32, "ones"),
        TensorPlan(name(T.ATTN_Q, bid), (e, q_dim), wtype, "random"),
        TensorPlan(name(T.ATTN_K, bid), (e, kv_dim), wtype, "random"),
        TensorPlan(name(T.ATTN_V, bid), (e, kv_dim), wtype, "random"),
        TensorPlan(name(T.ATTN_OUT, bid), (q_dim, e), wtype, "random"),
    ]
    if spec.qkv_bias or spec.attn_bias:
        out += [
            TensorPlan(name(T.ATTN_Q, bid, "bias"), (q_dim,), f32, "zeros"),
            TensorPlan(name(T.ATTN_K, bid, "bias"), (kv_dim,), f32, "zeros"),
            TensorPlan(name(T.ATTN_V, bid, "bias"), (kv_dim,), f32, "zeros"),
        ]
    if spec.attn_bias:
        out.append(TensorPlan(name(T.ATTN_OUT, bid, "bias"), (e,), f32, "zeros"))
    if spec.attn_sinks:
        # A sink logit of 0 next to unit-scale scores: a small, constant share of attention.
        out.append(TensorPlan(name(T.ATTN_SINKS, bid), (spec.n_head,), f32, "zeros"))
    if spec.qk_norm:
        out += [
            TensorPlan(name(T.ATTN_Q_NORM, bid), (spec.head_dim,), f32, "ones"),
            TensorPlan(name(T.ATTN_K_NORM, bid), (spec.head_dim,), f32, "ones"),
        ]
    if spec.post_norms:
        out.append(TensorPlan(name(T.ATTN_POST_NORM, bid), (e,), f32, "ones"))
    return out


def _ffn_tensors(spec: ArchSpec, bid: int, wtype: QType, name: _Namer) -> list[TensorPlan]:
    e, ff, f32, T = spec.n_embd, spec.n_ff, QType.F32, MODEL_TENSOR
    if spec.post_norms:
        norm = T.FFN_PRE_NORM  # Gemma's name; both map to `blk.N.ffn_norm`
    elif spec.arch == "gpt-oss":
        norm = T.ATTN_POST_NORM  # gpt-oss's pre-FFN norm is `blk.N.post_attention_norm`
    else:
        norm = T.FFN_NORM
    out = [TensorPlan(name(norm, bid), (e,), f32, "ones")]
    if not spec.is_moe or bid < spec.n_dense_lead:
        out += [
            TensorPlan(name(T.FFN_GATE, bid), (e, ff), wtype, "random"),
            TensorPlan(name(T.FFN_UP, bid), (e, ff), wtype, "random"),
            TensorPlan(name(T.FFN_DOWN, bid), (ff, e), wtype, "random"),
        ]
    else:
        out += _expert_tensors(spec, bid, wtype, name)
    if spec.post_norms:
        out.append(TensorPlan(name(T.FFN_POST_NORM, bid), (e,), f32, "ones"))
    return out


def _expert_tensors(spec: ArchSpec, bid: int, wtype: QType, name: _Namer) -> list[TensorPlan]:
    """Router and routed experts: 3-D tensors (ne0, ne1, n_expert), as llama.cpp loads them."""
    e, ff, n, f32, T = spec.n_embd, spec.n_ff_exp, spec.n_expert, QType.F32, MODEL_TENSOR
    xtype = EXPERT_TYPES[spec.expert_type] if spec.expert_type else wtype
    # The router stays F32, as llama.cpp's converter and llama-quantize leave it.
    out = [
        TensorPlan(name(T.FFN_GATE_INP, bid), (e, n), f32, "random"),
        TensorPlan(name(T.FFN_GATE_EXP, bid), (e, ff, n), xtype, "random"),
        TensorPlan(name(T.FFN_UP_EXP, bid), (e, ff, n), xtype, "random"),
        TensorPlan(name(T.FFN_DOWN_EXP, bid), (ff, e, n), xtype, "random"),
    ]
    if spec.n_expert_shared:
        sh = ff * spec.n_expert_shared
        out += [
            TensorPlan(name(T.FFN_GATE_SHEXP, bid), (e, sh), wtype, "random"),
            TensorPlan(name(T.FFN_UP_SHEXP, bid), (e, sh), wtype, "random"),
            TensorPlan(name(T.FFN_DOWN_SHEXP, bid), (sh, e), wtype, "random"),
        ]
    if spec.expert_bias:
        out += [
            TensorPlan(name(T.FFN_GATE_INP, bid, "bias"), (n,), f32, "zeros"),
            TensorPlan(name(T.FFN_GATE_EXP, bid, "bias"), (ff, n), f32, "zeros"),
            TensorPlan(name(T.FFN_UP_EXP, bid, "bias"), (ff, n), f32, "zeros"),
            TensorPlan(name(T.FFN_DOWN_EXP, bid, "bias"), (e, n), f32, "zeros"),
        ]
    return out


def plan_tensors(spec: ArchSpec, wtype: QType) -> list[TensorPlan]:
    """Every tensor llama.cpp loads for this architecture, with its exact shape and type."""
    name = _Namer(spec.arch)
    e, f32 = spec.n_embd, QType.F32
    plans = [TensorPlan(name(MODEL_TENSOR.TOKEN_EMBD), (e, spec.n_vocab), wtype, "random")]
    for bid in range(spec.n_layer):
        plans += _attention_tensors(spec, bid, wtype, name)
        plans += _ffn_tensors(spec, bid, wtype, name)
    plans.append(TensorPlan(name(MODEL_TENSOR.OUTPUT_NORM), (e,), f32, "ones"))
    if not spec.tied_output:
        plans.append(TensorPlan(name(MODEL_TENSOR.OUTPUT), (e, spec.n_vocab), wtype, "random"))
    for t in plans:
        block = gguf.GGML_QUANT_SIZES[t.qtype][0]
        if t.ne[0] % block:
            raise SynthError(f"{t.name}: rows of {t.ne[0]} do not split into {block}-weight blocks")
    return plans
