"""Model geometry (layers, KV heads, head sizes, sliding window) and KV-cache size estimates.

The geometry is read from a GGUF header (llama.cpp) or an HF `config.json` (SGLang). The
estimates reproduce how each engine sizes its KV cache, so the exporter can say how much
memory a configured context *should* take and compare it with what the engine reports:

* llama.cpp (`llama-context.cpp`, `llama-kv-cache-iswa.cpp`): `n_ctx` is padded to 256;
  without `--kv-unified` every sequence gets its own stream of `pad256(n_ctx / n_seq)` cells,
  with it one stream of `n_ctx` cells. Full-attention layers hold all cells of a stream;
  sliding-window layers hold `pad256(min(cells, n_swa * (n_seq if unified else 1) + n_ubatch))`
  (all cells with `--swa-full`). Layers below `n_layer + 1 - ngl` keep their KV on the CPU.
* SGLang (`mem_cache/memory_pool.py`): every layer holds `max_total_num_tokens + page_size`
  token slots (the extra page is a dummy slot for padded tokens); hybrid-SWA models keep the
  sliding-window layers in a second, smaller pool.
"""

from __future__ import annotations

import dataclasses
import json
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exporter.model import ggml_types, weights

# llama.cpp pads contexts and the SWA cache to this many cells.
LLAMACPP_PAD = 256

# Bytes per element of llama.cpp KV cache types (`--cache-type-k/-v`): block bytes / block size.
LLAMACPP_KV_TYPE_BYTES: dict[str, float] = {
    "f32": 4.0,
    "f16": 2.0,
    "bf16": 2.0,
    "q8_0": 34 / 32,
    "q4_0": 18 / 32,
    "q4_1": 20 / 32,
    "iq4_nl": 18 / 32,
    "q5_0": 22 / 32,
    "q5_1": 24 / 32,
}

# SGLang `--kv-cache-dtype` values; "auto" is the model's dtype (16-bit for the checkpoints
# this tool sees; SGLang keeps fp32 models' KV in fp32, which `kv_type_bytes` cannot know).
SGLANG_KV_DTYPE_BYTES: dict[str, float] = {
    "auto": 2.0,
    "bf16": 2.0,
    "bfloat16": 2.0,
    "float16": 2.0,
    "fp16": 2.0,
    "float32": 4.0,
    "fp8_e4m3": 1.0,
    "fp8_e5m2": 1.0,
    "fp4_e2m1": 0.5,
}


def kv_type_bytes(name: str) -> float:
    """Bytes per element of a KV cache type: llama.cpp `-ctk/-ctv` or SGLang `--kv-cache-dtype`.

    Quantized llama.cpp types store blocks (q8_0: 34 bytes per 32 values). ValueError when
    the name is not a KV type either engine knows.
    """
    key = name.strip().lower()
    if key in LLAMACPP_KV_TYPE_BYTES:
        return LLAMACPP_KV_TYPE_BYTES[key]
    if key in SGLANG_KV_DTYPE_BYTES:
        return SGLANG_KV_DTYPE_BYTES[key]
    raise ValueError(f"unknown KV cache type {name!r}")


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


@dataclass(frozen=True)
class ModelGeometry:
    """Shape facts of a model that decide its KV-cache size."""

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
    # What a decode step reads of the weights (exporter/model/weights.py; CONTRACT-roofline.md).
    # always_read_bytes is None when the structure is unknown (then assume every weight).
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
    kv_lora_rank: int | None = None  # MLA: the cache holds this latent + the rope key
    weights_source: str = ""  # gguf | safetensors | config

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


@dataclass(frozen=True)
class KVEstimate:
    """KV-cache bytes an engine allocates, split into full-attention and sliding-window caches.

    `cells_*` are per stream, as llama.cpp logs them (`size = ... (N cells, ...)`); llama.cpp
    without `--kv-unified` has one stream per sequence, everything else one stream.
    """

    full_bytes: int
    swa_bytes: int
    cells_full: int
    cells_swa: int
    n_stream: int = 1
    cpu_bytes: int = 0  # part of the total kept in host memory (layers not offloaded)

    @property
    def total(self) -> int:
        """All KV bytes."""
        return self.full_bytes + self.swa_bytes

    @property
    def gpu_bytes(self) -> int:
        """KV bytes on the GPU."""
        return self.total - self.cpu_bytes


