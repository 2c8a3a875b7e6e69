"""Which weight bytes one decode step reads: the always-read part, routed experts, embedding rows.

A decode step reads every weight of attention, norms, dense FFN layers, shared experts and the
router, and the output projection, whatever the batch. Of a mixture-of-experts layer it reads
only the experts the batch's tokens were routed to, and of an untied token-embedding table only
one row per sequence. `WeightSplit` holds those parts of one model; the decision core turns them
into bytes per step (core/). The split comes from tensor names and sizes (GGUF
tensor infos, safetensors headers) or, without weights at hand, from an HF `config.json`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

# GGUF routed-expert tensors: blk.N.ffn_{gate,up,down,gate_up}_exps.{weight,bias,scale},
# ffn_norm_exps, and the chunked experts ffn_*_chexps (gguf-py constants / llama-arch.cpp).
GGUF_ROUTED = re.compile(r"_(?:ch)?exps\.")
GGUF_BLOCK = re.compile(r"^blk\.(\d{1,6})\.")
# Lookup tables: a step reads one row per sequence of these when the output is not tied to them.
GGUF_LOOKUP = ("token_embd.weight", "per_layer_token_embd.weight")
GGUF_OUTPUT = "output.weight"
# HF checkpoints: model.layers.N.mlp.experts.M.* or fused mlp.experts.gate_up_proj (gpt-oss);
# "shared_experts." / "shared_expert." do not match (no dot right before "experts").
HF_ROUTED = re.compile(r"\.experts\.")
HF_BLOCK = re.compile(r"\.layers\.(\d{1,6})\.")
HF_LOOKUP = ("embed_tokens.weight",)
HF_OUTPUT = "lm_head.weight"
# Towers of multimodal checkpoints: not read by a text decode step.
HF_NOT_DECODE = re.compile(r"vision|visual|multi_modal_projector|audio")


@dataclass(frozen=True)
class TensorInfo:
    """One weight tensor: its name, bytes, and rows (the vocabulary for an embedding table)."""

    name: str
    nbytes: int
    rows: int = 1


@dataclass(frozen=True)
class WeightSplit:
    """A model's weight bytes by how a decode step reads them."""

    always_read_bytes: int
    routed_expert_bytes: int
    token_embedding_bytes: int  # untied lookup tables (0 when tied)
    token_embedding_row_bytes: int  # one row of each untied lookup table (0 when tied)
    tied_embeddings: bool
    routed_expert_bytes_by_layer: tuple[int, ...] = ()  # routed-expert bytes of each layer
    skipped_bytes: int = 0  # multi-token-prediction layers a plain decode step never reads
    input_embedding_bytes: int = 0  # the token-embedding table(s), tied or not
    # GGUF, per n = 0..n_layer: the file span llama.cpp maps into host memory when the token
    # embedding and the routed experts of layers 0..n-1 stay there (`--n-cpu-moe n`).
    host_mapped_bytes_by_layers: tuple[int, ...] = ()


# GGUF's default data alignment (`general.alignment`): every tensor starts on it.
GGUF_ALIGNMENT = 32


