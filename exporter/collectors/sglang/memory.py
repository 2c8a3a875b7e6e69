"""What an SGLang server holds in memory: weights, the KV pool, and the model's structure.

SGLang's "GB" is GiB: `memory_pool.py` defines `GB = 1024 * 1024 * 1024` and
`get_available_gpu_memory` divides by `1 << 30`, so `*_memory_usage_gb` x 2^30 = bytes.
"""

from __future__ import annotations

import math

from core import series as llmb
from exporter.collectors.sglang.metrics import scheduler_value
from exporter.fields import Fields
from exporter.prefill_series import add_prefill_structure
from exporter.promtext import Exposition
from exporter.schema import MetricSet, add_kv_cache_type, add_model_structure
from model.geometry import ModelGeometry
from model.kv_cache import estimate_sglang_kv, kv_type_bytes

GIB = 1 << 30
# How far the model structure's bytes may be from what the engine placed (its own weight
# figure is rounded to 0.01 GiB and counts buffers SGLang adds, 0.78 vs 0.72 GiB on the H200).
STRUCTURE_TOLERANCE = 0.10


def checkpoint_weight_bytes(geom: ModelGeometry) -> float | None:
    """The checkpoint's weight bytes: safetensors headers, else the HF config's shapes x dtype.

    `--load-format dummy` (and a checkpoint not on this host) leaves only config.json: the
    byte split from it (always-read + routed experts + an untied embedding) is the weights.
    """
    if geom.weight_bytes:
        return float(geom.weight_bytes)
    if geom.always_read_bytes is None:
        return None
    return float(geom.always_read_bytes + geom.routed_expert_bytes + geom.token_embedding_bytes)


def structure_fits(geom: ModelGeometry, placed: float | None) -> bool:
    """Whether the config's byte split describes the weights the engine placed.

    A config missing sizes (no `intermediate_size`, no vocabulary) or a model quantized while
    loading (`--quantization fp8` of a bf16 checkpoint) gives a split that is not what a step
    reads: then no structure is exported and the roofline counts the placed weights.
    """
    total = checkpoint_weight_bytes(geom)
    if placed is None or total is None:
        return True
    return abs(total - placed) <= STRUCTURE_TOLERANCE * placed


def kv_dtype(server_info: Fields, geom: ModelGeometry | None) -> str | None:
    """The KV cache element type: `kv_cache_dtype`, `auto` read as the model's dtype."""
    kv = server_info.text("kv_cache_dtype")
    if kv is None:
        return None
    if kv != "auto":
        return kv
    dtype = server_info.text("dtype")
    if dtype and dtype != "auto":
        return dtype
    if geom is not None and geom.file_type:
        # SGLang serves a float32 checkpoint in float16 ("auto" follows the served dtype).
        return "float16" if geom.file_type in ("float32", "fp32") else geom.file_type
    return None


def map_memory(
    ms: MetricSet,
    expo: Exposition,
    server_info: Fields,
    reported_kv: float | None,
    geom: ModelGeometry | None,
    labels: dict[str, str],
) -> None:
    """The KV pool's bytes, spec-decoding accept length and KV element types."""
    kv_gb = scheduler_value(expo, "kv_cache_memory_usage_gb")
    kv = reported_kv if kv_gb is None else kv_gb * GIB
    ms.add(llmb.ENGINE_KV_CACHE_BYTES, kv, device="gpu", **labels)
    if server_info.text("speculative_algorithm"):
        # 0 until the first verified step; a real accept length is at least 1.
        accept = scheduler_value(expo, "spec_accept_length", "max")
        ms.add(
            llmb.ENGINE_SPEC_ACCEPT_LENGTH,
            accept if accept and accept >= 1 else None,
            **labels,
        )
    kv_type = kv_dtype(server_info, geom)
    if kv_type is not None:
        add_kv_cache_type(ms, type_k=kv_type, type_v=kv_type, **labels)


def map_weights(
    ms: MetricSet,
    expo: Exposition,
    server_info: Fields,
    geom: ModelGeometry | None,
    reported_weights: float | None,
    labels: dict[str, str],
) -> float | None:
    """Weights on the GPU and in host memory (`--cpu-offload-gb`), and the model's size.

    The size is what SGLang placed (GPU + CPU offload), so weights quantized while
    loading still count as resident; the checkpoint's size is the fallback. Returns the
    placed bytes (None when the engine did not say).
    """
    gpu_gb = scheduler_value(expo, "weight_memory_usage_gb")
    gpu = None if gpu_gb is None else gpu_gb * GIB
    if gpu is None:
        # 0.5.11 has no weight series: /server_info memory_usage or the log say it.
        gpu = reported_weights
    cpu = (server_info.num("cpu_offload_gb") or 0.0) * GIB
    if gpu is not None:
        ms.add(llmb.ENGINE_MODEL_BUFFER_BYTES, gpu, device="gpu", **labels)
        if cpu:
            ms.add(llmb.ENGINE_MODEL_BUFFER_BYTES, cpu, device="cpu", **labels)
        ms.add(llmb.MODEL_WEIGHTS_BYTES, gpu + cpu, **labels)
        return gpu + cpu  # what the engine placed
    if geom is not None:
        ms.add(llmb.MODEL_WEIGHTS_BYTES, checkpoint_weight_bytes(geom), **labels)
    return None


def map_geometry(
    ms: MetricSet,
    expo: Exposition,
    server_info: Fields,
    geom: ModelGeometry,
    placed: float | None,
    labels: dict[str, str],
) -> None:
    """The model's parameters, layers, structure and KV estimates from its HF config."""
    ms.add(llmb.MODEL_PARAMETERS, geom.n_params, **labels)
    ms.add(llmb.MODEL_LAYERS, float(geom.n_layer), **labels)
    if structure_fits(geom, placed):
        add_model_structure(ms, geom, **labels)
    add_prefill_structure(ms, geom, **labels)
    kv_type = kv_dtype(server_info, geom) or server_info.text("kv_cache_dtype") or "auto"
    try:
        dtype_bytes = kv_type_bytes(kv_type)
    except ValueError:
        ms.problems.append(f"/server_info.kv_cache_dtype: unknown type {kv_type!r}")
        return  # bytes per element unknown: no KV estimate rather than a wrong one
    ms.add(
        llmb.MODEL_KV_BYTES_PER_TOKEN_ESTIMATED,
        geom.kv_bytes_per_token(dtype_bytes),
        **labels,
    )
    tokens = scheduler_value(expo, "max_total_num_tokens", "max")
    if tokens is None:
        tokens = server_info.num("max_total_num_tokens")
    swa_tokens = scheduler_value(expo, "max_total_num_tokens_swa", "max")
    page = scheduler_value(expo, "page_size", "max") or server_info.num("page_size") or 1
    tp = server_info.num("tp_size") or 1
    values = (tokens, swa_tokens, page, tp)
    if not tokens or not all(v is None or (math.isfinite(v) and v < 2**53) for v in values):
        return  # unknown, or an Inf/absurd value the schema would drop anyway
    est = estimate_sglang_kv(
        geom,
        int(tokens),
        kv_cache_dtype=kv_type,
        hybrid_swa=swa_tokens is not None,
        page_size=max(1, int(page)),
        max_total_num_tokens_swa=None if swa_tokens is None else int(swa_tokens),
        tp_size=max(1, int(tp)),
    )
    ms.add(llmb.MODEL_KV_CACHE_BYTES_ESTIMATED, float(est.total), **labels)