def _pad(value: int, to: int) -> int:
    return (value + to - 1) // to * to


def estimate_llamacpp_kv(
    geom: ModelGeometry,
    n_ctx: int,
    n_seq: int = 1,
    kv_unified: bool = False,
    n_ubatch: int = 512,
    type_k_bytes: float = 2.0,
    type_v_bytes: float = 2.0,
    swa_full: bool = False,
    n_gpu_layers: int | None = None,
    type_k: str | None = None,
    type_v: str | None = None,
) -> KVEstimate:
    """KV cache llama-server allocates for `-c n_ctx -np n_seq [-kvu] [-ub n_ubatch]`.

    `n_ctx` 0 means the training context, as in llama.cpp. `n_gpu_layers` is `-ngl`
    (None: all layers on the GPU); it only moves bytes between `cpu_bytes` and the GPU.
    `type_k`/`type_v` are `-ctk`/`-ctv` names (f16, q8_0, ...); they override the byte sizes.
    """
    if type_k is not None:
        type_k_bytes = kv_type_bytes(type_k)
    if type_v is not None:
        type_v_bytes = kv_type_bytes(type_v)
    if n_ctx <= 0:
        if not geom.n_ctx_train:
            raise ValueError("n_ctx is 0 and the model has no training context")
        n_ctx = geom.n_ctx_train
    n_seq = max(1, n_seq)
    n_ctx = _pad(n_ctx, LLAMACPP_PAD)
    if kv_unified:
        n_stream, cells = 1, n_ctx
    else:
        n_stream, cells = n_seq, _pad(n_ctx // n_seq, LLAMACPP_PAD)
    cells_swa = 0
    if geom.swa_layers and geom.sliding_window:
        window = geom.sliding_window * (n_seq if kv_unified else 1) + n_ubatch
        cells_swa = cells if swa_full else _pad(min(cells, window), LLAMACPP_PAD)
    per_layer_cell = geom.kv_bytes_per_layer_token(type_k_bytes, type_v_bytes)
    full_layer_bytes = round(cells * n_stream * per_layer_cell)
    swa_layer_bytes = round(cells_swa * n_stream * per_layer_cell)
    # llama.cpp offloads the last ngl-1 repeating layers (the output layer counts as one).
    gpu_start = 0 if n_gpu_layers is None else max(geom.n_layer + 1 - n_gpu_layers, 0)
    cpu_bytes = 0
    for layer in range(min(gpu_start, geom.n_layer)):
        is_swa = geom.is_swa(layer) and cells_swa > 0
        cpu_bytes += swa_layer_bytes if is_swa else full_layer_bytes
    n_full = geom.full_layers if cells_swa else geom.n_layer
    n_swa = geom.swa_layers if cells_swa else 0
    return KVEstimate(
        full_bytes=n_full * full_layer_bytes,
        swa_bytes=n_swa * swa_layer_bytes,
        cells_full=cells,
        cells_swa=cells_swa,
        n_stream=n_stream,
        cpu_bytes=cpu_bytes,
    )


def estimate_sglang_kv(
    geom: ModelGeometry,
    max_total_num_tokens: int,
    kv_dtype_bytes: float = 2.0,
    hybrid_swa: bool = False,
    page_size: int = 1,
    max_total_num_tokens_swa: int | None = None,
    tp_size: int = 1,
    kv_cache_dtype: str | None = None,
) -> KVEstimate:
    """KV pool SGLang allocates for `max_total_num_tokens` token slots (per GPU).

    `kv_cache_dtype` is SGLang's `--kv-cache-dtype` (auto, bf16, fp8_e5m2, ...); it
    overrides `kv_dtype_bytes`.

    Without hybrid SWA (SGLang's default for most models, Gemma 3 included in 0.5.23) every
    layer gets the full pool. With it the sliding-window layers get
    `max_total_num_tokens_swa` slots (the full count when that is unknown: an upper bound).
    KV heads are split over `tp_size` GPUs (at least one head each).
    """
    if kv_cache_dtype is not None:
        kv_dtype_bytes = kv_type_bytes(kv_cache_dtype)
    heads = max(1, geom.n_head_kv // max(1, tp_size))
    per_layer_token = heads * (geom.head_dim_k + geom.head_dim_v) * kv_dtype_bytes
    slots = max_total_num_tokens + page_size
    if hybrid_swa and geom.swa_layers:
        swa_tokens = (
            max_total_num_tokens if max_total_num_tokens_swa is None else max_total_num_tokens_swa
        )
        return KVEstimate(
            full_bytes=round(geom.full_layers * slots * per_layer_token),
            swa_bytes=round(geom.swa_layers * (swa_tokens + page_size) * per_layer_token),
            cells_full=max_total_num_tokens,
            cells_swa=swa_tokens,
        )
    return KVEstimate(
        full_bytes=round(geom.n_layer * slots * per_layer_token),
        swa_bytes=0,
        cells_full=max_total_num_tokens,
        cells_swa=0,
    )


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


def _check_shape(n_layer: int, n_head_kv: int, head_k: int, head_v: int) -> None:
    if not 0 < n_layer <= MAX_LAYERS:
        raise ValueError(f"implausible layer count {n_layer}")
    for name, value in (("n_head_kv", n_head_kv), ("head_dim_k", head_k), ("head_dim_v", head_v)):
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


# GGUF scalar value types: type id -> struct format.
_GGUF_SCALARS = {
    0: "B",
    1: "b",
    2: "H",
    3: "h",
    4: "I",
    5: "i",
    6: "f",
    7: "?",
    10: "Q",
    11: "q",
    12: "d",
}
_GGUF_STRING, _GGUF_ARRAY = 8, 9
# Arrays longer than this (tokenizer vocabularies) are skipped, not decoded.
_GGUF_MAX_KEPT_ARRAY = 65536


@dataclass(frozen=True)
class GGUFField:
    """One GGUF metadata value with its GGUF type ids (`sub_type` for arrays)."""

    value: Any
    vtype: int
    sub_type: int | None = None


class _GGUFHeader:
    """Walks a GGUF header (v2/v3) in a memory map without touching tensor data.

    The `gguf` package's reader builds a numpy view per array item, which takes minutes
    for a 262k-token vocabulary; this walker skips such arrays in well under a second.
    With `keep_arrays` it decodes them too (one `struct` call per numeric array), and with
    `raw_strings` strings stay bytes, so a tokenizer can be copied byte for byte
    (`llmb-synth-model`).
    """

    def __init__(self, buf: Any, endian: str, keep_arrays: bool = False, raw_strings: bool = False):
        self.buf = buf
        self.pos = 0
        self.endian = endian
        self.keep_arrays = keep_arrays
        self.raw_strings = raw_strings

    def scalar(self, fmt: str) -> Any:
        value = struct.unpack_from(self.endian + fmt, self.buf, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return value

    def raw_string(self) -> bytes:
        length = self.scalar("Q")
        if self.pos + length > len(self.buf):
            raise ValueError("string runs past the end of the file")
        raw = bytes(self.buf[self.pos : self.pos + length])
        self.pos += length
        return raw

    def string(self) -> str:
        return self.raw_string().decode("utf-8", "replace")

    def field(self, vtype: int) -> GGUFField:
        if vtype != _GGUF_ARRAY:
            return GGUFField(self.value(vtype), vtype)
        itype, count = self.scalar("I"), self.scalar("Q")
        return GGUFField(self._array(itype, count), vtype, itype)

    def value(self, vtype: int) -> Any:
        if vtype in _GGUF_SCALARS:
            return self.scalar(_GGUF_SCALARS[vtype])
        if vtype == _GGUF_STRING:
            return self.raw_string() if self.raw_strings else self.string()
        if vtype == _GGUF_ARRAY:
            itype, count = self.scalar("I"), self.scalar("Q")
            return self._array(itype, count)
        raise ValueError(f"unknown GGUF value type {vtype}")

    def _array(self, itype: int, count: int) -> Any:
        keep = self.keep_arrays or count <= _GGUF_MAX_KEPT_ARRAY
        if itype in _GGUF_SCALARS:
            size = count * struct.calcsize(_GGUF_SCALARS[itype])
            if self.pos + size > len(self.buf):
                raise ValueError("array runs past the end of the file")
            values = None
            if keep:
                fmt = f"{self.endian}{count}{_GGUF_SCALARS[itype]}"
                values = list(struct.unpack_from(fmt, self.buf, self.pos))
            self.pos += size
            return values
        if itype == _GGUF_STRING and not keep:
            length = struct.Struct(self.endian + "Q").unpack_from
            buf, pos = self.buf, self.pos
            for _ in range(count):
                pos += 8 + length(buf, pos)[0]
            self.pos = pos
            return None
        return [self.value(itype) for _ in range(count)]


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor info of a GGUF header: name, dimensions (ne0 first) and ggml type id."""

    name: str
    shape: tuple[int, ...]
    ggml_type: int

    @property
    def n_elements(self) -> int:
        """Elements of the tensor."""
        count = 1
        for dim in self.shape:
            count *= dim
        return count

    @property
    def nbytes(self) -> int:
        """Bytes of the tensor's data (ValueError for an unknown ggml type)."""
        return ggml_types.tensor_bytes(self.n_elements, self.ggml_type)


def _walk_gguf(
    path: str | Path, keep_arrays: bool = False, raw_strings: bool = False
) -> tuple[dict[str, GGUFField], list[GGUFTensor]]:
    import mmap

    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        if bytes(buf[:4]) != b"GGUF":
            raise ValueError(f"{path}: not a GGUF file")
        # A big-endian file shows its version byte-swapped when read little-endian.
        version = struct.unpack_from("<I", buf, 4)[0]
        endian = "<" if version < 65536 else ">"
        hdr = _GGUFHeader(buf, endian, keep_arrays, raw_strings)
        hdr.pos = 4
        version = hdr.scalar("I")
        if version < 2:
            raise ValueError(f"{path}: GGUF version {version} is not supported")
        n_tensors, n_kv = hdr.scalar("Q"), hdr.scalar("Q")
        meta: dict[str, GGUFField] = {}
        for _ in range(n_kv):
            key = hdr.string()
            meta[key] = hdr.field(hdr.scalar("I"))
        tensors = []
        for _ in range(n_tensors):
            name = hdr.string()
            n_dims = hdr.scalar("I")
            if n_dims > 8:  # GGML_MAX_DIMS is 4; a corrupt header, not a tensor
                raise ValueError(f"{path}: tensor {name!r} has {n_dims} dimensions")
            shape = tuple(hdr.scalar("Q") for _ in range(n_dims))
            ggml_type = hdr.scalar("I")
            hdr.pos += 8  # data offset
            tensors.append(GGUFTensor(name, shape, ggml_type))
    return meta, tensors


def read_gguf_header(path: str | Path) -> tuple[dict[str, Any], list[tuple[str, int, int]]]:
    """Metadata and `(name, n_elements, ggml_type)` of every tensor, from the header only.

    Arrays longer than 65536 items (tokenizer vocabularies) are skipped, as `None`.
    """
    meta, tensors = _walk_gguf(path)
    return (
        {key: f.value for key, f in meta.items()},
        [(t.name, t.n_elements, t.ggml_type) for t in tensors],
    )


def read_gguf_tensors(path: str | Path) -> tuple[dict[str, Any], list[GGUFTensor]]:
    """Metadata and the tensor infos (name, shape, type) of a GGUF, from the header only."""
    meta, tensors = _walk_gguf(path)
    return {key: f.value for key, f in meta.items()}, tensors


def read_gguf_fields(path: str | Path) -> dict[str, GGUFField]:
    """Every metadata value of a GGUF with its type, arrays included and strings as bytes.

    For tools that write GGUF metadata back (`llmb-synth-model` copies a tokenizer).
    """
    return _walk_gguf(path, keep_arrays=True, raw_strings=True)[0]


@dataclass(frozen=True)
class WeightStructure:
    """ModelGeometry's weight-structure fields, as one typed value (see ModelGeometry)."""

    always_read_bytes: int | None = None
    routed_expert_bytes: int = 0
    expert_count: int | None = None
    expert_used_count: int | None = None
    expert_shared_count: int | None = None
    leading_dense_block_count: int | None = None
    token_embedding_row_bytes: int = 0
    token_embedding_bytes: int = 0
    input_embedding_bytes: int = 0
    tied_embeddings: bool | None = None
    routed_expert_bytes_by_layer: tuple[int, ...] = ()
    weights_source: str = ""

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
            always_read_bytes=split.always_read_bytes,
            routed_expert_bytes=split.routed_expert_bytes,
            expert_count=experts,
            expert_used_count=used,
            expert_shared_count=shared,
            leading_dense_block_count=leading,
            token_embedding_row_bytes=split.token_embedding_row_bytes,
            token_embedding_bytes=split.token_embedding_bytes,
            input_embedding_bytes=split.input_table_bytes,
            tied_embeddings=split.tied_embeddings,
            routed_expert_bytes_by_layer=split.routed_by_layer,
            weights_source=source,
        )

    def fields(self) -> dict[str, Any]:
        """Keyword arguments for ModelGeometry."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


def _gguf_kv_shape(
    key: Callable[[str], Any], n_embd: int | None, n_head: int | None
) -> tuple[int, int, int, int | None]:
    """(n_head_kv, head_dim_k, head_dim_v, kv_lora_rank) as llama.cpp sizes its KV cache.

    MLA models (DeepSeek-V2/V3, `attention.kv_lora_rank`) cache one latent of kv_lora_rank
    plus the rope key per token and layer, in K only (llama.cpp's V-less cache, PR #19067).
    """
    kv_lora = _as_int(key("attention.kv_lora_rank")) or None
    if kv_lora:
        return 1, kv_lora + (_as_int(key("rope.dimension_count")) or 0), 0, kv_lora
    n_head_kv = _as_int(key("attention.head_count_kv")) or n_head or 0
    default_head_dim = n_embd // n_head if n_embd and n_head else 0
    head_k = _as_int(key("attention.key_length")) or default_head_dim
    head_v = _as_int(key("attention.value_length")) or default_head_dim
    return n_head_kv, head_k, head_v, None


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
    n_head_kv, head_k, head_v, kv_lora = _gguf_kv_shape(key, n_embd, n_head)
    _check_shape(n_layer, n_head_kv, head_k, head_v)
    sliding_window = _as_int(key("attention.sliding_window")) or None
    mask = _swa_mask(arch, n_layer, sliding_window, key("attention.sliding_window_pattern"))
    moe = _gguf_moe(key, tensors) if tensors else WeightStructure()
    return ModelGeometry(
        architecture=arch,
        n_layer=n_layer,
        n_head_kv=n_head_kv,
        head_dim_k=head_k,
        head_dim_v=head_v,
        sliding_window=sliding_window,
        swa_layers=sum(mask),
        n_params=sum(t.n_elements for t in tensors) if tensors else None,
        weight_bytes=sum(t.nbytes for t in tensors) if tensors else None,
        n_ctx_train=_as_int(key("context_length")),
        file_type=_file_type_name(meta.get("general.file_type")),
        n_embd=n_embd,
        n_head=n_head,
        swa_mask=mask,
        kv_lora_rank=kv_lora,
        **moe.fields(),
    )


# Safetensors headers are small JSON; refuse absurd lengths instead of reading a huge file.
_MAX_SAFETENSORS_HEADER = 100 * 1024 * 1024


@dataclass(frozen=True)
class _Safetensors:
    params: int
    size: int
    tensors: tuple[weights.TensorInfo, ...]


def _safetensors_totals(directory: Path) -> _Safetensors | None:
    """Parameters, bytes and tensor infos of all `*.safetensors` in `directory` (headers only)."""
    params = size = 0
    infos: list[weights.TensorInfo] = []
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        return None
    for file in files:
        with file.open("rb") as fh:
            raw = fh.read(8)
            if len(raw) != 8:
                return None
            (length,) = struct.unpack("<Q", raw)
            if length > _MAX_SAFETENSORS_HEADER:
                return None
            header = json.loads(fh.read(length))
        for name, info in header.items():
            if name == "__metadata__" or not isinstance(info, dict):
                continue
            shape = [int(dim) for dim in info.get("shape", [])]
            count = 1
            for dim in shape:
                count *= dim
            params += count
            start, end = info.get("data_offsets", (0, 0))
            nbytes = int(end) - int(start)
            size += nbytes
            # HF tables are [n_vocab, hidden].
            infos.append(weights.TensorInfo(name, nbytes, shape[0] if len(shape) >= 2 else 1))
    return _Safetensors(params, size, tuple(infos))


def _hf_structure(
    config: Mapping[str, Any],
    text: Mapping[str, Any],
    dtype: str | None,
    files: _Safetensors | None,
) -> WeightStructure:
    """`_hf_moe_fields`, or nothing (structure unknown) when the config's MoE keys are odd.

    A strange `mlp_only_layers` or `quantization_config` must not cost the KV geometry.
    """
    try:
        return _hf_moe_fields(config, text, dtype, files)
    except (ValueError, TypeError, ArithmeticError, AttributeError):
        return WeightStructure()


def _hf_moe_fields(
    config: Mapping[str, Any],
    text: Mapping[str, Any],
    dtype: str | None,
    files: _Safetensors | None,
) -> WeightStructure:
    """ModelGeometry's MoE/embedding fields: safetensors sizes when present, else the config."""
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
    files: _Safetensors | None = None
    if isinstance(path_or_mapping, Mapping):
        config: Mapping[str, Any] = path_or_mapping
    else:
        path = Path(path_or_mapping)
        directory = path if path.is_dir() else path.parent
        file = path / "config.json" if path.is_dir() else path
        config = json.loads(file.read_text(encoding="utf-8"))
        files = _safetensors_totals(directory)
    text = config.get("text_config") or config
    arch_list = config.get("architectures") or []
    model_type = str(text.get("model_type") or config.get("model_type") or "")
    architecture = str(arch_list[0]) if arch_list else model_type
    n_layer = int(text["num_hidden_layers"])
    n_head = int(text.get("num_attention_heads") or 0) or None
    n_embd = int(text.get("hidden_size") or 0) or None
    if text.get("kv_lora_rank"):
        # MLA (DeepSeek-style): one compressed latent + rope key per token and layer.
        n_head_kv = 1
        head_k = int(text["kv_lora_rank"]) + int(text.get("qk_rope_head_dim") or 0)
        head_v = 0
    else:
        n_head_kv = int(text.get("num_key_value_heads") or n_head or 0)
        head_dim = text.get("head_dim") or (n_embd // n_head if n_embd and n_head else 0)
        head_k = head_v = int(head_dim)
    _check_shape(n_layer, n_head_kv, head_k, head_v)
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
    dtype = text.get("torch_dtype") or text.get("dtype") or config.get("torch_dtype")
    return ModelGeometry(
        architecture=architecture,
        n_layer=n_layer,
        n_head_kv=n_head_kv,
        head_dim_k=head_k,
        head_dim_v=head_v,
        sliding_window=sliding_window,
        swa_layers=sum(mask),
        n_params=files.params if files else None,
        weight_bytes=files.size if files else None,
        n_ctx_train=_as_int(text.get("max_position_embeddings")),
        file_type=str(dtype) if dtype else None,
        n_embd=n_embd,
        n_head=n_head,
        swa_mask=mask,
        kv_lora_rank=int(text["kv_lora_rank"]) if text.get("kv_lora_rank") else None,
        **_hf_structure(config, text, str(dtype) if dtype else None, files).fields(),
    )
