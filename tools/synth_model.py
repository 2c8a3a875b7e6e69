"""Synthetic same-shape GGUF models: real tensor shapes and metadata, random weights.

A 27B model costs a 54 GB download to measure a card's decode speed and memory; the speed and the
memory depend only on the tensor shapes and the weight type, not on the values. This tool writes a
GGUF with exactly the shapes llama.cpp expects for a chosen architecture, random weights in Q4_0,
Q8_0 or F16, and the tokenizer of any small GGUF of the same family. The text it generates is
nonsense; compute, bandwidth and memory are those of the real model.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import struct
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from gguf.constants import MODEL_ARCH_NAMES, MODEL_TENSOR, MODEL_TENSORS, TENSOR_NAMES, Keys
from tqdm import tqdm

from core.roofline import ModelStructure, active_weights_bytes
from model.gguf_header import read_gguf_fields
from model.weights import TensorInfo, WeightSplit, split_tensors

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

# Bytes of random data generated per step: large enough for numpy to run at memory speed,
# small enough that a 15 GB model never needs more than a few hundred MB of RAM.
CHUNK_BYTES = 64 << 20


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

    @property
    def is_moe(self) -> bool:
        """Whether the FFN of every block is a set of routed experts."""
        return self.n_expert > 0


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


def _attention_tensors(spec: ArchSpec, bid: int, wtype: QType, name: _Namer) -> list[TensorPlan]:
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
    if not spec.is_moe:
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


@dataclass(frozen=True)
class KV:
    """One GGUF metadata entry."""

    value: Any
    vtype: gguf.GGUFValueType
    sub_type: gguf.GGUFValueType | None = None


def model_metadata(spec: ArchSpec, like: str, wname: str) -> dict[str, KV]:
    """The architecture keys llama.cpp reads for this model (tokenizer keys come separately)."""
    u32, f32, s = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.FLOAT32, gguf.GGUFValueType.STRING
    a = spec.arch
    ftype = WEIGHT_TYPES[wname][1]
    types = wname
    if spec.is_moe and spec.expert_type and spec.expert_type != wname:
        types = f"{wname}, {spec.expert_type} experts"
        if spec.expert_type == "mxfp4":
            ftype = gguf.LlamaFileType.MOSTLY_MXFP4_MOE
    kv: dict[str, KV] = {
        Keys.General.NAME: KV(f"synthetic {like} ({types}, random weights)", s),
        Keys.General.FILE_TYPE: KV(int(ftype), u32),
    }
    # The per-architecture keys, in a fixed order: the file's bytes follow it.
    shape: list[tuple[str, float | int, gguf.GGUFValueType]] = [
        (Keys.LLM.CONTEXT_LENGTH, spec.ctx_train, u32),
        (Keys.LLM.EMBEDDING_LENGTH, spec.n_embd, u32),
        (Keys.LLM.BLOCK_COUNT, spec.n_layer, u32),
        (Keys.LLM.FEED_FORWARD_LENGTH, spec.n_ff, u32),
        (Keys.LLM.VOCAB_SIZE, spec.n_vocab, u32),
        (Keys.Attention.HEAD_COUNT, spec.n_head, u32),
        (Keys.Attention.HEAD_COUNT_KV, spec.n_head_kv, u32),
        # Explicit because head_dim is not always n_embd / n_head (Gemma 3, Qwen 3).
        (Keys.Attention.KEY_LENGTH, spec.head_dim, u32),
        (Keys.Attention.VALUE_LENGTH, spec.head_dim, u32),
    ]
    shape += [(Keys.Attention.LAYERNORM_RMS_EPS, spec.rms_eps, f32)]
    shape += [(Keys.Rope.FREQ_BASE, spec.rope_freq_base, f32)]
    shape += [(Keys.Rope.DIMENSION_COUNT, spec.head_dim, u32)]
    kv.update({key.format(arch=a): KV(value, vtype) for key, value, vtype in shape})
    if spec.sliding_window:
        kv[Keys.Attention.SLIDING_WINDOW.format(arch=a)] = KV(spec.sliding_window, u32)
    if spec.rope_scaling is not None:
        kv[Keys.Rope.SCALING_TYPE.format(arch=a)] = KV(spec.rope_scaling[0], s)
        kv[Keys.Rope.SCALING_FACTOR.format(arch=a)] = KV(spec.rope_scaling[1], f32)
    if spec.rope_orig_ctx:
        kv[Keys.Rope.SCALING_ORIG_CTX_LEN.format(arch=a)] = KV(spec.rope_orig_ctx, u32)
    if spec.is_moe:
        kv[Keys.LLM.EXPERT_COUNT.format(arch=a)] = KV(spec.n_expert, u32)
        kv[Keys.LLM.EXPERT_USED_COUNT.format(arch=a)] = KV(spec.n_expert_used, u32)
        kv[Keys.LLM.EXPERT_FEED_FORWARD_LENGTH.format(arch=a)] = KV(spec.n_ff_exp, u32)
    if ftype != gguf.LlamaFileType.MOSTLY_F16:
        kv[Keys.General.QUANTIZATION_VERSION] = KV(gguf.GGML_QUANT_VERSION, u32)
    return kv


def read_metadata(path: Path) -> dict[str, KV]:
    """Every key/value of a GGUF file (the exporter's GGUF reader); the tensors are not read."""
    try:
        fields = read_gguf_fields(path)
        return {
            key: KV(
                f.value,
                gguf.GGUFValueType(f.vtype),
                None if f.sub_type is None else gguf.GGUFValueType(f.sub_type),
            )
            for key, f in fields.items()
        }
    except (OSError, ValueError, struct.error) as exc:
        raise SynthError(f"cannot read {path} as GGUF: {exc}") from exc


def read_tokenizer(path: Path) -> dict[str, KV]:
    """Every `tokenizer.*` key of a GGUF (a full model or a tokenizer-only file)."""
    out = {k: v for k, v in read_metadata(path).items() if k.startswith("tokenizer.")}
    if "tokenizer.ggml.tokens" not in out:
        raise SynthError(f"{path} has no tokenizer (no tokenizer.ggml.tokens key)")
    return out


def synthetic_tokenizer(n_vocab: int) -> dict[str, KV]:
    """A SentencePiece-style vocabulary of `n_vocab` made-up tokens, for when no GGUF is at hand.

    Byte tokens make every text encodable (llama.cpp needs `<0x0A>` to load an SPM vocabulary);
    the other tokens are printable characters and short pieces, so output stays readable. Token
    counts of a prompt differ from the real tokenizer's, which matters only for prompt lengths.
    """
    control, normal = int(gguf.TokenType.CONTROL), int(gguf.TokenType.NORMAL)
    tokens: list[bytes] = [b"<unk>", b"<s>", b"</s>"]
    types = [int(gguf.TokenType.UNKNOWN), control, control]
    tokens += [f"<0x{b:02X}>".encode() for b in range(256)]
    types += [int(gguf.TokenType.BYTE)] * 256
    chars = [chr(c) for c in range(33, 127)]
    pieces = ["\u2581", *chars, *("\u2581" + c for c in chars)]
    pieces += [a + b for a in chars for b in chars]
    room = n_vocab - len(tokens)
    if room < 0:
        raise SynthError(f"a vocabulary of {n_vocab} cannot hold the 259 special and byte tokens")
    pieces = pieces[:room] + [f"<synthetic_{i}>" for i in range(room - len(pieces))]
    tokens += [p.encode() for p in pieces]
    types += [normal] * len(pieces)
    s, arr = gguf.GGUFValueType.STRING, gguf.GGUFValueType.ARRAY
    u32, boolean = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.BOOL
    return {
        "tokenizer.ggml.model": KV("llama", s),
        "tokenizer.ggml.tokens": KV(tokens, arr, s),
        # Shorter pieces score higher, so SentencePiece merging prefers them: a stable, plain split.
        "tokenizer.ggml.scores": KV(
            [0.0] * 259 + [-float(len(p)) for p in pieces], arr, gguf.GGUFValueType.FLOAT32
        ),
        "tokenizer.ggml.token_type": KV(types, arr, gguf.GGUFValueType.INT32),
        "tokenizer.ggml.unknown_token_id": KV(0, u32),
        "tokenizer.ggml.bos_token_id": KV(1, u32),
        "tokenizer.ggml.eos_token_id": KV(2, u32),
        "tokenizer.ggml.add_bos_token": KV(True, boolean),
        "tokenizer.ggml.add_eos_token": KV(False, boolean),
    }


def fit_tokenizer(tok: dict[str, KV], spec: ArchSpec, like: str) -> dict[str, KV]:
    """Pad the vocabulary to the model's embedding rows, as llama.cpp's converter does."""
    tokens = tok["tokenizer.ggml.tokens"].value
    have, n_vocab = len(tokens), spec.n_vocab
    if have > n_vocab:
        raise SynthError(
            f"the tokenizer has {have} tokens, more than {like}'s vocabulary of {n_vocab}: "
            f"take it from a GGUF of the {spec.family} family"
        )
    if have == n_vocab:
        return tok
    pad = n_vocab - have
    out = dict(tok)
    out["tokenizer.ggml.tokens"] = replace(
        tok["tokenizer.ggml.tokens"], value=tokens + [f"[PAD{i}]".encode() for i in range(pad)]
    )
    if "tokenizer.ggml.scores" in tok:
        scores = tok["tokenizer.ggml.scores"]
        out["tokenizer.ggml.scores"] = replace(scores, value=scores.value + [-1000.0] * pad)
    if "tokenizer.ggml.token_type" in tok:
        types = tok["tokenizer.ggml.token_type"]
        unused = int(gguf.TokenType.UNUSED)
        out["tokenizer.ggml.token_type"] = replace(types, value=types.value + [unused] * pad)
    return out


def _weight_std(plan: TensorPlan) -> float:
    # 1/sqrt(fan_in) keeps every matmul output near unit scale, so activations stay finite
    # through all layers (NaN logits would stop llama-server sampling).
    return 1.0 / math.sqrt(plan.ne[0])


def _random_bytes(gen: np.random.Generator, n: int) -> np.ndarray:
    # random_raw is the fastest numpy source (~1 GB/s a core); Generator.bytes is 3x slower.
    words = gen.bit_generator.random_raw((n + 7) // 8)
    return np.asarray(words, dtype=np.uint64).view(np.uint8)[:n]


def _block_scale(qtype: QType, std: float) -> np.ndarray:
    """The leading scale bytes of every block of `qtype` whose weights have RMS `std`."""
    if qtype == QType.Q4_0:
        # Nibbles uniform in 0..15 stand for -8..7: RMS ≈ 4.64 units of the fp16 scale.
        return np.frombuffer(np.float16(std / 4.64).tobytes(), dtype=np.uint8)
    if qtype == QType.Q8_0:
        # int8 uniform in -128..127: RMS ≈ 73.9 units of the fp16 scale.
        return np.frombuffer(np.float16(std / 73.9).tobytes(), dtype=np.uint8)
    if qtype == QType.MXFP4:
        # Nibbles index the e2m1 values (doubled) 0, ±1, ±2, ±3, ±4, ±6, ±8, ±12: RMS 5.85 units
        # of the E8M0 scale byte e, which stands for 2^(e - 128) (ggml's "half" conversion).
        return np.array([round(math.log2(std / 5.852)) + 128], dtype=np.uint8)
    raise SynthError(f"no random blocks for {qtype.name}")


def _random_chunks(plan: TensorPlan, gen: np.random.Generator) -> Iterator[np.ndarray]:
    """The tensor's bytes in bounded chunks: valid blocks of the weight type with small scales."""
    block, size = gguf.GGML_QUANT_SIZES[plan.qtype]
    n_blocks = plan.n_elements // block
    per_chunk = max(1, CHUNK_BYTES // size)
    std = _weight_std(plan)
    if plan.qtype == QType.F32:
        # Small tensors only (MoE routers): plain normal floats.
        for start in range(0, n_blocks, per_chunk):
            count = min(per_chunk, n_blocks - start)
            yield (gen.standard_normal(count, dtype=np.float32) * np.float32(std)).view(np.uint8)
        return
    scale = b"" if plan.qtype == QType.F16 else _block_scale(plan.qtype, std)
    for start in range(0, n_blocks, per_chunk):
        count = min(per_chunk, n_blocks - start)
        raw = _random_bytes(gen, count * size)
        if plan.qtype == QType.F16:
            yield _f16_from_bits(raw.view(np.uint16), std)
            continue
        blocks = raw.reshape(count, size)
        blocks[:, 0 : len(scale)] = scale  # every block starts with its scale
        yield raw


def _f16_from_bits(bits: np.ndarray, std: float) -> np.ndarray:
    # Keep the random sign and mantissa, fix the exponent: |w| in [2^k, 2^(k+1)) has RMS 1.53 * 2^k,
    # so k is picked to bring the RMS within a factor sqrt(2) of `std`. Two in-place passes:
    # 5x faster than converting normal floats to float16, and never inf or NaN.
    exponent = round(math.log2(std / 1.528)) + 15
    np.bitwise_and(bits, np.uint16(0x83FF), out=bits)
    np.bitwise_or(bits, np.uint16(exponent << 10), out=bits)
    return bits.view(np.uint8)


def _constant_bytes(plan: TensorPlan) -> np.ndarray:
    value = 1.0 if plan.fill == "ones" else 0.0
    return np.full(plan.n_elements, value, dtype=np.float32).view(np.uint8)


@dataclass(frozen=True)
class Model:
    """Everything needed to write (or describe) one synthetic GGUF."""

    like: str
    wname: str
    spec: ArchSpec
    tensors: list[TensorPlan]
    metadata: dict[str, KV]

    @property
    def n_params(self) -> int:
        """Parameter count as llama.cpp reports it (`n_params` in /v1/models)."""
        return sum(t.n_elements for t in self.tensors)

    @property
    def data_bytes(self) -> int:
        """Sum of tensor sizes (llama.cpp's `size` in /v1/models)."""
        return sum(t.nbytes for t in self.tensors)


def weight_split(model: Model) -> WeightSplit:
    """The planned tensors split as the exporter splits a GGUF's (model.weights)."""
    tensors = [
        TensorInfo(t.name, t.nbytes, model.spec.n_vocab if t.name == "token_embd.weight" else 1)
        for t in model.tensors
    ]
    return split_tensors(tensors, model.spec.n_layer)


def weights_step_bytes(model: Model, batch: int = 1) -> float:
    """Expected weight bytes a decode step of `batch` sequences reads: the decision core's
    formula (always-read + routed x (1 - (1 - k/E)^B) + B x embedding row)."""
    split, s = weight_split(model), model.spec
    structure = ModelStructure(
        weights_bytes=model.data_bytes,
        always_read_bytes=split.always_read_bytes,
        routed_expert_bytes=split.routed_expert_bytes,
        experts=s.n_expert or None,
        experts_used=s.n_expert_used or None,
        token_embedding_row_bytes=split.token_embedding_row_bytes,
    )
    return active_weights_bytes(structure, batch)


def make_model(spec: ArchSpec, like: str, wname: str, tokenizer: dict[str, KV] | None) -> Model:
    """Plan a model of any shape, with a tokenizer fitted to its vocabulary."""
    metadata = model_metadata(spec, like, wname)
    if tokenizer is not None:
        metadata.update(fit_tokenizer(tokenizer, spec, like))
    tensors = plan_tensors(spec, WEIGHT_TYPES[wname][0])
    return Model(like, wname, spec, tensors, metadata)


def build_model(
    like: str,
    wname: str,
    tokenizer: dict[str, KV] | None,
    layers: int | None = None,
    ctx_train: int | None = None,
    expert_type: str | None = None,
) -> Model:
    """Plan a model: the named shape, optionally shallower, with a tokenizer fitted to it.

    `expert_type` sets the weight type of routed experts (default: the shape's own, e.g. MXFP4
    for gpt-oss, else `wname`).
    """
    if like not in SPECS:
        raise SynthError(f"unknown --like {like!r}; known: {', '.join(SPECS)}")
    if wname not in WEIGHT_TYPES:
        raise SynthError(f"unknown --type {wname!r}; known: {', '.join(WEIGHT_TYPES)}")
    spec = SPECS[like]
    if expert_type is not None:
        if not spec.is_moe:
            raise SynthError(f"--expert-type: {like} has no experts")
        if expert_type not in EXPERT_TYPES:
            raise SynthError(
                f"unknown --expert-type {expert_type!r}; known: {', '.join(EXPERT_TYPES)}"
            )
    if spec.is_moe:
        spec = replace(spec, expert_type=expert_type or spec.expert_type or wname)
    if layers is not None:
        if layers < 1:
            raise SynthError("--layers must be at least 1")
        spec = replace(spec, n_layer=layers)
    if ctx_train is not None:
        if ctx_train < 1:
            raise SynthError("--ctx-train must be at least 1")
        spec = replace(spec, ctx_train=ctx_train)
    return make_model(spec, like, wname, tokenizer)


# numpy dtypes of GGUF array element types, for packing whole arrays at once.
_ARRAY_DTYPES = {
    gguf.GGUFValueType.UINT8: "<u1",
    gguf.GGUFValueType.INT8: "<i1",
    gguf.GGUFValueType.UINT16: "<u2",
    gguf.GGUFValueType.INT16: "<i2",
    gguf.GGUFValueType.UINT32: "<u4",
    gguf.GGUFValueType.INT32: "<i4",
    gguf.GGUFValueType.FLOAT32: "<f4",
    gguf.GGUFValueType.UINT64: "<u8",
    gguf.GGUFValueType.INT64: "<i8",
    gguf.GGUFValueType.FLOAT64: "<f8",
    gguf.GGUFValueType.BOOL: "?",
}


class FastWriter(gguf.GGUFWriter):
    """GGUFWriter that packs metadata arrays in one go (a 262k-token vocabulary: 0.2 s, not 4 s)."""

    def _pack_val(
        self,
        val: Any,
        vtype: gguf.GGUFValueType,
        add_vtype: bool,
        sub_type: gguf.GGUFValueType | None = None,
    ) -> bytes:
        little = self.endianess == gguf.GGUFEndian.LITTLE
        if vtype != gguf.GGUFValueType.ARRAY or sub_type is None or not little or not len(val):
            return super()._pack_val(val, vtype, add_vtype, sub_type)
        head = struct.pack("<I", vtype) if add_vtype else b""
        head += struct.pack("<IQ", sub_type, len(val))
        if sub_type == gguf.GGUFValueType.STRING:
            items = [v.encode() if isinstance(v, str) else v for v in val]
            return head + b"".join(struct.pack("<Q", len(b)) + b for b in items)
        if sub_type in _ARRAY_DTYPES:
            return head + np.asarray(val, dtype=_ARRAY_DTYPES[sub_type]).tobytes()
        return super()._pack_val(val, vtype, add_vtype, sub_type)


def _writer(model: Model, path: Path) -> gguf.GGUFWriter:
    writer = FastWriter(path, model.spec.arch)
    for key, kv in model.metadata.items():
        writer.add_key_value(key, kv.value, kv.vtype, kv.sub_type)
    for t in model.tensors:
        # ggml order (ne0 first) reversed: the writer takes numpy order and reverses it back.
        shape = tuple(reversed(t.ne))
        writer.add_tensor_info(t.name, shape, np.dtype(np.float32), t.nbytes, raw_dtype=t.qtype)
    return writer


def _value_bytes(value: Any, vtype: gguf.GGUFValueType, sub: gguf.GGUFValueType | None) -> int:
    if vtype == gguf.GGUFValueType.STRING:
        return 8 + len(value.encode() if isinstance(value, str) else value)
    if vtype == gguf.GGUFValueType.ARRAY:
        assert sub is not None
        if sub == gguf.GGUFValueType.STRING:
            return 4 + 8 + sum(8 + len(v.encode() if isinstance(v, str) else v) for v in value)
        return 4 + 8 + len(value) * struct.calcsize(gguf.GGUFWriter._simple_value_packing[sub])
    return struct.calcsize(gguf.GGUFWriter._simple_value_packing[vtype])


def header_bytes(model: Model) -> int:
    """Exact size of the GGUF header, metadata and tensor index, padded to the data alignment."""
    # Counted, not packed: packing a 262k-token vocabulary twice would double the start-up time.
    size = 4 + 4 + 8 + 8  # magic, version, tensor count, key count
    kvs = {Keys.General.ARCHITECTURE: KV(model.spec.arch, gguf.GGUFValueType.STRING)}
    kvs.update(model.metadata)
    for key, kv in kvs.items():
        size += 8 + len(key.encode()) + 4 + _value_bytes(kv.value, kv.vtype, kv.sub_type)
    for t in model.tensors:
        size += 8 + len(t.name.encode()) + 4 + 8 * len(t.ne) + 4 + 8
    return gguf.GGUFWriter.ggml_pad(size, gguf.GGUF_DEFAULT_ALIGNMENT)


def file_bytes(model: Model) -> int:
    """Exact size of the file `write_model` produces."""
    align = gguf.GGUF_DEFAULT_ALIGNMENT
    data = sum(gguf.GGUFWriter.ggml_pad(t.nbytes, align) for t in model.tensors)
    return header_bytes(model) + data


def _write_tensorless(writer: gguf.GGUFWriter, out: Path) -> int:
    """Write header, metadata and tensor index (no tensor data), close; returns the size."""
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
    finally:
        writer.close()
    return out.stat().st_size


def write_header_only(model: Model, out: Path) -> int:
    """Write the GGUF header, metadata and tensor index without tensor data; returns its size.

    Enough for readers of geometry (tensor names, shapes, types: model.geometry); llama.cpp
    cannot load it. The simulators serve one as their `model_path`.
    """
    return _write_tensorless(_writer(model, out), out)


def write_model(
    model: Model, out: Path, seed: int, progress: Callable[[int], None] | None = None
) -> int:
    """Stream the model to `out` tensor by tensor, chunk by chunk; returns the file size."""
    gen = np.random.Generator(np.random.SFC64(seed))
    align = gguf.GGUF_DEFAULT_ALIGNMENT
    writer = _writer(model, out)
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        assert writer.fout is not None
        fout = writer.fout[0]
        # Tensor offsets in the index are relative to an aligned data section; we write the
        # data ourselves because the writer wants each tensor whole in memory.
        writer.write_padding(fout, fout.tell())
        for plan in model.tensors:
            chunks = _random_chunks(plan, gen) if plan.fill == "random" else [_constant_bytes(plan)]
            for chunk in chunks:
                chunk.tofile(fout)
                if progress is not None:
                    progress(chunk.nbytes)
            writer.write_padding(fout, plan.nbytes, align)
        fout.flush()
        size = fout.tell()
    finally:
        writer.close()
    return size


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.2f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.2f} GiB"


def describe(model: Model, total: int) -> str:
    """Tensor list and totals, as `--dry-run` prints them."""
    lines = [f"{'tensor':<32} {'type':<5} {'shape (ne0, ne1, ...)':<20} bytes"]
    for t in model.tensors:
        lines.append(f"{t.name:<32} {t.qtype.name:<5} {t.ne!s:<20} {t.nbytes}")
    s = model.spec
    lines += [
        f"architecture: {s.arch} ({model.like}), {s.n_layer} layers, n_embd {s.n_embd}, "
        f"{s.n_head} heads / {s.n_head_kv} KV heads x {s.head_dim}, FFN {s.n_ff}, "
        f"vocab {s.n_vocab}, sliding window {s.sliding_window or 'none'}",
        f"tensors: {len(model.tensors)}",
        f"n_params: {model.n_params}",
        f"tensor data bytes: {model.data_bytes} ({_human(model.data_bytes)})",
        f"file bytes: {total} ({_human(total)})",
    ]
    return "\n".join(lines + _describe_reads(model))


def _describe_reads(model: Model) -> list[str]:
    split, s = weight_split(model), model.spec
    lines = []
    if s.is_moe:
        lines.append(
            f"experts: {s.n_expert}, {s.n_expert_used} used per token, FFN {s.n_ff_exp} each, "
            f"{s.expert_type}"
        )
    lines += [
        f"routed expert bytes: {split.routed_expert_bytes} ({_human(split.routed_expert_bytes)})",
        f"always-read bytes: {split.always_read_bytes} ({_human(split.always_read_bytes)})",
        f"token embedding row bytes: {split.token_embedding_row_bytes}",
    ]
    for batch in (1, 4, 16):
        active = round(weights_step_bytes(model, batch))
        label = (
            "active bytes per token" if batch == 1 else f"weight bytes per step at batch {batch}"
        )
        lines.append(f"{label}: {active} ({_human(active)})")
    return lines


def save_tokenizer(tok: dict[str, KV], arch: str, out: Path) -> int:
    """Write a tensor-free GGUF holding only the tokenizer (a few MB instead of the whole model)."""
    writer = FastWriter(out, arch)
    for key, kv in tok.items():
        writer.add_key_value(key, kv.value, kv.vtype, kv.sub_type)
    return _write_tensorless(writer, out)


def _source_arch(path: Path) -> str:
    arch = read_metadata(path).get(Keys.General.ARCHITECTURE)
    return bytes(arch.value).decode() if arch is not None else "llama"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="llmb-synth-model",
        description="Write a GGUF with the exact tensor shapes of a real model and random weights "
        "(nonsense text; the real model's compute, bandwidth and memory).",
    )
    p.add_argument("--like", choices=list(SPECS), help="architecture to copy")
    p.add_argument("--type", dest="wtype", default="q4_0", choices=list(WEIGHT_TYPES))
    p.add_argument(
        "--expert-type",
        choices=list(EXPERT_TYPES),
        help="weight type of the routed experts of an MoE shape (default: the shape's own, "
        "mxfp4 for gpt-oss, else --type)",
    )
    p.add_argument(
        "--tokenizer-from",
        type=Path,
        help="GGUF of the same family whose tokenizer.* metadata to copy (e.g. Gemma 3 270M)",
    )
    p.add_argument("--out", type=Path, help="GGUF file to write")
    p.add_argument("--layers", type=int, help="number of blocks (shrink the depth for tests)")
    p.add_argument("--ctx-train", type=int, help="override the training context length")
    p.add_argument("--seed", type=int, default=0, help="random seed (same seed, same bytes)")
    p.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    p.add_argument(
        "--dry-run", action="store_true", help="print tensors, bytes and n_params; write nothing"
    )
    tokenizer_only = "write only the tokenizer of --tokenizer-from to --out (small enough to carry)"
    p.add_argument("--save-tokenizer", action="store_true", help=tokenizer_only)
    return p


def _check_out(parser: argparse.ArgumentParser, out: Path | None, force: bool) -> Path:
    if out is None:
        parser.error("--out is required (or use --dry-run)")
    if out.exists() and not force:
        parser.error(f"{out} exists; pass --force to overwrite it")
    if not out.parent.is_dir():
        parser.error(f"folder {out.parent} does not exist")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `llmb-synth-model`; exit 2 on a bad request."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.tokenizer_from is not None and not args.tokenizer_from.is_file():
        parser.error(f"--tokenizer-from {args.tokenizer_from}: no such file")
    if args.save_tokenizer:
        if args.tokenizer_from is None:
            parser.error("--save-tokenizer needs --tokenizer-from")
        out = _check_out(parser, args.out, args.force)
        try:
            source = read_tokenizer(args.tokenizer_from)
        except SynthError as exc:
            parser.error(str(exc))
        size = save_tokenizer(source, _source_arch(args.tokenizer_from), out)
        print(f"wrote {out}: tokenizer only, {len(source)} keys, {size} bytes")
        return 0
    if args.like is None:
        parser.error("--like is required")
    if not args.dry_run:
        _check_out(parser, args.out, args.force)
    try:
        if args.tokenizer_from is not None:
            tok = read_tokenizer(args.tokenizer_from)
            tok_note = f"tokenizer: from {args.tokenizer_from}"
        else:
            tok = synthetic_tokenizer(SPECS[args.like].n_vocab)
            tok_note = "tokenizer: synthetic (no --tokenizer-from; prompt token counts will differ)"
        model = build_model(
            args.like, args.wtype, tok, args.layers, args.ctx_train, args.expert_type
        )
        total = file_bytes(model)
        if args.dry_run:
            print(describe(model, total))
            print(tok_note)
            return 0
        print(tok_note, file=sys.stderr)
        free = shutil.disk_usage(args.out.parent).free
        if free < total:
            raise SynthError(
                f"{args.out.parent} has {_human(free)} free, the model needs {_human(total)}"
            )
    except SynthError as exc:
        parser.error(str(exc))
    # Write beside the target and rename at the end: an interrupted run leaves no half model
    # that llama-server would later fail to load with a confusing error.
    partial = args.out.with_name(args.out.name + ".partial")
    bar = tqdm(
        total=model.data_bytes,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        disable=not sys.stderr.isatty(),
    )
    try:
        with bar:
            size = write_model(model, partial, args.seed, bar.update)
        os.replace(partial, args.out)
    finally:
        partial.unlink(missing_ok=True)
    print(
        f"wrote {args.out}: {size} bytes, {len(model.tensors)} tensors, n_params {model.n_params}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
