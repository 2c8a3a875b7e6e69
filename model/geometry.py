"""Model geometry: layers, KV heads, head sizes, sliding window and the weights' structure.

Read from a GGUF header (llama.cpp; model.gguf_header) or an HF `config.json` with
its safetensors headers (SGLang; model.safetensors). What a configured context
should take of KV cache is computed from it in model.kv_cache.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from model import flops, ggml_types, weights
from model.gguf_header import GGUFTensor, read_gguf_tensors
from model.safetensors import SafetensorsTotals, safetensors_totals

# Sliding-window layout of architectures whose GGUF does not carry
# `<arch>.attention.sliding_window_pattern`: every n-th layer is full attention,
# as llama.cpp's `hparams.set_swa_pattern(n)` for these architectures.
_SWA_PERIOD: dict[str, int] = {
    "gemma2": 2,
    "gemma3": 6,
    "gemma3_text": 6,
    "cohere2": 4,
    "gpt-oss": 2,
    "gpt_oss": 2,
}


# WeightStructure's fields that a WeightSplit carries under the same name.
_FROM_SPLIT = (
    "always_read_bytes",
    "routed_expert_bytes",
    "token_embedding_row_bytes",
    "token_embedding_bytes",
    "input_embedding_bytes",
    "tied_embeddings",
    "routed_expert_bytes_by_layer",
    "host_mapped_bytes_by_layers",
)


@dataclass(frozen=True, kw_only=True)
class WeightStructure:
    """What a decode step reads of the weights (model/weights.py; CONTRACT-roofline.md).

    `always_read_bytes` is None when the structure is unknown (then assume every weight).
    """

    always_read_bytes: int | None = None
    routed_expert_bytes: int = 0
    expert_count: int | None = None  # E (None for a dense model)
    expert_used_count: int | None = None  # k
    expert_shared_count: int | None = None
    leading_dense_block_count: int | None = None
    token_embedding_row_bytes: int = 0  # one row of an untied token embedding (0 when tied)
    token_embedding_bytes: int = 0  # the untied token-embedding table (0 when tied)
    input_embedding_bytes: int = 0  # the token-embedding table, tied or not (llama.cpp: host)
    tied_embeddings: bool | None = None
    routed_expert_bytes_by_layer: tuple[int, ...] = ()  # () for a dense model
    # GGUF: llama.cpp's host mapping with the experts of layers 0..n-1 on the host, n = 0..L
    host_mapped_bytes_by_layers: tuple[int, ...] = ()
    weights_source: str = ""  # gguf | safetensors | config

    @classmethod
    def of(
        cls,
        split: weights.WeightSplit,
        moe: tuple[int | None, int | None, int | None, int | None],
        source: str,
    ) -> WeightStructure:
        """From a byte split and (E, k, shared experts, leading dense blocks)."""
        experts, used, shared, leading = moe
        return cls(
            expert_count=experts,
            expert_used_count=used,
            expert_shared_count=shared,
            leading_dense_block_count=leading,
            weights_source=source,
            **{name: getattr(split, name) for name in _FROM_SPLIT},
        )

    def fields(self) -> dict[str, Any]:
        """The structure's fields as keyword arguments (for ModelGeometry)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(WeightStructure)}


class KVShape(NamedTuple):
    """What one layer caches per token: KV heads and their K/V sizes (MLA: one latent in K)."""

    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    kv_lora_rank: int | None = None  # MLA: the cache holds this latent + the rope key