def host_mapped_spans(tensors: list[TensorInfo], n_layer: int) -> tuple[int, ...]:
    """Bytes of the host mapping for `--n-cpu-moe n`, n = 0..n_layer (GGUF, file order).

    With mmap llama.cpp maps one range of the file per buffer type: from the first to the
    last tensor it keeps there, so the tensors in between (the attention weights of every
    host layer) count too. Its `CPU_Mapped model buffer size` is that span.
    """
    offsets, pos = [], 0
    for t in tensors:
        offsets.append(pos)
        pos += -(-t.nbytes // GGUF_ALIGNMENT) * GGUF_ALIGNMENT
    # Each layer's routed-expert tensors as (first, last) positions in the file.
    layer_range: list[tuple[int, int] | None] = [None] * n_layer
    for i, t in enumerate(tensors):
        match = GGUF_BLOCK.search(t.name)
        if match and GGUF_ROUTED.search(t.name) and int(match[1]) < n_layer:
            seen = layer_range[int(match[1])]
            layer_range[int(match[1])] = (i, i) if seen is None else (seen[0], i)
    held = [i for i, t in enumerate(tensors) if t.name in GGUF_LOOKUP]
    spans = []
    for n in range(n_layer + 1):
        if n and (part := layer_range[n - 1]) is not None:
            held.extend(part)
        lo, hi = (min(held), max(held)) if held else (0, -1)
        spans.append(offsets[hi] + tensors[hi].nbytes - offsets[lo] if held else 0)
    return tuple(spans)


def split_tensors(
    tensors: Iterable[TensorInfo],
    n_layer: int,
    *,
    gguf: bool = True,
    first_skipped_layer: int | None = None,
) -> WeightSplit:
    """Classify tensors by name into always-read, routed-expert and lookup-table bytes.

    `first_skipped_layer`: blocks from here on (GGUF `nextn_predict_layers`, the MTP head) are
    not read by a plain decode step and count in `skipped_bytes` only.
    """
    routed_re, block_re = (GGUF_ROUTED, GGUF_BLOCK) if gguf else (HF_ROUTED, HF_BLOCK)
    lookup_names, output_name = (GGUF_LOOKUP, GGUF_OUTPUT) if gguf else (HF_LOOKUP, HF_OUTPUT)
    items = [t for t in tensors if gguf or not HF_NOT_DECODE.search(t.name)]

    # GGUF names are exact ("blk.N.attn_output.weight" also ends in "output.weight"); HF
    # names carry a module prefix ("model.", "language_model.").
    def named(name: str, targets: tuple[str, ...]) -> bool:
        return name in targets if gguf else name.endswith(targets)

    tied = not any(named(t.name, (output_name,)) for t in items)
    always = routed = lookup = row = skipped = table = 0
    by_layer = [0] * n_layer
    for t in items:
        match = block_re.search(t.name)
        layer = int(match[1]) if match else None
        if layer is not None and first_skipped_layer is not None and layer >= first_skipped_layer:
            skipped += t.nbytes
            continue
        is_table = named(t.name, lookup_names)
        table += t.nbytes if is_table else 0
        if routed_re.search(t.name):
            routed += t.nbytes
            if layer is not None and layer < n_layer:
                by_layer[layer] += t.nbytes
        elif is_table and not tied:
            lookup += t.nbytes
            row += t.nbytes // max(1, t.rows)
        else:
            # With a tied embedding the table is the output projection, read in full.
            always += t.nbytes
    return WeightSplit(
        always_read_bytes=always,
        routed_expert_bytes=routed,
        token_embedding_bytes=lookup,
        token_embedding_row_bytes=row,
        tied_embeddings=tied,
        routed_expert_bytes_by_layer=tuple(by_layer) if routed else (),
        skipped_bytes=skipped,
        input_embedding_bytes=table,
        host_mapped_bytes_by_layers=host_mapped_spans(items, n_layer) if gguf and routed else (),
    )


# --- HF config.json ----------------------------------------------------------------------------


def _int(config: Mapping[str, Any], *names: str) -> int:
    """The first of `names` that the config sets to a number, else 0."""
    for name in names:
        value = config.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return int(value)
    return 0


@dataclass(frozen=True)
class MoEShape:
    """Mixture-of-experts facts of an HF config (all 0 for a dense model)."""

    experts: int
    used: int
    shared: int  # shared experts (DeepSeek n_shared_experts; Qwen2-MoE: 1 shared expert)
    expert_ffn: int  # intermediate size of one routed expert
    shared_ffn: int  # intermediate size of all shared experts together
    moe_layers: tuple[bool, ...]  # per layer: True when its FFN is a routed MoE block

    @property
    def leading_dense(self) -> int:
        """Dense layers before the first MoE layer."""
        return next((i for i, moe in enumerate(self.moe_layers) if moe), len(self.moe_layers))


def moe_shape(text: Mapping[str, Any], n_layer: int) -> MoEShape:
    """Experts and MoE layers from HF keys of Qwen2/3-MoE, DeepSeek-V2/V3, Mixtral, gpt-oss."""
    experts = _int(text, "num_experts", "num_local_experts", "n_routed_experts")
    if experts <= 1:
        return MoEShape(0, 0, 0, 0, 0, (False,) * n_layer)
    used = _int(text, "num_experts_per_tok", "experts_per_token", "num_experts_per_token")
    expert_ffn = _int(text, "moe_intermediate_size") or _int(text, "intermediate_size")
    n_shared = _int(text, "n_shared_experts")
    shared_ffn = n_shared * expert_ffn
    if _int(text, "shared_expert_intermediate_size"):
        n_shared, shared_ffn = 1, _int(text, "shared_expert_intermediate_size")
    first_dense = _int(text, "first_k_dense_replace")
    freq = max(1, _int(text, "moe_layer_freq") or 1)
    step = max(1, _int(text, "decoder_sparse_step") or 1)
    mlp_only = text.get("mlp_only_layers")
    dense_only = (
        {x for x in mlp_only if isinstance(x, int)} if isinstance(mlp_only, list) else set()
    )
    layers = tuple(
        layer >= first_dense
        and layer % freq == 0
        and (layer + 1) % step == 0
        and layer not in dense_only
        for layer in range(n_layer)
    )
    return MoEShape(experts, used, n_shared, expert_ffn, shared_ffn, layers)


def _attention_params(text: Mapping[str, Any], hidden: int) -> int:
    """Weights of one attention block (projections, biases, q/k norms, sinks)."""
    n_head = _int(text, "num_attention_heads")
    kv_lora = _int(text, "kv_lora_rank")
    if kv_lora:
        q_lora = _int(text, "q_lora_rank")
        nope, rope = _int(text, "qk_nope_head_dim"), _int(text, "qk_rope_head_dim")
        v_head = _int(text, "v_head_dim") or nope
        q_out = n_head * (nope + rope)
        q = hidden * q_lora + q_lora + q_lora * q_out if q_lora else hidden * q_out
        kv = hidden * (kv_lora + rope) + kv_lora + kv_lora * n_head * (nope + v_head)
        return q + kv + n_head * v_head * hidden
    n_kv = _int(text, "num_key_value_heads") or n_head
    head = _int(text, "head_dim") or (hidden // n_head if n_head else 0)
    params = 2 * hidden * n_head * head + 2 * hidden * n_kv * head
    model_type = str(text.get("model_type") or "")
    if text.get("attention_bias") or model_type.startswith("qwen2"):
        params += (n_head + 2 * n_kv) * head
    if model_type.startswith(("qwen3", "gemma3", "olmo2")):
        params += 2 * head  # q_norm, k_norm
    if model_type.startswith("gpt_oss"):
        params += n_head + hidden  # attention sinks, o_proj bias
    return params


@dataclass(frozen=True)
class ConfigWeights:
    """Parameter counts of an HF config, split as a decode step reads them."""

    always_params: int  # attention, norms, dense FFNs, shared experts, routers (no embeddings)
    routed_params: int
    routed_by_layer: tuple[int, ...]
    embedding_params: int  # the token-embedding table
    output_params: int  # the untied output projection (0 when tied)
    moe: MoEShape

    @property
    def total_params(self) -> int:
        """All parameters."""
        return self.always_params + self.routed_params + self.embedding_params + self.output_params


def _tied(config: Mapping[str, Any], text: Mapping[str, Any]) -> bool:
    for source in (text, config):
        value = source.get("tie_word_embeddings")
        if isinstance(value, bool):
            return value
    # Transformers' per-model defaults: Gemma ties, Llama/Qwen/Mistral/DeepSeek/gpt-oss do not.
    return str(text.get("model_type") or config.get("model_type") or "").startswith("gemma")


def config_weights(config: Mapping[str, Any], text: Mapping[str, Any]) -> ConfigWeights:
    """Count parameters from an HF config (language model of `text`, whole `config` for flags)."""
    n_layer = _int(text, "num_hidden_layers")
    hidden = _int(text, "hidden_size")
    dense_ffn = _int(text, "intermediate_size")
    moe = moe_shape(text, n_layer)
    gpt_oss = str(text.get("model_type") or "").startswith("gpt_oss")
    attention = _attention_params(text, hidden) + 4 * hidden  # + up to 4 norms per layer
    always = routed = 0
    by_layer = []
    for is_moe in moe.moe_layers:
        layer_routed = 0
        if is_moe:
            expert = 3 * hidden * moe.expert_ffn + (2 * moe.expert_ffn + hidden if gpt_oss else 0)
            layer_routed = moe.experts * expert
            router = hidden * moe.experts + (moe.experts if gpt_oss else 0)
            shared_gate = hidden if _int(text, "shared_expert_intermediate_size") else 0
            always += attention + router + 3 * hidden * moe.shared_ffn + shared_gate
        else:
            always += attention + 3 * hidden * dense_ffn
        routed += layer_routed
        by_layer.append(layer_routed)
    vocab = _int(text, "vocab_size")
    tied = _tied(config, text)
    return ConfigWeights(
        always_params=always + hidden,  # + the final norm
        routed_params=routed,
        routed_by_layer=tuple(by_layer),
        embedding_params=vocab * hidden,
        output_params=0 if tied else vocab * hidden,
        moe=moe,
    )


_DTYPE_BYTES = {
    "float32": 4.0,
    "float": 4.0,
    "bfloat16": 2.0,
    "float16": 2.0,
    "half": 2.0,
    "float8_e4m3fn": 1.0,
    "float8_e5m2": 1.0,
}
# A config that describes more than this (1 PiB) is corrupt, not a model.
MAX_MODEL_BYTES = 1 << 50
# MXFP4: blocks of 32 four-bit values with one shared 8-bit exponent (gpt-oss experts).
MXFP4_BYTES = 17 / 32


def _quantized_bytes(config: Mapping[str, Any]) -> tuple[float | None, bool]:
    """(bytes per quantized parameter, experts only?) from `quantization_config`."""
    quant = config.get("quantization_config")
    if not isinstance(quant, Mapping):
        return None, False
    method = str(quant.get("quant_method") or "").lower()
    if method == "mxfp4":
        return MXFP4_BYTES, True
    if method.startswith("fp8"):
        return 1.0, False
    bits = quant.get("bits") or quant.get("w_bit")
    if isinstance(bits, int) and 0 < bits <= 16:
        return bits / 8, False
    return None, False


def config_split(
    config: Mapping[str, Any], text: Mapping[str, Any], dtype: str | None
) -> tuple[WeightSplit, ConfigWeights]:
    """Bytes per part from config counts x the checkpoint dtype (and its quantization)."""
    counts = config_weights(config, text)
    base = _DTYPE_BYTES.get(str(dtype or "bfloat16").removeprefix("torch."), 2.0)
    quant, experts_only = _quantized_bytes(config)
    linear = base if quant is None or experts_only else quant
    expert_bytes = base if quant is None else quant
    embedding = round(counts.embedding_params * base)
    output = round(counts.output_params * base)
    hidden = _int(text, "hidden_size")
    by_layer = tuple(round(p * expert_bytes) for p in counts.routed_by_layer)
    if counts.total_params * base > MAX_MODEL_BYTES:
        raise ValueError(f"implausible model size: {counts.total_params} parameters")
    split = WeightSplit(
        always_read_bytes=round(counts.always_params * linear) + (output or embedding),
        routed_expert_bytes=sum(by_layer),
        token_embedding_bytes=embedding if output else 0,
        token_embedding_row_bytes=round(hidden * base) if output else 0,
        tied_embeddings=not output,
        routed_expert_bytes_by_layer=by_layer if counts.routed_params else (),
        input_embedding_bytes=embedding,
    )
    return split, counts
