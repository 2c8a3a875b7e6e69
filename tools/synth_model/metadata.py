"""GGUF metadata: the architecture keys llama.cpp reads, and tokenizers (copied or made up)."""

from __future__ import annotations

import struct
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import gguf
from gguf.constants import Keys

from model.gguf_header import read_gguf_fields
from tools.synth_model.shapes import WEIGHT_TYPES, ArchSpec, SynthError


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
        # Explicit because head_dim is not always n_embd / n_head (Gemma 3, Qwen 3); MLA
        # values are narrower than its keys (DeepSeek-V2: 192 and 128).
        (Keys.Attention.KEY_LENGTH, spec.head_dim, u32),
        (Keys.Attention.VALUE_LENGTH, spec.v_head_dim or spec.head_dim, u32),
    ]
    shape += [(Keys.Attention.LAYERNORM_RMS_EPS, spec.rms_eps, f32)]
    shape += [(Keys.Rope.FREQ_BASE, spec.rope_freq_base, f32)]
    shape += [(Keys.Rope.DIMENSION_COUNT, spec.rope_dim or spec.head_dim, u32)]
    if spec.is_mla:
        shape += [(Keys.Attention.KV_LORA_RANK, spec.kv_lora_rank, u32)]
    if spec.n_dense_lead:
        shape += [(Keys.LLM.LEADING_DENSE_BLOCK_COUNT, spec.n_dense_lead, u32)]
    if spec.n_expert_shared:
        shape += [(Keys.LLM.EXPERT_SHARED_COUNT, spec.n_expert_shared, u32)]
        # DeepSeek-V2-Lite's routed_scaling_factor.
        shape += [(Keys.LLM.EXPERT_WEIGHTS_SCALE, 1.0, f32)]
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