@dataclass(frozen=True, kw_only=True)
class ModelGeometry(WeightStructure):
    """Shape facts of a model that decide its KV-cache size, and its weight structure."""

    architecture: str
    n_layer: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    sliding_window: int | None
    swa_layers: int  # how many layers use the sliding window
    n_params: int | None
    weight_bytes: int | None
    n_ctx_train: int | None
    file_type: str | None
    n_embd: int | None = None
    n_head: int | None = None
    # Per layer: True when the layer uses the sliding window; () when unknown.
    swa_mask: tuple[bool, ...] = ()
    kv_lora_rank: int | None = None  # MLA: the cache holds this latent + the rope key
    # Prefill (model/flops.py): parameters a prompt token multiplies through (MoE: k/E of
    # the routed experts) and per-head (query-key, value) sizes of its attention.
    prefill_matmul_params: int | None = None
    attention_head_dims: tuple[int, int] | None = None

    @property
    def is_moe(self) -> bool:
        """Whether the model has routed experts."""
        return self.routed_expert_bytes > 0 or bool(self.expert_count)

    @property
    def full_layers(self) -> int:
        """Layers that attend over the whole context."""
        return self.n_layer - self.swa_layers

    def is_swa(self, layer: int) -> bool:
        """Whether `layer` uses the sliding window."""
        if self.swa_mask:
            return self.swa_mask[layer]
        # Without a mask only the count is known; which layers they are then does not
        # matter except for a CPU/GPU split, where this is the best guess.
        return layer < self.swa_layers

    def kv_bytes_per_layer_token(
        self, type_k_bytes: float = 2.0, type_v_bytes: float = 2.0
    ) -> float:
        """K+V bytes one layer stores for one token."""
        return self.n_head_kv * (self.head_dim_k * type_k_bytes + self.head_dim_v * type_v_bytes)

    def kv_bytes_per_token(
        self, kv_dtype_bytes: float = 2.0, type_v_bytes: float | None = None
    ) -> float:
        """KV bytes per token of context over the full-attention layers only.

        Sliding-window layers stop growing at the window, so this is what each extra
        token of context costs once a sequence is longer than the window. `kv_dtype_bytes`
        is the K element size (and V's unless `type_v_bytes` is given); see `kv_type_bytes`.
        """
        v_bytes = kv_dtype_bytes if type_v_bytes is None else type_v_bytes
        return self.full_layers * self.kv_bytes_per_layer_token(kv_dtype_bytes, v_bytes)


def _swa_mask(
    arch: str, n_layer: int, sliding_window: int | None, pattern: Any = None
) -> tuple[bool, ...]:
    """Per-layer SWA flags from an explicit pattern (period or list) or the architecture."""
    if not sliding_window:
        return ()
    if isinstance(pattern, Sequence) and not isinstance(pattern, str):
        flags = tuple(bool(x) for x in pattern)
        return flags if len(flags) == n_layer else ()
    period = (
        int(pattern) if isinstance(pattern, (int, float)) and pattern else _SWA_PERIOD.get(arch)
    )
    if not period:
        return ()
    if period == 1:
        return (True,) * n_layer
    return tuple(layer % period < period - 1 for layer in range(n_layer))


# Beyond these a header is corrupt, not a model: refuse it before sizing per-layer tables.
MAX_LAYERS = 10_000
MAX_HEAD_SIZE = 1 << 20
MAX_EXPERTS = 1 << 16


def _check_shape(n_layer: int, kv: KVShape) -> None:
    if not 0 < n_layer <= MAX_LAYERS:
        raise ValueError(f"implausible layer count {n_layer}")
    for name, value in (
        ("n_head_kv", kv.n_head_kv),
        ("head_dim_k", kv.head_dim_k),
        ("head_dim_v", kv.head_dim_v),
    ):
        if not 0 <= value <= MAX_HEAD_SIZE:
            raise ValueError(f"implausible {name} {value}")


