"""What a llama-server holds in memory: the model (GGUF header), its KV cache, and what the
server log says about buffers, offloaded layers, host-resident experts and a draft model."""

from __future__ import annotations

from core import series as llmb
from exporter.collectors.llamacpp.log import MIB, LogState, is_host_buffer
from exporter.collectors.llamacpp.metrics import PREFIX, slot_shape
from exporter.fields import Fields
from exporter.prefill_series import add_prefill_structure
from exporter.promtext import Exposition
from exporter.schema import MetricSet, add_kv_cache_type, add_model_structure
from model.geometry import ModelGeometry
from model.kv_cache import estimate_llamacpp_kv, kv_type_bytes


def host_experts(state: LogState, geom: ModelGeometry | None) -> tuple[int, float] | None:
    """(layers, bytes) of routed experts that llama.cpp keeps in host memory; None: unknown.

    From the `buffer type overridden to CPU` lines (-lv 5) when the log has them: their layers,
    with each layer's expert bytes from the GGUF (else the MiB the lines print). Without them
    (-lv 4), when every layer is offloaded to a GPU: the whole layers from layer 0 (as
    `--n-cpu-moe N` places them) whose host buffers match the logged ones best. Both count
    layers that hold routed experts (a leading dense layer among the first N is none).
    """
    if state.expert_overrides:
        host = {layer for layer, _ in state.expert_overrides.values()}
        by_layer = geom.routed_expert_bytes_by_layer if geom else ()
        if by_layer and all(layer < len(by_layer) for layer in host):
            return len(host), float(sum(by_layer[layer] for layer in host))
        return len(host), float(sum(mib for _, mib in state.expert_overrides.values()) * MIB)
    if geom is None or not geom.routed_expert_bytes_by_layer:
        return None
    buffers = state.model_buffer_bytes
    on_device = sum(v for dev, v in buffers.items() if not is_host_buffer(dev))
    all_offloaded = state.layers_total and state.layers_offloaded == state.layers_total
    if not on_device or not all_offloaded:
        return None  # CPU-only build, or whole layers on the CPU (-ngl): other signals say so
    n = n_cpu_moe_layers(buffers, geom)
    # `--n-cpu-moe N` names the first N layers, leading dense ones included (DeepSeek's
    # `first_k_dense_replace`): the count is of those that hold experts, as at -lv 5.
    first_n = geom.routed_expert_bytes_by_layer[:n]
    return sum(1 for b in first_n if b), float(sum(first_n))


def n_cpu_moe_layers(buffers: dict[str, float], geom: ModelGeometry) -> int:
    """N of `--n-cpu-moe N` whose host model buffers are closest to the logged ones.

    With mmap (`CPU_Mapped`) the host buffer is the file span from the token embedding to
    the last host expert tensor, the attention weights of those layers included; without
    it (`CPU`, `CUDA_Host`) the tensors themselves: the embedding plus the experts.
    """
    host = sum(v for dev, v in buffers.items() if is_host_buffer(dev))
    by_layer = geom.routed_expert_bytes_by_layer
    mapped = any(dev.endswith("_Mapped") for dev in buffers if is_host_buffer(dev))
    if mapped and len(geom.host_mapped_bytes_by_layers) == len(by_layer) + 1:
        expected = list(geom.host_mapped_bytes_by_layers)
    else:
        expected = [
            geom.input_embedding_bytes + sum(by_layer[:n]) for n in range(len(by_layer) + 1)
        ]
    return min(range(len(expected)), key=lambda n: abs(expected[n] - host))


def kv_unified(log_state: LogState | None) -> bool:
    """Whether the server runs one KV stream for all slots (`--kv-unified`, from its log)."""
    return bool(log_state and log_state.kv_unified)


def map_model(
    ms: MetricSet,
    geom: ModelGeometry | None,
    sizes: tuple[float | None, float | None],
    endpoints: tuple[Fields, list[Fields] | None],
    log_state: LogState | None,
    labels: dict[str, str],
) -> None:
    """The model's layers, parameters, size, structure and KV estimate.

    `sizes` are /v1/models' (meta.size, meta.n_params), already exported, and `endpoints`
    the /props and /slots answers; the GGUF header (`geom`) fills what they lack.
    """
    size, n_params = sizes
    if geom is None:
        if log_state and log_state.layers_total:
            # "offloaded N/M layers" counts the output layer as one more.
            ms.add(llmb.MODEL_LAYERS, log_state.layers_total - 1, **labels)
        return
    ms.add(llmb.MODEL_LAYERS, geom.n_layer, **labels)
    if not n_params:
        ms.add(llmb.MODEL_PARAMETERS, geom.n_params, **labels)
    if not size:
        ms.add(llmb.MODEL_WEIGHTS_BYTES, geom.weight_bytes, **labels)
    add_model_structure(ms, geom, **labels)
    add_prefill_structure(ms, geom, **labels)
    _map_kv_estimate(ms, geom, endpoints, log_state, labels)


