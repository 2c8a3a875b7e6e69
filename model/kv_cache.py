"""KV-cache size estimates: how llama.cpp and SGLang size their caches for a model geometry.

The estimates reproduce how each engine sizes its KV cache, so the exporter can say how much
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

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from model.geometry import ModelGeometry

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
    full_layers, swa_layers, swa_tokens = geom.n_layer, 0, 0
    if hybrid_swa and geom.swa_layers:
        full_layers, swa_layers = geom.full_layers, geom.swa_layers
        swa_tokens = (
            max_total_num_tokens if max_total_num_tokens_swa is None else max_total_num_tokens_swa
        )
    return KVEstimate(
        full_bytes=round(full_layers * slots * per_layer_token),
        swa_bytes=round(swa_layers * (swa_tokens + page_size) * per_layer_token),
        cells_full=max_total_num_tokens,
        cells_swa=swa_tokens,
    )