def _as_int(value: Any) -> int | None:
    """An int from a GGUF/JSON value; per-layer arrays give their maximum."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        return max((int(v) for v in value), default=None)
    return int(value)


def _file_type_name(value: Any) -> str | None:
    if value is None:
        return None
    return ggml_types.file_type_name(int(value))


def _gguf_kv_shape(key: Callable[[str], Any], n_embd: int | None, n_head: int | None) -> KVShape:
    """The KV shape as llama.cpp sizes its cache.

    MLA models (DeepSeek-V2/V3, `attention.kv_lora_rank`) cache one latent of kv_lora_rank
    plus the rope key per token and layer, in K only (llama.cpp's V-less cache, PR #19067).
    """
    kv_lora = _as_int(key("attention.kv_lora_rank")) or None
    if kv_lora:
        return KVShape(1, kv_lora + (_as_int(key("rope.dimension_count")) or 0), 0, kv_lora)
    n_head_kv = _as_int(key("attention.head_count_kv")) or n_head or 0
    default_head_dim = n_embd // n_head if n_embd and n_head else 0
    head_k = _as_int(key("attention.key_length")) or default_head_dim
    head_v = _as_int(key("attention.value_length")) or default_head_dim
    return KVShape(n_head_kv, head_k, head_v)


def _hf_kv_shape(text: Mapping[str, Any], n_embd: int | None, n_head: int | None) -> KVShape:
    """The KV shape from an HF text config; MLA (DeepSeek-style): one compressed latent +
    the rope key per token and layer."""
    if text.get("kv_lora_rank"):
        kv_lora = int(text["kv_lora_rank"])
        return KVShape(1, kv_lora + int(text.get("qk_rope_head_dim") or 0), 0, kv_lora)
    n_head_kv = int(text.get("num_key_value_heads") or n_head or 0)
    head_dim = int(text.get("head_dim") or (n_embd // n_head if n_embd and n_head else 0))
    return KVShape(n_head_kv, head_dim, head_dim)


class _Layers(NamedTuple):
    architecture: str
    n_layer: int
    n_embd: int | None
    n_head: int | None


class _FileFacts(NamedTuple):
    n_params: int | None
    weight_bytes: int | None
    n_ctx_train: int | None
    file_type: str | None


def _geometry(
    layers: _Layers,
    kv: KVShape,
    window: tuple[int | None, tuple[bool, ...]],
    facts: _FileFacts,
    structure: WeightStructure,
) -> ModelGeometry:
    """Assemble what a reader found; `window` is (sliding window, per-layer SWA mask)."""
    sliding_window, mask = window
    return ModelGeometry(
        sliding_window=sliding_window,
        swa_layers=sum(mask),
        swa_mask=mask,
        **layers._asdict(),
        **kv._asdict(),
        **facts._asdict(),
        **structure.fields(),
    )


def _gguf_rows(tensor: GGUFTensor) -> int:
    # GGUF dims run ne0 first: an embedding table is [n_embd, n_vocab].
    return tensor.shape[-1] if len(tensor.shape) >= 2 else 1


def _gguf_moe(key: Callable[[str], Any], tensors: list[GGUFTensor]) -> WeightStructure:
    """ModelGeometry's MoE fields from the GGUF keys and tensor infos."""
    nextn = _as_int(key("nextn_predict_layers")) or 0
    n_layer = _as_int(key("block_count")) or 0
    split = weights.split_tensors(
        (weights.TensorInfo(t.name, t.nbytes, _gguf_rows(t)) for t in tensors),
        n_layer,
        first_skipped_layer=n_layer - nextn if nextn else None,
    )
    experts = _as_int(key("expert_count")) or None
    if experts is None and split.routed_expert_bytes:
        # A 3-D expert tensor is [.., .., n_expert].
        experts = next((t.shape[-1] for t in tensors if len(t.shape) == 3), None)
    used = _as_int(key("expert_used_count")) or None
    if experts is not None and not 0 < experts <= MAX_EXPERTS:
        experts = used = None  # a corrupt header, not a model
    if used is not None and (experts is None or not 0 < used <= experts):
        used = None
    return WeightStructure.of(
        split,
        (
            experts,
            used,
            (_as_int(key("expert_shared_count")) or 0) if experts else None,
            (_as_int(key("leading_dense_block_count")) or 0) if experts else None,
        ),
        "gguf",
    )


def geometry_from_gguf(path: str | Path) -> ModelGeometry:
    """Read the geometry from a GGUF file's header (tensor data is not read)."""
    meta, tensors = read_gguf_tensors(path)
    arch = str(meta.get("general.architecture") or "")
    if not arch:
        raise ValueError(f"{path}: no general.architecture")

    def key(name: str) -> Any:
        return meta.get(f"{arch}.{name}")

    n_layer = _as_int(key("block_count"))
    if not n_layer:
        raise ValueError(f"{path}: no {arch}.block_count")
    n_embd = _as_int(key("embedding_length"))
    n_head = _as_int(key("attention.head_count"))
    kv = _gguf_kv_shape(key, n_embd, n_head)
    _check_shape(n_layer, kv)
    window = _as_int(key("attention.sliding_window")) or None
    mask = _swa_mask(arch, n_layer, window, key("attention.sliding_window_pattern"))
    moe = _gguf_moe(key, tensors) if tensors else WeightStructure()
    params = sum(t.n_elements for t in tensors) if tensors else None
    size = sum(t.nbytes for t in tensors) if tensors else None
    file_type = _file_type_name(meta.get("general.file_type"))
    facts = _FileFacts(params, size, _as_int(key("context_length")), file_type)
    geo = _geometry(_Layers(arch, n_layer, n_embd, n_head), kv, (window, mask), facts, moe)
    nextn = _as_int(key("nextn_predict_layers")) or 0
    matmul = flops.gguf_matmul_params(
        tensors, n_layer - nextn, geo.expert_count, geo.expert_used_count
    )
    return dataclasses.replace(
        geo, prefill_matmul_params=matmul, attention_head_dims=flops.gguf_attention_dims(key)
    )


def _hf_structure(
    config: Mapping[str, Any],
    text: Mapping[str, Any],
    dtype: str | None,
    files: SafetensorsTotals | None,
) -> WeightStructure:
    """The weight structure: safetensors sizes when present, else the config's shapes.

    ValueError (and the errors of odd values) when the config's MoE keys make no sense.
    """
    n_layer = int(text["num_hidden_layers"])
    split, counts = weights.config_split(config, text, dtype)
    source = "config"
    if files is not None and files.tensors:
        # Layers past num_hidden_layers are multi-token-prediction heads (DeepSeek-V3's 61).
        split = weights.split_tensors(
            files.tensors, n_layer, gguf=False, first_skipped_layer=n_layer
        )
        source = "safetensors"
    moe = counts.moe
    if moe.experts > MAX_EXPERTS or not 0 <= moe.used <= moe.experts:
        raise ValueError(f"implausible experts {moe.experts} / used {moe.used}")
    parts = (split.always_read_bytes, split.routed_expert_bytes, split.token_embedding_bytes)
    if min(parts) < 0:
        raise ValueError("negative weight bytes")
    experts = moe.experts or None
    return WeightStructure.of(
        split,
        (
            experts,
            moe.used or None,
            moe.shared if experts else None,
            moe.leading_dense if experts else None,
        ),
        source,
    )


def geometry_from_hf_config(path_or_mapping: str | Path | Mapping[str, Any]) -> ModelGeometry:
    """Geometry from an HF `config.json` (a file, its model directory, or the parsed mapping).

    Multimodal configs (Gemma 3) keep the language model under `text_config`. For a
    directory, parameters and weight bytes come from the safetensors headers.
    """
    files: SafetensorsTotals | None = None
    if isinstance(path_or_mapping, Mapping):
        config: Mapping[str, Any] = path_or_mapping
    else:
        path = Path(path_or_mapping)
        directory = path if path.is_dir() else path.parent
        file = path / "config.json" if path.is_dir() else path
        config = json.loads(file.read_text(encoding="utf-8"))
        files = safetensors_totals(directory)
    text = config.get("text_config") or config
    arch_list = config.get("architectures") or []
    model_type = str(text.get("model_type") or config.get("model_type") or "")
    architecture = str(arch_list[0]) if arch_list else model_type
    n_layer = int(text["num_hidden_layers"])
    n_head = int(text.get("num_attention_heads") or 0) or None
    n_embd = int(text.get("hidden_size") or 0) or None
    kv = _hf_kv_shape(text, n_embd, n_head)
    _check_shape(n_layer, kv)
    sliding_window = _as_int(text.get("sliding_window")) or None
    layer_types = text.get("layer_types")
    if text.get("use_sliding_window") is False:
        # Qwen-style configs carry a window that is switched off.
        mask: tuple[bool, ...] = ()
    elif isinstance(layer_types, list) and len(layer_types) == n_layer and sliding_window:
        mask = tuple(str(t).startswith("sliding") for t in layer_types)
    elif text.get("use_sliding_window") and sliding_window:
        first_swa = int(text.get("max_window_layers") or 0)
        mask = tuple(layer >= first_swa for layer in range(n_layer))
    else:
        mask = _swa_mask(model_type, n_layer, sliding_window, text.get("sliding_window_pattern"))
    raw_dtype = text.get("torch_dtype") or text.get("dtype") or config.get("torch_dtype")
    dtype = str(raw_dtype) if raw_dtype else None
    params, size = (files.params, files.size) if files else (None, None)
    facts = _FileFacts(params, size, _as_int(text.get("max_position_embeddings")), dtype)
    try:
        structure = _hf_structure(config, text, dtype, files)
    except (ValueError, TypeError, ArithmeticError, AttributeError):
        # A strange `mlp_only_layers` or `quantization_config` must not cost the KV geometry.
        structure = WeightStructure()
    layers = _Layers(architecture, n_layer, n_embd, n_head)
    geo = _geometry(layers, kv, (sliding_window, mask), facts, structure)
    return dataclasses.replace(
        geo,
        prefill_matmul_params=_hf_matmul_params(config, text),
        attention_head_dims=flops.hf_attention_dims(text),
    )


def _hf_matmul_params(config: Mapping[str, Any], text: Mapping[str, Any]) -> int | None:
    """Parameters a prompt token multiplies through, from the config's shapes."""
    try:
        counts = weights.config_weights(config, text)
    except (ValueError, TypeError, ArithmeticError, AttributeError, KeyError):
        return None
    moe = counts.moe
    routed = counts.routed_params * moe.used / moe.experts if moe.experts else 0
    return round(counts.always_params + routed) or None