def _kv_types(ms: MetricSet, log_state: LogState | None) -> tuple[str, str]:
    """The cache's element types from the log's KV lines; llama.cpp's default f16 else."""
    type_k = (log_state.kv_type_k if log_state else None) or "f16"
    type_v = (log_state.kv_type_v if log_state else None) or type_k
    for name in (type_k, type_v):
        try:
            kv_type_bytes("f16" if name == "none" else name)
        except ValueError:
            ms.problems.append(f"KV estimate: unknown KV cache type {name!r}, assumed f16")
            return "f16", "f16"
    return type_k, type_v


def _map_kv_estimate(
    ms: MetricSet,
    geom: ModelGeometry,
    endpoints: tuple[Fields, list[Fields] | None],
    log_state: LogState | None,
    labels: dict[str, str],
) -> None:
    type_k, type_v = _kv_types(ms, log_state)
    # An MLA model's V-less cache ("none") stores no V; its head_dim_v is 0 anyway.
    type_v = type_k if type_v == "none" else type_v
    per_token = geom.kv_bytes_per_token(kv_type_bytes(type_k), kv_type_bytes(type_v))
    ms.add(llmb.MODEL_KV_BYTES_PER_TOKEN_ESTIMATED, per_token, **labels)
    n_slots, n_ctx_slot = slot_shape(*endpoints)
    if n_ctx_slot and n_slots:
        unified = kv_unified(log_state)
        n_ctx = n_ctx_slot if unified else n_ctx_slot * n_slots
        try:
            est = estimate_llamacpp_kv(
                geom, n_ctx=n_ctx, n_seq=n_slots, kv_unified=unified, type_k=type_k, type_v=type_v
            )
        except (ValueError, ArithmeticError) as exc:  # e.g. an absurd n_ctx
            ms.problems.append(f"KV estimate: {exc}")
            return
        ms.add(llmb.MODEL_KV_CACHE_BYTES_ESTIMATED, est.total, **labels)


def map_roofline_log(
    ms: MetricSet,
    state: LogState | None,
    expo: Exposition | None,
    geom: ModelGeometry | None,
    labels: dict[str, str],
) -> None:
    """Experts in host memory, speculative decoding's accept length, the draft's weights."""
    if state is not None and state.kv_type_k:
        add_kv_cache_type(ms, state.kv_type_k, state.kv_type_v or state.kv_type_k, **labels)
    experts = host_experts(state, geom) if state else None
    if experts is not None:
        ms.add(llmb.ENGINE_EXPERTS_HOST_LAYERS, experts[0], **labels)
        ms.add(llmb.ENGINE_EXPERTS_HOST_BYTES, experts[1], **labels)
    accept = state.spec_accept_length if state else None
    if accept is None and expo is not None:
        drafts = expo.first(PREFIX + "spec_decode_num_drafts_total")
        accepted = expo.first(PREFIX + "spec_decode_num_accepted_tokens_total")
        if drafts and accepted is not None:
            # Over verification steps only (llama.cpp's own "mean len").
            accept = 1.0 + accepted / drafts
    ms.add(llmb.ENGINE_SPEC_ACCEPT_LENGTH, accept, **labels)
    if state is not None:
        ms.add(llmb.MODEL_DRAFT_WEIGHTS_BYTES, state.draft_weights_bytes, **labels)


def map_log(ms: MetricSet, state: LogState, labels: dict[str, str]) -> None:
    """What the server log says of the process: layers, load time, buffers, KV pressure."""
    ms.add(llmb.ENGINE_GPU_LAYERS_OFFLOADED, state.layers_offloaded, **labels)
    ms.add(llmb.ENGINE_GPU_LAYERS_TOTAL, state.layers_total, **labels)
    ms.add(llmb.ENGINE_LOAD_SECONDS, state.load_seconds, **labels)
    for device, value in sorted(state.model_buffer_bytes.items()):
        ms.add(llmb.ENGINE_MODEL_BUFFER_BYTES, value, device=device, **labels)
    for device, value in sorted(state.kv_buffer_bytes.items()):
        ms.add(llmb.ENGINE_KV_CACHE_BYTES, value, device=device, **labels)
    for event in ("kv_no_space", "context_exceeded", "context_shift", "slot_truncated"):
        count = state.events.get(event, 0)
        ms.add(llmb.ENGINE_KV_PRESSURE_EVENTS_TOTAL, count, event=event, **labels)
