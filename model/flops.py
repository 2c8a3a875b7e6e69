"""FLOPs per prompt token from the model's structure: the weights a token multiplies through
(MoE: k of E routed experts) and attention per attended position (sliding window, MLA).

A prompt token costs 2 FLOPs per parameter it multiplies through: every matrix of the
transformer blocks, the routed experts at k/E. The token embedding is a lookup and the
output projection runs for the last prompt token only, so neither counts. Attention adds,
per layer and attended position, 2 x heads x (query-key head size + value head size): the
scores and the weighted sum. MLA models (DeepSeek) compute prefill in the decompressed form
(per-head key 192 = nope + rope, value 128), not over the cached latent. The core's
`core.prefill.prefill_flops_per_token` turns this into FLOPs at a prompt length.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

from model.gguf_header import GGUFTensor


class PrefillFlops(NamedTuple):
    """FLOPs per prompt token: the matmuls, and attention per attended position summed over
    the full-attention layers and over the sliding-window layers (window in tokens)."""

    matmul_flops: float
    attention_flops_full: float
    attention_flops_swa: float
    sliding_window: float | None


def gguf_matmul_params(
    tensors: Iterable[GGUFTensor], n_layer: int, experts: int | None, used: int | None
) -> int | None:
    """Parameters one prompt token multiplies through, from a GGUF's tensor infos.

    Matrices of the blocks `blk.N.` (N below `n_layer`: multi-token-prediction layers are
    skipped), routed-expert tensors (`*_exps`) at k/E; None without any block matrix.
    """
    total = 0.0
    found = False
    for t in tensors:
        parts = t.name.split(".")
        if len(t.shape) < 2 or parts[0] != "blk" or not parts[1].isdigit():
            continue
        if int(parts[1]) >= n_layer:
            continue
        found = True
        n = float(t.n_elements)
        if "_exps" in t.name and experts and used:
            n = n * used / experts
        total += n
    return round(total) if found else None


def gguf_attention_dims(key: Callable[[str], Any]) -> tuple[int, int] | None:
    """Per-head (query-key, value) sizes of prefill attention from GGUF keys (MLA: the
    `*_mla` sizes, the decompressed heads), None when unknown."""

    def num(name: str) -> int | None:
        value = key(name)
        return int(value) if isinstance(value, int | float) and value > 0 else None

    n_embd, n_head = num("embedding_length"), num("attention.head_count")
    default = n_embd // n_head if n_embd and n_head else None
    qk = num("attention.key_length_mla") or num("attention.key_length") or default
    v = num("attention.value_length_mla") or num("attention.value_length") or default
    if key("attention.kv_lora_rank") and not num("attention.key_length_mla"):
        # Older MLA conversions: key_length is already the decompressed head.
        qk, v = num("attention.key_length") or default, num("attention.value_length") or default
    return (qk, v) if qk and v else None


def hf_attention_dims(text: Mapping[str, Any]) -> tuple[int, int] | None:
    """Per-head (query-key, value) sizes from an HF text config (MLA: nope + rope, v)."""
    if text.get("kv_lora_rank"):
        qk = int(text.get("qk_nope_head_dim") or 0) + int(text.get("qk_rope_head_dim") or 0)
        v = int(text.get("v_head_dim") or 0)
        return (qk, v) if qk and v else None
    n_embd, n_head = int(text.get("hidden_size") or 0), int(text.get("num_attention_heads") or 0)
    head = int(text.get("head_dim") or (n_embd // n_head if n_embd and n_head else 0))
    return (head, head) if head else None


def prefill_flops(geo: Any) -> PrefillFlops | None:
    """FLOPs per prompt token of a `ModelGeometry` (None when its matrices are unknown)."""
    params = getattr(geo, "prefill_matmul_params", None)
    if not params:
        return None
    per_layer = 0.0
    dims = getattr(geo, "attention_head_dims", None)
    if dims and geo.n_head:
        per_layer = 2.0 * geo.n_head * (dims[0] + dims[1])
    swa = geo.swa_layers if geo.sliding_window else 0
    return PrefillFlops(
        2.0 * params,
        per_layer * (geo.n_layer - swa),
        per_layer * swa,
        float(geo.sliding_window) if swa else None,
    )
